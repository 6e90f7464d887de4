"""The processor contract (Jet's ``Processor``) and its convenience base class.

A processor receives items from zero or more inbound edges and emits to zero or more
outbound edges. The engine calls it from one thread at a time; a *cooperative* processor
must return quickly (well under a millisecond) and return as soon as the outbox refuses
an item, keeping whatever it still has to emit.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Iterable, Iterator, MutableMapping
from functools import partial
from itertools import islice
from operator import length_hint
from typing import TYPE_CHECKING, Any

from slipstream.core.config import ProcessingGuarantee
from slipstream.core.inbox import Inbox
from slipstream.core.item_errors import ItemErrors
from slipstream.core.items import NO_WATERMARK, IdleMessage, Watermark
from slipstream.core.outbox import Outbox

if TYPE_CHECKING:
    pass

__all__ = [
    "Processor",
    "AbstractProcessor",
    "Context",
    "FlatMapper",
    "blocking_call_advice",
    "drain_between",
]


class Context:
    """What a processor knows about where it runs (Jet's ``Processor.Context``).

    ``services`` gives access to the engine's named structures (``get_list``/``get_map``)
    and job-level counters (``increment_metric``); in tests it is a plain in-memory store.
    """

    __slots__ = (
        "vertex_name",
        "global_processor_index",
        "local_processor_index",
        "local_parallelism",
        "total_parallelism",
        "member_index",
        "member_count",
        "processing_guarantee",
        "logger",
        "job_name",
        "services",
        "metrics",
        "current_snapshot_id",
        "hold_watermarks",
        "micro_batch_watermarks",
        "metric_listener",
        "allow_rollback",
        "item_errors",
        "pipeline_stage",
        "commits_snapshots",
        "epoch_commit_id",
        "epoch_final",
        "committed_snapshot_id",
        "completion_committed",
        "incremental_snapshots",
        "snapshot_writer",
        "live_saves",
        "spilled_keys",
        "restored_snapshot_id",
        "_restored_maps",
        "_restored_states",
        "state_backend",
        "state_dir",
        "closers",
        "sink_outage_timeout",
        "snapshot_interval_ms",
        "warning",
        "unavailable_since",
        "_staged",
        "_staged_at_completion",
    )

    def __init__(
        self,
        vertex_name: str = "vertex",
        global_processor_index: int = 0,
        local_processor_index: int = 0,
        local_parallelism: int = 1,
        total_parallelism: int = 1,
        member_index: int = 0,
        member_count: int = 1,
        processing_guarantee: ProcessingGuarantee = ProcessingGuarantee.NONE,
        job_name: str = "job",
        services: Any = None,
        logger: logging.Logger | None = None,
    ) -> None:
        self.vertex_name = vertex_name
        self.global_processor_index = global_processor_index
        self.local_processor_index = local_processor_index
        self.local_parallelism = local_parallelism
        self.total_parallelism = total_parallelism
        self.member_index = member_index
        self.member_count = member_count
        self.processing_guarantee = processing_guarantee
        self.job_name = job_name
        if services is None:
            from slipstream.core.services import InMemoryServices

            services = InMemoryServices()
        self.services = services
        self.logger = logger or logging.getLogger(
            f"slipstream.{vertex_name}#{global_processor_index}"
        )
        # Per-processor counters (e.g. "late_items_dropped"); summed per vertex in job metrics.
        self.metrics: dict[str, int] = {}
        # id of the snapshot being saved while save_to_snapshot() runs
        self.current_snapshot_id = 0
        # a batch job (every source bounded): watermark inserters emit no watermark, so
        # windows see every item and emit at the end (see JobConfig.batch_watermarks)
        self.hold_watermarks = False
        # an epoch of a Spark Structured Streaming query: watermark inserters hold their
        # watermark until the epoch's input ends and start the next epoch from the
        # highest one of their vertex, so the watermark is the whole micro-batch's, as in
        # Spark (slipstream.processors.watermarks, docs/spark.md "Event time")
        self.micro_batch_watermarks = False
        # the engine's listener(vertex_name, metric, delta) of increment_metric, if any:
        # the job reports dropped late items from it (slipstream.core.late_items)
        self.metric_listener: Callable[[str, str, int], None] | None = None
        # a restored sink that finds its own output of a newer snapshot than the restored
        # one (the snapshot store was rolled back): True resumes all the same, replaying
        # (JobConfig.allow_rollback), False fails with SnapshotStoreRolledBackError; None:
        # not checked (no snapshots, or an engine whose sinks commit before the snapshot)
        self.allow_rollback: bool | None = None
        # what to do when user code raises on an item (JobConfig.on_item_error): the
        # engine sets it per vertex; by default the job fails naming the item
        self.item_errors = ItemErrors(self)
        # the Pipeline stage this vertex was compiled from ("map 'parse'"), None for a
        # vertex of the Core API: advice to the user names what they can change
        self.pipeline_stage: str | None = None
        #: ``True`` when the engine writes snapshots to a store and tells the processor
        #: when one committed (``Processor.snapshot_commit_finish``): a two-phase sink
        #: then holds its output back until that call. ``False`` without a processing
        #: guarantee and in the processor test harness: output is final at once; also on
        #: the Spark engine, whose epochs commit differently (see ``epoch_commit_id``).
        self.commits_snapshots = False
        #: an epoch of a Spark streaming job that asked for exactly-once: the id of the
        #: snapshot the epoch's manifest commits (0 otherwise). Every epoch ends with the
        #: same terminal barrier (``current_snapshot_id`` is always 1 there), and no
        #: ``snapshot_commit_finish`` comes: a two-phase sink files what it prepared under
        #: this id in its saved state, and writes it when a later run restores that state
        #: (the driver's commit step or the next epoch), checking its own marker so that
        #: a replayed epoch writes nothing twice (docs/spark.md, "Kafka on Spark")
        self.epoch_commit_id = 0
        #: the last run of a Spark micro-batch job (restore, then complete): it commits no
        #: snapshot that could hold a two-phase sink's last output, so the sink writes
        #: that output itself, once (with ``epoch_commit_id`` set)
        self.epoch_final = False
        #: the newest snapshot known to have committed, set before each
        #: ``snapshot_commit_finish`` call (0: none yet)
        self.committed_snapshot_id = 0
        #: ``True`` once a snapshot recording this processor as completed committed (or
        #: the job's end released its last output): ``snapshot_commit_finish(True)`` may
        #: then commit what ``complete()`` prepared
        self.completion_committed = False
        #: ``True`` when the engine's snapshots take keyed state as deltas: a
        #: :class:`~slipstream.state.keyed.KeyedState` then records changed keys and saves
        #: only those (``False``: every save is full, nothing is tracked per item)
        self.incremental_snapshots = False
        #: ``"fork"`` when a full save of a :class:`~slipstream.state.keyed.KeyedState`
        #: hands the map itself over (no copy: a forked child writes it, see
        #: ``JobConfig.snapshot_writer``), else ``"thread"``
        self.snapshot_writer = "thread"
        #: where keyed state hands its copy-on-write saves (state.live.LiveSave) to be
        #: produced in steps between two calls of the processor: a list the engine's
        #: tasklet works through (``None``: nothing drives them, saves copy at the barrier)
        self.live_saves: list[Any] | None = None
        #: whether one of a list of keys would go to another processor than this one
        #: at a restore at the same shape (the vertex's key routing), set where the
        #: engine records that a processor's saved keys are all its own (member
        #: processes: such a restore then reads only its chain); copy-on-write saves
        #: check the keys they save with it (``None``: not checked)
        self.spilled_keys: Callable[[list[Any]], bool] | None = None
        #: the snapshot whose chain (state/format.py) this processor was restored from
        #: exactly: the same processor of the same vertex parallelism got back just the
        #: entries it saved (no other processor's, no broadcast entry). Keyed state then
        #: continues that chain: its first save is a delta relative to this snapshot, not
        #: a full copy (0: restored otherwise, or not at all; the first save is full)
        self.restored_snapshot_id = 0
        # set with restored_snapshot_id until the restore entries are taken: the chain's
        # maps ((tag, detail) -> size), and the keyed states made meanwhile
        # (state.keyed.continue_restored_chain checks that they equal the chain)
        self._restored_maps: dict[Any, int] | None = None
        self._restored_states: list[Any] | None = None
        #: where :func:`~slipstream.state.keyed.keyed_state` keeps keyed state:
        #: ``"memory"`` (a dict) or ``"sqlite"`` (on disk behind a cache; the engine sets
        #: it from ``JobConfig.state_backend`` or the vertex's own ``state_backend``)
        self.state_backend = "memory"
        #: the directory under which disk-backed state makes its private directory
        #: (``None``: the system's temporary directory)
        self.state_dir: str | None = None
        #: what to call when the processor is closed (the engine does, after
        #: ``Processor.close``): disk-backed state closes and removes its files
        self.closers: list[Callable[[], None]] = []
        #: seconds a sink may keep retrying a commit its server refuses before the job
        #: fails (``JobConfig.sink_outage_timeout``)
        self.sink_outage_timeout = 120.0
        #: the job's ``snapshot_interval_ms`` when it commits snapshots (0 otherwise)
        self.snapshot_interval_ms = 0
        #: what keeps this processor from making progress (e.g. "commit retrying: ..."),
        #: shown by ``job.watch()`` and the dashboard; ``None`` when all is well
        self.warning: str | None = None
        #: ``time.monotonic()`` when the processor's server became unreachable (a sink
        #: retrying its commit), ``None`` while it is reachable
        self.unavailable_since: float | None = None
        # stage_on_commit: (snapshot id, action) and the actions staged at completion
        self._staged: list[tuple[int, Callable[[], None]]] = []
        self._staged_at_completion: list[Callable[[], None]] = []

    @property
    def snapshotting_enabled(self) -> bool:
        return self.processing_guarantee is not ProcessingGuarantee.NONE

    def get_list(self, name: str) -> list[Any]:
        return self.services.get_list(name)  # type: ignore[no-any-return]

    def get_map(self, name: str) -> MutableMapping[Any, Any]:
        return self.services.get_map(name)  # type: ignore[no-any-return]

    def stage_on_commit(self, action: Callable[[], None], at_completion: bool = False) -> bool:
        """Two-phase sinks, the short form of ``Processor.snapshot_commit_finish``: run
        ``action`` once the snapshot being saved now commits; with ``at_completion`` (for
        output produced after the processor's last snapshot, staged from ``complete()``)
        once a snapshot recording this processor as completed commits, or the job
        completes. The actions run on the processor's own tasklet, in staging order,
        before its ``snapshot_commit_finish`` (so an action that raises fails the job
        like any processor error, naming the vertex). A failed execution drops what it
        staged after the last committed snapshot. Returns ``False`` (and does nothing)
        when the job commits no snapshots (``commits_snapshots``): the caller then
        applies its output directly."""
        if not self.commits_snapshots:
            return False
        if at_completion:
            self._staged_at_completion.append(action)
        else:
            self._staged.append((self.current_snapshot_id, action))
        return True

    @property
    def has_staged(self) -> bool:
        """Whether actions staged with :meth:`stage_on_commit` wait for a commit."""
        return bool(self._staged or self._staged_at_completion)

    def run_staged(self, committed_id: int, completion: bool) -> None:
        """Run (and forget) the actions staged for snapshots up to ``committed_id`` and,
        with ``completion``, every other one (the engine calls this where the processor's
        commit runs). An action that raises stays staged with those after it."""
        staged = self._staged
        while staged and (completion or staged[0][0] <= committed_id):
            staged[0][1]()
            staged.pop(0)
        if completion:
            at = self._staged_at_completion
            while at:
                at[0]()
                at.pop(0)

    def run_closers(self) -> None:
        """Call :attr:`closers`, newest first, each once (the engine does, after
        ``Processor.close``, for every processor's context: a fused producer's too)."""
        closers = self.closers
        while closers:
            closers.pop()()

    def increment_metric(self, name: str, delta: int = 1) -> None:
        self.metrics[name] = self.metrics.get(name, 0) + delta
        listener = self.metric_listener
        if listener is not None:
            listener(self.vertex_name, name, delta)

    def __repr__(self) -> str:
        return (
            f"Context({self.vertex_name!r}, global={self.global_processor_index}/"
            f"{self.total_parallelism}, member={self.member_index}/{self.member_count})"
        )


def blocking_call_advice(processor: Any, context: Context) -> str:
    """What to do about a cooperative call that blocks, in terms of the API the user
    wrote the vertex with: a Pipeline stage moves the call into ``map_using_service``
    (a thread of its own), a library processor of the Core API likewise into
    ``P.map_using_service``, a processor of the user's own becomes non-cooperative."""
    stage = context.pipeline_stage
    if stage is not None:
        return (
            f"It runs the Pipeline stage {stage}: move a blocking call (I/O, a remote "
            "service, a model) into stage.map_using_service(P.service_factory(create), fn) "
            "(or filter_/flat_map_using_service), which gets a thread of its own"
        )
    if type(processor).__module__.startswith("slipstream."):
        return (
            "Move a blocking call (I/O, a remote service, a model) out of its function into "
            "P.map_using_service(P.service_factory(create), fn) (or filter_/"
            "flat_map_using_service, or an _async variant), which gets a thread of its own"
        )
    return "Make it non-cooperative (is_cooperative() -> False) to give it a thread of its own"


def drain_between(processor: Any) -> bool:
    """Hand on what ``processor`` holds between two processors it runs back to back in
    one tasklet (``drain_between()``: engine fusion's ``FusedPairP``, the Pipeline
    compiler's ``PipeP`` and a processor wrapping one); ``True`` once nothing is (at
    once for any other processor). The tasklet forwards an idle mark, which no processor
    sees, only then: unfused, the mark queued behind those items, and a downstream
    coalescer that takes it may pass over their timestamps."""
    drain = getattr(processor, "drain_between", None)
    return True if drain is None else bool(drain())


class Processor:
    """Base of every processor. All callbacks have Jet's defaults; override what you need.

    ``init`` keeps the outbox and context as ``self.outbox`` and ``self.context``.
    """

    outbox: Outbox
    context: Context

    #: The counters this processor may increment (``context.increment_metric``): they
    #: appear in the job's metrics as 0 from the start, so a reader never gets a
    #: ``KeyError`` just because nothing happened yet.
    metric_names: tuple[str, ...] = ()

    #: The processor applies the bad-record policy (``JobConfig.on_item_error``): when
    #: user code raises on an item it calls ``context.item_errors.handle(item, error)``
    #: and re-raises only if that returns ``False`` (see :mod:`slipstream.core.item_errors`).
    #: Vertices of other processors fail on such an error whatever the policy.
    handles_item_errors = False

    def init(self, outbox: Outbox, context: Context) -> None:
        """Called once before any other callback."""
        self.outbox = outbox
        self.context = context
        for name in self.metric_names:
            context.metrics.setdefault(name, 0)
        context.item_errors.bind(outbox)

    def is_cooperative(self) -> bool:
        """``False`` asks for a dedicated thread and a blocking outbox."""
        return True

    def process(self, ordinal: int, inbox: Inbox) -> None:
        """Process items of inbound edge ``ordinal``; remove each item once it is done
        with. Items left in the inbox are offered again in the next call."""
        raise NotImplementedError(
            f"{type(self).__name__} received items on ordinal {ordinal} but does not "
            "implement process()"
        )

    def try_process(self) -> bool:
        """Called when the inbox is empty (timers, watermarks during lulls). ``False``
        means "call me again before anything else"."""
        return True

    def try_process_watermark(self, watermark: Watermark) -> bool:
        """A coalesced watermark. The default forwards it to every outbound edge."""
        return self.outbox.offer(watermark)

    def min_relevant_watermark(self) -> int:
        """An optional hint (slipstream's, not Jet's): watermarks below the returned
        value would only be forwarded by ``try_process_watermark`` -- no output before
        them, no change of state -- and items processed meanwhile do not change that.
        The engine then keeps draining the input past such a watermark instead of
        stopping to deliver it, and of several of them delivers only the last, after
        the items drained with it. A window processor returns the end of the next window
        to emit: an unthrottled watermark policy then costs it a watermark per drain,
        not per input chunk. The default (``NO_WATERMARK``) makes every watermark
        relevant."""
        return NO_WATERMARK

    def complete_edge(self, ordinal: int) -> bool:
        """Inbound edge ``ordinal`` is exhausted. Repeated until ``True``."""
        return True

    def complete(self) -> bool:
        """All inputs are exhausted (sources: called repeatedly from the start). Repeated
        until ``True``; a streaming source never returns ``True``."""
        return True

    def save_to_snapshot(self) -> bool:
        """Write state with ``outbox.offer_to_snapshot(key, value)``; repeated until
        ``True``."""
        return True

    def snapshot_commit_prepare(self) -> bool:
        """Phase one of a two-phase commit (Jet's ``snapshotCommitPrepare``): called after
        ``save_to_snapshot()`` returned ``True`` and before the barrier is forwarded,
        repeated until ``True``. Make what this snapshot covers durable but not yet
        visible (``PREPARE TRANSACTION``, an fsynced temporary file) and record in the
        snapshot (``outbox.offer_to_snapshot``) what a restore needs to finish it. The
        snapshot is ``context.current_snapshot_id``. Only called when the job commits
        snapshots (``context.commits_snapshots``)."""
        return True

    def snapshot_commit_finish(self, success: bool) -> bool:
        """Phase two (Jet's ``snapshotCommitFinish``), on this processor's own thread,
        repeated until ``True`` (so a cooperative processor can wait for a slow server
        without blocking its worker), once the outcome of a snapshot is known.

        ``success=True``: snapshot ``context.committed_snapshot_id`` committed: make
        visible what you prepared for it and for earlier snapshots. The engine calls
        this before the processor saves a later snapshot, so "everything prepared so
        far" is right, except for what ``complete()`` prepared: that may be committed
        only once ``context.completion_committed`` is ``True`` (a snapshot recording
        the processor as completed committed; the engine keeps the tasklet alive after
        its completion until then, and calls this once more). ``success=False``: the
        snapshot was not written; keep what you prepared, the next snapshot that
        commits covers it (each snapshot must name everything not committed yet).

        An exception fails the job like any processor error; after a restart the
        restored processor finds what the last committed snapshot names (in
        ``restore_from_snapshot``) and commits it idempotently. Retry transient server
        errors here with :class:`slipstream.core.retry.CommitRetry` (bounded by
        ``context.sink_outage_timeout``). Called only when the job commits snapshots."""
        return True

    def restore_from_snapshot(self, inbox: Inbox) -> None:
        """Receive ``(key, value)`` entries of this processor's share of a snapshot."""
        if inbox:
            raise NotImplementedError(
                f"{type(self).__name__} has snapshot state to restore but does not "
                "implement restore_from_snapshot()"
            )

    def finish_snapshot_restore(self) -> bool:
        """All snapshot entries were delivered."""
        return True

    def close(self) -> None:
        """The last call, always made, also after a failure."""


class FlatMapper:
    """Remembers the output iterator of the current input item until all of it was
    emitted (Jet's ``FlatMapper``)."""

    __slots__ = ("_processor", "_fn", "_it", "_ordinal")

    def __init__(
        self,
        processor: AbstractProcessor,
        fn: Callable[[Any], Iterable[Any]],
        ordinal: int | None = None,
    ) -> None:
        self._processor = processor
        self._fn = fn
        self._it: Iterator[Any] | None = None
        self._ordinal = ordinal

    def try_process(self, item: Any) -> bool:
        it = self._it
        if it is None:
            it = self._it = iter(self._fn(item))
        if self._processor.emit_from(it, self._ordinal):
            self._it = None
            return True
        return False


def _call_both(first: Callable[[], None], second: Callable[[], None]) -> None:
    first()
    second()


def _leave_fast_path(ref: weakref.ref[AbstractProcessor]) -> None:
    """``Outbox.on_refused`` of an :class:`AbstractProcessor` that has ``try_emit``'s fast
    path. It holds the processor weakly: a bound method would make a reference cycle
    (processor -> outbox -> processor), and an ended job's processors and their state
    must be freed by reference counting alone (tests/engine/test_ended_execution.py)."""
    processor = ref()
    if processor is not None:
        processor._emit_capacity = 0  # until an offer through try_emit succeeds again


class AbstractProcessor(Processor):
    """Convenience base class: per-item processing, ``try_emit`` and resumable
    ``emit_from(iterator)``."""

    _pending_it: Any = None
    _pending_item: Any = None
    _pending_snapshot_it: Any = None
    _pending_snapshot_entry: Any = None
    # try_emit's fast path: the single bucket of a plain Outbox, and its capacity while
    # the outbox's last offer was not refused (0 once one was, until an offer through
    # try_emit succeeds again: Outbox.on_refused), so that the fast path need not clear
    # ``unfinished`` (a store per item, ~8 ns of the CSV running sum's ~340 a line in
    # the user's processor). No fast path (a capacity of 0 throughout): every offer goes
    # through Outbox.offer, e.g. the test harness's checking outbox
    _emit_bucket: Any = ()  # a list with a fast path (an empty tuple without)
    _emit_capacity = 0
    _emit_fast_capacity = 0  # the outbox's capacity with a fast path, else 0

    def init(self, outbox: Outbox, context: Context) -> None:
        super().init(outbox, context)
        if type(outbox) is Outbox and outbox.data_ordinal_count == 1:
            self._emit_bucket = outbox.buckets[0]
            self._emit_fast_capacity = outbox.capacity
            self._emit_capacity = 0 if outbox.unfinished else outbox.capacity
            # several processors may share an outbox (a wrapper that inits its inner
            # processor with its own): each is told of every refusal
            prev, mine = outbox.on_refused, partial(_leave_fast_path, weakref.ref(self))
            outbox.on_refused = mine if prev is None else partial(_call_both, prev, mine)
        else:
            self._emit_bucket = ()
            self._emit_fast_capacity = self._emit_capacity = 0
        self.init_processor(context)

    def init_processor(self, context: Context) -> None:
        """Override for set-up that needs the context."""

    def process(self, ordinal: int, inbox: Inbox) -> None:
        # Iterate in place and remove the processed items afterwards (one C-level clear
        # when all were processed): cheaper per item than peek + popleft. The refused item
        # and those behind it stay in the inbox, in order. Nothing is counted per item:
        # after a refusal the iterator's length hint (the items it has not yielded) says
        # how many were processed (a counter cost ~15-25 ns an item, docs/performance.md)
        try_item = self.try_process_item
        it = iter(inbox)
        for item in it:
            if not try_item(ordinal, item):
                break
        else:
            inbox.clear()
            return
        left = length_hint(it, -1)  # the refused item was yielded: not among these
        n = len(inbox) - (left + 1 if left >= 0 else len([item, *it]))
        if n:
            rest = list(islice(inbox, n, None))
            inbox.clear()
            inbox.extend(rest)

    def try_process_item(self, ordinal: int, item: Any) -> bool:
        """Process one item; ``False`` keeps it in the inbox for the next call."""
        raise NotImplementedError(
            f"{type(self).__name__} received an item on ordinal {ordinal} but implements "
            "neither process() nor try_process_item()"
        )

    def try_emit(self, item: Any, ordinal: int | None = None) -> bool:
        """Offer ``item`` to ``ordinal`` (``None``: all outbound ordinals); ``False`` when
        the outbox is full (return, and emit the same item again in the next call)."""
        b = self._emit_bucket
        if len(b) < self._emit_capacity and ordinal is None:
            # fast path (one outbound ordinal, room in its bucket, ``unfinished`` not
            # set: see _emit_capacity): what Outbox.offer does, without its call and
            # branches
            t = type(item)
            # a plain tuple (the usual output) is told apart with one compare
            if t is tuple or (t is not Watermark and t is not IdleMessage):
                b.append(item)
                return True
        if self.outbox.offer(item, ordinal):
            # ``unfinished`` is clear again: the fast path may resume
            self._emit_capacity = self._emit_fast_capacity
            return True
        return False

    def try_emit_to_snapshot(self, key: Any, value: Any) -> bool:
        return self.outbox.offer_to_snapshot(key, value)

    def emit_from(
        self, iterator: Iterator[Any], ordinal: int | None = None, *, plain: bool = False
    ) -> bool:
        """Emit items from ``iterator`` until it is exhausted (``True``) or the outbox is
        full (``False``). Call again with the same iterator to resume: the refused item is
        kept here, not lost. ``plain``: no item is a watermark or idle mark (e.g. values
        read from a Spark row), so the outbox need not look for them (``Outbox.offer_many``)."""
        outbox = self.outbox
        offer = outbox.offer
        if self._pending_it is iterator:
            if not offer(self._pending_item, ordinal):
                return False
            self._pending_it = self._pending_item = None
        if ordinal is None and outbox.data_ordinal_count == 1:
            # one bucket: move a bucketful at C speed
            rest = outbox.offer_many(iterator, 0, plain=plain)
            if rest is None:
                return True
            self._pending_it = iterator
            self._pending_item = next(rest)  # the refused item; the rest stays in iterator
            return False
        for item in iterator:
            if not offer(item, ordinal):
                self._pending_it = iterator
                self._pending_item = item
                return False
        return True

    def emit_to_snapshot_from(self, iterator: Iterator[tuple[Any, Any]]) -> bool:
        """Like ``emit_from`` for ``(key, value)`` snapshot entries (it keeps its own
        refused entry, so it never disturbs a pending ``emit_from``)."""
        offer = self.outbox.offer_to_snapshot
        if self._pending_snapshot_it is iterator:
            k, v = self._pending_snapshot_entry
            if not offer(k, v):
                return False
            self._pending_snapshot_it = self._pending_snapshot_entry = None
        for entry in iterator:
            if not offer(entry[0], entry[1]):
                self._pending_snapshot_it = iterator
                self._pending_snapshot_entry = entry
                return False
        return True

    _state_entries: Any = None

    def save_state(self, entries: Callable[[], Iterable[tuple[Any, Any]]]) -> bool:
        """The usual body of ``save_to_snapshot``: ``return self.save_state(lambda:
        self.sums.items())``. ``entries()`` is called once per snapshot (take a copy of
        the state if the processor could change it before the snapshot is saved whole);
        when the snapshot bucket fills up this returns ``False`` and the next call goes on
        where it stopped."""
        it = self._state_entries
        if it is None:
            it = self._state_entries = iter(list(entries()))
        if self.emit_to_snapshot_from(it):
            self._state_entries = None
            return True
        return False

    def flat_mapper(
        self, fn: Callable[[Any], Iterable[Any]], ordinal: int | None = None
    ) -> FlatMapper:
        return FlatMapper(self, fn, ordinal)

    def restore_from_snapshot(self, inbox: Inbox) -> None:
        entry = self.restore_from_snapshot_entry
        while inbox:
            k, v = inbox.popleft()
            entry(k, v)

    def restore_from_snapshot_entry(self, key: Any, value: Any) -> None:
        """Receive one ``(key, value)`` entry of saved state."""
        raise NotImplementedError(
            f"{type(self).__name__} has snapshot state to restore but does not implement "
            "restore_from_snapshot_entry()"
        )
