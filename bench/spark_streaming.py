"""slipstream streaming on Spark against native Structured Streaming, on the same files.

    PYTHONPATH=src python bench/spark_streaming.py [--rows count-10k latest-10k count-1m
        latest-1m count-3m window]
        [--lines 500000] [--batches 6] [--events 2000000] [--files 20] [--breakdown]
        [--rounds N]

Issue 23's table, in ONE local[2] SparkSession (``spark.sql.shuffle.partitions=2``),
each row's two variants run one after the other (native first), each with
``trigger(availableNow=True)`` over a directory of files written once into the private
bench cache:

* ``count-<K>``: a rolling count per key over ``--batches`` files of ``--lines`` lines
  (one key per line, uniform over ``K`` keys, fixed seed), one file per micro-batch.
  Native: ``groupBy("value").count()`` in update mode into the ``noop`` sink (state in
  the default HDFS-backed state store; ``--rocksdb`` uses RocksDB). slipstream:
  ``spark_stream_source -> rolling_aggregate(counting()) -> sinks.noop()`` (the count on
  a distributed partitioned edge), its state on the executors: one output per line;
* ``column-<K>`` (10k, 1m; not run unless named): ``count-<K>``'s job with its source
  reading the ``value`` column's values (``spark_stream_source(df, column="value")``)
  instead of a ``Row`` per line mapped by ``row.value``: the same output, one per line;
* ``latest-<K>``: the same input and native job, and slipstream with native's output
  contract: ``spark_stream(df, column="value")`` (the column's values as items, no
  ``Row`` per line) ``.group_by(key).rolling_aggregate(counting(), per_epoch=True)``
  (each micro-batch's keys counted before the shuffle, each changed key's count emitted
  once per epoch, as update mode does);
* ``window``: 1 s tumbling counts per key (1,000 keys, 600 ms lag) over ``--events``
  JSON events in ``--files`` time-ordered files, 2 files per micro-batch. Native: the
  append-mode ``withWatermark`` + ``groupBy(window, key).count()``; slipstream:
  ``insert_watermarks -> aggregate_to_sliding_window`` into a list sink that keeps
  every window (``max_list_items=None``: the driver's RSS of this row includes them).
  The row also prints both windows' totals (they must be equal).

Per row and variant: seconds per epoch (the mean of Spark's ``triggerExecution`` over
the micro-batches that had input: the same measure for both, from
``query.recentProgress``), the driver Python process's peak RSS while the variant ran
(sampled every 20 ms), and the bytes written per epoch (native: the growth of its
checkpoint's ``state`` directory; slipstream: the chunk and manifest bytes its commits
report). ``ratio`` is slipstream's time over native's (target: <= 1.0).

``--breakdown`` also prints, for each slipstream variant, where an epoch's time goes
(from ``SparkStreamingJob.epoch_breakdown``: the driver's phases, the Spark jobs and
stages, the size of the pickled task closures, and per task the Python worker's
process (reused or fresh), restore, run and chunk-write time); see docs/performance.md.

``--rounds N`` runs the table N times in the one session, the rows' native and slipstream
variants alternately (native first in rounds 1, 3, ..., slipstream first in 2, 4, ...), and
ends with each row's median ratio over the rounds: back-to-back runs of the 10k-key rows
moved by 0.3-0.5x, so one round is a draw, not a measurement.

``--ab N`` instead runs N rounds per row of native, slipstream and slipstream the old
ways (``--old-env``), or with ``--variant NAME:ENV=VALUE,...`` (repeatable) those
variants instead of the old ways, each round starting one variant later, and prints the
medians over the rounds, e.g. the micro-batch spread over the source's processors again::

    PYTHONPATH=src python bench/spark_streaming.py --rows count-10k latest-10k \
        --batches 3 --ab 5 --variant spread:SLIPSTREAM_SPARK_ARROW_SPREAD=1

Report ``uptime`` with the figures: on a loaded 2-core machine they mean little.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import shutil
import sys
import tempfile
import threading
from collections import Counter
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import cache_path  # noqa: E402

import slipstream as ss  # noqa: E402
from slipstream import DAG, Edge, sinks  # noqa: E402
from slipstream import processors as P  # noqa: E402
from slipstream.aggregate import counting  # noqa: E402
from slipstream.pipeline.keyed import rolling_aggregate  # noqa: E402
from slipstream.watermark import with_fixed_lag  # noqa: E402
from slipstream.window import tumbling_window_def  # noqa: E402

LAG = 600
WINDOW_KEYS = 1000
KEYS = {"count-10k": 10_000, "count-1m": 1_000_000, "count-3m": 3_000_000}
#: the same counts with native's output contract: each changed key's count once per epoch
LATEST = {"latest-10k": 10_000, "latest-1m": 1_000_000, "latest-3m": 3_000_000}
#: count-<K>'s job reading the ``value`` column's values (``column=``) instead of a
#: ``Row`` per line mapped by ``row.value``: the same output, one per line
COLUMN = {"column-10k": 10_000, "column-1m": 1_000_000}


# -- input files ---------------------------------------------------------------------------
def _publish(directory: str, i: int, text: str) -> None:
    tmp = os.path.join(directory, f".tmp-{i}")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.utime(tmp, (1_700_000_000 + i, 1_700_000_000 + i))  # read oldest first
    os.rename(tmp, os.path.join(directory, f"part-{i:03d}.txt"))


def count_files(keys: int, lines: int, batches: int) -> str:
    directory = cache_path(f"spark-streaming-count-{keys}-{lines}-{batches}")
    marker = os.path.join(directory, "..", f".done-{os.path.basename(directory)}")
    if not os.path.exists(marker):
        shutil.rmtree(directory, ignore_errors=True)
        os.makedirs(directory)
        rng = random.Random(keys)
        for i in range(batches):
            _publish(directory, i, "\n".join(f"k{rng.randrange(keys)}" for _ in range(lines)))
        open(marker, "w").close()
    return directory


def window_files(events: int, files: int) -> str:
    directory = cache_path(f"spark-streaming-window-{events}-{files}")
    marker = os.path.join(directory, "..", f".done-{os.path.basename(directory)}")
    if not os.path.exists(marker):
        shutil.rmtree(directory, ignore_errors=True)
        os.makedirs(directory)
        rng = random.Random(23)
        per = events // files
        span = per  # 1 event per ms on average
        for i in range(files):
            ts = sorted(i * span + rng.randrange(span) for _ in range(per))
            _publish(
                directory,
                i,
                "\n".join(
                    json.dumps({"ts": t, "key": f"k{rng.randrange(WINDOW_KEYS)}"}) for t in ts
                ),
            )
        open(marker, "w").close()
    return directory


# -- measuring -----------------------------------------------------------------------------
class PeakRss:
    """The driver Python process's peak VmRSS while the block runs (MB)."""

    def __enter__(self) -> PeakRss:
        self.peak = _rss_mb()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, _rss_mb())

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss_mb())


