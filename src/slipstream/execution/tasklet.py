"""The processor tasklet: the one place that drives a processor (docs/semantics.md §2).

It feeds the inbox from the inbound edges (highest priority group first, round robin
within a group), presents coalesced watermarks, calls ``try_process`` / ``process`` /
``complete_edge`` / ``complete``, aligns snapshot barriers and calls the snapshot
callbacks, and moves the outbox into the outbound collectors while honouring their
back-pressure. The embedded engine runs tasklets on worker threads; the Spark engine runs
the very same class inside a Spark task. Nothing else drives processors.
"""

from __future__ import annotations

import enum
import os
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from slipstream.core.config import ProcessingGuarantee
from slipstream.core.inbox import Inbox
from slipstream.core.items import (
    DONE_ITEM,
    IDLE_MESSAGE,
    NO_WATERMARK,
    DoneItem,
    IdleMessage,
    SnapshotBarrier,
    Watermark,
)
from slipstream.core.outbox import DEFAULT_BUCKET_CAPACITY, SPECIAL_AT_TAIL, Outbox
from slipstream.core.processor import Context, Processor
from slipstream.execution.coalescer import NO_NEW_WM, WatermarkCoalescer
from slipstream.execution.collectors import Collector
from slipstream.execution.inbound import InboundEdgeStream
from slipstream.state import live as live_mod
from slipstream.state.keyed import continue_restored_chain

NO_PROGRESS = 0
MADE_PROGRESS = 1
DONE = 2

#: hands the CPU (and the GIL) to whatever else is runnable, and comes back: what a
#: worker in its spin window calls between passes (engine/workers.py), and what a
#: cross-process sender calls after a lone frame (execution/remote.py)
yield_cpu: Callable[[], Any] = getattr(os, "sched_yield", lambda: time.sleep(0))


#: The most processing steps (a watermark, then a drained chunk) one
#: ``ProcessorTasklet.call`` takes while its input keeps stopping at watermarks. An
#: inbound stream stops its drain at every watermark a processor must see, so a source
#: with a watermark every ~80 records gave a stateless processor one call per ~80
#: records: each call paid the tasklet's and the worker's fixed costs and handed its
#: consumers one small chunk and a watermark (one frame per step across processes).
#: Several steps in one call make one hand-over of [items, watermark, items, ...] in
#: order, bounded by this, by half the outbox's capacity, and by every stop the steps
#: have alone (a barrier, a finished edge, a refused offer). docs/performance.md, "K2's
#: watermarks: steps per tasklet call, and events that cannot move one".
MAX_STEPS = 16


class State(enum.IntEnum):
    """The states of a processor tasklet (Jet's ``ProcessorState``): per state, the
    callback it repeats and until when. A call does one step of the current state.
    ``ProcessorTasklet.state`` holds the plain ``int`` (the module constants below):
    the hot loop compares it on every call, and exact ints compare fastest."""

    #: ``restore_from_snapshot(inbox)`` until the routed snapshot entries are taken
    RESTORE = 0
    #: ``finish_snapshot_restore()`` until ``True``; then processing, or EMIT_DONE for
    #: a processor restored as completed
    FINISH_RESTORE = 1
    #: ``try_process_watermark(wm)`` until ``True`` for a pending coalesced watermark
    #: (an idle mark is forwarded without a callback)
    PROCESS_WATERMARK = 2
    #: ``try_process()`` until ``True`` (only once input was read and streams are live)
    NULLARY_PROCESS = 3
    #: ``process(ordinal, inbox)`` until the inbox is empty, refilled from the inbound
    #: queues; an empty inbox leads to COMPLETE_EDGE, SAVE_SNAPSHOT, COMPLETE or (a
    #: snapshot's outcome was published) COMMIT_FINISH
    PROCESS_INBOX = 4
    #: ``complete_edge(ordinal)`` until ``True`` for each exhausted inbound edge
    COMPLETE_EDGE = 5
    #: ``save_to_snapshot()`` until ``True``, once the barrier is aligned (a published
    #: outcome of the previous snapshot is finished first: COMMIT_FINISH)
    SAVE_SNAPSHOT = 6
    #: ``snapshot_commit_prepare()`` until ``True`` (jobs that commit snapshots)
    COMMIT_PREPARE = 7
    #: no callback: forward the barrier; then processing, COMPLETE, or after a terminal
    #: barrier CLOSE (or AWAIT_OUTCOME)
    EMIT_BARRIER = 8
    #: ``snapshot_commit_finish(success)`` until ``True`` (after the actions staged with
    #: ``context.stage_on_commit``), once the coordinator published a snapshot's
    #: outcome; then back to the state it interrupted
    COMMIT_FINISH = 9
    #: ``complete()`` until ``True`` (sources: from the start); a requested snapshot
    #: leads to SAVE_SNAPSHOT, a published outcome to COMMIT_FINISH
    COMPLETE = 10
    #: no callback: record the completion with the coordinator, end-of-stream to every
    #: output; then AWAIT_COMPLETION_COMMIT (a processor with a commit phase in a job
    #: that commits snapshots) or CLOSE
    EMIT_DONE = 11
    #: no callback: wait until a snapshot recording this processor as completed
    #: committed (the job's final snapshot included), then COMMIT_FINISH(True) with
    #: ``context.completion_committed``, then CLOSE
    AWAIT_COMPLETION_COMMIT = 12
    #: no callback: after a terminal barrier (suspend), wait for that snapshot's
    #: outcome (every tasklet of a job that commits snapshots: the execution must not
    #: end before the outcome is known), then COMMIT_FINISH if the processor has a
    #: commit phase, then CLOSE
    AWAIT_OUTCOME = 13
    #: ``close()`` once everything emitted left the outbox and collectors
    CLOSE = 14
    #: nothing: the worker drops the tasklet
    END = 15


