"""Argument checks shared by the factories of processors, sources and sinks.

Factories check their arguments when the DAG is built, so that a mistake fails there,
with an error naming the factory and the argument, and not deep inside a running job.

The library words these errors in two ways, and each has one check here:
``"map(): argument 'fn' must be callable, ..."`` (:func:`check_callable`, used by the
batch processors, sources and sinks) and ``"aggregate_to_sliding_window: key_fn must be
callable, ..."`` (:func:`check_fn`, used by the streaming ones).
"""

from __future__ import annotations

import codecs
import datetime
import math
import operator
import os
from typing import Any

from slipstream.core.describe import short_repr
from slipstream.core.time import MAX_TIMESTAMP, NO_WATERMARK

__all__ = [
    "check_callable",
    "check_csv_dialect",
    "check_encoding",
    "check_fn",
    "check_name",
    "check_path",
    "check_port",
    "int_value",
    "check_invalid_timestamps",
    "only_int_timestamps",
    "timestamp_out_of_range",
    "valid_timestamps",
    "LATE_COUNTS",
]


def check_callable(fn: Any, argument: str, factory: str, *, optional: bool = False) -> None:
    """Raise ``TypeError`` naming ``argument`` of ``factory()`` unless ``fn`` is callable
    (or ``None``, when ``optional``)."""
    if fn is None and optional:
        return
    if not callable(fn):
        raise TypeError(f"{factory}(): argument {argument!r} must be callable, got {fn!r}")


def check_fn(fn: Any, name: str, where: str) -> None:
    """Raise ``TypeError`` ``"<where>: <name> must be callable"`` unless ``fn`` is callable."""
    if not callable(fn):
        raise TypeError(f"{where}: {name} must be callable, got {fn!r}")


def per_input_fns(fns: Any, name: str, where: str, arity: int) -> tuple[Any, ...]:
    """``fns`` as a tuple of ``arity`` callables, one per input ordinal: a single
    callable serves every input; a list or tuple must hold one callable per input
    (``arity`` is the aggregate operation's). Errors name ``where`` and ``name``."""
    if callable(fns):
        return (fns,) * arity
    if isinstance(fns, (list, tuple)):
        if len(fns) != arity:
            raise ValueError(
                f"{where}: {name} has {len(fns)} function(s) but agg_op takes {arity} "
                f"input(s): give one per inbound edge (ordinal)"
            )
        for i, fn in enumerate(fns):
            if not callable(fn):
                raise TypeError(f"{where}: {name}[{i}] must be callable, got {fn!r}")
        return tuple(fns)
    raise TypeError(f"{where}: {name} must be callable or a list of callables, got {fns!r}")


