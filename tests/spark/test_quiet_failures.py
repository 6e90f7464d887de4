"""What a user sees on stderr when a job on Spark fails in a processor: the job's one
clear line (vertex, processor, exception), with no Spark log line, Java frame or JVM
start-up warning before it.

A fresh process is needed to see the JVM's stderr, so the script starts its own local
Spark session (the suite's shared session lives in the test process). Before this was
fixed, the clear line came after 82 lines for this job: the JVM's ``WARNING: Using
incubator modules: jdk.incubator.vector``, the executor's ``ERROR Executor: Exception in
task`` with the worker's Python traceback and 24 Java frames, the scheduler's ``ERROR
TaskSetManager: ... aborting job``, then Python's traceback."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]

SRC = str(Path(__file__).resolve().parents[2] / "src")

CLEAR_LINE = (
    "slipstream.core.errors.JobFailedError: job 'divide' failed: vertex 'map', processor 0, on item 0: "
    "ZeroDivisionError: integer division or modulo by zero"
)

#: Lines Spark and the JVM print (log4j's layout, Java frames, the JVM's own warnings).
_SPARK_LINE = re.compile(r"^\d\d/\d\d/\d\d \d\d:\d\d:\d\d [A-Z]+ |^\s+at [\w$.]+\(|^WARNING: |^org\.apache\.|^java\.")


def test_a_failing_job_shows_its_clear_line_without_spark_noise_first(tmp_path: Path) -> None:
    from slipstream.spark.session import SparkUnavailableError, check_spark_available

    try:
        check_spark_available()
    except SparkUnavailableError as exc:
        pytest.skip(str(exc))
    script = tmp_path / "divide.py"
    script.write_text(
        textwrap.dedent(
            """
            import slipstream as ss
            from slipstream import sinks, sources

            p = ss.Pipeline()
            p.read_from(sources.items([1, 2, 0, 4])).map(lambda x: 10 // x).write_to(
                sinks.list_sink("out"))
            ss.spark().new_job(p, ss.JobConfig(name="divide")).join()
            """
        )
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=240, env=env
    )
    assert r.returncode == 1, r.stderr
    lines = r.stderr.splitlines()
    assert CLEAR_LINE in lines, r.stderr
    before = lines[: lines.index(CLEAR_LINE)]
    assert "WARNING: Using incubator modules: jdk.incubator.vector" not in lines
    assert [line for line in before if _SPARK_LINE.search(line)] == []
    # what is left before it is Python's display of the chained processor exception:
    # its one line, "The above exception was the direct cause...", the user's frame
    # and join()'s (9 lines; 82 before the fix)
    assert lines[0] == "ZeroDivisionError: integer division or modulo by zero"
    assert len(before) <= 9, "\n".join(before)