RESTORE = int(State.RESTORE)
FINISH_RESTORE = int(State.FINISH_RESTORE)
PROCESS_WATERMARK = int(State.PROCESS_WATERMARK)
NULLARY_PROCESS = int(State.NULLARY_PROCESS)
PROCESS_INBOX = int(State.PROCESS_INBOX)
COMPLETE_EDGE = int(State.COMPLETE_EDGE)
SAVE_SNAPSHOT = int(State.SAVE_SNAPSHOT)
COMMIT_PREPARE = int(State.COMMIT_PREPARE)
EMIT_BARRIER = int(State.EMIT_BARRIER)
COMMIT_FINISH = int(State.COMMIT_FINISH)
COMPLETE = int(State.COMPLETE)
EMIT_DONE = int(State.EMIT_DONE)
AWAIT_COMPLETION_COMMIT = int(State.AWAIT_COMPLETION_COMMIT)
AWAIT_OUTCOME = int(State.AWAIT_OUTCOME)
CLOSE = int(State.CLOSE)
END = int(State.END)

_STATE_NAMES = {int(s): s.name for s in State}

#: The processor callback each state calls (for messages naming what a processor is in).
CALLBACKS = {
    RESTORE: "restore_from_snapshot",
    FINISH_RESTORE: "finish_snapshot_restore",
    PROCESS_WATERMARK: "try_process_watermark",
    NULLARY_PROCESS: "try_process",
    PROCESS_INBOX: "process",
    COMPLETE_EDGE: "complete_edge",
    SAVE_SNAPSHOT: "save_to_snapshot",
    COMMIT_PREPARE: "snapshot_commit_prepare",
    COMMIT_FINISH: "snapshot_commit_finish",
    COMPLETE: "complete",
    CLOSE: "close",
}


class CommitBoard:
    """What a snapshot coordinator publishes to its tasklets: the outcome of each
    snapshot. One writer (the coordinator's store thread) stores the ids first and
    bumps ``seq`` last; a tasklet compares ``seq`` with the last one it handled (one int
    compare, where its inbox runs empty) and reads the ids only when it changed."""

    __slots__ = ("seq", "committed_id", "failed_id", "released")

    def __init__(self, committed_id: int = 0) -> None:
        self.seq = 0
        #: the newest committed snapshot
        self.committed_id = committed_id
        #: the newest snapshot that could not be written
        self.failed_id = 0
        #: the job ended and its last output is final although no snapshot records it
        #: (at-least-once, when the final snapshot could not be written)
        self.released = False

    def publish_committed(self, snapshot_id: int) -> None:
        self.committed_id = snapshot_id
        self.seq += 1

    def publish_failed(self, snapshot_id: int) -> None:
        self.failed_id = snapshot_id
        self.seq += 1

    def release(self) -> None:
        self.released = True
        self.seq += 1


