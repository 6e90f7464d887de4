"""User code that raises on an item: naming the item, and the bad-record policy.

**Naming the item.** A processor that calls user code per item (``map``, ``filter``,
``flat_map``, the Pipeline's fused stages, service calls, the key and accumulate
functions of aggregations and windows, ``map_stateful``) records which item the code raised on
(:func:`blame`), and the job's error says it: ``job 'j' failed: vertex 'parse',
processor 0, on item 'a;b': ValueError: ...`` (the repr cut at 200 characters). It costs
nothing until something raises: the bulk paths still run the function over a whole chunk
at C speed, and only after an exception find the item from how far the chunk's iterator
got (:func:`failed_position`). Where an item came from (``file:line``, a Kafka topic,
partition and offset) is known where the item is read: the sources' own errors name it,
and a source that sets items aside passes it as ``source`` (``read_csv`` and
``read_jsonl``: ``<file>:<line>`` of a malformed record); downstream the engine does not
track the origin of every item (that would cost per item), so the item's repr
identifies it.

**The bad-record policy** (``JobConfig(on_item_error=...)``, ``Vertex.on_item_error``,
``Stage.on_item_error``): ``"fail"`` (the default) fails the job on the first item whose
user code raises; ``"skip"`` drops that item and goes on; a *sink* (a sink supplier such
as ``sinks.list_sink("bad")``, or a sink vertex of the DAG) drops it and sends a
:class:`DeadLetter` record there. Skipped items are counted per vertex in the
``items_skipped`` metric and reported in a WARNING (the first at once, then at most once
a minute, and the total at the job's end: :class:`ItemErrorReport`). Dead letters flow
through the DAG on an extra edge, so snapshots cover them as any other output: a
transactional sink gets each one exactly once under an exactly-once job.

Each processor of a vertex has an :class:`ItemErrors` in its context
(``context.item_errors``); a processor that handles item errors declares
``handles_item_errors = True`` and calls ``context.item_errors.handle(item, error)`` in
its ``except`` clause: ``False`` means re-raise (the policy is ``"fail"``), ``True``
means the item was set aside and the processor drops it and goes on.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from slipstream.core.describe import short_repr

if TYPE_CHECKING:
    from slipstream.core.outbox import Outbox
    from slipstream.core.processor import Context

__all__ = [
    "FAIL",
    "SKIP",
    "SKIPPED_METRIC",
    "DeadLetter",
    "ItemErrorReport",
    "ItemErrors",
    "blame",
    "blamed",
    "check_policy",
    "failed_position",
    "handles_item_errors",
    "on_item",
]

FAIL = "fail"
SKIP = "skip"

SKIPPED_METRIC = "items_skipped"
"""The metric counting the items a vertex set aside (skipped or sent to the dead
letters) because user code raised on them."""

REPEAT_INTERVAL_S = 60.0
"""While items keep failing, the warning repeats at most this often."""


class DeadLetter(NamedTuple):
    """An item set aside by ``on_item_error=<sink>``: the vertex whose code raised, the
    item as it entered that vertex, the error (``"ValueError: ..."``) and where the item
    came from when the vertex read it itself (``"data/a.csv:12"`` for a malformed
    record of ``read_csv``/``read_jsonl``; else ``None``). File sinks write
    the four fields as columns (CSV, Parquet) or keys (JSON lines)."""

    vertex: str
    item: Any
    error: str
    source: str | None


class _Blame(NamedTuple):
    item: Any
    source: str | None


_BLAME_ATTR = "_slipstream_item"


def blame(error: BaseException, item: Any, source: str | None = None) -> BaseException:
    """Record on ``error`` that it was raised on ``item`` (read at ``source``, if known);
    the first record wins (the innermost processor knows best). Returns ``error``."""
    if getattr(error, _BLAME_ATTR, None) is None:
        try:
            setattr(error, _BLAME_ATTR, _Blame(item, source))
        except (AttributeError, TypeError):  # an exception type without a __dict__
            pass
    return error


def blamed(error: BaseException) -> tuple[Any, str | None] | None:
    """``(item, source)`` recorded by :func:`blame`, or ``None``."""
    b = getattr(error, _BLAME_ATTR, None)
    return (b.item, b.source) if type(b) is _Blame else None


def on_item(error: BaseException) -> str:
    """``", on item 'x' (data/a.csv:3)"``: the words a job's error adds about the item
    ``error`` was raised on (empty if no processor recorded one)."""
    b = blamed(error)
    if b is None:
        return ""
    item, source = b
    return f", on item {short_repr(item)}" + (f" ({source})" if source else "")


def error_text(error: BaseException) -> str:
    """``"ValueError: bad"``: an exception as a dead letter or a warning quotes it."""
    try:
        message = str(error)
    except Exception:  # noqa: BLE001 - a broken __str__ must not hide the failure
        message = "<unprintable>"
    return f"{type(error).__name__}: {message}" if message else type(error).__name__


def failed_position(size: int, iterator: Any) -> int:
    """The index of the item a C-speed loop over ``iterator`` (over a sequence of
    ``size`` items: a deque or list iterator) raised on: the last one it handed out."""
    return size - iterator.__length_hint__() - 1


def handles_item_errors(supplier: Any) -> bool:
    """Whether the processors of ``supplier`` (a vertex's supplier) apply the bad-record
    policy: they, their class or the supplier say ``handles_item_errors = True``."""
    flag = getattr(supplier, "handles_item_errors", None)
    if flag is None and isinstance(supplier, functools.partial):
        flag = getattr(supplier.func, "handles_item_errors", None)
    return bool(flag)


def check_policy(value: Any, where: str) -> Any:
    """``value`` if it is a valid ``on_item_error``: ``"fail"``, ``"skip"``, a sink
    supplier or a vertex; else a ``ValueError``/``TypeError`` saying what is."""
    if isinstance(value, str):
        if value in (FAIL, SKIP):
            return value
        raise ValueError(
            f"{where}: on_item_error must be 'fail', 'skip' or a sink to send the items to "
            f"(e.g. sinks.list_sink('bad'), or a sink vertex of the DAG), got {value!r}"
        )
    from slipstream.core.dag import Vertex
    from slipstream.core.traits import SINK, traits_of

    if isinstance(value, Vertex):
        supplier = value.supplier
    elif callable(value) or callable(getattr(value, "get", None)):
        supplier = value
    else:
        raise TypeError(
            f"{where}: on_item_error must be 'fail', 'skip' or a sink (a sink supplier such "
            f"as sinks.list_sink('bad'), or a sink vertex of the DAG), got {value!r}"
        )
    traits = traits_of(supplier)
    if traits is not None and SINK not in traits:
        raise TypeError(
            f"{where}: on_item_error={short_repr(value)} is not a sink; give a sink (e.g. "
            "sinks.list_sink('bad'), sinks.write_jsonl('bad/')) to send the items to"
        )
    return value


class ItemErrors:
    """A processor's bad-record policy (``context.item_errors``; see the module
    docstring). ``side_ordinal``: the outbound ordinal of the dead-letter edge, if the
    policy is a sink. The engine makes one per processor."""

    __slots__ = ("context", "fails", "side_ordinal", "target", "report", "_outbox")

    def __init__(
        self,
        context: Context,
        *,
        skip: bool = False,
        side_ordinal: int | None = None,
        target: str | None = None,
        report: ItemErrorReport | None = None,
    ) -> None:
        self.context = context
        #: the policy is "fail": the caller re-raises
        self.fails = not skip and side_ordinal is None
        self.side_ordinal = side_ordinal
        #: the dead-letter vertex's name (for the warning)
        self.target = target
        self.report = report
        self._outbox: Outbox | None = None
        if not self.fails:  # in the metrics from the start, as 0
            context.metrics.setdefault(SKIPPED_METRIC, 0)

    def bind(self, outbox: Outbox) -> None:
        """The processor's outbox (``Processor.init``): the dead-letter ordinal becomes a
        side output that ``offer(item)`` leaves out. Processors that wrap others call
        ``init`` of the wrapped ones with private outboxes later: the first one wins."""
        if self.side_ordinal is not None and self._outbox is None:
            outbox.reserve_side_ordinal(self.side_ordinal)
            self._outbox = outbox

    def handle(
        self,
        item: Any,
        error: BaseException,
        source: str | None = None,
        *,
        names_item: bool = False,
    ) -> bool:
        """User code raised ``error`` on ``item``. Under ``"fail"``: records the item on
        the error (unless its message ``names_item`` already) and returns ``False``
        (re-raise it). Otherwise sets the item aside (counted, reported, sent to the dead
        letters) and returns ``True``."""
        if not names_item:
            blame(error, item, source)
        if self.fails:
            return False
        ctx = self.context
        outbox = self._outbox
        if outbox is not None:
            # past the bucket's capacity if need be (a few records per call at most):
            # the engine hands the bucket on before it calls the processor again
            outbox.buckets[self.side_ordinal].append(  # type: ignore[index]
                DeadLetter(ctx.vertex_name, item, error_text(error), source)
            )
        ctx.increment_metric(SKIPPED_METRIC)
        if self.report is not None:
            self.report.add(ctx.vertex_name, item, error, source, self.target)
        return True

    def __repr__(self) -> str:
        what = "fail" if self.fails else (f"dead letters to {self.target!r}" if self.target else "skip")
        return f"ItemErrors({self.context.vertex_name!r}, {what})"


class ItemErrorReport:
    """One job's warnings about the items it set aside: the first at once, then at most
    once per ``interval_s`` with the running counts, and the total at the job's end.
    Thread-safe (processors of several threads report)."""

    def __init__(
        self,
        job_name: str,
        logger: logging.Logger,
        *,
        interval_s: float = REPEAT_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.job_name = job_name
        self._log = logger
        self._interval = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}
        self._targets: dict[str, str | None] = {}
        self._last: tuple[str, Any, BaseException, str | None] | None = None
        self._warned_at: float | None = None
        self._unreported = False

    @property
    def counts(self) -> dict[str, int]:
        """Items set aside per vertex since the job started (over every execution)."""
        with self._lock:
            return dict(self._counts)

    def add(
        self,
        vertex: str,
        item: Any,
        error: BaseException,
        source: str | None = None,
        target: str | None = None,
    ) -> None:
        with self._lock:
            self._counts[vertex] = self._counts.get(vertex, 0) + 1
            self._targets[vertex] = target
            self._last = (vertex, item, error, source)
            now = self._clock()
            if self._warned_at is not None and now - self._warned_at < self._interval:
                self._unreported = True
                return
            self._warned_at = now
            self._unreported = False
            message = self._message(final=False)
        self._log.warning(message)

    def _message(self, final: bool) -> str:
        assert self._last is not None
        vertex, item, error, source = self._last
        total = sum(self._counts.values())
        parts = []
        for v, n in sorted(self._counts.items()):
            t = self._targets.get(v)
            parts.append(f"vertex {v!r}: {n}" + (f" sent to {t!r}" if t else ""))
        items = "item" if total == 1 else "items"
        when = "in all" if final else "so far"
        where = f" ({source})" if source else ""
        repeat = "" if final else " (repeated at most once a minute while items fail)"
        return (
            f"job {self.job_name!r} skipped {total} {items} on which user code raised {when} "
            f"({', '.join(parts)}); the last: vertex {vertex!r}, item {short_repr(item)}"
            f"{where}: {error_text(error)}. See docs/troubleshooting.md{repeat}"
        )

    def finish(self) -> None:
        """At the job's end: the total, if items were set aside since the last warning
        (otherwise that warning's count is the total)."""
        with self._lock:
            if not self._unreported:
                return
            self._unreported = False
            message = self._message(final=True)
        self._log.warning(message)
