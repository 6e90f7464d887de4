"""The embedded engine: runs DAGs in this process on a small pool of threads."""

from __future__ import annotations

import logging
import os
import sys
import threading
import warnings
from collections.abc import MutableMapping
from typing import Any

from slipstream.core.config import JobConfig
from slipstream.core.dag import DAG, as_dag
from slipstream.core.dead_letters import with_dead_letters
from slipstream.core.outbox import DEFAULT_BUCKET_CAPACITY
from slipstream.core.services import InMemoryServices
from slipstream.engine import at_exit
from slipstream.engine.heartbeat import HEARTBEAT_TIMEOUT_MS
from slipstream.engine.job import Job


def gil_enabled() -> bool:
    """Whether this interpreter runs Python in one thread at a time (every CPython before
    the free-threaded builds; ``sys._is_gil_enabled()`` where it exists)."""
    return bool(getattr(sys, "_is_gil_enabled", lambda: True)())


def default_cooperative_threads() -> int:
    """1 where the GIL is on (measured: a second thread halves throughput of pure-Python
    DAGs, since only one thread runs Python at a time), else one per CPU."""
    return 1 if gil_enabled() else (os.cpu_count() or 1)


_forkserver_starting = False
_forkserver_lock = threading.Lock()


def start_forkserver_early() -> None:
    """Start the member processes' forkserver on a daemon thread, once per process
    (``ss.local(processes=N)`` with N > 1 calls it): its preload of slipstream then runs
    beside the script's own work before its first job, which otherwise waited for all of
    it (docs/performance.md, "Start-up of a 10-item job with processes=2"). A failure
    here is left to the first job, which starts the server itself and reports it."""
    global _forkserver_starting
    with _forkserver_lock:
        if _forkserver_starting:
            return
        _forkserver_starting = True
    threading.Thread(
        target=_start_forkserver, name="slipstream-forkserver-start", daemon=True
    ).start()


def _start_forkserver() -> None:
    try:
        from slipstream.engine.processes import start_forkserver

        start_forkserver()
    except Exception:  # noqa: BLE001 - the first job starts it again and reports why
        logging.getLogger("slipstream.processes").debug(
            "starting the forkserver early failed; the first job starts it", exc_info=True
        )


class GilThreadsWarning(RuntimeWarning):
    """``cooperative_threads`` > 1 on a GIL build: the engine runs with one thread."""


#: ``SLIPSTREAM_ALLOW_GIL_THREADS=1`` is the default of ``allow_gil_threads`` (the test
#: suite sets it, to exercise real concurrency between worker threads).
ALLOW_GIL_THREADS_ENV = "SLIPSTREAM_ALLOW_GIL_THREADS"


def _allow_gil_threads_default() -> bool:
    return os.environ.get(ALLOW_GIL_THREADS_ENV, "") not in ("", "0")