def _rss_mb() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _dir_bytes(path: str) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(root, f))
            except OSError:
                pass
    return total


def epoch_durations(query: Any) -> dict[str, float]:
    """Spark's ``durationMs`` phases of the micro-batches that had input, mean (s):
    ``addBatch`` is the epoch's own work (native: its plan; slipstream: the
    ``foreachBatch`` call), the rest is the query's (offsets, WAL, commit log)."""
    out: dict[str, list[float]] = {}
    for p in query.recentProgress:
        if p.get("numInputRows", 0) > 0:
            for k, v in p["durationMs"].items():
                out.setdefault(k, []).append(v / 1000.0)
    return {k: sum(v) / len(v) for k, v in out.items()}


def epoch_seconds(query: Any) -> list[float]:
    """``triggerExecution`` of each micro-batch that had input (s)."""
    out = []
    for p in query.recentProgress:
        if p.get("numInputRows", 0) > 0:
            out.append(p["durationMs"]["triggerExecution"] / 1000.0)
    return out


# -- the jobs ------------------------------------------------------------------------------
def _ident(row: Any) -> str:
    return row.value  # type: ignore[no-any-return]


def _same(k: str) -> str:
    return k


def _ts(e: tuple[int, str]) -> int:
    return e[0]


def _key(e: tuple[int, str]) -> str:
    return e[1]


def _event(row: Any) -> tuple[int, str]:
    return (row.ts, row.key)


def count_dag(df: Any, column: bool = False) -> DAG:
    from slipstream.spark.io import spark_stream_source

    dag = DAG()
    source = spark_stream_source(df, column="value") if column else spark_stream_source(df, _ident)
    src = dag.new_vertex("source", source)
    count = dag.new_vertex("count", rolling_aggregate(_same, counting()))
    out = dag.new_vertex("sink", sinks.noop())
    dag.edge(Edge.between(src, count).distributed().partitioned(_same))
    dag.edge(Edge.between(count, out))
    return dag