#: the board of tasklets whose snapshot sink publishes no commits: nothing is ever
#: published on it (so its ``seq`` never changes)
_NO_COMMITS = CommitBoard()


class SnapshotSink(Protocol):
    """Where a tasklet's snapshot state goes (the engine's snapshot coordinator)."""

    def requested_snapshot(self) -> SnapshotBarrier | None:
        """The newest barrier the coordinator asked sources to start, if any."""

    def add_entries(self, tasklet: ProcessorTasklet, snapshot_id: int, entries: list[Any]) -> None:
        """Store part of a processor's state for ``snapshot_id``."""

    def processor_done(self, tasklet: ProcessorTasklet, barrier: SnapshotBarrier) -> None:
        """A processor finished saving ``barrier``'s snapshot."""

    def add_completion_entries(self, tasklet: ProcessorTasklet, entries: list[Any]) -> None:
        """Entries the processor offered to the snapshot in ``complete()``: recorded
        with its completion, restored to it (then it ends) to commit its last output."""

    def tasklet_completed(self, tasklet: ProcessorTasklet) -> None:
        """A processor completed (it takes part in no further snapshot)."""

    @property
    def hold_sources(self) -> bool:
        """``True`` while snapshots cannot be committed: ``complete()`` is not called."""

    # Optional: ``commit_board`` (a :class:`CommitBoard`), when the sink commits
    # snapshots and publishes their outcomes; the tasklet then runs the processor's
    # commit phase (``snapshot_commit_prepare`` / ``snapshot_commit_finish``).


