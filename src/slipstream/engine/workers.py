"""Threads that run tasklets: cooperative workers take turns over many tasklets, each
non-cooperative tasklet gets a thread of its own.

Idle strategy (:func:`idle_pause`): a pass over a worker's tasklets in which none made
progress is followed by a pause that doubles from ~20 µs up to 1 ms; once the worker has
been idle for longer, the pause grows with the idle time (a twentieth of it) up to
10 ms; any progress resets it. The pause always sleeps (never spins) so an idle worker
releases the GIL to busy ones. The first item after a lull of ``L`` seconds therefore
waits up to ``min(L / 20, 10 ms)`` longer than it would with a busy worker: the price
of a streaming job that sits idle costing a fraction of a percent of a core instead of
several (docs/performance.md, bench/latency.py).

A worker that runs cross-process channel tasklets (``waits_on()``, the senders and
receivers of :mod:`slipstream.execution.remote`) spends its idle pause in ``select`` on
their sockets instead of a blind sleep (:func:`wait_idle`): a frame or a credit report
ends the pause at once (measured 1.7-3.7x the channel's throughput, docs/performance.md,
"Channels").

``idle_spin_s`` (``JobConfig(idle_spin_ms=...)``, opt-in): for that long after its last
progress a worker does not sleep at all: it keeps making passes over its tasklets (a
receiver's pass reads its socket without blocking), with ``os.sched_yield`` between them
(it releases the GIL and the CPU to whatever else is runnable), then backs off as above
from the start of the schedule. A worker that spins costs a core while it does; an item
that arrives meanwhile does not wait for the worker's thread (and, with member processes,
its process) to be woken and scheduled, the floor of a cross-process hop on a machine whose
idle cores halt (docs/performance.md, "A lone item across processes"). The pool counts
its workers' idle passes (``idle_counts``): those spent polling in the window and those
followed by a pause.

A watchdog thread per pool notes which tasklet each worker is calling since when. A
cooperative call that runs longer than ``slow_call_s`` gets a warning naming the vertex,
the processor and the callback (a cooperative processor that blocks stalls every tasklet
of its worker). Python cannot interrupt a thread, so a call that never returns cannot be
stopped; but once the pool is stopped (cancel, failure) and ``stop_grace_s`` passed with
workers still stuck in a call, the pool gives up on them: it reports itself finished,
with the stuck tasklets in ``abandoned`` (they are not closed: their call still runs), so
``cancel()`` ends the job and ``join()`` returns in bounded time. A stuck worker that
returns later just exits, calling none of its other tasklets: the execution commits and
closes those on its own thread then (:func:`run_committed_closures`).
"""

from __future__ import annotations

import logging
import os
import select
import shutil
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from slipstream.core.errors import trim_driver_frames
from slipstream.core.processor import blocking_call_advice
from slipstream.engine.ended import clear_error_frames, ended_tasklet
from slipstream.execution.fusion import failed_stage, running_stage
from slipstream.execution.tasklet import (
    AWAIT_COMPLETION_COMMIT,
    COMMIT_FINISH,
    DONE,
    MADE_PROGRESS,
    ProcessorTasklet,
    _Cancelled,
    yield_cpu,
)

MIN_IDLE_S = 0.00002
MAX_IDLE_S = 0.001
#: After about ``MAX_IDLE_S / IDLE_SHARE`` idle, the pause is this share of the idle time...
IDLE_SHARE = 0.05
#: ...up to this.
MAX_LONG_IDLE_S = 0.01
#: A cooperative call longer than this is reported (``ss.local(slow_call_ms=...)``).
SLOW_CALL_S = 1.0
#: How long a stopped pool waits for workers stuck in a call before it gives up on them
#: (``ss.local(stop_grace_ms=...)``).
STOP_GRACE_S = 5.0
#: How often the watchdog looks, at the most: it looks every quarter of the shorter of
#: the pool's ``slow_call_s`` and ``stop_grace_s`` (a call is warned about, a stuck pool
#: abandoned, at most a quarter of that late), but not more often than this. At the
#: defaults (1 s, 5 s) 4 wake-ups a second instead of 20: each wakes a thread that takes
#: the GIL beside the workers (docs/performance.md, "A member's reports").
WATCHDOG_PERIOD_S = 0.05

