"""The coordinator of a job whose members run in OS processes (``ss.local(processes=N)``).

The user's process is the coordinator: for each execution it takes one member process
per member (the engine's spares, forked after its previous job ended, or fresh forks:
:mod:`slipstream.engine.member_spares`; each runs one job,
:func:`slipstream.engine.member.member_main`), hands each the job (the DAG
and its config pickled with cloudpickle, the way the Spark engine ships suppliers) and its
ends of the cross-process channels, and follows them over a control pipe each: it sums
their metrics (``job.metrics``), applies what their list and map sinks produced to the
engine's own lists and maps (``engine.get_list`` works as with one process), stops them
on ``cancel()``, and ends the execution when all of them ended: a member that completes
at its ``done`` (its last report: its output and its snapshots' part are here), not at
its process's exit, which goes on beside the job's end; a member that fails, is
cancelled or suspended once its process is gone.

**Channels.** One ``socket.socketpair()`` per (edge, producing member, consuming member)
with a lane between them (:func:`slipstream.execution.remote.channel_sockets`), made
here and handed to the two members over their control pipes (file descriptors passed
with ``SCM_RIGHTS``, ``member_spares.hand_over``); nothing listens on an
address, so no other process can write into a member's unpickling receiver.

**Start method: forkserver, with slipstream preloaded.** A plain ``fork`` copies the
coordinator with its other threads' state (worker threads of other jobs, the dashboard's
server, snapshot writers): a lock one of them holds at that moment (the logging module's,
an allocator's) stays held forever in the child. ``forkserver`` forks from a
single-threaded server process that imported slipstream once; a member then starts in
about 14 ms, where ``spawn`` pays an interpreter and the imports every time (75-85 ms,
docs/performance.md, "Channels"). The server starts once per process, when the first
``ss.local(processes=N)`` (N > 1) is created, on a thread of its own
(:func:`start_forkserver`), so its preload runs beside the script's own work up to the
first job. A member still gets the coordinator's ``sys.path`` (multiprocessing sends it)
and environment variables (sent with its setup) as they are when its job starts.

**Failures.** A member reports the first error of its processors (vertex, processor,
member) and stops; the coordinator then stops the others and, once all ended, fails the
job with the most telling error: a processor's, else a member that died (its exit
status), else the job-level error of a member, else a channel's (a channel to a member
that stopped is a consequence, not a cause). A member that dies (SIGKILL, OOM) fails the
execution naming it: with a processing guarantee the job restarts from its last
committed snapshot with fresh members (as after a processor's error), without one it
fails. A member that stops answering without dying (SIGSTOP, a call that holds the
GIL) is found by the heartbeat (:mod:`slipstream.engine.heartbeat`), killed, and fails
the job naming it (with a processing guarantee: restarts it, as a member that died).

**Snapshots.** With a processing guarantee the execution's ``coordinator`` is a
:class:`~slipstream.engine.process_snapshots.ProcessSnapshots`: the members' snapshot
messages (``snap_*``) go to it, its control messages to the members through
:meth:`ProcessExecution.send_to`; the members write their chunks, the coordinator
commits the manifests.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import pickle
import signal
import sys
import threading
import weakref
from typing import TYPE_CHECKING, Any

from slipstream.core.dag import effective_parallelism
from slipstream.core.errors import DagError
from slipstream.engine import gc_tuning, member_output, member_reports
from slipstream.engine.heartbeat import HeartbeatMonitor, silence_text
from slipstream.engine.member_control import NAMED, NAMED_REPLY, PONG, Calls
from slipstream.engine.member_logging import LOG, levels_here, replay
from slipstream.engine.member_output import OUTPUT
from slipstream.engine.member_reports import ITEM_ERROR, LATE
from slipstream.engine.member_stats import CpuShare
from slipstream.engine.workers import TaskletFailure
from slipstream.execution.plan import VertexPlan

if TYPE_CHECKING:
    from slipstream.engine.job import Job

log = logging.getLogger("slipstream.processes")

#: after ``cancel()`` (or a failure) a member gets the engine's ``stop_grace_ms`` plus
#: this long to end by itself before it is killed
KILL_AFTER_S = 5.0

#: what the forkserver imports once, so a member does not import it again: the member's
#: own machinery, cloudpickle (the job unpickles with it), the Pipeline's compiled
#: processors and the built-in processors, sources and sinks most DAGs use (not those
#: that import a client library: Kafka, SQL, Parquet). Measured: a word count member
#: spent 40 ms importing these when only the member module was preloaded, 4 ms without
PRELOAD = [
    "slipstream.engine.member",
    "slipstream.core.pickling",
    "slipstream.core.commit",
    "slipstream.state.keys",
    "slipstream.pipeline",
    "slipstream.pipeline.fused",
    "slipstream.pipeline.compiler",
    "slipstream.aggregate",
    "slipstream.window",
    "slipstream.watermark",
    "slipstream.processors.aggregation",
    "slipstream.processors.basic",
    "slipstream.processors.services",
    "slipstream.processors.sessions",
    "slipstream.processors.sort",
    "slipstream.processors.watermarks",
    "slipstream.processors.windows",
    "slipstream.sources.batch",
    "slipstream.sources.decoding",
    "slipstream.sources.event_time",
    "slipstream.sources.files",
    "slipstream.sources.lines",
    "slipstream.sources.streaming",
    "slipstream.sinks.basic",
]

_context: Any = None
_context_lock = threading.Lock()


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity), what ``processes="auto"``
    takes."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - no affinity on this platform
        return os.cpu_count() or 1


def member_context() -> Any:
    """The ``forkserver`` multiprocessing context, its server preloading slipstream's
    member module (module docstring: why not ``fork``)."""
    global _context
    with _context_lock:
        if _context is None:
            ctx = multiprocessing.get_context("forkserver")
            ctx.set_forkserver_preload(PRELOAD)
            _context = ctx
        return _context


def start_forkserver() -> None:
    """Start the forkserver now, if it is not running: its start returns once the server
    process exists (a few ms); the server then imports ``PRELOAD`` (~110 ms of CPU) on
    its own while this process goes on, and the first member waits only for what is left
    of that. ``ss.local(processes=N)`` calls it on a thread of its own
    (:func:`slipstream.engine.local.start_forkserver_early`)."""
    from multiprocessing import forkserver

    member_context()
    forkserver.ensure_running()


_start_lock = threading.Lock()


def reap(p: Any, timeout: float | None) -> int | None:
    """Wait up to ``timeout`` seconds for the member process ``p`` to end; its exit
    status, or ``None`` while it runs. Every reader of a member's status goes through
    here: a forkserver child's status is read once from its sentinel, and two threads
    that poll at the same moment (a listener joining its member while the spares'
    refill joins the same process, or ``Process.start()`` polling finished children)
    make the second read end of file, which multiprocessing records as status 255 (a
    member that exited cleanly seen as crashed). The wait reads nothing; the one read is
    made under the lock ``process.start()`` holds too (:func:`_start_without_main`)."""
    if p.pid is None:
        return None  # never started
    if timeout is None or timeout > 0:
        from multiprocessing.connection import wait

        wait([p.sentinel], timeout)
    with _start_lock:
        p.join(0)
        code: int | None = p.exitcode
    return code


_spares_lock = threading.Lock()


def fork_member() -> tuple[Any, Any]:
    """A member process waiting for its job (``member_spares.standby_main``) and the
    coordinator's end of its control pipe."""
    from slipstream.engine.member_spares import standby_main

    ctx = member_context()
    parent, child = ctx.Pipe()
    p = ctx.Process(target=standby_main, args=(child,), name="slipstream-member", daemon=True)
    try:
        _start_without_main(p)
    finally:
        child.close()
    return p, parent