class ProcessorTasklet:
    """Drives one processor. ``call()`` does a small step and returns ``NO_PROGRESS``,
    ``MADE_PROGRESS`` or ``DONE``."""

    def __init__(
        self,
        processor: Processor,
        context: Context,
        inbound: Sequence[InboundEdgeStream],
        outbound: Sequence[Collector],
        *,
        guarantee: ProcessingGuarantee = ProcessingGuarantee.NONE,
        snapshot_sink: SnapshotSink | None = None,
        restore_entries: list[Any] | None = None,
        restore_completed: bool = False,
        outbox_capacity: int = DEFAULT_BUCKET_CAPACITY,
    ) -> None:
        self.processor = processor
        self.context = context
        self.vertex_name = context.vertex_name
        self.index = context.global_processor_index
        self.collectors = list(outbound)
        #: the processors of vertices fused into this one (execution/fusion.py): the
        #: snapshot coordinator counts them saved and completed with this tasklet
        self.fused_stages: list[Any] = list(getattr(processor, "fused_stages", None) or ())
        # and what is between them goes on before an idle mark does (drain_between)
        self.drain_between: Callable[[], bool] | None = getattr(processor, "drain_between", None)
        self.cooperative = bool(processor.is_cooperative())
        self.outbox = Outbox(
            len(self.collectors),
            outbox_capacity,
            flush_fn=None if self.cooperative else self._blocking_flush,
        )
        self.guarantee = guarantee
        self.exactly_once = guarantee is ProcessingGuarantee.EXACTLY_ONCE
        self.snapshot_sink = snapshot_sink
        self.inbox = Inbox()
        self.inbox_ordinal = -1

        streams = sorted(inbound, key=lambda s: (s.priority, s.ordinal))
        self.streams = streams
        self.ordinal_index = {s.ordinal: i for i, s in enumerate(streams)}
        self.coalescer = WatermarkCoalescer(
            len(streams), [f"inbound edge ordinal {s.ordinal}" for s in streams]
        )
        self.groups: list[list[InboundEdgeStream]] = []
        for s in streams:
            if self.groups and self.groups[-1][0].priority == s.priority:
                self.groups[-1].append(s)
            else:
                self.groups.append([s])
        self.cursor = 0
        self.live_streams = len(streams)
        self.barrier_at = [False] * len(streams)
        self.barrier_count = 0
        self.pending_barrier: SnapshotBarrier | None = None
        # the barrier pause: from the first save_to_snapshot call to the barrier going out
        self._save_started: float | None = None
        self.last_save_seconds = 0.0
        self._aligning: SnapshotBarrier | None = None
        # barriers of this execution continue after the snapshot it was restored from
        self.last_snapshot_id = getattr(snapshot_sink, "committed_id", 0)
        self.completed_edges: list[int] = []
        self.pending_wm: Any = NO_NEW_WM
        # the processor's min_relevant_watermark, when it overrides the default (looked up
        # on the instance: wrappers such as the Spark epoch gate delegate attributes)
        relevant = getattr(processor, "min_relevant_watermark", None)
        self.wm_relevant_fn: Callable[[], int] | None = (
            relevant
            if relevant is not None
            and getattr(relevant, "__func__", None) is not Processor.min_relevant_watermark
            else None
        )
        self.filled_once = False
        # set by a step whose drain stopped at a watermark with its inbox processed:
        # another step may follow in the same call (call(), MAX_STEPS)
        self.more = False

        # the commit phase: only where the snapshot sink publishes commit outcomes
        board = getattr(snapshot_sink, "commit_board", None)
        self.commits = board is not None
        self.board: CommitBoard = board if board is not None else _NO_COMMITS
        context.commits_snapshots = self.commits
        context.committed_snapshot_id = self.board.committed_id
        self.outcome_seen = self.board.seq  # the board's seq last handled
        self.committed_seen = self.board.committed_id
        self.commit_success = False
        self.after_commit = CLOSE  # the state COMMIT_FINISH returns to
        # set by the coordinator: the newest snapshot that records this processor as
        # completed (0: none yet)
        self.completion_snapshot_id = 0
        self.prepare_fn: Callable[[], bool] | None = None
        self.finish_fn: Callable[[bool], bool] | None = None
        if self.commits:
            self.prepare_fn = _overridden(processor, "snapshot_commit_prepare")
            self.finish_fn = _overridden(processor, "snapshot_commit_finish")

        self.restore_entries = restore_entries
        # finished before the snapshot: downstream already has all of its output. With
        # restore entries (its completion state) it restores them first, to commit its
        # last output, and then ends without processing anything
        self.restored_completed = restore_completed
        if restore_completed and restore_entries is None:
            self.state = EMIT_DONE
        elif restore_entries is not None:
            self.state = RESTORE
        else:
            self.state = self._processing_state()
        self.items_out = 0
        # the last watermark handed downstream (read by job.vertex_gauges())
        self.last_wm_out = NO_WATERMARK
        self.cancelled = False
        self.closed = False
        self.progress = False

    # -- lifecycle ---------------------------------------------------------------------
    def init(self) -> None:
        self.processor.init(self.outbox, self.context)

    def _processing_state(self) -> int:
        return PROCESS_WATERMARK if self.streams else COMPLETE

    @property
    def items_in(self) -> int:
        return sum(s.items_in for s in self.streams)

    @property
    def state_name(self) -> str:
        return _STATE_NAMES[self.state]

    @property
    def callback_name(self) -> str:
        """The processor callback the current state calls (the state's name when it
        calls none)."""
        return CALLBACKS.get(self.state, self.state_name)

    def close(self) -> None:
        """Close the processor once (also on failure); errors are the caller's to log."""
        if not self.closed:
            self.closed = True
            try:
                saves = self.context.live_saves
                while saves:  # nothing changes the state any more: produce them now
                    saves.pop(0).finish(timed=False)
                self.processor.close()
            finally:
                self.context.run_closers()  # disk-backed keyed state: its files go

    def __repr__(self) -> str:
        return f"ProcessorTasklet({self.vertex_name}#{self.index}, {self.state_name})"

    # -- the step ----------------------------------------------------------------------
    def call(self) -> int:
        self.progress = False
        if self.context.live_saves and self.pending_barrier is None:
            self._step_live_saves()  # not while saving: that is the pause
        if not self._flush():
            return MADE_PROGRESS if self.progress else NO_PROGRESS
        self.more = False
        self._step()
        steps = 1
        while self.more and steps < MAX_STEPS and self._room_for_a_step():
            self.more = False
            self._step()
            steps += 1
        self._flush()
        if self.state == END and self._outbound_empty():
            return DONE
        return MADE_PROGRESS if self.progress else NO_PROGRESS

    def _room_for_a_step(self) -> bool:
        """Whether another step may follow in this call: no copy-on-write save to step
        between two calls of the processor, and every bucket at most half full (the
        next step's output fits as it would after a flush). A watermark at the tail of
        the bucket (``SPECIAL_AT_TAIL``) is no longer at its tail once the next step
        adds items: the hand-over then looks for the specials."""
        if self.context.live_saves:
            return False
        outbox = self.outbox
        half = outbox.capacity >> 1
        for b in outbox.buckets:
            if len(b) > half:
                return False
        if outbox.specials is SPECIAL_AT_TAIL:
            outbox.specials = True
        return True

    def _step_live_saves(self) -> None:
        """One step of the oldest copy-on-write save of the processor's keyed state
        (state/live.py): a bounded slice of the state as of its barrier, between two
        calls of the processor, whatever the tasklet's state."""
        saves = self.context.live_saves
        assert saves is not None
        if saves[0].step(live_mod.LIVE_SAVE_STEP):
            saves.pop(0)
        self.progress = True

    def _step(self) -> None:
        state = self.state
        if state == PROCESS_WATERMARK:
            if not self._process_watermark():
                return
            state = self.state = NULLARY_PROCESS
        if state == NULLARY_PROCESS:
            if self.filled_once and self.live_streams and not self.processor.try_process():
                return
            state = self.state = PROCESS_INBOX
        if state == PROCESS_INBOX:
            self._process_inbox()
            return
        if state == COMPLETE_EDGE:
            ordinal = self.completed_edges[0]
            if self.processor.complete_edge(ordinal):
                self.completed_edges.pop(0)
                self.progress = True
                if not self.completed_edges:
                    if self.live_streams == 0 and self.pending_wm is NO_NEW_WM:
                        self.state = COMPLETE
                    else:
                        self.state = PROCESS_WATERMARK
            return
        if state == SAVE_SNAPSHOT:
            self._save_snapshot()
            return
        if state == COMMIT_PREPARE:
            prepare = self.prepare_fn
            if prepare is None or prepare():
                self.progress = True
                self.state = EMIT_BARRIER
            return
        if state == EMIT_BARRIER:
            self._emit_barrier()
            return
        if state == COMPLETE:
            self._complete()
            return
        if state == COMMIT_FINISH:
            self._commit_finish()
            return
        if state == EMIT_DONE:
            if self.snapshot_sink is not None:
                for stage in self.fused_stages:
                    self.snapshot_sink.tasklet_completed(stage)  # type: ignore[arg-type]
                self.snapshot_sink.tasklet_completed(self)
            self._emit_special(DONE_ITEM)
            self.state = AWAIT_COMPLETION_COMMIT if self._has_commit_phase() else CLOSE
            self.progress = True
            return
        if state == AWAIT_COMPLETION_COMMIT:
            self._await_completion_commit()
            return
        if state == AWAIT_OUTCOME:
            self._await_outcome()
            return
        if state == CLOSE:
            if self._outbound_empty():
                self.close()
                self.state = END
                self.progress = True
            return
        if state == RESTORE:
            self._restore()
            return
        if state == FINISH_RESTORE:
            if self.processor.finish_snapshot_restore():
                self.progress = True
                self.state = EMIT_DONE if self.restored_completed else self._processing_state()
            return

    # -- states ------------------------------------------------------------------------
    def _process_watermark(self) -> bool:
        wm = self.pending_wm
        if wm is NO_NEW_WM:
            wm = self.coalescer.check_pending_idle()
            if wm is NO_NEW_WM:
                return True
            self.pending_wm = wm
        if wm is IDLE_MESSAGE:
            # processors never see idle marks: forward them to every output, behind
            # what a processor running two back to back still holds between them
            # (core/processor.py's drain_between: FusedPairP, PipeP, InputFusedP)
            drain = self.drain_between
            if drain is not None and not drain():
                return False
            self._emit_special(IDLE_MESSAGE)
        elif not self.processor.try_process_watermark(Watermark(wm)):
            return False
        self.pending_wm = NO_NEW_WM
        self.progress = True
        return True

    def _process_inbox(self) -> None:
        inbox = self.inbox
        if not inbox:
            if self.board.seq != self.outcome_seen and self._take_outcome(PROCESS_INBOX):
                return
            self._fill_inbox()
        if inbox:
            before = len(inbox)
            self.processor.process(self.inbox_ordinal, inbox)
            if len(inbox) != before:
                self.progress = True
            if inbox:
                return
        if self.completed_edges:
            self.state = COMPLETE_EDGE
        elif self.pending_barrier is not None and self.pending_wm is NO_NEW_WM:
            # a watermark released in the same drain as the barrier came before it:
            # process it first (PROCESS_WATERMARK comes back here, and the fill waits)
            self.state = SAVE_SNAPSHOT
        elif self.live_streams == 0 and self.pending_wm is NO_NEW_WM:
            self.state = COMPLETE
        else:
            self.state = PROCESS_WATERMARK
            # the drain stopped at a watermark: the items behind it may go in this call
            self.more = self.pending_wm is not NO_NEW_WM

    def _fill_inbox(self) -> None:
        if self.pending_barrier is not None or self.completed_edges:
            return
        self.filled_once = True
        if not self.groups:
            return
        group = self.groups[0]
        n = len(group)
        inbox = self.inbox
        coalescer = self.coalescer
        for _ in range(n):
            if self.cursor >= n:
                self.cursor = 0
            stream = group[self.cursor]
            self.cursor += 1
            si = self.ordinal_index[stream.ordinal]
            if self.barrier_at[si] and (self.exactly_once or self._terminal_aligning()):
                continue
            relevant = self.wm_relevant_fn
            if not stream.drain_to(
                inbox, NO_WATERMARK if relevant is None else relevant()
            ):
                continue
            self.progress = True
            self.inbox_ordinal = stream.ordinal
            if inbox:
                coalescer.observe_event(si)
            wm = stream.wm_out
            if wm is not None:
                out = coalescer.observe_wm(si, wm)
                if out is not NO_NEW_WM:
                    self.pending_wm = out
            barrier = stream.barrier_out
            if barrier is not None:
                self._barrier_on(si, barrier)
            if stream.done:
                group.remove(stream)
                self.cursor = 0
                self.live_streams -= 1
                if not group:
                    self.groups.pop(0)
                if self.barrier_at[si]:
                    self.barrier_at[si] = False
                    self.barrier_count -= 1
                out = coalescer.queue_done(si)
                if out is not NO_NEW_WM and self.pending_wm is NO_NEW_WM:
                    self.pending_wm = out
                self.completed_edges.append(stream.ordinal)
                self._check_barrier_alignment()
            return

    def _terminal_aligning(self) -> bool:
        b = self._aligning
        return b is not None and b.is_terminal

    def _barrier_on(self, si: int, barrier: SnapshotBarrier) -> None:
        expected = self.last_snapshot_id + 1
        if barrier.snapshot_id != expected:
            raise RuntimeError(
                f"{self.vertex_name}#{self.index}: snapshot barrier {barrier.snapshot_id} "
                f"received, expected {expected}"
            )
        self.barrier_at[si] = True
        self.barrier_count += 1
        self._aligning = barrier
        self._check_barrier_alignment()

    def _check_barrier_alignment(self) -> None:
        b = self._aligning
        if b is not None and self.barrier_count == self.live_streams:
            self.pending_barrier = b
            self._aligning = None

    def _save_snapshot(self) -> None:
        if self._save_started is None:
            # the previous snapshot's outcome is finished before this one is saved, so
            # "commit everything prepared so far" never takes in this snapshot's part
            if self.board.seq != self.outcome_seen and self._take_outcome(SAVE_SNAPSHOT):
                return
            self._save_started = time.perf_counter()
        self.context.current_snapshot_id = self.pending_barrier.snapshot_id  # type: ignore[union-attr]
        if self.processor.save_to_snapshot():
            self.progress = True
            self.state = COMMIT_PREPARE if self.prepare_fn is not None else EMIT_BARRIER

    def _emit_barrier(self) -> None:
        barrier = self.pending_barrier
        assert barrier is not None
        # the state was flushed to the snapshot sink by _flush(); now mark the point
        self._emit_special(barrier)
        started = self._save_started
        self._save_started = None
        self.last_save_seconds = 0.0 if started is None else time.perf_counter() - started
        if self.snapshot_sink is not None:
            for stage in self.fused_stages:
                self.snapshot_sink.processor_done(stage, barrier)  # type: ignore[arg-type]
            self.snapshot_sink.processor_done(self, barrier)
        self.last_snapshot_id = barrier.snapshot_id
        self.pending_barrier = None
        self.barrier_at = [False] * len(self.streams)
        self.barrier_count = 0
        self.progress = True
        if barrier.is_terminal:
            # every tasklet waits for the terminal snapshot's outcome: the execution
            # must not end before it is known (it would be taken as completed)
            self.state = AWAIT_OUTCOME if self.commits else CLOSE
        else:
            self.state = COMPLETE if self.live_streams == 0 else PROCESS_WATERMARK

    def _complete(self) -> None:
        sink = self.snapshot_sink
        if sink is not None:
            if (
                self.board.seq != self.outcome_seen
                and not self.outbox.has_unfinished_item()
                and self._take_outcome(COMPLETE)
            ):
                return
            requested = sink.requested_snapshot()
            if (
                requested is not None
                and requested.snapshot_id > self.last_snapshot_id
                and not self.outbox.has_unfinished_item()  # never with an item half-offered
            ):
                self.pending_barrier = requested
                self.state = SAVE_SNAPSHOT
                self._save_snapshot()
                return
            if sink.hold_sources:
                return
        if self.processor.complete():
            self.progress = True
            self.state = EMIT_DONE

    # -- the commit phase --------------------------------------------------------------
    def _has_commit_phase(self) -> bool:
        """Whether the processor commits anything: it implements
        ``snapshot_commit_finish`` or staged actions with ``stage_on_commit``."""
        return self.commits and (self.finish_fn is not None or self.context.has_staged)

    def _take_outcome(self, back_to: int) -> bool:
        """The coordinator published an outcome since the last one handled: go to
        COMMIT_FINISH (and from there back to ``back_to``) if the processor has
        anything to do for it. ``False``: nothing to do, carry on."""
        board = self.board
        self.outcome_seen = board.seq
        committed = board.committed_id
        success = committed > self.committed_seen
        self.committed_seen = committed
        self.context.committed_snapshot_id = committed
        if self.finish_fn is None and not (success and self.context.has_staged):
            return False
        self.commit_success = success
        self.after_commit = back_to
        self.state = COMMIT_FINISH
        self.progress = True
        return True

    def _commit_finish(self) -> None:
        ctx = self.context
        ctx.committed_snapshot_id = self.committed_seen
        if self.commit_success and ctx.has_staged:
            ctx.run_staged(self.committed_seen, ctx.completion_committed)
        finish = self.finish_fn
        if finish is None or finish(self.commit_success):
            self.state = self.after_commit
            self.progress = True

    def _await_completion_commit(self) -> None:
        board = self.board
        if board.seq == self.outcome_seen:
            return
        cid = self.completion_snapshot_id
        if board.released or (cid and board.committed_id >= cid):
            self.outcome_seen = board.seq
            self.context.completion_committed = True
            self.committed_seen = self.context.committed_snapshot_id = board.committed_id
            self.commit_success = True
            self.after_commit = CLOSE
            self.state = COMMIT_FINISH
            self.progress = True
        else:
            # a snapshot that does not record the completion: it still commits what the
            # processor prepared for it (not what complete() prepared)
            self._take_outcome(AWAIT_COMPLETION_COMMIT)

    def _await_outcome(self) -> None:
        """After a terminal barrier: its snapshot's outcome, then CLOSE."""
        board = self.board
        if board.seq == self.outcome_seen:
            return
        sid = self.last_snapshot_id
        if board.committed_id >= sid or board.failed_id >= sid:
            if not self._take_outcome(CLOSE):
                self.state = CLOSE
            self.progress = True
        else:
            self.outcome_seen = board.seq

    def _restore(self) -> None:
        entries = self.restore_entries
        inbox = self.inbox
        if not inbox and entries:
            inbox.extend(entries)
            entries.clear()
        if inbox:
            before = len(inbox)
            self.processor.restore_from_snapshot(inbox)
            if len(inbox) != before:
                self.progress = True
            if inbox:
                return
        self.restore_entries = None
        if self.context.restored_snapshot_id:
            # restored from exactly its own chain: its keyed state continues it
            continue_restored_chain(self.context)
        self.state = FINISH_RESTORE
        self.progress = True

    # -- output ------------------------------------------------------------------------
    def _emit_special(self, item: Any) -> None:
        """Queue ``item`` after everything already in the outbox, on every ordinal."""
        for b in self.outbox.buckets:
            b.append(item)
        self.outbox.specials = True

    def _outbound_empty(self) -> bool:
        if self.outbox.snapshot_bucket:
            return False
        for b in self.outbox.buckets:
            if b:
                return False
        for c in self.collectors:
            if not c.is_empty():
                return False
        return True

    def _flush(self) -> bool:
        """Move bucket contents to collectors and push collectors into queues. ``True``
        if everything went out."""
        outbox = self.outbox
        sb = outbox.snapshot_bucket
        if sb:
            barrier = self.pending_barrier
            # hand the bucket over (no copy): the snapshot sink owns these entries now
            outbox.snapshot_bucket = []
            if self.snapshot_sink is not None:
                if barrier is not None:
                    self.snapshot_sink.add_entries(self, barrier.snapshot_id, sb)
                elif self.state in (COMPLETE, EMIT_DONE):
                    # offered in complete(): the processor's completion state
                    self.snapshot_sink.add_completion_entries(self, sb)
                else:
                    raise RuntimeError(
                        f"vertex {self.vertex_name!r}, processor {self.index}: "
                        f"{type(self.processor).__name__} offered snapshot entries "
                        f"({sb[0][0]!r}, ...) in {self.state_name}; offer_to_snapshot() "
                        "is for save_to_snapshot(), snapshot_commit_prepare() and "
                        "complete()"
                    )
            self.progress = True
        specials = outbox.specials
        outbox.specials = False
        ok = True
        for b, c in zip(outbox.buckets, self.collectors, strict=True):
            if b:
                if specials is SPECIAL_AT_TAIL:
                    last = b.pop()
                    if b:
                        c.add_chunk(b.copy())
                    c.add_special(last)
                    self.last_wm_out = last.timestamp
                elif specials:
                    wm = _hand_over_mixed(b, c)
                    if wm is not None:
                        self.last_wm_out = wm
                else:
                    c.add_chunk(b.copy())
                b.clear()
            if not c.is_empty():
                c.progress = False  # type: ignore[attr-defined]
                if not c.flush():
                    ok = False
                if c.progress:  # type: ignore[attr-defined]
                    self.progress = True
        return ok

    def _blocking_flush(self) -> None:
        """Flush for a non-cooperative processor's outbox: wait until there is room."""
        idle = 0
        while not self._flush():
            if self.cancelled:
                raise _Cancelled()
            idle += 1
            time.sleep(min(0.001, 0.00002 * (1 << min(idle, 6))))