def latest_pipeline(df: Any) -> ss.Pipeline:
    """Update mode's contract: ``rolling_aggregate(counting(), per_epoch=True)`` counts
    each micro-batch's keys before the shuffle and emits each changed key's count once;
    the items are the ``value`` column's values (``column=``, as native's
    ``groupBy("value")``), not Rows."""
    from slipstream import sources

    p = ss.Pipeline()
    (
        p.read_from(sources.spark_stream(df, column="value"))
        .group_by(_same)
        .rolling_aggregate(counting(), per_epoch=True)
        .write_to(sinks.noop())
    )
    return p


def window_dag(df: Any) -> DAG:
    from slipstream.spark.io import spark_stream_source

    dag = DAG()
    src = dag.new_vertex("source", spark_stream_source(df, _event))
    wm = dag.new_vertex(
        "watermarks", P.insert_watermarks(_ts, functools.partial(with_fixed_lag, LAG))
    )
    win = dag.new_vertex(
        "windows",
        P.aggregate_to_sliding_window(
            key_fn=_key, timestamp_fn=_ts, window_def=tumbling_window_def(1000), agg_op=counting()
        ),
    )
    out = dag.new_vertex("sink", sinks.list_sink("bench-windows")).local_parallelism(1)
    dag.edge(Edge.between(src, wm).isolated())
    dag.edge(Edge.between(wm, win).distributed().partitioned(_key))
    dag.edge(Edge.between(win, out).distributed().all_to_one())
    return dag


def _input(session: Any, row: str, directory: str) -> Any:
    if row == "window":
        return (
            session.readStream.schema("ts long, key string")
            .option("maxFilesPerTrigger", 2)
            .json(directory)
        )
    return session.readStream.option("maxFilesPerTrigger", 1).text(directory)


def run_native(session: Any, row: str, directory: str, work: str) -> dict[str, Any]:
    from pyspark.sql import functions as F  # noqa: N812

    checkpoint = os.path.join(work, "native")
    df = _input(session, row, directory)
    total: list[int] = [0]
    if row == "window":
        out = (
            df.withColumn("t", F.timestamp_millis("ts"))
            .withWatermark("t", f"{LAG} milliseconds")
            .groupBy(F.window("t", "1 second"), "key")
            .count()
        )

        def add(batch: Any, _epoch: int) -> None:
            r = batch.agg(F.count("*").alias("w"), F.sum("count").alias("e")).collect()[0]
            total[0] += r["w"] or 0
            total.append(r["e"] or 0)

        writer = out.writeStream.outputMode("append").foreachBatch(add)
    else:
        writer = df.groupBy("value").count().writeStream.outputMode("update").format("noop")
    with PeakRss() as rss:
        query = writer.option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
        query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(f"native {row}: {query.exception()}")
    times = epoch_seconds(query)
    result = {
        "times": times,
        "durations": epoch_durations(query),
        "rss": rss.peak,
        "bytes": _dir_bytes(os.path.join(checkpoint, "state")) / max(1, len(times)),
    }
    if row == "window":
        result["windows"] = (total[0], sum(total[1:]))
    return result


#: ``--ab``'s third variant, the old ways: these environment variables set (``--old-env``;
#: by default the rows pickled one by one instead of Arrow batches)
OLD_ENV = {"SLIPSTREAM_SPARK_ARROW": "0"}
#: ``--variant NAME=ENV...``: more slipstream variants for ``--ab``, each its environment
VARIANTS: dict[str, dict[str, str]] = {}


def _set_env(env: dict[str, str], on: bool) -> None:
    """Set ``env`` (read when an epoch is compiled), or remove its names again."""
    for name, value in env.items():
        if on:
            os.environ[name] = value
        else:
            os.environ.pop(name, None)