def engine_spares(engine: Any) -> Any:
    """``engine``'s :class:`~slipstream.engine.member_spares.MemberSpares`, made at its
    first job with processes > 1 (closed by ``engine.shutdown()``, or when the engine is
    collected)."""
    from slipstream.engine.member_spares import MemberSpares, close_soon

    with _spares_lock:
        spares = engine.__dict__.get("_member_spares")
        if spares is None:
            spares = engine._member_spares = MemberSpares(engine.process_count, fork_member)
            weakref.finalize(engine, close_soon, spares).atexit = False  # the exit hook's
        return spares


def _start_without_main(process: Any) -> None:
    """``process.start()`` without the user's main module in the child: multiprocessing
    would run the main script again in every member (the reason for its ``if __name__ ==
    "__main__"`` rule), which a member does not need, since cloudpickle ships what the DAG
    uses of ``__main__`` by value; a script without the guard would otherwise start its
    job again in each member. The preparation data the child gets keeps ``sys.path``, the
    working directory and the rest."""
    from multiprocessing import spawn

    with _start_lock:
        real = spawn.get_preparation_data

        def without_main(name: str) -> dict[str, Any]:
            data: dict[str, Any] = real(name)
            data.pop("init_main_from_path", None)
            data.pop("init_main_from_name", None)
            return data

        spawn.get_preparation_data = without_main
        try:
            process.start()
        finally:
            spawn.get_preparation_data = real


