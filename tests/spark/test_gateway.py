"""slipstream.spark.gateway: the JVM's stderr filter and the standalone master probe.

None of these start a JVM: the probe runs before one would (an unreachable master fails
in about a second, where Spark itself waits 60 s and then fails with ``Cannot call
methods on a stopped SparkContext``)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from slipstream.spark.gateway import (
    INCUBATOR_WARNING,
    SparkMasterUnreachableError,
    StderrFilter,
    check_master_reachable,
    standalone_addresses,
)
from slipstream.spark.session import SparkUnavailableError, _registration_failure

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _filtered(chunks: list[bytes]) -> bytes:
    """What a StderrFilter copies of ``chunks`` written one by one to its pipe."""
    r_in, w_in = os.pipe()
    r_out, w_out = os.pipe()
    f = StderrFilter(r_in, w_out)
    thread = threading.Thread(target=f.run, daemon=True)
    thread.start()
    for chunk in chunks:
        os.write(w_in, chunk)
    os.close(w_in)
    thread.join(timeout=30)
    assert not thread.is_alive()
    os.close(w_out)
    with os.fdopen(r_out, "rb") as out:
        return out.read()


def test_the_filter_drops_only_the_incubator_line() -> None:
    got = _filtered(
        [
            INCUBATOR_WARNING + b"\n",
            b"26/11/25 17:30:54 ERROR SparkContext: a real error\n",
            b"WARNING: Using incubator modules: jdk.incubator.vector, jdk.incubator.foo\n",
            b"a line in two ",
            b"chunks\nthe last line, no break",
        ]
    )
    assert got == (
        b"26/11/25 17:30:54 ERROR SparkContext: a real error\n"
        b"WARNING: Using incubator modules: jdk.incubator.vector, jdk.incubator.foo\n"
        b"a line in two chunks\nthe last line, no break"
    )


def test_the_filter_drops_the_line_split_over_chunks_and_with_crlf() -> None:
    half = len(INCUBATOR_WARNING) // 2
    got = _filtered([INCUBATOR_WARNING[:half], INCUBATOR_WARNING[half:] + b"\r\nnext\n"])
    assert got == b"next\n"


def test_the_filter_keeps_reading_when_stderr_is_gone() -> None:
    """A JVM whose stderr pipe fills up blocks in the middle of logging: the filter reads
    to the end even when it has nowhere to write."""
    r_in, w_in = os.pipe()
    r_out, w_out = os.pipe()
    os.close(r_out)  # writes to w_out now fail (EPIPE; Python ignores SIGPIPE)
    f = StderrFilter(r_in, w_out)
    thread = threading.Thread(target=f.run, daemon=True)
    thread.start()
    for _ in range(64):  # 4 MiB, far more than a pipe buffer
        os.write(w_in, b"x" * 65535 + b"\n")
    os.close(w_in)
    thread.join(timeout=30)
    assert not thread.is_alive()
    os.close(w_out)


def test_drain_copies_what_the_thread_has_not() -> None:
    r_in, w_in = os.pipe()
    r_out, w_out = os.pipe()
    f = StderrFilter(r_in, w_out)  # no thread: as at interpreter exit, before it ran
    os.write(w_in, INCUBATOR_WARNING + b"\nlast words")
    f.drain()
    os.close(w_out)
    with os.fdopen(r_out, "rb") as out:
        assert out.read() == b"last words"
    os.close(w_in)


def test_standalone_addresses() -> None:
    assert standalone_addresses("spark://127.0.0.1:7077") == [("127.0.0.1", 7077)]
    assert standalone_addresses("spark://a:1,b:2") == [("a", 1), ("b", 2)]
    assert standalone_addresses("spark://host") == [("host", 7077)]
    assert standalone_addresses("spark://[::1]:7078") == [("::1", 7078)]
    assert standalone_addresses("local[2]") == []
    assert standalone_addresses("local-cluster[2,1,1024]") == []
    assert standalone_addresses("yarn") == []


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A loopback port held by a socket that does not listen: connections are refused,
    and no other process can take the port while the test runs."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


def _message(port: int) -> str:
    return (
        f"cannot reach the Spark master spark://127.0.0.1:{port} (127.0.0.1:{port}: Connection "
        "refused). Check that the master is running (its log says 'Starting Spark master at "
        "spark://HOST:PORT'), that the URL has that host and port (7077 by default, not the "
        "web UI's 8080), and that this machine can connect to it"
    )


def test_probe_of_a_master_that_is_not_there(closed_port: int) -> None:
    with pytest.raises(SparkMasterUnreachableError) as info:
        check_master_reachable(f"spark://127.0.0.1:{closed_port}")
    assert str(info.value) == _message(closed_port)
    assert isinstance(info.value, SparkUnavailableError)


def test_probe_passes_when_one_master_listens(closed_port: int) -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        check_master_reachable(f"spark://127.0.0.1:{port}")
        check_master_reachable(f"spark://127.0.0.1:{closed_port},127.0.0.1:{port}")
    check_master_reachable("local[2]")  # not probed


def test_a_master_that_never_registers_the_application_gets_one_line() -> None:
    spark_text = (
        "An error occurred while calling None.org.apache.spark.sql.classic.SparkSession.\n"
        ": java.lang.IllegalStateException: Cannot call methods on a stopped SparkContext.\n"
    )
    err = _registration_failure("spark://127.0.0.1:7077", RuntimeError(spark_text))
    assert isinstance(err, SparkMasterUnreachableError)
    assert str(err) == (
        "the Spark master spark://127.0.0.1:7077 accepted the connection but did not register "
        "this application (Spark gave up after its retries). Check that the URL has the port "
        "of the master's 'Starting Spark master at spark://HOST:PORT' log line (not its web "
        "UI's or a worker's), and the master's log"
    )
    assert _registration_failure("local[2]", RuntimeError(spark_text)) is None
    assert _registration_failure("spark://127.0.0.1:7077", RuntimeError("other")) is None


def _run(code: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


@pytest.mark.spark
def test_ss_spark_on_an_unreachable_master_fails_at_once(closed_port: int) -> None:
    """Before: 65-68 s of waiting, then ``Py4JJavaError ... Cannot call methods on a
    stopped SparkContext`` and 40 Java frames. The test's timeout bounds the wait."""
    pytest.importorskip("pyspark")
    r = _run(
        f"""
        import slipstream as ss
        ss.spark(master="spark://127.0.0.1:{closed_port}")
        """
    )
    assert r.returncode == 1
    lines = r.stderr.splitlines()
    assert lines[-1] == (
        "slipstream.spark.gateway.SparkMasterUnreachableError: " + _message(closed_port)
    )
    assert "Java" not in r.stderr and "SparkContext" not in r.stderr