def run_slipstream(
    session: Any, row: str, directory: str, work: str, breakdown: bool
) -> dict[str, Any]:
    engine = ss.spark(session)
    df = _input(session, row, directory)
    dag: Any
    if row == "window":
        dag = window_dag(df)
    elif row in LATEST:
        dag = latest_pipeline(df)
    else:
        dag = count_dag(df, column=row in COLUMN)
    written: list[int] = []
    with PeakRss() as rss:
        job = engine.new_job(
            dag,
            ss.JobConfig(name=f"bench-{row}"),
            checkpoint_location=os.path.join(work, "slipstream"),
            trigger={"availableNow": True},
            max_list_items=None,  # every window, to compare with native's
        )
        commit = job.store.commit

        def counted(manifest: Any, **kw: Any) -> Any:
            out = commit(manifest, **kw)
            written.append(int(job.store.last_write_bytes or 0))
            return out

        job.store.commit = counted
        job.join()
    times = epoch_seconds(job.query)
    result: dict[str, Any] = {
        "times": times,
        "durations": epoch_durations(job.query),
        "rss": rss.peak,
        "bytes": sum(written) / max(1, len(written)),
        "breakdown": list(getattr(job, "epoch_breakdown", []) or []),
    }
    if row == "window":
        got: Counter[tuple[int, str]] = Counter()
        for r in engine.get_list("bench-windows"):
            got[(r.start, r.key)] += r.value
        result["windows"] = (len(got), sum(got.values()))
        engine.get_list("bench-windows").clear()
    return result


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def print_breakdown(row: str, epochs: list[dict[str, Any]]) -> None:
    """Where a slipstream epoch's time went (job.epoch_breakdown, see docs/performance.md)."""
    data = [e for e in epochs if not e.get("no_data")]
    if not data:
        print(f"  {row}: no breakdown recorded (this slipstream has no epoch_breakdown)")
        return
    print(f"  breakdown of {row}, mean over {len(data)} data epochs (s unless named):")
    keys = list(data[0]["driver"])
    for k in keys:
        print(f"    driver {k:<24} {_mean([e['driver'].get(k, 0.0) for e in data]):8.3f}")
    print(f"    driver {'total':<24} {_mean([e['total'] for e in data]):8.3f}")
    arrow = sorted({v for e in data for v in e.get("arrow_sources", [])})
    print(f"    sources fed Arrow batches          {', '.join(arrow) or 'none'}")
    for k in ("spark_jobs", "spark_stages", "tasks", "closure_bytes", "state_bc_bytes"):
        if k in data[0]:
            print(f"    {k:<31} {_mean([float(e[k]) for e in data]):8.0f}")
    tasks = [t for e in data for t in e.get("task", [])]
    if tasks:
        fresh = sum(1 for t in tasks if t.get("fresh_worker"))
        print(f"    tasks in a fresh Python worker   {fresh} of {len(tasks)}")
        restored = [t["kept_state"] for t in tasks if t.get("kept_state")]
        if restored:
            hits = restored.count("hit")
            print(f"    restores from the worker's kept state {hits} of {len(restored)}")
            for outcome in ("hit", "miss"):
                reads = [float(t["restore_read"]) for t in tasks if t.get("kept_state") == outcome]
                if reads:
                    print(
                        f"    restore read on a {outcome:<4}              {_mean(reads):8.3f} "
                        f"mean, {max(reads):.3f} max"
                    )
        for vertex in dict.fromkeys(t["vertex"] for t in tasks):
            mine = [t for t in tasks if t["vertex"] == vertex]
            for k in (
                "setup", "restore_read", "run", "input_wait", "output_wait", "cpu", "write_chunk"
            ):
                vals = [float(t.get(k, 0.0)) for t in mine]
                if any(v >= 0.0005 for v in vals):
                    print(
                        f"    task {vertex + ' ' + k:<26} {_mean(vals):8.3f} mean, "
                        f"{max(vals):.3f} max"
                    )