def member_figures(ex: ProcessExecution, idle: bool = True) -> dict[str, int]:
    """``job.metrics["__job__"]``'s figures of the member processes: their count, the
    busiest member's CPU time and all members' together (ms, as of their latest
    reports), and the sum of their peak resident sets (KiB; an upper bound of what they
    held at once); with ``idle`` (``JobConfig.idle_spin_ms`` set) their workers'
    idle passes too."""
    usage = list(ex.member_usage.values())  # a listener thread may add a member's
    figures = {
        "processes": ex.count,
        "member_cpu_ms_max": int(max((u[0] for u in usage), default=0.0) * 1000),
        "member_cpu_ms_total": int(sum(u[0] for u in usage) * 1000),
        "member_peak_rss_kb_total": sum(u[1] for u in usage),
        # the members' workers' idle passes (JobConfig.idle_spin_ms; usage() and the
        # pool's idle_counts, engine/member.py)
        "idle_spin_passes": sum(u[3] for u in usage if len(u) > 4),
        "idle_pauses": sum(u[4] for u in usage if len(u) > 4),
    }
    if not idle:  # JobConfig.idle_spin_ms unset: the spin window's figures are not shown
        del figures["idle_spin_passes"], figures["idle_pauses"]
    return figures


class MemberTasklet:
    """Stands for the processor (or channel) of a member process that failed, where
    the coordinator's failure handling expects a tasklet: it names the vertex, the
    processor's global index and the member."""

    processor = None

    def __init__(self, vertex_name: str, index: int, member: int, pid: int | None) -> None:
        self.vertex_name = vertex_name
        self.index = index
        self.member = member
        self.pid = pid

    def __repr__(self) -> str:
        return f"MemberTasklet({self.vertex_name!r}#{self.index}, member {self.member})"


class MemberFailedError(RuntimeError):
    """A member process failed with an error that could not be rebuilt here (its type
    and message are in the text), or died."""


class MemberUnresponsiveError(MemberFailedError):
    """A member process stopped answering the coordinator's heartbeat
    (:mod:`slipstream.engine.heartbeat`) and was killed."""


def bare_plans(dag: Any, member_count: int, default_parallelism: int) -> dict[str, VertexPlan]:
    """Each vertex's parallelism and member count, without processors (the coordinator
    creates none: the members do)."""
    return {
        v.name: VertexPlan(v, effective_parallelism(v, default_parallelism), member_count)
        for v in dag.topological_order()
    }


