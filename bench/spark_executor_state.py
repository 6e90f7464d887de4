"""Driver memory and time per epoch of a Spark streaming rolling count with a large state.

    PYTHONPATH=src python bench/spark_executor_state.py [--keys 1000000] [--epochs 4]
        [--items 200000] [--hot 0]

The job of issue 23's table: a rolling count per key (``rolling_aggregate`` on a
distributed partitioned edge) into a noop sink, run as a Spark streaming job
(``SparkStreamingJob``) in ``local[2]``. Epoch 0 creates ``--keys`` keys (one item
each); then ``--epochs`` epochs of ``--items`` items over random keys of that state
(``--hot N``: over N keys only, others in every epoch: the skewed pattern, where a task
that continues its chain writes a delta of those keys instead of its whole state).
Each epoch's rows are made on the executors (``sc.range(...).map``), so the driver
holds no input; the epochs are fed to the job's ``foreachBatch`` function directly (the
same epoch code as a Structured Streaming query, without its file source).

Prints the driver Python process's resident memory before the first epoch and its peak
(``ru_maxrss``) after the last, each epoch's time (the job's ``duration_ms``: restore,
run, commit) and the bytes each epoch wrote. Run it once with ``PYTHONPATH=src`` of the
version to measure (the driver's memory is one process's: run each version in its own
process).
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from typing import Any

import slipstream as ss
from slipstream import DAG, Edge, sinks
from slipstream.aggregate import counting
from slipstream.pipeline.keyed import rolling_aggregate


def _key(e: tuple[str, int]) -> str:
    return e[0]


def _event(row: Any) -> tuple[str, int]:
    return tuple(row)  # type: ignore[return-value]


class _StreamingDF:
    isStreaming = True


class _Batch:
    def __init__(self, rdd: Any) -> None:
        self.rdd = rdd


def rolling_dag(source: Any) -> DAG:
    dag = DAG()
    src = dag.new_vertex("source", source)
    count = dag.new_vertex("count", rolling_aggregate(_key, counting()))
    out = dag.new_vertex("sink", sinks.noop())
    dag.edge(Edge.between(src, count).distributed().partitioned(_key))
    dag.edge(Edge.between(count, out))
    return dag


def rss_mb() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--items", type=int, default=200_000)
    ap.add_argument("--hot", type=int, default=0)
    ap.add_argument("--master", default="local[2]")
    args = ap.parse_args()

    from slipstream.spark.io import spark_stream_source
    from slipstream.spark.session import create_session
    from slipstream.spark.streaming import SparkStreamingJob

    session = create_session(args.master, "executor-state-bench")
    sc = session.sparkContext
    engine = ss.spark(session)
    keys = args.keys
    with tempfile.TemporaryDirectory() as checkpoint:
        job = SparkStreamingJob(
            engine,
            rolling_dag(spark_stream_source(_StreamingDF(), _event)),
            ss.JobConfig(name="rolling"),
            checkpoint,
            None,
        )
        job._prepare()
        sc.range(4, numSlices=2).count()  # warm the Python workers
        before = rss_mb()
        times = []
        written = []
        for epoch_id in range(args.epochs + 1):
            if epoch_id == 0:
                rdd = sc.range(keys, numSlices=2).map(lambda i: (f"k{i}", i))
            else:
                seed, n, hot = epoch_id, args.items, args.hot
                if hot:
                    rdd = sc.range(n, numSlices=2).map(
                        lambda i, s=seed, h=hot: (f"k{((i % h) * 2654435761 + s * 7919) % keys}", i)
                    )
                else:
                    rdd = sc.range(n, numSlices=2).map(
                        lambda i, s=seed: (f"k{(i * 2654435761 + s * 97) % keys}", i)
                    )
            t0 = time.perf_counter()
            job._epoch(_Batch(rdd), epoch_id)
            times.append(time.perf_counter() - t0)
            written.append(job._last_epoch["bytes"] if job._last_epoch else None)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"slipstream from {os.path.dirname(ss.__file__)}")
        over = f"{args.hot:,} hot keys each" if args.hot else "random keys"
        print(
            f"keys {keys:,}, then {args.epochs} epochs of {args.items:,} items over {over}, "
            f"{args.master}"
        )
        print(f"driver RSS before the first epoch {before:.0f} MB, peak {peak:.0f} MB")
        for i, (t, b) in enumerate(zip(times, written, strict=True)):
            print(f"epoch {i}: {t:.2f} s, {b or 0:,} bytes written")
        later = times[1:]
        print(f"median of epochs 1..{args.epochs}: {sorted(later)[len(later) // 2]:.2f} s")
    session.stop()
    sys.exit(0)


if __name__ == "__main__":
    main()