def ab(session: Any, args: Any, dirs: dict[str, str]) -> None:
    """``--ab``: per row, rounds of native / slipstream / slipstream the old ways (or the
    ``--variant`` s instead of the old ways), each variant's mean seconds per epoch per
    round, then the median over rounds. Each round starts one variant later than the
    one before (whichever ran later in a round tended to do better)."""
    variants: dict[str, dict[str, str] | None] = {"native": None, "slipstream": {}}
    if VARIANTS:
        variants.update(VARIANTS)
    else:
        variants["slipstream, old ways"] = OLD_ENV
    names = list(variants)
    for row in args.rows:
        per: dict[str, list[float]] = {n: [] for n in names}
        hits: list[str] = []
        for r in range(args.ab):
            for name in names[r % len(names):] + names[: r % len(names)]:
                env = variants[name]
                with tempfile.TemporaryDirectory(prefix="spark-streaming-bench-") as work:
                    if env is None:
                        out = run_native(session, row, dirs[row], work)
                    else:
                        _set_env(env, True)
                        try:
                            out = run_slipstream(session, row, dirs[row], work, False)
                        finally:
                            _set_env(env, False)
                        if name == "slipstream":
                            hits += [
                                t["kept_state"]
                                for e in out["breakdown"]
                                for t in e.get("task", [])
                                if t.get("kept_state")
                            ]
                per[name].append(_mean(out["times"]))
                print(
                    f"{row} round {r}: {name} {per[name][-1]:.2f} s/epoch "
                    f"{[round(t, 2) for t in out['times']]} (load {os.getloadavg()[0]:.1f})",
                    flush=True,
                )
        med = {n: _median(v) for n, v in per.items()}
        print(
            f"{row}: median s/epoch over {args.ab} rounds: "
            + ", ".join(f"{n} {med[n]:.2f} ({med[n] / med['native']:.2f}x)" for n in names)
            + f"; kept-state hits {hits.count('hit')} of {len(hits)}",
            flush=True,
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--rows",
        nargs="+",
        default=["count-10k", "latest-10k", "count-1m", "latest-1m", "count-3m", "window"],
    )
    ap.add_argument("--lines", type=int, default=500_000)
    ap.add_argument("--batches", type=int, default=6)
    ap.add_argument("--events", type=int, default=2_000_000)
    ap.add_argument("--files", type=int, default=20)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--rocksdb", action="store_true", help="native state in RocksDB")
    ap.add_argument("--breakdown", action="store_true")
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        metavar="N",
        help="run the table N times in one session, native first in odd rounds and "
        "slipstream first in even ones, and print each row's median ratio over the rounds",
    )
    ap.add_argument(
        "--event-log",
        metavar="DIR",
        help="write Spark's event log there (bench/spark_event_log.py reads it: each "
        "epoch's jobs, stages and tasks, native and slipstream)",
    )
    ap.add_argument(
        "--ab",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="instead of the table: ROUNDS interleaved rounds per row of native, slipstream, "
        "and slipstream with the rows pickled one by one instead of Arrow batches (the old ways)",
    )
    ap.add_argument(
        "--old-env",
        nargs="+",
        metavar="NAME=VALUE",
        help="--ab's third variant sets these instead of SLIPSTREAM_SPARK_ARROW=0",
    )
    ap.add_argument(
        "--variant",
        action="append",
        metavar="NAME:ENV=VALUE[,ENV=VALUE]",
        help="with --ab: a slipstream variant run with these environment variables (repeat "
        "for more; replaces the old ways)",
    )
    args = ap.parse_args()
    if args.old_env:
        OLD_ENV.clear()
        OLD_ENV.update(kv.split("=", 1) for kv in args.old_env)
    for spec in args.variant or ():
        name, _, envs = spec.partition(":")
        VARIANTS[name] = dict(kv.split("=", 1) for kv in envs.split(",") if kv)
    if args.breakdown:
        os.environ["SLIPSTREAM_EPOCH_BREAKDOWN"] = "1"  # closure sizes too

    from slipstream.spark.session import create_session

    dirs = {}
    for row in args.rows:
        if row == "window":
            dirs[row] = window_files(args.events, args.files)
        elif row in KEYS or row in LATEST or row in COLUMN:
            keys = KEYS.get(row) or LATEST.get(row) or COLUMN[row]
            dirs[row] = count_files(keys, args.lines, args.batches)
        else:
            ap.error(f"unknown row {row!r}: one of {[*KEYS, *LATEST, *COLUMN, 'window']}")
    conf = {"spark.sql.shuffle.partitions": "2"}
    if args.rocksdb:
        conf["spark.sql.streaming.stateStore.providerClass"] = (
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
        )
    if args.event_log:
        os.makedirs(args.event_log, exist_ok=True)
        conf["spark.eventLog.enabled"] = "true"
        conf["spark.eventLog.dir"] = os.path.abspath(args.event_log)
        conf["spark.eventLog.compress"] = "false"  # JSON lines spark_event_log.py reads
        conf["spark.eventLog.rolling.enabled"] = "false"
    session = create_session(args.master, "spark-streaming-bench", conf)
    session.sparkContext.range(4, numSlices=2).count()  # start the Python workers
    # one untimed round of both variants over 2 small files: the JVM's first queries
    # (class loading, code generation) would otherwise count against the first row
    warm = count_files(1000, 2000, 2)
    with tempfile.TemporaryDirectory(prefix="spark-streaming-bench-") as work:
        run_native(session, "count-warm", warm, work)
        run_slipstream(session, "count-warm", warm, work, False)
    print(f"slipstream from {os.path.dirname(ss.__file__)}, {args.master}")
    print(f"load before: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}")
    header = (
        f"{'row':<10} {'native s/epoch':>14} {'slipstream s/epoch':>18} {'ratio':>6} "
        f"{'native RSS MB':>13} {'slip RSS MB':>11} {'native B/epoch':>14} {'slip B/epoch':>12}"
    )
    if args.ab:
        ab(session, args, dirs)
        session.stop()
        return
    lines = []
    per: dict[str, list[tuple[float, float]]] = {row: [] for row in args.rows}
    for r in range(args.rounds):
        for row in args.rows:
            # odd rounds run slipstream first: whichever variant runs second in a
            # round tended to do better (docs/performance.md)
            native, slip = _run_row(session, row, dirs[row], args.breakdown, r % 2 == 1)
            n, s = _mean(native["times"]), _mean(slip["times"])
            per[row].append((n, s))
            line = (
                f"{row:<10} {n:14.2f} {s:18.2f} {s / n:6.2f} {native['rss']:13.0f} "
                f"{slip['rss']:11.0f} {native['bytes']:14,.0f} {slip['bytes']:12,.0f}"
            )
            lines.append(line)
            if args.rounds > 1:
                first = "slipstream" if r % 2 else "native"
                print(
                    f"round {r + 1} of {args.rounds} ({first} first), load {os.getloadavg()[0]:.2f}"
                )
            print(header)
            print(line)
            _print_row_details(row, native, slip, args.breakdown)
            sys.stdout.flush()
    print(f"load after: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}")
    print(header)
    for line in lines:
        print(line)
    if args.rounds > 1:
        print(f"median over {args.rounds} interleaved rounds (native first in rounds 1, 3, ...):")
        print(
            f"{'row':<10} {'native s/epoch':>14} {'slipstream s/epoch':>18} "
            f"{'median ratio':>12}  ratios"
        )
        for row, pairs in per.items():
            ratios = [s / n for n, s in pairs]
            print(
                f"{row:<10} {_median([n for n, _ in pairs]):14.2f} "
                f"{_median([s for _, s in pairs]):18.2f} {_median(ratios):12.2f}  "
                + " ".join(f"{x:.2f}" for x in ratios)
            )
    session.stop()


