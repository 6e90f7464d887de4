"""A throw-away Spark standalone cluster (one master, N workers) on 127.0.0.1.

pip-installed pyspark has no ``sbin/start-master.sh``, but its
``bin/spark-class`` starts the master and worker daemons; it ``exec``s java, so
the process we start *is* the daemon's JVM. Each daemon runs in its own process
group (workers fork executor JVMs into that group), so stopping a group takes
the executors down too.

Typical use::

    with StandaloneCluster(workers=1) as cluster:
        session = create_session(master=cluster.master_url,
                                 conf={"spark.executor.memory": "512m"})
        ...

Start-up costs roughly 7 s for the master plus 7-15 s for the workers on a
2-core machine; each daemon JVM idles at about 230 MB RSS.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType

from slipstream.spark.session import (
    DEFAULT_DRIVER_JAVA_OPTIONS,
    LOOPBACK,
    check_spark_available,
    log4j2_properties,
    spark_home,
)

__all__ = ["StandaloneCluster", "StandaloneClusterError"]

MASTER_READY = "I have been elected leader"
WORKER_READY = "Successfully registered with master"
_MASTER_URL_RE = re.compile(r"Starting Spark master at (spark://[^\s]+)")

#: Faster start-up for the short-lived daemon JVMs (same flags as the driver).
_DAEMON_JAVA_OPTS = DEFAULT_DRIVER_JAVA_OPTIONS

# INFO is needed for the readiness checks (MASTER_READY, WORKER_READY).
_DAEMON_LOG4J2 = log4j2_properties(
    "slipstream.spark.standalone", "info", {"org.sparkproject.jetty": "warn"}
)

_PR_SET_PDEATHSIG = 1


class StandaloneClusterError(RuntimeError):
    """The standalone cluster could not be started."""


def _free_ports(n: int) -> list[int]:
    """Pick ``n`` distinct free TCP ports on 127.0.0.1 (bind to port 0)."""
    sockets: list[socket.socket] = []
    try:
        for _ in range(n):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((LOOPBACK, 0))
            sockets.append(sock)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        return f"<cannot read {path}: {exc}>"
    return "\n".join(text.splitlines()[-lines:])


def _parent_death_signal() -> Callable[[], None] | None:
    """A ``preexec_fn`` making the child get SIGTERM if this process dies (Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)

    return preexec