class LocalEngine:
    """``ss.local(cooperative_threads=None, members=1)``.

    ``cooperative_threads`` (default: :func:`default_cooperative_threads`) is also the
    default local parallelism of vertices.

    On an interpreter with the GIL, ``cooperative_threads`` > 1 runs as 1 (one worker
    thread, local parallelism 1) and warns once (:class:`GilThreadsWarning`), because only
    one thread runs Python at a time: a second worker thread only adds contention, and
    measured, made pure-Python jobs slower (word count 0.42x of one thread's
    throughput, docs/performance.md). ``allow_gil_threads=True`` (or the environment
    variable ``SLIPSTREAM_ALLOW_GIL_THREADS=1``) runs the threads asked for anyway: worth
    it when processors spend their time outside Python (I/O, C extensions that release
    the GIL). Free-threaded builds are never clamped. ``cooperative_threads`` keeps what
    runs; ``requested_cooperative_threads`` what was asked for.

    ``slow_call_ms``: a cooperative processor call running longer is logged as a warning
    naming the vertex and processor. ``stop_grace_ms``: after ``cancel()`` (or a failure)
    a processor stuck in a call is waited for this long, then the job ends without it.

    ``members`` > 1 simulates a cluster in one process: every vertex gets
    ``local_parallelism`` processors per member, member-local edges stay within a member
    and distributed edges cross members, so distribution semantics can be tested here.

    ``processes`` > 1 (or ``"auto"``: the cores this process may use) runs each job's
    members in that many OS processes, one member each, so a job uses that many cores;
    this process coordinates (:mod:`slipstream.engine.processes`). Distributed edges
    cross processes; list and map sinks fill this engine's lists and maps. With a
    processing guarantee the members take part in every snapshot and a member that dies
    restarts the job from the last one (:mod:`slipstream.engine.process_snapshots`).
    ``heartbeat_timeout_ms``: a member process that does not answer the coordinator's
    heartbeat for this long (stopped, or stuck in a call that holds the GIL) is killed
    and fails the job naming it, or restarts it from its last snapshot with a processing
    guarantee (:mod:`slipstream.engine.heartbeat`). The default, 60 s as Jet's failure
    detector, outlasts a member starved on a loaded machine.
    docs/guide.md, "Member processes".
    """

    def __init__(
        self,
        cooperative_threads: int | None = None,
        members: int = 1,
        work_dir: str | None = None,
        outbox_capacity: int = DEFAULT_BUCKET_CAPACITY,
        tune_gc: bool = True,
        dashboard: int | None = None,
        dashboard_host: str = "127.0.0.1",
        slow_call_ms: float = 1000.0,
        stop_grace_ms: float = 5000.0,
        allow_gil_threads: bool | None = None,
        processes: int | str = 1,
        heartbeat_timeout_ms: float = HEARTBEAT_TIMEOUT_MS,
    ) -> None:
        if cooperative_threads is None:
            cooperative_threads = default_cooperative_threads()
        if cooperative_threads < 1:
            raise ValueError(f"cooperative_threads must be >= 1, got {cooperative_threads}")
        self.requested_cooperative_threads = cooperative_threads
        if allow_gil_threads is None:
            allow_gil_threads = _allow_gil_threads_default()
        if cooperative_threads > 1 and not allow_gil_threads and gil_enabled():
            warnings.warn(
                f"cooperative_threads={cooperative_threads} on a Python with the GIL: the "
                f"engine runs with cooperative_threads=1 (one thread runs Python at a time; "
                f"more threads made pure-Python jobs slower). Pass allow_gil_threads=True "
                f"(or set {ALLOW_GIL_THREADS_ENV}=1) to run {cooperative_threads} threads "
                f"anyway, e.g. when processors release the GIL.",
                GilThreadsWarning,
                stacklevel=3 if _called_from_factory() else 2,
            )
            cooperative_threads = 1
        if members < 1:
            raise ValueError(f"members must be >= 1, got {members}")
        if processes == "auto":
            from slipstream.engine.processes import usable_cores

            processes = usable_cores()
        if isinstance(processes, bool) or not isinstance(processes, int) or processes < 1:
            raise ValueError(f'processes must be an int >= 1 or "auto", got {processes!r}')
        if processes > 1:
            if members not in (1, processes):
                raise ValueError(
                    f"members={members} and processes={processes}: with processes > 1 each "
                    f"member is a process, so members is processes (leave it out)"
                )
            members = processes
            start_forkserver_early()
        #: member processes of a job (1: the members, if several, share this process)
        self.process_count = processes
        if outbox_capacity < 1:
            raise ValueError(f"outbox_capacity must be >= 1, got {outbox_capacity}")
        # per outbound ordinal; 1 is useful in tests (every offer may be refused)
        self.outbox_capacity = outbox_capacity
        # see slipstream.engine.gc_tuning: fewer, cheaper collections while jobs run
        self.tune_gc = tune_gc
        if not slow_call_ms > 0 or not stop_grace_ms >= 0:
            raise ValueError(
                f"slow_call_ms must be > 0 and stop_grace_ms >= 0, got {slow_call_ms!r} and "
                f"{stop_grace_ms!r}"
            )
        if not heartbeat_timeout_ms > 0:
            raise ValueError(f"heartbeat_timeout_ms must be > 0, got {heartbeat_timeout_ms!r}")
        # a member process not heard from for this long is killed and fails the job
        # (slipstream.engine.heartbeat)
        self.heartbeat_timeout_ms = heartbeat_timeout_ms
        # a cooperative call longer than this is logged as a warning naming the processor
        self.slow_call_ms = slow_call_ms
        # cancel()/a failure waits this long for a processor stuck in a call, then ends
        # the job without it (see slipstream.engine.workers)
        self.stop_grace_ms = stop_grace_ms
        self.cooperative_threads = cooperative_threads
        #: local parallelism of vertices that set none
        self.default_parallelism = cooperative_threads
        self.member_count = members
        self.work_dir = work_dir or os.path.join(os.getcwd(), ".slipstream")
        self.services = InMemoryServices()
        self._jobs: list[Job] = []
        self._lock = threading.Lock()
        # jobs still running at interpreter exit are waited for or cancelled, and
        # reported (slipstream.engine.at_exit)
        at_exit.watch(self)
        # dashboard=PORT serves the live job page (0 picks a free port); see docs/watching.md
        self.dashboard: Any = None
        if dashboard is not None:
            from slipstream.dashboard.server import DashboardServer

            self.dashboard = DashboardServer(lambda: self.jobs, dashboard, dashboard_host)

    @property
    def dashboard_url(self) -> str | None:
        """The dashboard's address (``None`` without ``dashboard=``)."""
        return self.dashboard.url if self.dashboard is not None else None

    def new_job(
        self, dag: DAG | Any, config: JobConfig | None = None, *, restore_from: Any = None
    ) -> Job:
        """Validate ``dag`` (a DAG, or a Pipeline, compiled here) and start it; returns
        the running :class:`Job`.

        ``restore_from`` starts from a snapshot: a ``SnapshotData`` (``job.export_snapshot()``),
        a ``DirectorySnapshotStore`` or a snapshot directory (its latest intact snapshot).
        """
        # a pipeline compiles to the same DAG on every engine (stores and metric keys
        # carry over between engines and entry points)
        dag = as_dag(dag)
        config = config or JobConfig()
        # on_item_error=<sink>: dead letters reach their sink on edges of their own
        dag = with_dead_letters(dag, config.on_item_error)
        job = Job(self, dag, config, restore_from=restore_from)
        with self._lock:
            self._jobs.append(job)
        job._start()
        return job

    def get_list(self, name: str) -> list[Any]:
        return self.services.get_list(name)

    def get_map(self, name: str) -> MutableMapping[Any, Any]:
        return self.services.get_map(name)

    @property
    def jobs(self) -> list[Job]:
        return list(self._jobs)

    def shutdown(self) -> None:
        """Cancel every running job, stop the dashboard and the spare member processes
        (``processes`` > 1, engine/member_spares.py)."""
        for j in self._jobs:
            j.cancel()
        spares = self.__dict__.get("_member_spares")
        if spares is not None:
            spares.close()
        if self.dashboard is not None:
            self.dashboard.close()
            self.dashboard = None

    def __enter__(self) -> LocalEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        processes = f", processes={self.process_count}" if self.process_count > 1 else ""
        return (
            f"LocalEngine(cooperative_threads={self.cooperative_threads}, "
            f"members={self.member_count}{processes})"
        )


def _called_from_factory() -> bool:
    """Whether ``LocalEngine.__init__`` was called by ``ss.local(...)`` (the warning then
    names the caller of ``ss.local``)."""
    frame = sys._getframe(2)
    return frame.f_code.co_name == "local" and frame.f_globals.get("__name__") == "slipstream"