def check_name(name: Any, factory: str) -> None:
    """The ``name`` of a named list or map: a non-empty ``str``, else ``TypeError``."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"{factory}(): argument 'name' must be a non-empty str, got {name!r}")


def check_path(directory: Any, factory: str) -> None:
    """The ``directory`` argument: a ``str`` or ``os.PathLike``, else ``TypeError``."""
    if not isinstance(directory, (str, os.PathLike)):
        raise TypeError(f"{factory}(): argument 'directory' must be a path, got {directory!r}")


def check_port(port: Any, where: str) -> None:
    """A TCP port: a plain ``int`` (not a ``bool``) in 1..65535, else ``ValueError``."""
    if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
        raise ValueError(f"{where}: port must be an int in 1..65535, got {port!r}")


def check_encoding(encoding: str, where: str) -> None:
    """A text encoding that ``codecs`` knows, else ``ValueError``."""
    try:
        codecs.lookup(encoding)
    except LookupError:
        raise ValueError(f"{where}: unknown encoding {encoding!r}") from None


def int_value(value: Any) -> int | None:
    """``value`` as a plain ``int``, or ``None`` when it is not an integer.

    Integer-like values (numpy integers, anything with ``__index__``) are accepted and
    converted; a ``bool`` is refused although it is an ``int``, because ``True`` where
    a size or a timeout belongs is a mistake, not the number 1. The caller raises the
    error, in its own words, when this returns ``None``.
    """
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def check_csv_dialect(dialect: Any, factory: str) -> None:
    """A CSV dialect: a name ``csv`` knows (``ValueError`` otherwise) or a
    ``csv.Dialect`` subclass (``TypeError`` for anything else)."""
    import csv  # here: only the CSV connectors need it, not every importer of this module

    if isinstance(dialect, str):
        if dialect not in csv.list_dialects():
            raise ValueError(
                f"{factory}(): unknown CSV dialect {dialect!r} (known: {csv.list_dialects()})"
            )
    elif not (isinstance(dialect, type) and issubclass(dialect, csv.Dialect)):
        raise TypeError(
            f"{factory}(): argument 'dialect' must be a dialect name or a csv.Dialect "
            f"subclass, got {dialect!r}"
        )


INVALID_TIMESTAMPS = ("fail", "late")
"""What a windowing processor does with an item whose timestamp is not an integer
(``NaN``, ``inf``, ``1.5``, ``"5"``, ``None``): ``"fail"`` the job with an error naming
the vertex and the item (the default), or count it as ``"late"`` and drop it."""


def check_invalid_timestamps(value: Any, where: str) -> str:
    """The ``invalid_timestamps`` argument of ``where``: one of :data:`INVALID_TIMESTAMPS`."""
    if value not in INVALID_TIMESTAMPS:
        raise ValueError(
            f"{where}: invalid_timestamps must be 'fail' or 'late', got {value!r}"
        )
    return str(value)


def only_int_timestamps(timestamps: list[Any]) -> bool:
    """Whether every timestamp is a plain ``int`` (one type scan at C speed; counting
    is faster than building a set of the types)."""
    return list(map(type, timestamps)).count(int) == len(timestamps)



def valid_timestamps(
    items: list[Any], timestamps: list[Any], where: str, invalid: str
) -> tuple[list[Any], list[int], int]:
    """The slow path for a batch whose timestamps are not all plain ints: integer-like
    ones (numpy integers) become ints; any other one, or one outside the 64-bit range
    (:func:`timestamp_out_of_range`), fails with an error naming ``where`` and the item,
    or (``invalid == "late"``) its item is left out and counted. Returns the kept items,
    their timestamps and the number left out."""
    kept: list[Any] = []
    stamps: list[int] = []
    dropped = 0
    for item, ts in zip(items, timestamps, strict=True):
        v = int_value(ts)
        if v is None or not NO_WATERMARK <= v <= MAX_TIMESTAMP:
            if invalid == "late":
                dropped += 1
                continue
            if v is not None:
                raise timestamp_out_of_range(where, item, v, LATE_COUNTS)
            raise not_a_timestamp(where, item, ts, LATE_COUNTS)
        kept.append(item)
        stamps.append(v)
    return kept, stamps, dropped

LATE_COUNTS = "(invalid_timestamps='late' counts such items as late instead)"
"""The hint the windowing processors end a timestamp error with."""


def not_a_timestamp(where: str, item: Any, ts: Any, late_hint: str) -> TypeError:
    """The error for ``item`` whose timestamp function gave ``ts``, which is not an
    integer (see :func:`timestamp_advice`)."""
    return TypeError(
        f"{where}: the timestamp of item {short_repr(item)} is {short_repr(ts)}, not an "
        f"int: timestamps are int milliseconds{timestamp_advice(ts, late_hint)}"
    )


def timestamp_advice(ts: Any, late_hint: str) -> str:
    """What to do about a timestamp ``ts`` that is not an integer, fitting the value: a
    float or a datetime is converted to int milliseconds in the timestamp function
    (dropping such items would drop them all), a string is parsed; ``late_hint`` (how to
    count such items as late) is offered only for values that carry no time at all
    (NaN, infinite, ``None``, other types)."""
    if isinstance(ts, float) and math.isfinite(ts):
        return (
            ", so a float of seconds needs int(seconds * 1000) in the timestamp function "
            "(a float of milliseconds: int(ms))"
        )
    if isinstance(ts, str):
        return (
            "; parse the string in the timestamp function (int(s) for digits, "
            "int(datetime.fromisoformat(s).timestamp() * 1000) for an ISO date)"
        )
    if isinstance(ts, datetime.datetime):
        return ", so a datetime needs int(dt.timestamp() * 1000) in the timestamp function"
    return f" {late_hint}" if late_hint else ""


def timestamp_out_of_range(where: str, item: Any, ts: int, hint: str) -> ValueError:
    """The error for ``item`` whose timestamp ``ts`` is an int outside the 64-bit range
    of timestamps (``NO_WATERMARK`` .. ``MAX_TIMESTAMP``, Jet's ``long``; a larger one
    would become a watermark beyond every later item, which would all be dropped as
    late): ``where`` names the processor and vertex, ``hint`` says what else can be done
    (``""`` for nothing)."""
    return ValueError(
        f"{where}: item {short_repr(item)} has timestamp {ts}, outside the range of "
        "timestamps (64-bit: -2**63 .. 2**63 - 1)" + (f" {hint}" if hint else "")
    )
