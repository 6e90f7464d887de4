"""Tests for slipstream.spark.standalone (a real master + workers).

Starting a cluster costs 9-14 s on the 2-core build machines (load 6-9), so the suite starts one:
two driver programs run on it in turn (a plain SparkSession whose executors lack
slipstream, then slipstream's own ``create_session``)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from slipstream.spark.standalone import StandaloneCluster

from .spark_engine_procs import word_count_oracle

APP = Path(__file__).with_name("any_session_app.py")

OVERALL_TIMEOUT = 600.0


def _processes_mentioning(needle: str) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if needle in cmdline:
            found.append(f"{entry.name}: {cmdline[:200]}")
    return found


def _bare_python(tmp_path: Path) -> Path:
    """A venv of this interpreter with nothing installed: no slipstream, no cloudpickle,
    no pyspark (Spark itself puts pyspark.zip and py4j on its Python workers' path)."""
    venv = tmp_path / "bare-venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120
    )
    python = venv / "bin" / "python3"
    for module in ("slipstream", "cloudpickle", "pyspark"):
        probe = subprocess.run(
            [str(python), "-c", f"import {module}"], capture_output=True, cwd=tmp_path
        )
        assert probe.returncode != 0, f"the bare venv can import {module}"
    return python


#: the create_session driver's input: a word count on the cluster
LINES = [
    "the quick brown fox jumps over the lazy dog",
    "to be or not to be that is the question",
    "a stream is a batch that never ends",
] * 50

