"""Peak memory of the Python workers: word count on the Spark engine vs hand-written PySpark.

    python bench/spark_memory.py [--words 10000000 20000000 40000000] [--master local[2]]

For each corpus size (4 text files, ten words per line, Zipf-like over 50,000 words,
fixed seed, written once to a temp dir) every variant runs once in ONE SparkSession
with ``spark.python.worker.reuse=false``, so each Spark task gets a freshly forked Python
worker whose peak resident memory (``VmHWM`` in ``/proc/<pid>/status``) is that task's
own. A sampler thread reads the peak of every ``pyspark.daemon`` child every 20 ms while
the variant runs; the table shows the largest, and the wall time (after one untimed
warm-up round of every variant on 200,000 words). Variants:

* ``pyspark flatMap/reduceByKey``: the hand-written baseline;
* ``slipstream spark (default shape)``: bench/spark_wordcount.py's two-stage DAG on
  ``ss.spark(session)`` (one member per task slot, local parallelism 1: the
  tokenize -> accumulate edge is narrow, only the distributed edge shuffles);
* ``slipstream spark, members=1 lp=<slots>``: the same DAG with every word shuffled on
  the member-local partitioned edge, the case where a task's input is large: its
  memory must not grow with the input (the task streams its sorted input).

Peak worker memory is the figure that matters on a cluster: a task whose memory grows
with its partition fails there. The targets (issue 8): slipstream's peak at most 1.5x
the hand-written job's, and flat from 10M to 40M words.
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import operator
import os
import random
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import VOCAB_SIZE, WORDS_PER_LINE, cache_path, vocabulary  # noqa: E402
from spark_wordcount import wordcount_dag  # noqa: E402

import slipstream as ss  # noqa: E402

FILES = 4


def write_corpus(directory: str, n_words: int, seed: int = 42) -> None:
    """``FILES`` text files, streamed out in batches (the corpus never sits in memory)."""
    marker = os.path.join(directory, f".complete-{n_words}-{FILES}-{seed}")
    if os.path.exists(marker):
        return
    os.makedirs(directory, exist_ok=True)
    for name in os.listdir(directory):
        os.remove(os.path.join(directory, name))
    rng = random.Random(seed)
    vocab = vocabulary(VOCAB_SIZE)
    cum = list(itertools.accumulate(1.0 / (r + 1) for r in range(VOCAB_SIZE)))
    total = cum[-1]
    per_file = -(-n_words // FILES)
    left = n_words
    for f in range(FILES):
        n = min(per_file, left)
        left -= n
        with open(os.path.join(directory, f"part-{f:02d}.txt"), "w", encoding="utf-8") as fh:
            while n > 0:
                batch = min(n, 1_000_000)
                n -= batch
                words = [vocab[bisect.bisect(cum, rng.random() * total)] for _ in range(batch)]
                fh.write(
                    "\n".join(
                        " ".join(words[i : i + WORDS_PER_LINE])
                        for i in range(0, batch, WORDS_PER_LINE)
                    )
                )
                fh.write("\n")
    open(marker, "w").close()


def _daemon_children() -> list[int]:
    """PIDs of THIS session's Python workers: processes running pyspark.daemon whose
    parent does too (the daemon forks one per task), descending from this process (other
    Spark sessions on the machine have workers of their own)."""
    me = os.getpid()
    parent: dict[int, int] = {}
    daemon: set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            with open(f"/proc/{pid}/stat") as fh:
                parent[pid] = int(fh.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if b"pyspark.daemon" in fh.read():
                    daemon.add(pid)
        except OSError:
            continue

    def mine(pid: int) -> bool:
        seen = 0
        while pid > 1 and seen < 64:
            if pid == me:
                return True
            pid = parent.get(pid, 1)
            seen += 1
        return False

    return [pid for pid in daemon if parent.get(pid) in daemon and mine(pid)]


def _peak_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


class Sampler:
    """Largest VmHWM of any Python worker while running."""

    def __init__(self, interval: float = 0.02) -> None:
        self.interval = interval
        self.peak_kib = 0
        self.workers: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for pid in _daemon_children():
                self.workers.add(pid)
                self.peak_kib = max(self.peak_kib, _peak_kib(pid))
            self._stop.wait(self.interval)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _pair(w: str) -> tuple[str, int]:
    return (w, 1)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--words", type=int, nargs="+", default=[10_000_000, 20_000_000, 40_000_000])
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--skip-shuffled", action="store_true", help="omit the members=1 variant")
    a = ap.parse_args()

    import spark_wordcount
    from pyspark import cloudpickle

    from slipstream.spark.session import create_session

    # the DAG's functions live in a module the executors cannot import: ship them by value
    cloudpickle.register_pickle_by_value(spark_wordcount)

    t0 = time.perf_counter()
    session = create_session(
        a.master, "slipstream-bench-memory", {"spark.python.worker.reuse": "false"}
    )
    print(f"SparkSession ({a.master}) up in {time.perf_counter() - t0:.1f} s", flush=True)
    sc = session.sparkContext
    slots = int(sc.defaultParallelism)
    default_engine = ss.spark(session)
    shuffled_engine = ss.spark(session, members=1, local_parallelism=slots)

    rows: list[tuple[int, str, float, float]] = []
    try:
        # warm-up (JVM, Python workers, first-job costs) on a small corpus, not reported
        for n_words in [200_000, *a.words]:
            directory = cache_path(f"memory-{n_words}-{FILES}")
            print(f"writing/reusing corpus of {n_words:,} words in {directory} ...", flush=True)
            write_corpus(directory, n_words)
            pattern = os.path.join(directory, "*.txt")

            def pyspark_rdd() -> dict[str, int]:
                rdd = sc.textFile(pattern, slots)  # noqa: B023 - run within this iteration
                return dict(rdd.flatMap(str.split).map(_pair).reduceByKey(operator.add).collect())

            def slipstream_on(engine: Any) -> Callable[[], dict[str, int]]:
                def run() -> dict[str, int]:
                    engine.get_list("counts").clear()
                    engine.new_job(wordcount_dag(directory)).join()  # noqa: B023
                    return dict(engine.get_list("counts"))

                return run

            variants: list[tuple[str, Callable[[], dict[str, int]]]] = [
                ("pyspark flatMap/reduceByKey", pyspark_rdd),
                ("slipstream spark (default shape)", slipstream_on(default_engine)),
            ]
            if not a.skip_shuffled:
                variants.append(
                    (f"slipstream spark, members=1 lp={slots}", slipstream_on(shuffled_engine))
                )
            reference: dict[str, int] | None = None
            for name, fn in variants:
                print(f"running {name} on {n_words:,} words ...", flush=True)
                with Sampler() as sampler:
                    t = time.perf_counter()
                    result = fn()
                    elapsed = time.perf_counter() - t
                if reference is None:
                    reference = result
                    assert sum(result.values()) == n_words, "word total differs"
                assert result == reference, f"{name}: counts differ from the baseline"
                if n_words == 200_000:
                    continue  # the warm-up round
                rows.append((n_words, name, sampler.peak_kib / 1024, elapsed))
                print(
                    f"  {sampler.peak_kib / 1024:.0f} MiB peak worker, {elapsed:.1f} s, "
                    f"{len(sampler.workers)} workers seen",
                    flush=True,
                )
    finally:
        session.stop()

    print(f"\nword count, {a.master}, {FILES} files, peak RSS of any Python worker (VmHWM)")
    header = (
        f"{'words':>12}  {'variant':<36}{'peak MiB':>10}{'x base':>8}{'time s':>8}{'x base':>8}"
    )
    print(header)
    print("-" * len(header))
    base: dict[int, tuple[float, float]] = {}
    for n_words, name, mib, secs in rows:
        b = base.setdefault(n_words, (mib, secs))
        print(
            f"{n_words:>12,}  {name:<36}{mib:>10.0f}{mib / b[0]:>7.2f}x{secs:>8.1f}{secs / b[1]:>7.2f}x"
        )
    print("(x base = ratio to pyspark flatMap/reduceByKey on the same corpus)")


if __name__ == "__main__":
    main()