def _median(xs: list[float]) -> float:
    """The median (the mean of the middle two for an even count)."""
    ys = sorted(xs)
    mid = len(ys) // 2
    return ys[mid] if len(ys) % 2 else (ys[mid - 1] + ys[mid]) / 2


def _run_row(
    session: Any, row: str, directory: str, breakdown: bool, slipstream_first: bool
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One row's native and slipstream variants, one after the other, each in a fresh
    checkpoint directory."""
    with tempfile.TemporaryDirectory(prefix="spark-streaming-bench-") as work:
        if slipstream_first:
            slip = run_slipstream(session, row, directory, work, breakdown)
            native = run_native(session, row, directory, work)
        else:
            native = run_native(session, row, directory, work)
            slip = run_slipstream(session, row, directory, work, breakdown)
    return native, slip


def _print_row_details(
    row: str, native: dict[str, Any], slip: dict[str, Any], breakdown: bool
) -> None:
    print(
        f"  epochs: native {[round(t, 2) for t in native['times']]}, "
        f"slipstream {[round(t, 2) for t in slip['times']]}"
    )
    if row == "window":
        print(
            f"  windows (count, events): native {native['windows']}, slipstream {slip['windows']}"
        )
    if breakdown:
        phases = list(dict.fromkeys([*native["durations"], *slip["durations"]]))
        print("  Spark's durationMs per epoch, mean (s): phase native slipstream")
        for k in phases:
            print(
                f"    {k:<20} {native['durations'].get(k, 0.0):8.3f} "
                f"{slip['durations'].get(k, 0.0):8.3f}"
            )
        print_breakdown(row, slip["breakdown"])


if __name__ == "__main__":
    main()
