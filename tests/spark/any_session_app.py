"""A user's driver program for tests/spark/test_standalone.py, run as a script.

It makes a plain SparkSession (no ``PYSPARK_PYTHON``, no slipstream session factory),
then runs a batch and a streaming job through ``ss.spark(session)`` and prints a JSON
report on its last stdout line. Only slipstream's library processors and lambdas of
this ``__main__`` are used, as in a real user's script.

    python any_session_app.py <master> <work dir> <executors to wait for>
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from typing import Any

from pyspark.sql import SparkSession

import slipstream as ss
from slipstream import DAG, Edge, sinks, sources
from slipstream import processors as P
from slipstream.aggregate import counting
from slipstream.spark.io import spark_stream_source
from slipstream.watermark import with_fixed_lag
from slipstream.window import tumbling_window_def

WORDS = ("to be or not to be that is the question " * 50).split()


def word_count_dag() -> DAG:
    dag = DAG()
    src = dag.new_vertex("source", sources.items(WORDS))
    acc = dag.new_vertex("accumulate", P.accumulate_by_key(lambda w: w, counting()))
    comb = dag.new_vertex("combine", P.combine_by_key(counting()))
    out = dag.new_vertex("sink", sinks.list_sink("counts")).local_parallelism(1)
    dag.edge(Edge.between(src, acc).partitioned(lambda w: w))
    dag.edge(Edge.between(acc, comb).distributed().partitioned(ss.entry_key))
    dag.edge(Edge.between(comb, out))
    return dag


def write_events(directory: str) -> Counter[tuple[int, str]]:
    """Three files of events, ts 0-9, 10-19, 20-29; returns the windows that close
    (the last one stays open: the watermark never passes 30)."""
    closed: Counter[tuple[int, str]] = Counter()
    os.makedirs(directory, exist_ok=True)
    for i in range(3):
        events = [(10 * i + j, k) for j in range(10) for k in "xy" if (j + i) % 3 or k == "x"]
        closed.update((t // 10 * 10, k) for t, k in events if t < 20)
        tmp = os.path.join(directory, f".tmp-{i}")
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write("\n".join(json.dumps({"ts": t, "key": k}) for t, k in events))
        os.utime(tmp, (1_700_000_000 + i, 1_700_000_000 + i))  # read oldest first
        os.rename(tmp, os.path.join(directory, f"part-{i}.json"))
    return closed


def window_dag(df: Any) -> DAG:
    dag = DAG()
    src = dag.new_vertex("events", spark_stream_source(df, lambda row: (row.ts, row.key)))
    wm = dag.new_vertex("watermarks", P.insert_watermarks(lambda e: e[0], lambda: with_fixed_lag(0)))
    win = dag.new_vertex(
        "windows",
        P.aggregate_to_sliding_window(
            key_fn=lambda e: e[1],
            timestamp_fn=lambda e: e[0],
            window_def=tumbling_window_def(10),
            agg_op=counting(),
        ),
    )
    out = dag.new_vertex("sink", sinks.list_sink("windows")).local_parallelism(1)
    dag.edge(Edge.between(src, wm))
    dag.edge(Edge.between(wm, win).distributed().partitioned(lambda e: e[1]))
    dag.edge(Edge.between(win, out))
    return dag


def where(_: Any) -> tuple[str, str]:
    import slipstream

    return sys.executable, str(slipstream.__file__)


def main() -> None:
    master, work, want_executors = sys.argv[1], sys.argv[2], int(sys.argv[3])
    t0 = time.monotonic()
    spark = (
        SparkSession.builder.master(master)
        .appName("slipstream-any-session")
        .config("spark.executor.memory", "512m")
        .getOrCreate()
    )
    sc = spark.sparkContext
    report: dict[str, Any] = {"master": sc.master, "python_exec": sc.pythonExec}
    try:
        deadline = time.monotonic() + 120
        while sc._jsc.sc().getExecutorIds().size() < want_executors:
            if time.monotonic() > deadline:
                raise SystemExit(f"fewer than {want_executors} executors registered")
            time.sleep(0.2)
        report["session_seconds"] = round(time.monotonic() - t0, 1)
        engine = ss.spark(spark)
        report["members"] = engine.member_count

        t1 = time.monotonic()
        engine.new_job(word_count_dag(), ss.JobConfig(name="wordcount")).join(300)
        report["counts_ok"] = dict(engine.get_list("counts")) == dict(Counter(WORDS))
        report["batch_seconds"] = round(time.monotonic() - t1, 1)
        report["executors"] = sorted(set(sc.parallelize(range(8), 8).map(where).collect()))

        t2 = time.monotonic()
        expected = write_events(os.path.join(work, "events"))
        df = (
            spark.readStream.schema("ts long, key string")
            .option("maxFilesPerTrigger", 1)
            .json(os.path.join(work, "events"))
        )
        job = engine.new_job(
            window_dag(df),
            ss.JobConfig(name="windows"),
            checkpoint_location=os.path.join(work, "checkpoint"),
            trigger={"availableNow": True},
        )
        job.join(300)
        got = Counter({(r.start, r.key): r.value for r in engine.get_list("windows")})
        report["windows_ok"] = got == expected
        report["windows"] = sorted([list(k), v] for k, v in got.items())
        report["epochs"] = job.epochs_committed
        report["stream_seconds"] = round(time.monotonic() - t2, 1)
    finally:
        spark.stop()
    print(json.dumps(report))


if __name__ == "__main__":
    main()
