"""Word count on the Spark engine vs hand-written PySpark vs the embedded engine.

    python bench/spark_wordcount.py [--words 2000000] [--repeat 5] [--master local[2]]

The corpus is bench/wordcount.py's (Zipf-like over 50,000 pseudo-words, fixed seed, ten
words per line, 8 text files), written once to a temp dir. All Spark variants run in ONE
SparkSession, each first once untimed (JVM and Python-worker warm-up, and the check that
every variant gets the same counts), then ``--repeat`` interleaved rounds of all
variants; the table shows the best and the median time. Variants:

* ``pyspark flatMap/reduceByKey``: ``sc.textFile(...).flatMap(str.split)
  .map(lambda w: (w, 1)).reduceByKey(add).collect()`` -- the hand-written baseline;
* ``pyspark mapPartitions(Counter)``: the fastest hand-written RDD version we know;
* ``slipstream spark, read_files``: the guide's two-stage word-count DAG
  (read_files -> flat_map(split) -> accumulate_by_key -> distributed partitioned ->
  combine_by_key -> list_sink) on ``ss.spark(session)``;
* ``slipstream spark, textFile source``: the same DAG fed by
  ``spark_rdd_source(sc.textFile(...))`` (Spark reads the files);
* ``slipstream spark, members=N lp=1``: the read_files DAG on
  ``ss.spark(session, members=N, local_parallelism=1)`` with N = the default
  parallelism: one processor per member, so every member-local edge (including the
  partitioned tokenize -> accumulate edge) stays narrow and only the distributed edge
  shuffles;
* ``slipstream embedded``: the same DAG on ``ss.local()`` in this process.

Issue 5's target: the Spark engine within 1.5x of hand-written PySpark.
"""

from __future__ import annotations

import argparse
import operator
import os
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import cache_path, write_corpus  # noqa: E402

import slipstream as ss  # noqa: E402
from slipstream import DAG, Edge, sinks, sources  # noqa: E402
from slipstream import processors as P  # noqa: E402
from slipstream.aggregate import counting  # noqa: E402


def wordcount_dag(directory: str, source: Any = None) -> DAG:
    dag = DAG()
    src = dag.new_vertex("source", source or sources.read_files(directory, "*.txt"))
    tok = dag.new_vertex("tokenize", P.flat_map(str.split))
    acc = dag.new_vertex("accumulate", P.accumulate_by_key(_word, counting()))
    comb = dag.new_vertex("combine", P.combine_by_key(counting()))
    out = dag.new_vertex("sink", sinks.list_sink("counts")).local_parallelism(1)
    dag.edge(Edge.between(src, tok))
    dag.edge(Edge.between(tok, acc).partitioned(_word))
    dag.edge(Edge.between(acc, comb).distributed().partitioned(ss.entry_key))
    dag.edge(Edge.between(comb, out))
    return dag


def _word(w: str) -> str:
    return w


def _pair(w: str) -> tuple[str, int]:
    return (w, 1)


def _count_partition(lines: Iterator[str]) -> Iterator[tuple[str, int]]:
    c: Counter[str] = Counter()
    for line in lines:
        c.update(line.split())
    return iter(c.items())


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--words", type=int, default=2_000_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--dir", default=None, help="corpus directory (default: a temp dir)")
    a = ap.parse_args()
    directory = a.dir or cache_path(f"corpus-{a.words}")
    print(f"writing/reusing corpus of {a.words:,} words in {directory} ...", flush=True)
    write_corpus(directory, a.words)
    pattern = os.path.join(directory, "*.txt")

    from slipstream.spark.io import spark_rdd_source
    from slipstream.spark.session import create_session

    t0 = time.perf_counter()
    session = create_session(a.master, "slipstream-bench")
    print(f"SparkSession ({a.master}) up in {time.perf_counter() - t0:.1f} s", flush=True)
    sc = session.sparkContext
    spark_engine = ss.spark(session)
    partitions = spark_engine.default_local_parallelism * spark_engine.member_count

    def pyspark_rdd() -> dict[str, int]:
        rdd = sc.textFile(pattern, partitions)
        return dict(rdd.flatMap(str.split).map(_pair).reduceByKey(operator.add).collect())

    def pyspark_counter() -> dict[str, int]:
        rdd = sc.textFile(pattern, partitions)
        return dict(rdd.mapPartitions(_count_partition).reduceByKey(operator.add).collect())

    def slipstream_spark(source: Any = None) -> dict[str, int]:
        spark_engine.get_list("counts").clear()
        spark_engine.new_job(wordcount_dag(directory, source)).join()
        return dict(spark_engine.get_list("counts"))

    def slipstream_spark_textfile() -> dict[str, int]:
        return slipstream_spark(spark_rdd_source(sc.textFile(pattern, partitions)))

    slot_engine = ss.spark(session, members=partitions, local_parallelism=1)

    def slipstream_spark_slots() -> dict[str, int]:
        slot_engine.get_list("counts").clear()
        slot_engine.new_job(wordcount_dag(directory)).join()
        return dict(slot_engine.get_list("counts"))

    def slipstream_local() -> dict[str, int]:
        engine = ss.local()
        engine.new_job(wordcount_dag(directory)).join()
        return dict(engine.get_list("counts"))

    variants: list[tuple[str, Callable[[], dict[str, int]]]] = [
        ("pyspark flatMap/reduceByKey", pyspark_rdd),
        ("pyspark mapPartitions(Counter)", pyspark_counter),
        ("slipstream spark, read_files", slipstream_spark),
        ("slipstream spark, textFile source", slipstream_spark_textfile),
        (f"slipstream spark, members={partitions} lp=1", slipstream_spark_slots),
        ("slipstream embedded", slipstream_local),
    ]
    times: dict[str, list[float]] = {name: [] for name, _ in variants}
    reference: dict[str, int] | None = None
    try:
        for name, fn in variants:
            print(f"warming up {name} ...", flush=True)
            result = fn()  # warm-up, also the correctness check
            if reference is None:
                reference = result
                assert sum(result.values()) == a.words, "word total differs from --words"
            assert result == reference, f"{name}: counts differ from the baseline"
        # interleaved rounds, so a burst of load from elsewhere hits every variant alike
        for r in range(a.repeat):
            print(f"round {r + 1}/{a.repeat} ...", flush=True)
            for name, fn in variants:
                t = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t)
    finally:
        session.stop()
    rows = [(name, min(ts), statistics.median(ts)) for name, ts in times.items()]

    base = rows[0][1]
    print(f"\nword count, {a.words:,} words, {a.master}, best of {a.repeat} interleaved rounds")
    header = f"{'variant':<36}{'best s':>9}{'median s':>10}{'words/s':>13}{'x baseline':>12}"
    print(header)
    print("-" * len(header))
    for name, best, median in rows:
        print(f"{name:<36}{best:>9.2f}{median:>10.2f}{a.words / best:>13,.0f}{best / base:>11.2f}x")
    print("(x baseline = time / time of pyspark flatMap/reduceByKey; lower is faster)")


if __name__ == "__main__":
    main()