class ProcessExecution:
    """One run of the job with its members in processes (what ``_Execution`` is for one
    process). ``tasklets`` is empty: the processors live in the members; ``coordinator``
    is the snapshot coordination (``None`` without a processing guarantee);
    ``member_metrics`` holds each member's latest figures. ``restore``: the snapshot the
    members restore from, if any."""

    def __init__(self, job: Job, restore: Any = None) -> None:
        from slipstream.core.pickling import cloudpickle
        from slipstream.sinks.basic import published_marks

        self.job = job
        engine = job.engine
        self.count = engine.process_count
        self.failure: TaskletFailure | None = None
        self.cancelled = False
        self.finished = threading.Event()
        self.tasklets: list[Any] = []
        self.member_metrics: dict[int, dict[str, dict[str, int]]] = {}
        #: per member: (CPU seconds, peak RSS, RSS in KiB) as of its latest report
        #: and its workers' idle passes: spin passes, pauses (WorkerPool.idle_counts)
        self.member_usage: dict[int, tuple[float, int, int, int, int]] = {}
        #: per member that ended: how (done, cancelled, failed, died, unresponsive)
        self.member_state: dict[int, str] = {}
        self.cpu_share = CpuShare()
        #: per member: its latest (watermark, queue fill) per vertex (member_stats.py)
        self.member_watch: dict[int, Any] = {}
        dag = job.dag
        dag.validate(
            default_parallelism=engine.default_parallelism,
            check_pickle=True,
            member_count=self.count,
            sample_data=True,
        )
        self.plans = bare_plans(dag, self.count, engine.default_parallelism)
        # the named lists and maps stay here: a member asks for what its processors
        # read (NamedFetch), once per name, and gets a share for a list_source
        self._named: dict[tuple[str, str], Any] = {}
        self._named_lock = threading.Lock()
        #: per member: bytes of named lists and maps sent to it (their shares)
        self.named_bytes: dict[int, int] = {}
        setup = {
            "dag": dag,
            "config": job.config,
            "job_name": job.name,
            "member_count": self.count,
            "default_parallelism": engine.default_parallelism,
            "cooperative_threads": engine.cooperative_threads,
            "outbox_capacity": engine.outbox_capacity,
            "slow_call_ms": engine.slow_call_ms,
            "stop_grace_ms": engine.stop_grace_ms,
            "tune_gc": engine.tune_gc,
            "work_dir": engine.work_dir,
            "batch_late_items": job.bounded and job.config.batch_watermarks,
            "log_levels": levels_here(),
            "published": published_marks(),
        }
        self.coordinator: Any = None
        if job.store is not None:  # snapshots across processes
            from slipstream.engine.process_snapshots import member_setup

            setup.update(member_setup(job, restore))
        #: how the members restore (``("store", ...)``: from the job's store, whose
        #: chains the coordinator continues, see process_snapshots.new_coordinator)
        self.restore_spec = setup.get("restore")
        try:
            self._payload = cloudpickle.dumps(setup, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:
            raise DagError(
                f"job {job.name!r} cannot be shipped to its member processes "
                f"(processes={self.count}): {type(e).__name__}: {e}; everything a DAG holds "
                "must pickle with cloudpickle"
            ) from e
        self._lock = threading.Lock()
        self._failures: list[tuple[int, TaskletFailure]] = []
        self._stopping = False
        self._live = 0
        #: members counted off ``_live`` (:meth:`_member_over`)
        self._over: set[int] = set()
        self._procs: list[Any] = []
        self._conns: list[Any] = []
        self._send_locks: list[threading.Lock] = []
        #: members the heartbeat found silent (and killed): not reported as died
        self._silent: set[int] = set()
        self.heartbeat: HeartbeatMonitor | None = None
        if job.store is not None:
            from slipstream.engine.process_snapshots import new_coordinator

            self.coordinator = new_coordinator(self)

    # -- lifecycle -----------------------------------------------------------------------
    _gc_tuned = False

    def start(self) -> None:
        """Start the members; if that fails (no process could be started) the execution
        ends failed at once, the members already started killed."""
        if self.job.engine.tune_gc:
            # this process gathers the members' list sink output as it comes (window
            # results and the like): the job's collector settings, as with one process
            # (engine/gc_tuning.py; measured, tumbling windows with processes=2: the
            # coordinator's CPU 0.20-0.21 -> 0.15-0.16 s). Before the members start: the
            # last listener may end the execution before _start returns
            gc_tuning.job_started()
            self._gc_tuned = True
        try:
            self._start()
        except BaseException as e:  # noqa: BLE001 - the job fails with it
            for p in self._procs:
                if p.pid is not None and reap(p, 0) is None:  # started, still running
                    p.kill()
            self._gc_untune()
            self.failure = TaskletFailure(None, e, restartable=False)
            self.finished.set()
            self.job._execution_ended(self)  # type: ignore[arg-type]

    def _start(self) -> None:
        from slipstream.engine.member_spares import hand_over
        from slipstream.execution.remote import channel_sockets

        spares = engine_spares(self.job.engine)
        sockets = channel_sockets(self.job.dag, self.plans)
        children: list[tuple[Any, Any]] = []
        try:
            # the engine's spare member processes, forked before this job, or fresh ones
            # (engine/member_spares.py); each gets its member index and channel ends
            taken = spares.take(self.count)
            self._procs = [p for p, _ in taken]
            for m, (p, conn) in enumerate(taken):
                mine = {k: e[0] if k[1] == m else e[1] for k, e in sockets.items() if m in k[1:]}
                try:
                    hand_over(conn, m, mine)
                except OSError:  # a spare that died since it was taken
                    p, conn = spares.replace(p, conn)
                    self._procs[m] = p
                    hand_over(conn, m, mine)
                children.append((p, conn))
        finally:
            for ends in sockets.values():
                for s in ends:
                    s.close()
        pids = {m: p.pid for m, (p, _) in enumerate(children)}
        self._conns = [c for _, c in children]
        self._send_locks = [threading.Lock() for _ in children]
        self._live = len(children)
        # every member gets its setup before any listener runs: a listener that sees a
        # member fail sends "cancel" to all, which must not come before a setup
        here = (pids, dict(os.environ), list(sys.path), os.getcwd())
        for _, conn in children:
            try:
                conn.send_bytes(self._payload)
                # the environment, module path and working directory of now: a member
                # forked before (a spare, or by the forkserver started at the first
                # ss.local(processes=N) of this process) takes them
                conn.send(here)
            except OSError:
                pass  # it died already: its listener reports it
        self.heartbeat = HeartbeatMonitor(
            len(children),
            self.job.engine.heartbeat_timeout_ms / 1000.0,
            self._send,
            self._silent_member,
        )
        for m, (p, conn) in enumerate(children):
            threading.Thread(
                target=self._listen,
                args=(m, p, conn),
                name=f"slipstream-{self.job.name}-member{m}-listener",
                daemon=True,
            ).start()
        self.heartbeat.start(self.job.name)
        if self.coordinator is not None:
            self.coordinator.start_timer()

    def _send(self, m: int, message: tuple[Any, ...]) -> None:
        """Send ``message`` to member ``m`` (one writer at a time on its pipe); a member
        that is gone is its listener's to report."""
        self.send_to(m, message)

    def stop(self) -> None:
        """Stop every member (``cancel()``): each ends its processors and reports; one
        that does not end within the grace is killed."""
        self.cancelled = True
        self._stop_members()

    def send_to(self, m: int, message: tuple[Any, ...]) -> bool:
        """Send a control message to member ``m`` (``False``: it is gone)."""
        if m >= len(self._conns):
            return False
        with self._send_locks[m]:
            try:
                self._conns[m].send(message)
            except (OSError, ValueError):
                return False
        return True

    def snapshot_failed(self, failure: TaskletFailure) -> None:
        """The snapshots fail the execution (too many in a row, a final or terminal one
        that could not be written, a stalled one): the members are stopped."""
        with self._lock:
            self._failures.append((2, failure))
        self._stop_members()

    def _stop_members(self) -> None:
        if self.coordinator is not None:
            self.coordinator.abort()  # no snapshot starts, none is retried
        with self._lock:
            if self._stopping:
                return
            self._stopping = True
        for m in range(len(self._conns)):
            self._send(m, ("cancel",))
        grace = self.job.engine.stop_grace_ms / 1000.0 + KILL_AFTER_S
        timer = threading.Timer(grace, self._kill_remaining)
        timer.daemon = True
        timer.start()

    def _kill_remaining(self) -> None:
        for m, p in enumerate(self._procs):
            if p.pid is not None and reap(p, 0) is None:
                log.error(
                    "job %s: member %d (pid %s) did not stop in time after the job stopped; "
                    "killing it",
                    self.job.name,
                    m,
                    p.pid,
                )
                try:
                    p.kill()
                except OSError:
                    pass

    # -- one member's reports ------------------------------------------------------------
    def _listen(self, m: int, p: Any, conn: Any) -> None:
        ended = False
        try:
            while True:
                try:
                    msg = conn.recv()
                except (EOFError, OSError):
                    break
                kind = msg[0]
                hb = self.heartbeat
                if hb is not None:
                    hb.heard(m, msg[1] if kind == PONG else None)
                if kind == PONG:
                    continue
                if kind == LOG:
                    replay(msg[1], m, p.pid)
                    continue
                if kind == OUTPUT:
                    member_output.write(msg[1], msg[2])
                    continue
                if kind in (LATE, ITEM_ERROR):
                    member_reports.apply(self.job, msg)
                    continue
                if kind == NAMED:  # answered apart: this thread keeps reading the pipe
                    threading.Thread(
                        target=self._answer_named, args=(m, msg), daemon=True
                    ).start()
                    continue
                if kind in ("report", "done", "cancelled"):
                    # usage first: member_rows calls a member with figures but no
                    # usage yet "starting" (a dashboard poll between the two showed
                    # a member with items as starting)
                    self.member_usage[m] = msg[4]
                    self.member_metrics[m] = msg[1]
                    self.cpu_share.record(m, msg[4][0])
                    self._apply(msg[2], msg[3])
                    if len(msg) > 5 and msg[5]:
                        from slipstream.sinks.basic import merge_published

                        merge_published(msg[5])
                    if len(msg) > 6 and msg[6] is not None:  # watermarks, queue fill
                        self.member_watch[m] = msg[6]
                    if kind != "report":
                        ended = True
                        self.member_state[m] = kind
                    if kind == "done" and not self.job._suspend_requested:
                        # its last message: every output of it is here and applied,
                        # its snapshots' part is sent (member.run ends them first).
                        # Its process's exit (its interpreter's shutdown, ~5-10 ms) is
                        # not waited for: the job may end now (_member_over). A
                        # suspend waits for it: suspend() returns with the members gone
                        self._member_over(m)
                elif kind == "failed":
                    ended = True
                    # a member whose channel broke because another stopped first
                    # after a cancel was cancelled too (the job is CANCELLED then)
                    peer_after_cancel = self.cancelled and msg[1] == "peer"  # member.PEER
                    self.member_state[m] = "cancelled" if peer_after_cancel else "failed"
                    self._failed(m, p.pid, msg)
                elif self.coordinator is not None:
                    self.coordinator.on_message(m, msg)
        finally:
            conn.close()
            reap(p, 30)
            if m in self._silent:
                self.member_state[m] = "unresponsive"
            elif not ended:
                self.member_state[m] = "died"
            if not ended and m not in self._silent:
                self._died(m, p)
            self._member_over(m)

    def _member_over(self, m: int) -> None:
        """Member ``m`` has nothing more to tell: its ``done`` arrived, or its pipe
        closed and its process was joined (a failed, cancelled or dead member: its
        process is gone before the execution ends, so a restart's fresh members never
        run beside it). Once per member; the last one ends the execution."""
        with self._lock:
            if m in self._over:
                return
            self._over.add(m)
            self._live -= 1
            last = self._live == 0
        if self.heartbeat is not None:
            self.heartbeat.ended(m)
        if last:
            self._ended()

    def _answer_named(self, m: int, msg: tuple[Any, ...]) -> None:
        """Member ``m`` asks for a named list or map, or a processor's share of it
        (``count`` > 0: the items, or a map's ``(key, value)`` pairs, at positions
        ``index, index + count, ...``). Every member's answer comes from one copy per
        name and execution, taken at the first request, so the shares of a
        ``list_source`` are of the same list as with one process."""
        from slipstream.core.pickling import cloudpickle

        _, req, kind, name, index, count = msg
        services = self.job.engine.services
        content: Any
        with self._named_lock:
            content = self._named.get((kind, name))
            if content is None:
                with services._lock:  # a consistent copy beside the members' reports
                    if kind == "list":
                        content = list(services.lists.get(name, ()))
                    else:
                        content = dict(services.maps.get(name, {}))
                self._named[(kind, name)] = content
        if count:
            pairs = content if kind == "list" else list(content.items())
            content = pairs[index::count]
        try:
            data = cloudpickle.dumps((NAMED_REPLY, req, True, content), protocol=5)
        except Exception as e:  # noqa: BLE001 - the asking processor fails with it
            data = cloudpickle.dumps(
                (
                    NAMED_REPLY,
                    req,
                    False,
                    f"the engine's named {kind} {name!r} cannot be sent to member process "
                    f"{m}: {type(e).__name__}: {e}; what a named list or map that a job "
                    "with processes > 1 reads holds must pickle with cloudpickle",
                )
            )
        with self._send_locks[m]:
            try:
                self._conns[m].send_bytes(data)
            except (OSError, ValueError):
                return  # it is gone: its listener reports it
        self.named_bytes[m] = self.named_bytes.get(m, 0) + len(data)

    def _apply(self, lists: dict[str, Any], maps: dict[str, Any]) -> None:
        from slipstream.execution.remote import unpack_rows

        services = self.job.engine.services
        for name, items in lists.items():
            services.get_list(name).extend(unpack_rows(items))  # member.report packed them
        for name, (updates, deleted) in maps.items():
            target = services.get_map(name)
            target.update(updates)
            for k in deleted:
                target.pop(k, None)

    def _failed(self, m: int, pid: int | None, msg: tuple[Any, ...]) -> None:
        from slipstream.engine.member import PEER, PROCESSOR

        _, kind, vertex, index, type_name, text, tb, blob = msg
        error: BaseException | None = None
        if blob is not None:
            try:
                error = pickle.loads(blob)
            except Exception:  # noqa: BLE001 - fall back to the text
                error = None
        if not isinstance(error, BaseException):
            error = MemberFailedError(f"{type_name}: {text}")
        if kind == PROCESSOR:
            tasklet: Any = MemberTasklet(vertex, index, m, pid)
        else:
            tasklet = None
            error = MemberFailedError(
                f"member {m} (pid {pid}): {vertex + ': ' if vertex else ''}{type_name}: {text}"
            )
        # with snapshots a processor's error (and a channel's, the consequence of a death)
        # restarts the job from the last committed snapshot, as with one process
        restartable = self.coordinator is not None and kind in (PROCESSOR, PEER)
        f = TaskletFailure(tasklet, error, restartable=restartable)
        f.traceback = tb
        rank = {PROCESSOR: 0, PEER: 3}.get(kind, 2)
        with self._lock:
            self._failures.append((rank, f))
        self._stop_members()

    def _died(self, m: int, p: Any) -> None:
        """Member ``m`` ended without a last report: it died."""
        code = reap(p, 0)
        if self.cancelled and self._stopping:
            return  # killed after a cancel it did not answer in time
        if code is not None and code < 0:
            try:
                how = f"killed by {signal.Signals(-code).name}"
            except ValueError:
                how = f"killed by signal {-code}"
        else:
            how = f"exit status {code}"
        if self.coordinator is not None:  # fresh members restore the last snapshot
            error = MemberFailedError(f"member {m} (pid {p.pid}) died ({how}) before the job ended")
        else:
            error = MemberFailedError(
                f"member {m} (pid {p.pid}) died ({how}) before the job ended; its "
                "processors' work is lost: a job without a processing guarantee has no "
                "snapshot to restart from, so the job fails"
            )
        f = TaskletFailure(None, error, restartable=self.coordinator is not None)
        with self._lock:
            self._failures.append((1, f))
        self._stop_members()

    def _silent_member(self, m: int, calls: Calls) -> None:
        """The heartbeat heard nothing from member ``m`` for the timeout: kill it and
        fail the job naming it (and the call it was last seen in, if any)."""
        p = self._procs[m]
        self._silent.add(m)
        text = silence_text(m, p.pid, self.job.engine.heartbeat_timeout_ms, calls)
        log.error("job %s: %s", self.job.name, text)
        if not self.cancelled:  # a cancel that a silent member holds up stays a cancel
            named = [c for c in calls if c[1] is not None]
            tasklet: Any = None
            if named:
                vertex, index, _, _ = max(named, key=lambda c: c[3])
                tasklet = MemberTasklet(vertex, index, m, p.pid)  # type: ignore[arg-type]
            # with snapshots fresh members restore the last one, as after a death
            restartable = self.coordinator is not None
            f = TaskletFailure(tasklet, MemberUnresponsiveError(text), restartable=restartable)
            with self._lock:
                self._failures.append((1, f))
        try:
            p.kill()  # SIGKILL ends a stopped process too
        except OSError:
            pass
        self._stop_members()

    def _gc_untune(self) -> None:
        with self._lock:
            tuned, self._gc_tuned = self._gc_tuned, False
        if tuned:
            gc_tuning.job_ended()

    def release(self) -> None:
        """The execution ended for good (engine/ended.py): drop the job's setup it sent
        the members and the copies of named lists and maps it answered them from."""
        if isinstance(self.job, weakref.ProxyType):  # released already
            return
        self._payload = b""
        with self._named_lock:
            self._named = {}
        if self.failure is not None:
            self.failure.release()
        # the job refers to its execution (job.metrics reads it): not back
        self.job = weakref.proxy(self.job)

    def _ended(self) -> None:
        self._gc_untune()
        # the next job's members are forked once these exited (engine/member_spares.py)
        engine_spares(self.job.engine).refill_after(list(self._procs))
        if self.heartbeat is not None:
            self.heartbeat.stop()
        if self.coordinator is not None:
            self.coordinator.stop()
        if self.cancelled:  # a channel to a member that stopped first is no failure then
            self._failures = [rf for rf in self._failures if rf[0] < 3]
        if self._failures:
            self._failures.sort(key=lambda rf: rf[0])  # stable: the first of a rank wins
            self.failure = self._failures[0][1]
        self.finished.set()
        self.job._execution_ended(self)  # type: ignore[arg-type]