class _Daemon:
    def __init__(self, name: str, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.name = name
        self.proc = proc
        self.log = log
        self.pgid = proc.pid  # start_new_session=True: pid == pgid

    def group_alive(self) -> bool:
        self.proc.poll()  # reap the leader so a zombie does not count
        if self.proc.returncode is None:
            return True
        try:
            os.killpg(self.pgid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass


class StandaloneCluster:
    """Start a Spark standalone master and ``workers`` workers on 127.0.0.1.

    Use as a context manager, or call :meth:`start` and :meth:`stop`. All ports
    (master RPC, master web UI, worker web UIs) are free ports picked at start;
    worker RPC ports are chosen by Spark. Files (logs, ``conf/``, the workers'
    ``--work-dir``) go to ``base_dir`` or a fresh temporary directory, which is
    removed on :meth:`stop` unless ``keep_files`` is true (or it was given).

    ``env`` adds environment variables for the daemons; executors inherit the
    workers' environment, so e.g. a ``PATH`` whose first ``python3`` is another
    interpreter makes that the executors' Python (when the driver leaves
    ``PYSPARK_PYTHON`` unset, PySpark runs ``python3``).

    Processes are never left behind: :meth:`stop` runs on exceptions during
    start-up, at interpreter exit (``atexit``) and, on Linux, the daemons get
    SIGTERM if this process dies (``PR_SET_PDEATHSIG``; note this fires when
    the *thread* that started the cluster exits, so start it from a
    long-lived thread, or pass ``kill_on_parent_exit=False``).
    """

    def __init__(
        self,
        workers: int = 1,
        cores: int = 1,
        memory: str = "1g",
        timeout: float = 90.0,
        base_dir: str | None = None,
        keep_files: bool = False,
        kill_on_parent_exit: bool = True,
        env: Mapping[str, str] | None = None,
    ) -> None:
        if workers < 1:
            raise ValueError("workers must be >= 1")
        if cores < 1:
            raise ValueError("cores must be >= 1")
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self.timeout = timeout
        self.keep_files = keep_files or base_dir is not None
        self.kill_on_parent_exit = kill_on_parent_exit
        self.env = dict(env or {})
        self._base_dir_arg = base_dir
        self._base_dir: Path | None = None
        self._daemons: list[_Daemon] = []
        self._master_url: str | None = None
        self._atexit_registered = False
        self.master_port: int | None = None
        self.master_webui_port: int | None = None
        self.worker_webui_ports: list[int] = []
        self.startup_seconds: float | None = None

    # ------------------------------------------------------------------ API

    @property
    def master_url(self) -> str:
        """``spark://127.0.0.1:PORT`` of the running master."""
        if self._master_url is None:
            raise StandaloneClusterError("the cluster is not started")
        return self._master_url

    @property
    def base_dir(self) -> Path:
        if self._base_dir is None:
            raise StandaloneClusterError("the cluster is not started")
        return self._base_dir

    @property
    def pids(self) -> list[int]:
        """PIDs of the master and worker JVMs that were started."""
        return [d.proc.pid for d in self._daemons]

    @property
    def log_files(self) -> list[Path]:
        return [d.log for d in self._daemons]

    def running(self) -> bool:
        """True if any started process (or a process in its group) is alive."""
        return any(d.group_alive() for d in self._daemons)

    def start(self) -> StandaloneCluster:
        if self._daemons:
            raise StandaloneClusterError("the cluster is already started")
        check_spark_available()
        started = time.monotonic()
        deadline = started + self.timeout
        try:
            self._register_atexit()
            self._base_dir = self._make_base_dir()
            env = self._environment(self._base_dir)
            ports = _free_ports(2 + self.workers)
            self.master_port, self.master_webui_port = ports[0], ports[1]
            self.worker_webui_ports = ports[2:]

            master = self._spawn(
                "master",
                [
                    "org.apache.spark.deploy.master.Master",
                    "--host",
                    LOOPBACK,
                    "--port",
                    str(self.master_port),
                    "--webui-port",
                    str(self.master_webui_port),
                ],
                env,
            )
            master_log = self._wait_for(master, MASTER_READY, deadline)
            # Spark moves to the next port if ours was taken in the meantime.
            match = _MASTER_URL_RE.search(master_log)
            self._master_url = match.group(1) if match else f"spark://{LOOPBACK}:{self.master_port}"

            work_dir = self._base_dir / "work"
            work_dir.mkdir(exist_ok=True)
            workers = [
                self._spawn(
                    f"worker{i + 1}",
                    [
                        "org.apache.spark.deploy.worker.Worker",
                        self._master_url,
                        "--host",
                        LOOPBACK,
                        "--cores",
                        str(self.cores),
                        "--memory",
                        self.memory,
                        "--work-dir",
                        str(work_dir),
                        "--webui-port",
                        str(port),
                    ],
                    env,
                )
                for i, port in enumerate(self.worker_webui_ports)
            ]
            for worker in workers:
                self._wait_for(worker, WORKER_READY, deadline)
        except BaseException:
            # Keep the logs of a failed start for inspection (they are small).
            keep, self.keep_files = self.keep_files, True
            try:
                self.stop()
            finally:
                self.keep_files = keep
            raise
        self.startup_seconds = time.monotonic() - started
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM every process group (workers first), SIGKILL after ``timeout``."""
        daemons = list(reversed(self._daemons))  # workers before the master
        try:
            for daemon in daemons:
                daemon.signal_group(signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and any(d.group_alive() for d in daemons):
                time.sleep(0.1)
            for daemon in daemons:
                if daemon.group_alive():
                    daemon.signal_group(signal.SIGKILL)
            for daemon in daemons:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    daemon.proc.wait(timeout=5)
        finally:
            self._daemons = []
            self._master_url = None
            if self._atexit_registered:
                atexit.unregister(self._atexit_stop)
                self._atexit_registered = False
            if self._base_dir is not None and not self.keep_files:
                shutil.rmtree(self._base_dir, ignore_errors=True)
            self._base_dir = None

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        url = self._master_url or "not started"
        return f"StandaloneCluster(workers={self.workers}, master={url})"

    # ------------------------------------------------------------ internals

    def _register_atexit(self) -> None:
        if not self._atexit_registered:
            atexit.register(self._atexit_stop)
            self._atexit_registered = True

    def _atexit_stop(self) -> None:
        with contextlib.suppress(Exception):
            self.stop()

    def _make_base_dir(self) -> Path:
        if self._base_dir_arg is not None:
            path = Path(self._base_dir_arg)
            path.mkdir(parents=True, exist_ok=True)
            return path
        return Path(tempfile.mkdtemp(prefix="slipstream-standalone-"))

    def _environment(self, base: Path) -> dict[str, str]:
        conf_dir = base / "conf"
        conf_dir.mkdir(exist_ok=True)
        (conf_dir / "log4j2.properties").write_text(_DAEMON_LOG4J2, encoding="utf-8")
        local_dir = base / "local"
        local_dir.mkdir(exist_ok=True)

        env = dict(os.environ)
        home = spark_home()
        python_bin = str(Path(sys.executable).parent)
        env["SPARK_HOME"] = home
        env["SPARK_LOCAL_IP"] = LOOPBACK
        env["SPARK_CONF_DIR"] = str(conf_dir)
        env["SPARK_LOCAL_DIRS"] = str(local_dir)
        # find-spark-home / load-spark-env run ``python3`` from PATH.
        env["PATH"] = python_bin + os.pathsep + env.get("PATH", os.defpath)
        env.setdefault("PYSPARK_PYTHON", sys.executable)
        daemon_opts = env.get("SPARK_DAEMON_JAVA_OPTS", "")
        env["SPARK_DAEMON_JAVA_OPTS"] = f"{daemon_opts} {_DAEMON_JAVA_OPTS}".strip()
        env.update(self.env)
        # Never inherit a driver's gateway settings.
        for key in ("PYSPARK_GATEWAY_PORT", "PYSPARK_GATEWAY_SECRET"):
            env.pop(key, None)
        return env

    def _spawn(self, name: str, args: list[str], env: dict[str, str]) -> _Daemon:
        base = self.base_dir
        log = base / f"{name}.log"
        spark_class = Path(env["SPARK_HOME"]) / "bin" / "spark-class"
        preexec = _parent_death_signal() if self.kill_on_parent_exit else None
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [str(spark_class), *args],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=str(base),
                start_new_session=True,
                preexec_fn=preexec,
            )
        daemon = _Daemon(name, proc, log)
        self._daemons.append(daemon)
        return daemon

    def _wait_for(self, daemon: _Daemon, marker: str, deadline: float) -> str:
        """Poll ``daemon``'s log until ``marker`` appears; return the log text."""
        while True:
            try:
                text = daemon.log.read_text(encoding="utf-8", errors="replace")
            except OSError:
                text = ""
            if marker in text:
                return text
            if daemon.proc.poll() is not None:
                raise StandaloneClusterError(
                    f"Spark standalone {daemon.name} exited with code "
                    f"{daemon.proc.returncode} before logging {marker!r}; "
                    f"tail of {daemon.log}:\n{_tail(daemon.log)}"
                )
            if time.monotonic() >= deadline:
                raise StandaloneClusterError(
                    f"Spark standalone {daemon.name} did not log {marker!r} within "
                    f"{self.timeout:.0f} s; tail of {daemon.log}:\n{_tail(daemon.log)}"
                )
            time.sleep(0.2)