log = logging.getLogger("slipstream.workers")


def idle_pause(idle_passes: int, idle_s: float) -> float:
    """How long a worker sleeps after its ``idle_passes``-th pass in a row without
    progress, idle for ``idle_s`` seconds: doubling from 2 x ``MIN_IDLE_S`` to
    ``MAX_IDLE_S`` (a short gap between items costs little latency), then
    ``IDLE_SHARE`` of the idle time up to ``MAX_LONG_IDLE_S`` (a long lull costs little
    CPU; the first item after it waits at most that share of the lull longer)."""
    short = min(MAX_IDLE_S, MIN_IDLE_S * (1 << min(idle_passes, 7)))
    return min(MAX_LONG_IDLE_S, max(short, idle_s * IDLE_SHARE))


def wait_idle(waiters: Sequence[Any], pause: float) -> bool:
    """Pause up to ``pause`` seconds, ended early when a socket one of ``waiters`` (tasklets
    with ``waits_on() -> (read sockets, write sockets)``) waits on is ready. Returns
    whether one was; without sockets to wait on, sleeps the pause."""
    reads: list[Any] = []
    writes: list[Any] = []
    for t in waiters:
        r, w = t.waits_on()
        reads += r
        writes += w
    if not reads and not writes:
        time.sleep(pause)
        return False
    try:
        ready = select.select(reads, writes, [], pause)
    except (OSError, ValueError):  # a socket closed meanwhile: its tasklet says so next call
        return True
    return bool(ready[0] or ready[1])


