"""Starting PySpark's JVM with one line of its stderr dropped, and probing a master.

Spark's launcher starts every driver JVM with ``--add-modules=jdk.incubator.vector``
(hard-coded in ``org.apache.spark.launcher.JavaModuleOptions``, added unconditionally by
``SparkSubmitCommandBuilder``), and the JVM prints ``WARNING: Using incubator modules:
jdk.incubator.vector`` for it while it boots, from ``System.err``, before any logging
exists: no JVM flag, Spark setting or log4j level turns it off, and no option removes a
module Spark adds (``--limit-modules`` keeps modules named by ``--add-modules``). So
:func:`launch_gateway` starts the JVM itself, as PySpark would, with its stderr on a pipe:
a thread copies everything to this process's stderr except that one line.

:func:`check_master_reachable` exists because Spark does not fail fast on a master that
is not there: its standalone client retries registration three times, 20 s each
(constants in ``StandaloneAppClient``, not settings), then stops the context, and
PySpark then fails with ``Cannot call methods on a stopped SparkContext``.
"""

from __future__ import annotations

import atexit
import logging
import os
import select
import socket
import threading
from collections.abc import Mapping
from typing import Any

from slipstream.spark.session import SparkUnavailableError

__all__ = [
    "INCUBATOR_WARNING",
    "SparkMasterUnreachableError",
    "StderrFilter",
    "check_master_reachable",
    "launch_gateway",
    "standalone_addresses",
]

log = logging.getLogger("slipstream.spark")

#: The line the JVM prints for the module Spark adds; dropped from the JVM's stderr.
INCUBATOR_WARNING = b"WARNING: Using incubator modules: jdk.incubator.vector"

#: Seconds to wait for a TCP connection to a standalone master.
PROBE_TIMEOUT_S = 5.0


class SparkMasterUnreachableError(SparkUnavailableError):
    """Nothing accepts connections at the address of a ``spark://`` master URL."""


class StderrFilter:
    """Copies the bytes of ``fd_in`` (a pipe) to ``fd_out`` as they come, dropping every
    line equal to ``INCUBATOR_WARNING``.

    The reading end never stops before end of file, whatever happens to ``fd_out``: a JVM
    whose stderr pipe filled up would block in the middle of logging. ``drain()`` (called
    at interpreter exit) copies what the JVM wrote but the thread has not copied yet.
    """

    def __init__(self, fd_in: int, fd_out: int = 2) -> None:
        os.set_blocking(fd_in, False)
        self._in = fd_in
        self._out = fd_out
        self._pending = b""
        self._eof = False
        self._lock = threading.Lock()

    def run(self) -> None:
        """Copy until end of file (the thread's body)."""
        try:
            poller = select.poll()  # not select(): no limit on the descriptor's number
            poller.register(self._in, select.POLLIN)
            while not self._eof:
                poller.poll()
                with self._lock:
                    self._pump()
        except Exception:  # noqa: BLE001 - never leave the JVM with a full pipe
            log.debug("JVM stderr filter failed; discarding the rest", exc_info=True)
            self._discard()

    def drain(self) -> None:
        """Copy what can be read now, including a last line without its line break."""
        with self._lock:
            if self._eof:
                return
            self._pump()
            self._flush(self._pending)
            self._pending = b""

    def _discard(self) -> None:
        with self._lock:
            self._eof = True  # drain() does nothing from now on
        try:
            os.set_blocking(self._in, True)
            while os.read(self._in, 65536):
                pass
        except OSError:
            pass

    def _pump(self) -> None:
        while not self._eof:
            try:
                chunk = os.read(self._in, 65536)
            except BlockingIOError:
                return
            except OSError:
                chunk = b""
            if not chunk:
                self._eof = True
                self._flush(self._pending)
                self._pending = b""
                try:
                    os.close(self._in)
                except OSError:
                    pass
                return
            lines = (self._pending + chunk).split(b"\n")
            self._pending = lines.pop()
            self._flush(b"".join(line + b"\n" for line in lines if not _dropped(line)))

    def _flush(self, data: bytes) -> None:
        if _dropped(data):
            return
        while data:
            try:
                n = os.write(self._out, data)
            except InterruptedError:
                continue
            except OSError:
                return  # stderr closed: the bytes have nowhere to go
            data = data[n:]


