"""Tests for slipstream.spark.standalone (a real master + worker)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from slipstream.spark.standalone import StandaloneCluster

TEXT = (
    """\
to be or not to be that is the question
whether tis nobler in the mind to suffer
the slings and arrows of outrageous fortune
"""
    * 40
)

# Runs in its own process: this test process may already hold the shared
# local[2] SparkContext, and a process can have only one.
APP_SCRIPT = """\
import json, sys, time
from slipstream.spark.session import create_session

master, text = sys.argv[1], sys.stdin.read()
t0 = time.monotonic()
spark = create_session(
    master=master,
    app_name="slipstream-standalone-test",
    conf={"spark.executor.memory": "512m", "spark.cores.max": "1"},
)
t1 = time.monotonic()
try:
    sc = spark.sparkContext
    counts = dict(
        sc.parallelize(text.splitlines(), 3)
        .flatMap(lambda line: line.split())
        .map(lambda word: (word, 1))
        .reduceByKey(lambda a, b: a + b)
        .collect()
    )
    t2 = time.monotonic()
    executors = sc._jsc.sc().getExecutorIds().size()  # a Scala Seq
    python = sc.parallelize([0], 1).map(lambda _: sys.executable).collect()[0]
finally:
    spark.stop()
print(json.dumps({
    "master": sc.master,
    "counts": counts,
    "executors": executors,
    "executor_python": python,
    "session_seconds": round(t1 - t0, 2),
    "job_seconds": round(t2 - t1, 2),
}))
"""

OVERALL_TIMEOUT = 240.0


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


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.timeout(OVERALL_TIMEOUT)
def test_standalone_cluster_runs_word_count() -> None:
    from slipstream.spark.session import SparkUnavailableError, check_spark_available

    try:
        check_spark_available()
    except SparkUnavailableError as exc:
        pytest.skip(str(exc))

    deadline = time.monotonic() + OVERALL_TIMEOUT - 20
    cluster = StandaloneCluster(workers=1, cores=1, memory="1g", timeout=90)
    with cluster:
        assert re.fullmatch(r"spark://127\.0\.0\.1:\d+", cluster.master_url)
        assert cluster.running()
        pids = cluster.pids
        base_dir = cluster.base_dir
        assert len(pids) == 2
        print(f"standalone start-up: {cluster.startup_seconds:.1f} s")

        result = subprocess.run(
            [sys.executable, "-c", APP_SCRIPT, cluster.master_url],
            input=TEXT,
            capture_output=True,
            text=True,
            timeout=max(30.0, deadline - time.monotonic()),
        )
        assert result.returncode == 0, result.stderr[-4000:]
        report = json.loads(result.stdout.strip().splitlines()[-1])
        print(
            f"app: session {report['session_seconds']} s, "
            f"first word-count job {report['job_seconds']} s"
        )
        assert report["master"] == cluster.master_url
        assert report["counts"] == dict(Counter(TEXT.split()))
        assert report["executors"] >= 1, "no standalone executor registered"
        assert report["executor_python"] == sys.executable

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