def execution_state_dir(work_dir: str, job_name: str, member: int | None = None) -> str:
    """Where one execution (the local job's, or member ``member``'s process) keeps its
    disk-backed keyed state (``state_backend="sqlite"``): a directory of its own under the
    engine's work directory, named after the job (made safe as one path part) and created
    by the first such state; :func:`remove_state_dir` removes it when the execution ends."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in job_name)[:60]
    part = safe if member is None else f"{safe}-member{member}"
    return os.path.join(work_dir, "state", f"{part}-{uuid.uuid4().hex[:12]}")


def remove_state_dir(state_dir: str) -> None:
    """The execution's disk-backed keyed state goes with it (each state removed its own
    files when its processor closed, unless a snapshot still held a view)."""
    if os.path.isdir(state_dir):
        shutil.rmtree(state_dir, ignore_errors=True)


def prepare_context(
    context: Any, vertex: Any, config: Any, state_dir: str, metric_listener: Callable[..., Any]
) -> None:
    """What every processor's context gets from its execution before the processors'
    init, in the local job and in a member process alike: the late-item metric listener,
    the sink outage budget, and where its keyed state lives (the vertex's own backend or
    the job's: state.keyed.keyed_state)."""
    context.metric_listener = metric_listener
    context.sink_outage_timeout = config.sink_outage_timeout
    context.state_backend = vertex.get_state_backend() or config.state_backend
    context.state_dir = state_dir


def close_tasklets(tasklets: Sequence[ProcessorTasklet], pool: WorkerPool | None) -> None:
    """Close every tasklet of an execution that failed or was cancelled (the local job's
    and a member process's alike). A processor still stuck in a call ``pool`` gave up on
    (``pool.abandoned``) is not closed under it; a close error is only logged, so every
    other processor still closes."""
    abandoned = {id(t) for t in pool.abandoned} if pool is not None else set()
    for t in tasklets:
        if id(t) in abandoned:
            continue
        try:
            t.close()
        except Exception:  # noqa: BLE001 - close errors are only logged
            log.exception("closing %s#%d failed", t.vertex_name, t.index)


def run_committed_closures(
    tasklets: Sequence[ProcessorTasklet],
    board: Any,
    pool: WorkerPool | None,
    failed: Any,
    grace_s: float,
    job_name: str,
) -> None:
    """An execution stopped (cancelled or failed; the local job's or a member
    process's): what the processors prepared for snapshots that committed (``board``,
    the execution's :class:`~slipstream.execution.tasklet.CommitBoard`) is committed
    now, if their tasklets had not done it yet: actions staged with
    ``context.stage_on_commit`` and the processors' own ``snapshot_commit_finish(True)``.
    A committed snapshot is final, so its output must not wait for a resume that may
    never come (a fresh start rolls back what it finds prepared; an in-memory list of a
    cancelled job would lack it for good). A restore would commit the same things again:
    the callbacks are idempotent by contract. Bounded by ``grace_s``; the processor that
    failed (``failed``) and those stuck in a call the pool gave up on are left to the
    restore."""
    abandoned = {id(t) for t in pool.abandoned} if pool is not None else set()
    deadline = time.monotonic() + grace_s
    for t in tasklets:
        ctx = t.context
        if (
            id(t) in abandoned
            or t is failed
            or failed in t.fused_stages  # a processor fused into t failed
            or board.committed_id <= 0
        ):
            continue
        cid = t.completion_snapshot_id
        completion = board.released or 0 < cid <= board.committed_id
        # it may not have finished committing: it had not taken that outcome yet, or
        # stopped inside its commit phase or while waiting for its completion to commit
        pending = t.committed_seen < board.committed_id or t.state in (
            COMMIT_FINISH,
            AWAIT_COMPLETION_COMMIT,
        )
        try:
            if ctx.has_staged:
                ctx.run_staged(board.committed_id, completion)
            if t.finish_fn is not None and pending:
                ctx.committed_snapshot_id = board.committed_id
                if completion:
                    ctx.completion_committed = True
                while not t.finish_fn(True):
                    if time.monotonic() > deadline:
                        log.warning(
                            "job %s: %s#%d did not finish committing snapshot %d before "
                            "the execution ended; a resume commits it",
                            job_name,
                            t.vertex_name,
                            t.index,
                            board.committed_id,
                        )
                        break
                    time.sleep(0.01)
        except Exception:  # noqa: BLE001 - the execution is already ending
            log.exception(
                "job %s: %s#%d: committing what it prepared for committed snapshot %d "
                "failed; a resume commits it",
                job_name,
                t.vertex_name,
                t.index,
                board.committed_id,
            )


class TaskletFailure:
    """Why an execution failed: a processor's exception (``tasklet`` set) or a
    job-level error such as an unwritable snapshot store (``tasklet`` is ``None``;
    ``restartable`` is ``False`` when a restart cannot help)."""

    def __init__(
        self, tasklet: ProcessorTasklet | None, error: BaseException, restartable: bool = True
    ) -> None:
        # a processor fused into the tasklet raised it: the failure names that one
        self.tasklet = failed_stage(tasklet) if tasklet is not None else None
        self.error = error
        self.restartable = restartable
        if tasklet is not None:  # a processor's error: its traceback starts at its code
            trim_driver_frames(error)
        self.traceback = "".join(traceback.format_exception(error))

    def release(self) -> None:
        """The execution ended: keep the processor's name, not the processor, and drop
        the locals of the error's frames (engine/ended.py)."""
        self.tasklet = ended_tasklet(self.tasklet)
        clear_error_frames(self.error)


def _ignore_failure(failure: TaskletFailure) -> None:
    """A released pool's failure callback (its execution ended)."""


def _nothing() -> None:
    """A released pool's end callback."""


class WorkerPool:
    """Runs one execution's tasklets until all are done or ``stop()`` is called."""

    def __init__(
        self,
        tasklets: Sequence[ProcessorTasklet],
        cooperative_threads: int,
        on_failure: Callable[[TaskletFailure], None],
        on_finished: Callable[[], None],
        name: str = "job",
        slow_call_s: float = SLOW_CALL_S,
        stop_grace_s: float = STOP_GRACE_S,
        on_idle: Callable[[], None] | None = None,
        idle_spin_s: float = 0.0,
    ) -> None:
        self.stopping = False
        # an idle worker polls for this long after its last progress before it sleeps
        self.idle_spin_s = idle_spin_s
        # called by a worker at its first pass without progress after one with progress
        # (a member process reports its sinks' new output then: engine/member.py)
        self._on_idle = on_idle
        self.name = name
        self._on_failure = on_failure
        self._on_finished = on_finished
        self.slow_call_s = slow_call_s
        self.stop_grace_s = stop_grace_s
        self._stopped_at = 0.0
        self._finished = False
        self.abandoned: list[ProcessorTasklet] = []
        coop = [t for t in tasklets if t.cooperative]
        noncoop = [t for t in tasklets if not t.cooperative]
        n = max(1, min(cooperative_threads, len(coop))) if coop else 0
        groups: list[list[ProcessorTasklet]] = [[] for _ in range(n)]
        for i, t in enumerate(coop):
            groups[i % n].append(t)
        groups.extend([t] for t in noncoop)
        self._threads = [
            threading.Thread(
                target=self._run, args=(g, i), name=f"slipstream-{name}-worker-{i}", daemon=True
            )
            for i, g in enumerate(groups)
        ]
        # per worker: the tasklet it is calling (None between calls) and since when
        self._calling: list[ProcessorTasklet | None] = [None] * len(groups)
        self._since = [0.0] * len(groups)
        self._warned = [0.0] * len(groups)  # the call start already warned about
        # per worker: idle passes spent polling (the spin window) / followed by a pause
        self._spins = [0] * len(groups)
        self._pauses = [0] * len(groups)
        self._watchdog = threading.Thread(
            target=self._watch, name=f"slipstream-{name}-watchdog", daemon=True
        )
        self._live = len(self._threads)
        self._lock = threading.Lock()

    def start(self) -> None:
        if not self._threads:
            self._on_finished()
            return
        for t in self._threads:
            t.start()
        self._watchdog.start()

    def stop(self) -> None:
        if not self.stopping:
            self._stopped_at = time.monotonic()
        self.stopping = True

    def idle_counts(self) -> tuple[int, int]:
        """``(spin passes, pauses)``: the workers' idle passes so far that polled on in
        the spin window (``idle_spin_s``) and those followed by a sleep or a wait on
        sockets (``job.metrics["__job__"]``'s ``idle_spin_passes`` and ``idle_pauses``)."""
        return sum(self._spins), sum(self._pauses)

    def release(self) -> None:
        """The execution ended (engine/ended.py): the callbacks, methods of the
        execution, and the tasklets the pool gave up on (their threads hold them)."""
        self._on_failure = _ignore_failure
        self._on_finished = _nothing
        self._on_idle = None
        self.abandoned = []

    def join(self, timeout: float | None = None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        for t in self._threads:
            if t is threading.current_thread():
                continue
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))

    def _run(self, tasklets: list[ProcessorTasklet], slot: int) -> None:
        try:
            self._work(tasklets, slot)
        finally:
            # a failure's traceback holds this frame (each frame holds its caller) after
            # it ended, with the locals it had then: none of them is a tasklet
            del tasklets
            with self._lock:
                self._live -= 1
                last = self._live == 0 and not self._finished
                if last:
                    self._finished = True
            if last:
                self._on_finished()

    def _work(self, tasklets: list[ProcessorTasklet], slot: int) -> None:
        """A worker's loop over its tasklets, until they are done or the pool stops."""
        calling = self._calling
        since = self._since
        now = time.monotonic
        on_idle = self._on_idle
        idle = 0
        idle_since = 0.0  # when the current run of idle passes began
        spin_s = self.idle_spin_s
        spun = 0  # passes of the current idle run spent in the spin window
        spins = self._spins
        pauses = self._pauses
        live = list(tasklets)
        waiters = [t for t in live if hasattr(t, "waits_on")]
        sleep = time.sleep
        while live and not self.stopping:
            progress = False
            for t in live:
                since[slot] = now()
                calling[slot] = t
                if self._finished:
                    # the pool gave up on this worker while it was stuck in a call
                    # (_abandon): the execution now commits and closes the tasklets
                    # it did not abandon on its own thread, so this worker calls
                    # none of them again. Checked after ``calling`` is set, as
                    # _abandon sets ``_finished`` before it reads ``calling``: either
                    # this sees it finished or t is in ``abandoned``
                    calling[slot] = None
                    return
                try:
                    r = t.call()
                except _Cancelled:
                    return
                except BaseException as e:  # noqa: BLE001 - reported to the job
                    if not self._finished:
                        self._on_failure(TaskletFailure(t, e))
                    return
                finally:
                    calling[slot] = None
                if r == MADE_PROGRESS:
                    progress = True
                elif r == DONE:
                    progress = True
                    live = [x for x in live if x is not t]
                    if waiters:
                        waiters = [x for x in waiters if x is not t]
                    break
            if progress:
                idle = 0
            else:
                if not idle:
                    idle_since = since[slot]
                    spun = 0
                    if on_idle is not None:
                        on_idle()
                idle += 1
                if spin_s and since[slot] - idle_since < spin_s:
                    # the spin window (JobConfig.idle_spin_ms): poll again at once
                    spun += 1
                    spins[slot] += 1
                    yield_cpu()
                    continue
                pauses[slot] += 1
                # after a spin the back-off starts from its first, shortest pause
                pause = idle_pause(idle - spun, since[slot] - idle_since)
                if waiters:
                    wait_idle(waiters, pause)
                else:
                    sleep(pause)

    def calls_running(self, min_s: float) -> list[tuple[str, int | None, str, float]]:
        """The calls running for at least ``min_s`` now: ``(vertex, processor index,
        callback, seconds)``, the index ``None`` for a channel's sender or receiver
        (what a member process tells its coordinator's heartbeat)."""
        now = time.monotonic()
        out: list[tuple[str, int | None, str, float]] = []
        for slot, t in enumerate(list(self._calling)):
            started = self._since[slot]
            if t is None or now - started < min_s:
                continue
            if getattr(t, "processor", None) is None:  # a channel's sender or receiver
                out.append((t.vertex_name, None, t.callback_name, round(now - started, 3)))
                continue
            s = running_stage(t)  # a fused producer's code, or the tasklet's
            out.append((s.vertex_name, s.index, t.callback_name, round(now - started, 3)))
        return out

    # -- the watchdog ----------------------------------------------------------------
    def watch_period_s(self) -> float:
        """How long the watchdog sleeps between its looks (:data:`WATCHDOG_PERIOD_S`)."""
        return max(WATCHDOG_PERIOD_S, min(self.slow_call_s, self.stop_grace_s) / 4)

    def _watch(self) -> None:
        period = self.watch_period_s()
        while True:
            time.sleep(period)
            with self._lock:
                if self._finished:
                    return
            now = time.monotonic()
            for slot, t in enumerate(list(self._calling)):
                started = self._since[slot]
                if t is None or not t.cooperative or self._warned[slot] == started:
                    continue
                if now - started > self.slow_call_s:
                    self._warned[slot] = started
                    if getattr(t, "processor", None) is None:  # a channel's sender or receiver
                        log.warning(
                            "job %s: %s: a call to %s() has been running for %.1f s",
                            self.name,
                            t.vertex_name,
                            t.callback_name,
                            now - started,
                        )
                        continue
                    s = running_stage(t)  # a fused producer's code, or the tasklet's
                    log.warning(
                        "job %s: vertex %r, processor %d (%s): a cooperative call to %s() has "
                        "been running for %.1f s; cooperative processors must return within "
                        "about a millisecond. %s",
                        self.name,
                        s.vertex_name,
                        s.index,
                        type(s.processor).__name__,
                        t.callback_name,
                        now - started,
                        blocking_call_advice(s.processor, s.context),
                    )
            if self.stopping and now - self._stopped_at > self.stop_grace_s:
                self._abandon()
                return

    def _abandon(self) -> None:
        """Stopped, and workers are still stuck in a call: finish without them."""
        with self._lock:
            if self._finished:
                return
            self._finished = True
            stuck = [t for t in self._calling if t is not None]
            self.abandoned = stuck
        for t in stuck:
            log.error(
                "job %s: vertex %r, processor %d (%s) did not return from its call within "
                "%.1f s of the job stopping; the job ends without it (its thread is left "
                "running and the processor is not closed)",
                self.name,
                t.vertex_name,
                t.index,
                type(getattr(t, "processor", t)).__name__,
                self.stop_grace_s,
            )
        self._on_finished()
