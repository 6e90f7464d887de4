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
import csv
import operator
import os
from typing import Any

__all__ = [
    "check_callable",
    "check_csv_dialect",
    "check_encoding",
    "check_fn",
    "check_name",
    "check_path",
    "check_port",
    "int_value",
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