CREATE_SESSION_SCRIPT = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, sys.argv[2])
    from pyspark import cloudpickle
    import spark.spark_engine_procs as procs
    cloudpickle.register_pickle_by_value(procs)
    import slipstream as ss
    from slipstream.spark.session import create_session

    lines = sys.stdin.read().splitlines()
    session = create_session(
        sys.argv[1], "slipstream-engine-standalone",
        conf={"spark.executor.memory": "512m", "spark.cores.max": "1"},
    )
    try:
        engine = ss.spark(session)
        job = engine.new_job(procs.word_count_dag(lines), ss.JobConfig(name="wc"))
        job.join(180)
        executors = session.sparkContext._jsc.sc().getExecutorIds().size()
        print(json.dumps({
            "counts": sorted(engine.get_list("counts")),
            "members": engine.member_count,
            "slots": session.sparkContext.defaultParallelism,
            "executors": executors,
            "status": job.status.value,
            "metrics": job.metrics,
        }))
    finally:
        session.stop()
    """
)


def _word_count_with_create_session(master_url: str, env: dict[str, str], timeout: float) -> None:
    """slipstream's session factory (PYSPARK_PYTHON: this interpreter) on the cluster:
    a word count, one member per task slot, the job's metrics back on the driver."""
    tests_dir = Path(__file__).resolve().parent.parent
    result = subprocess.run(
        [sys.executable, "-c", CREATE_SESSION_SCRIPT, master_url, str(tests_dir)],
        input="\n".join(LINES),
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["status"] == "completed"
    assert [tuple(x) for x in report["counts"]] == word_count_oracle(LINES)
    assert report["executors"] >= 1
    assert report["members"] == report["slots"]  # one member per task slot
    words = sum(len(line.split()) for line in LINES)
    assert report["metrics"]["split"]["items_out"] == words


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.timeout(OVERALL_TIMEOUT)
def test_any_session_on_a_cluster_whose_executors_lack_slipstream(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plain SparkSession (no PYSPARK_PYTHON) on a standalone cluster of two workers
    whose executors run a Python without slipstream: ss.spark(session) ships slipstream
    and runs a batch job, a streaming window job and a rolling count whose state the
    executors write to and read from the checkpoint, across a restart. Then, on the same
    cluster, a driver of slipstream's create_session runs a word count."""
    from slipstream.spark.session import SparkUnavailableError, check_spark_available

    try:
        check_spark_available()
    except SparkUnavailableError as exc:
        pytest.skip(str(exc))

    deadline = time.monotonic() + OVERALL_TIMEOUT - 20
    # a source tree on PYTHONPATH (a checkout run without installing) is the driver's
    # only: neither the bare venv nor the cluster's daemons and executors may see it
    driver_path = os.environ.get("PYTHONPATH")
    monkeypatch.delenv("PYTHONPATH", raising=False)
    bare = _bare_python(tmp_path)
    path = os.pathsep.join([str(bare.parent), os.environ.get("PATH", os.defpath)])
    cluster = StandaloneCluster(workers=2, cores=1, memory="1g", timeout=120, env={"PATH": path})
    with cluster:
        assert re.fullmatch(r"spark://127\.0\.0\.1:\d+", cluster.master_url)
        assert cluster.running()
        pids = cluster.pids
        base_dir = cluster.base_dir
        assert len(pids) == 3
        print(f"standalone start-up: {cluster.startup_seconds:.1f} s")

        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("PYSPARK_", "SPARK_CONF_DIR"))
        }
        env["SPARK_LOCAL_IP"] = "127.0.0.1"  # the host name resolves to loopback here
        if driver_path:
            env["PYTHONPATH"] = driver_path
        work = tmp_path / "app"
        work.mkdir()
        result = subprocess.run(
            [sys.executable, str(APP), cluster.master_url, str(work), "2"],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=max(30.0, deadline - time.monotonic()),
        )
        assert result.returncode == 0, result.stderr[-6000:]
        report = json.loads(result.stdout.strip().splitlines()[-1])
        print(
            f"app: session {report['session_seconds']} s, batch job {report['batch_seconds']} s,"
            f" streaming job ({report['epochs']} epochs) {report['stream_seconds']} s"
        )
        assert report["master"] == cluster.master_url
        assert report["python_exec"] == "python3"  # nobody set PYSPARK_PYTHON
        assert report["members"] == 2
        assert report["counts_ok"]
        for executable, slipstream_file in report["executors"]:
            assert executable == str(bare)
            assert ".zip" in slipstream_file  # the zip the engine shipped
        assert report["windows_ok"], report["windows"]
        assert report["epochs"] == 3
        # keyed state on the executors (checkpoint on the local file system the workers
        # see): exact output and state across a restart, whose tasks read their own
        # chains back and continued them with a delta
        print(f"app: rolling count, 2 runs: {report['state_seconds']} s")
        assert report["rolling_ok"] and report["state_ok"]
        assert report["state_epochs"] == [2, 1] and report["state_resumed"] == 2
        assert report["state_chains"] == {"0": ["full", "delta", "delta"], "1": ["full", "delta", "delta"]}
        assert report["state_flags"] == {"spill": [], "broadcast": []}

        own_env = dict(os.environ)  # the suite's own environment
        if driver_path:
            own_env["PYTHONPATH"] = driver_path
        t0 = time.monotonic()
        _word_count_with_create_session(
            cluster.master_url, own_env, timeout=max(30.0, deadline - time.monotonic())
        )
        print(f"create_session driver: word count {time.monotonic() - t0:.1f} s")

    # stop() ran: nothing of the cluster survives.
    assert not cluster.running()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert _processes_mentioning(str(base_dir)) == []
    assert not base_dir.exists()


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.timeout(60)
def test_standalone_start_timeout_reports_log_and_cleans_up(tmp_path: Path) -> None:
    from slipstream.spark.session import SparkUnavailableError, check_spark_available
    from slipstream.spark.standalone import StandaloneClusterError

    try:
        check_spark_available()
    except SparkUnavailableError as exc:
        pytest.skip(str(exc))

    # A failed start keeps its logs for inspection, so put them in tmp_path.
    cluster = StandaloneCluster(timeout=0.5, base_dir=str(tmp_path))
    with pytest.raises(StandaloneClusterError, match="did not log") as info:
        cluster.start()
    assert str(tmp_path / "master.log") in str(info.value)
    assert (tmp_path / "master.log").is_file()
    assert not cluster.running()
    assert cluster.pids == []
    with pytest.raises(StandaloneClusterError):
        _ = cluster.master_url