@pytest.mark.spark
def test_cli_on_an_unreachable_master_prints_one_line(closed_port: int, tmp_path: Path) -> None:
    pytest.importorskip("pyspark")
    (tmp_path / "job.py").write_text(
        "from slipstream import DAG, sinks, sources\n"
        "def build():\n"
        "    dag = DAG()\n"
        "    dag.new_vertex('s', sources.items([1]))\n"
        "    return dag\n"
    )
    r = _run(
        f"""
        import sys
        from slipstream import cli
        sys.exit(cli.main(["run", "{tmp_path / 'job.py'}:build", "--engine", "spark",
                           "--master", "spark://127.0.0.1:{closed_port}", "--quiet"]))
        """
    )
    assert r.returncode == 2
    assert r.stderr == f"error: {_message(closed_port)}\n"


@pytest.mark.spark
def test_a_jvm_that_cannot_start_still_says_why() -> None:
    """The filter reads the JVM's stderr from its first byte: Spark's own reason for not
    starting reaches the user (it was lost while the pipe was read only once the gateway
    was up), not only PySpark's JAVA_GATEWAY_EXITED."""
    pytest.importorskip("pyspark")
    r = _run(
        """
        from slipstream.spark.session import create_session
        create_session("local[1]", "bad", {"spark.driver.extraJavaOptions": "-Xmx1k"})
        """
    )
    assert r.returncode == 1
    assert (
        "Error: Not allowed to specify max heap(Xmx) memory settings through java options "
        "(was -Xmx1k). Use the corresponding --driver-memory or spark.driver.memory "
        "configuration instead." in r.stderr.splitlines()
    ), r.stderr
    assert "JAVA_GATEWAY_EXITED" in r.stderr.splitlines()[-1]
