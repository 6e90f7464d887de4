"""A user's driver program for tests/spark/test_standalone.py, run as a script.

It makes a plain SparkSession (no ``PYSPARK_PYTHON``, no slipstream session factory),
then runs a batch job, a streaming window job and a rolling count restarted from its
checkpoint (state on the executors) through ``ss.spark(session)`` and prints a JSON
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


def write_keyed_events(directory: str, files: range) -> list[str]:
    """Files of keyed events (one epoch each); returns their keys in order."""
    keys = []
    os.makedirs(directory, exist_ok=True)
    for i in files:
        events = [f"k{(i * 7 + j * j) % 40}" for j in range(200)]
        keys.extend(events)
        tmp = os.path.join(directory, f".tmp-{i}")
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write("\n".join(json.dumps({"key": k}) for k in events))
        os.utime(tmp, (1_700_000_000 + i, 1_700_000_000 + i))
        os.rename(tmp, os.path.join(directory, f"part-{i}.json"))
    return keys


def rolling_dag(df: Any) -> DAG:
    """A rolling count per key: its state lives in the checkpoint, written and read back
    by the executors' tasks."""
    from slipstream.pipeline.keyed import rolling_aggregate

    dag = DAG()
    src = dag.new_vertex("events", spark_stream_source(df, lambda row: row.key))
    cnt = dag.new_vertex("count", rolling_aggregate(lambda k: k, counting()))
    out = dag.new_vertex("sink", sinks.list_sink("rolling")).local_parallelism(1)
    dag.edge(Edge.between(src, cnt).distributed().partitioned(lambda k: k))
    dag.edge(Edge.between(cnt, out).distributed().all_to_one())
    return dag


def rolling_runs(spark: Any, engine: Any, work: str) -> dict[str, Any]:
    """The rolling count as two runs of one query (the second a restart from the
    checkpoint, on the local file system every worker of this cluster sees): the output
    and the state of the last snapshot must be exact, and the restarted tasks must have
    read their own chains back (their chunks continue them with deltas)."""
    from slipstream.state.store import DirectorySnapshotStore

    events = os.path.join(work, "keyed")
    checkpoint = os.path.join(work, "keyed-checkpoint")
    keys: list[str] = []
    jobs = []
    for files in (range(2), range(2, 3)):
        keys += write_keyed_events(events, files)
        df = spark.readStream.schema("key string").option("maxFilesPerTrigger", 1).json(events)
        job = engine.new_job(
            rolling_dag(df),
            ss.JobConfig(name="rolling"),
            checkpoint_location=checkpoint,
            trigger={"availableNow": True},
        )
        job.join(300)
        jobs.append(job)
    expected = Counter(keys)
    oracle = Counter((k, n) for k, total in expected.items() for n in range(1, total + 1))
    store = DirectorySnapshotStore(os.path.join(checkpoint, "slipstream-state"))
    newest = store.read_manifest(store.committed_ids()[-1])
    rows = ss.state.read(store, "count")
    return {
        "rolling_ok": Counter(tuple(r) for r in engine.get_list("rolling")) == oracle,
        "state_ok": {r.key: r.value for r in rows} == dict(expected),
        "state_epochs": [j.epochs_committed for j in jobs],
        "state_resumed": jobs[1].resumed_from_snapshot,
        "state_chains": {
            str(i): [r.mode for r in chain] for i, chain in newest.vertices["count"].chains.items()
        },
        "state_flags": newest.extra.get("executor_state"),
    }


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

        t3 = time.monotonic()
        report.update(rolling_runs(spark, engine, work))
        report["state_seconds"] = round(time.monotonic() - t3, 1)
    finally:
        spark.stop()
    print(json.dumps(report))


if __name__ == "__main__":
    main()