def _dropped(line: bytes) -> bool:
    return line.rstrip(b"\r") == INCUBATOR_WARNING


def launch_gateway(master: str, app_name: str, settings: Mapping[str, str]) -> bool:
    """Start PySpark's JVM (the py4j gateway) with its stderr through a
    :class:`StderrFilter`, for the SparkSession about to be built with ``master``,
    ``app_name`` and ``settings`` (passed to ``spark-submit`` as the builder would).

    Does nothing, returning ``False``, where PySpark would not start a JVM (one is
    running, or ``PYSPARK_GATEWAY_PORT`` names one) or on Windows; the session is then
    built as usual and the warning stays.
    """
    if os.name != "posix" or "PYSPARK_GATEWAY_PORT" in os.environ:
        return False
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway as pyspark_launch_gateway

    with SparkContext._lock:
        if SparkContext._gateway is not None:
            return False
        conf = SparkConf(loadDefaults=False)
        conf.set("spark.master", master)
        conf.set("spark.app.name", app_name)
        for key, value in settings.items():
            conf.set(key, value)
        # the thread reads from the start: a JVM that fails to start says why (and one
        # that writes a lot before its gateway is up never blocks on a full pipe)
        read_end, write_end = os.pipe()
        stream = StderrFilter(read_end)
        threading.Thread(target=stream.run, name="slipstream-jvm-stderr", daemon=True).start()
        atexit.register(stream.drain)
        try:
            gateway: Any = pyspark_launch_gateway(conf, popen_kwargs={"stderr": write_end})
        finally:
            os.close(write_end)  # the JVM holds its own copy: EOF when it exits
        SparkContext._gateway = gateway
        SparkContext._jvm = gateway.jvm
    return True


def standalone_addresses(master: str) -> list[tuple[str, int]]:
    """``(host, port)`` of every master of a ``spark://HOST:PORT[,HOST:PORT...]`` URL
    (port 7077 when left out); ``[]`` for any other master (``local[...]``, YARN, k8s)."""
    if not master.startswith("spark://"):
        return []
    out: list[tuple[str, int]] = []
    for part in master[len("spark://") :].split(","):
        host, sep, port = part.strip().rpartition(":")
        if not sep:
            host, port = port, "7077"
        host = host.strip("[]")
        try:
            out.append((host, int(port)))
        except ValueError:
            continue  # Spark itself rejects it, with its own message
    return out


def check_master_reachable(master: str, timeout: float = PROBE_TIMEOUT_S) -> None:
    """Raise :class:`SparkMasterUnreachableError` (one line: the URL, why, what to check)
    if no master of a ``spark://`` URL accepts a TCP connection within ``timeout``
    seconds; other masters are not probed."""
    addresses = standalone_addresses(master)
    problems: list[str] = []
    for host, port in addresses:
        try:
            with socket.create_connection((host, port), timeout=timeout):
                return
        except TimeoutError:
            problems.append(f"{host}:{port} did not answer within {timeout:g} s")
        except OSError as exc:
            reason = exc.strerror or type(exc).__name__
            problems.append(f"{host}:{port}: {reason}")
    if not addresses:
        return
    raise SparkMasterUnreachableError(
        f"cannot reach the Spark master {master} ({'; '.join(problems)}). Check that the "
        "master is running (its log says 'Starting Spark master at spark://HOST:PORT'), "
        "that the URL has that host and port (7077 by default, not the web UI's 8080), "
        "and that this machine can connect to it"
    )