def _overridden(processor: Processor, name: str) -> Any:
    """``processor``'s bound method ``name`` if it overrides ``Processor``'s (looked up
    on the instance: wrappers delegate attributes), else ``None``."""
    fn = getattr(processor, name, None)
    if fn is None or getattr(fn, "__func__", None) is getattr(Processor, name):
        return None
    return fn


class _Cancelled(Exception):
    """Unwinds a non-cooperative processor blocked on its outbox after cancellation."""


def _hand_over_mixed(bucket: list[Any], collector: Collector) -> int | None:
    """Hand a bucket holding special items over as data chunks and specials, in order.
    The specials are found with C-speed ``list.index`` scans over the item types.
    Returns the timestamp of the last watermark in the bucket, if any."""
    types = list(map(type, bucket))
    positions: list[int] = []
    for t in _SPECIAL_TYPES:
        i = -1
        while True:
            try:
                i = types.index(t, i + 1)
            except ValueError:
                break
            positions.append(i)
    positions.sort()
    prev = 0
    wm = None
    for i in positions:
        if i > prev:
            collector.add_chunk(bucket[prev:i])
        item = bucket[i]
        collector.add_special(item)
        if type(item) is Watermark:
            wm = item.timestamp
        prev = i + 1
    if prev < len(bucket):
        collector.add_chunk(bucket[prev:])
    return wm


_SPECIAL_TYPES = (Watermark, IdleMessage, SnapshotBarrier, DoneItem)
