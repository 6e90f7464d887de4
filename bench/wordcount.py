"""Word count and running-sum throughput: slipstream's embedded engine vs plain Python.

    python bench/wordcount.py [--words 5000000] [--events 2000000] [--threads N]
                              [--only wc,rs,rsf] [--clock cpu] [--repeat 3]

Every ``*-slipstream`` and ``*-pipeline`` row uses only documented API (docs/guide.md,
docs/reference.md); a row labelled ``tuned`` uses engine internals a user does not write (the
outbox's bucket lists) and is printed next to the documented one for comparison.

Running sum from a file (``rsf``, issue 12, the job as users write it): 2,000,000
``key,value`` CSV lines (1,000 keys) in a temp file, read with ``sources.read_files``,
a partitioned edge keyed by ``lambda line: line.split(",", 1)[0]``, a custom
``AbstractProcessor`` with ``try_process_item`` + ``try_emit((k, s))``, a partitioned
edge into ``sinks.map_sink``; against the plain loop that reads the same file and
updates a dict. The final map and the dict are checked equal.

Word count: the corpus (Zipf-like over 50,000 words, fixed seed) is written once as text
files; every variant reads the same files. ``wc-slipstream`` runs the guide's two-stage
DAG wired by hand (read_files -> flat_map(split) -> accumulate_by_key -> distributed
partitioned -> combine_by_key -> sink); ``wc-pipeline`` the same job written with the
Pipeline API (examples/wordcount.py's ``build_pipeline``: the compiler fuses the
tokenizer into the first aggregation stage). Running sum: 2,000,000 (key, value) events
over 1,000 keys; each event updates its key's sum and the running sum is emitted:
``rs-slipstream`` is a hand-written processor (``try_process_item`` + ``try_emit``),
``rs-slipstream-tuned`` the same processor filling the outbox bucket directly,
``rs-pipeline`` is
``group_by(key).rolling_aggregate(summing(value))``. Targets (issue 12): the documented
rows ``wc-slipstream`` and ``rsf-slipstream`` at >= 0.75x the plain loop's throughput,
and each pipeline at least as fast as its hand-wired DAG. Each variant runs in its own
process (peak memory is its own), after a warm-up job; results are checked equal.
Figures and what they mean: docs/performance.md, "The per-item path".
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import (  # noqa: E402
    count_words,
    load_example,
    peak_rss_mb,
    print_table,
    run_variant,
    set_input_dirs,
    write_corpus,
)

build_dag = load_example("wordcount").build_dag  # the DAG of examples/wordcount.py
build_pipeline = load_example("wordcount").build_pipeline  # ... and its pipeline

import operator  # noqa: E402

import slipstream as ss  # noqa: E402
from slipstream import DAG, Edge, sinks, sources  # noqa: E402
from slipstream.aggregate import summing  # noqa: E402


def corpus_files(d: str) -> list[str]:
    return sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".txt"))


wc_plain = count_words


def wc_counter(d: str) -> dict[str, int]:
    c: Counter[str] = Counter()
    for path in corpus_files(d):
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                c.update(line.split())
    return dict(c)


def wordcount_dag(d: str) -> DAG:
    """The example's DAG with the same tokenizer as the plain loops (str.split)."""
    return build_dag(d, "*.txt", str.split)


def wc_engine(d: str, threads: int | None, pipeline: bool = False) -> dict[str, int]:
    engine = ss.local(cooperative_threads=threads)
    job = build_pipeline(d, "*.txt", str.split) if pipeline else wordcount_dag(d)
    engine.new_job(job, ss.JobConfig(name="bench-wordcount")).join()
    return dict(engine.get_list("counts"))


# -- running sum ---------------------------------------------------------------------------
N_KEYS = 1000


def events(n: int) -> list[tuple[int, int]]:
    return [(i * 7919 % N_KEYS, i % 100) for i in range(n)]


def rs_plain(evs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    sums: dict[int, int] = {}
    get = sums.get
    out = []
    append = out.append
    for k, v in evs:
        s = get(k, 0) + v
        sums[k] = s
        append((k, s))
    return out


class RunningSum(ss.AbstractProcessor):
    """Emits (key, running sum) per event; state is the per-key sum. Documented API
    only: one ``try_process_item`` call and one ``try_emit`` per event."""

    def init_processor(self, context: ss.Context) -> None:
        self.sums: dict[int, int] = {}

    def try_process_item(self, ordinal: int, item: Any) -> bool:
        k, v = item
        s = self.sums.get(k, 0) + v
        if not self.try_emit((k, s)):
            return False  # outbox full: the event stays in the inbox
        self.sums[k] = s
        return True

    def save_to_snapshot(self) -> bool:
        return self.save_state(self.sums.items)

    def restore_from_snapshot_entry(self, key: Any, value: Any) -> None:
        self.sums[key] = value


class RunningSumTuned(ss.AbstractProcessor):
    """TUNED (engine internals): the same running sum filling ``outbox.buckets[0]``
    directly, a bucketful per call."""

    def init_processor(self, context: ss.Context) -> None:
        self.sums: dict[int, int] = {}

    def process(self, ordinal: int, inbox: Any) -> None:
        sums = self.sums
        get = sums.get
        room = self.outbox.room(0)
        bucket = self.outbox.buckets[0]
        append = bucket.append
        pop = inbox.popleft
        n = min(room, len(inbox))
        for _ in range(n):
            k, v = pop()
            s = get(k, 0) + v
            sums[k] = s
            append((k, s))

    def save_to_snapshot(self) -> bool:
        return self.save_state(self.sums.items)

    def restore_from_snapshot_entry(self, key: Any, value: Any) -> None:
        self.sums[key] = value


def rs_engine(
    evs: list[tuple[int, int]], threads: int | None, tuned: bool = False
) -> list[tuple[int, int]]:
    dag = DAG()
    src = dag.new_vertex("events", sources.items(evs))
    rs = dag.new_vertex("running-sum", RunningSumTuned if tuned else RunningSum)
    out = dag.new_vertex("sink", sinks.list_sink("sums")).local_parallelism(1)
    dag.edge(Edge.between(src, rs).partitioned(ss.entry_key))
    dag.edge(Edge.between(rs, out))
    engine = ss.local(cooperative_threads=threads)
    engine.new_job(dag, ss.JobConfig(name="bench-running-sum")).join()
    return engine.get_list("sums")


def rs_pipeline(evs: list[tuple[int, int]], threads: int | None) -> list[tuple[int, int]]:
    p = ss.Pipeline()
    p.read_from(sources.items(evs)).group_by(operator.itemgetter(0)).rolling_aggregate(
        summing(operator.itemgetter(1))
    ).write_to(sinks.list_sink("sums"))
    engine = ss.local(cooperative_threads=threads)
    engine.new_job(p, ss.JobConfig(name="bench-running-sum-pipeline")).join()
    return engine.get_list("sums")


# -- running sum from a CSV file (issue 12) ---------------------------------------------------
RSF_FILE = "events.csv"
RSF_GLOB = "events*.csv"  # RSF_FILE, or its parts events-00.csv, ... (files > 1)


def write_rsf_file(d: str, n: int, files: int = 1) -> str:
    """``n`` lines ``key,value`` over N_KEYS string keys (reused if present): one file,
    or the same lines cut into ``files`` consecutive parts (which processors of several
    members read in parallel, bench/processes.py)."""
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, RSF_FILE)
    marker = os.path.join(d, f".complete-{n}" + (f"-{files}" if files > 1 else ""))
    if not os.path.exists(marker):
        per = -(-n // files)
        for f in range(files):
            part = path if files == 1 else os.path.join(d, f"events-{f:02d}.csv")
            with open(part, "w", encoding="utf-8") as fh:
                fh.writelines(
                    f"k{i * 7919 % N_KEYS},{i % 100}\n" for i in range(f * per, min(n, (f + 1) * per))
                )
        open(marker, "w").close()
    return path


def rsf_plain(d: str) -> dict[str, int]:
    """What a user writes without an engine: read the file(s), update a dict."""
    import glob

    sums: dict[str, int] = {}
    get = sums.get
    for path in sorted(glob.glob(os.path.join(d, RSF_GLOB))):
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                k, v = line.split(",", 1)
                sums[k] = get(k, 0) + int(v)
    return sums


class CsvRunningSum(ss.AbstractProcessor):
    """Parses ``key,value`` lines and emits ``(key, running sum)`` per line (documented
    API: ``try_process_item`` + ``try_emit``)."""

    def init_processor(self, context: ss.Context) -> None:
        self.sums: dict[str, int] = {}

    def try_process_item(self, ordinal: int, line: Any) -> bool:
        k, v = line.split(",", 1)
        s = self.sums.get(k, 0) + int(v)
        if not self.try_emit((k, s)):
            return False
        self.sums[k] = s
        return True

    def save_to_snapshot(self) -> bool:
        return self.save_state(self.sums.items)

    def restore_from_snapshot_entry(self, key: Any, value: Any) -> None:
        self.sums[key] = value


def rsf_key(line: str) -> str:
    return line.split(",", 1)[0]


def rsf_dag(d: str) -> DAG:
    """The running sum from the CSV file(s) as users write it. The edge into the
    running sum is distributed: with several members (``processes``) each key's lines
    must meet on one processor of all members' (with one member it is a local edge)."""
    dag = DAG()
    src = dag.new_vertex("read", sources.read_files(d, RSF_GLOB))
    rs = dag.new_vertex("running-sum", CsvRunningSum)
    out = dag.new_vertex("sink", sinks.map_sink("sums"))
    dag.edge(Edge.between(src, rs).distributed().partitioned(rsf_key))
    dag.edge(Edge.between(rs, out).partitioned(ss.entry_key))
    return dag


def rsf_engine(d: str, threads: int | None) -> dict[str, int]:
    engine = ss.local(cooperative_threads=threads)
    engine.new_job(rsf_dag(d), ss.JobConfig(name="bench-running-sum-file")).join()
    return dict(engine.get_map("sums"))


def clock(a: argparse.Namespace) -> Any:
    """Wall-clock time, or with ``--clock cpu`` this process's CPU time (all its threads):
    on a machine shared with other work, CPU time is what the variant itself spent."""
    return time.process_time if a.clock == "cpu" else time.perf_counter


def warm_up() -> None:
    """Import what an engine variant uses before its clock starts (``import slipstream``
    loads its modules lazily, on first use): the table compares throughput, and the
    plain loops import nothing. bench/startup.py measures start-up itself."""
    from slipstream import processors as P
    from slipstream.aggregate import counting

    dag = DAG()
    src = dag.new_vertex("src", sources.items(["a b", "b"]))
    tok = dag.new_vertex("tok", P.flat_map(str.split))
    acc = dag.new_vertex("acc", P.accumulate_by_key(str, counting()))
    comb = dag.new_vertex("comb", P.combine_by_key(counting()))
    out = dag.new_vertex("out", sinks.map_sink("warm-up"))
    dag.edge(Edge.between(src, tok)).edge(Edge.between(tok, acc).partitioned(str))
    dag.edge(Edge.between(acc, comb).distributed().partitioned(ss.entry_key))
    dag.edge(Edge.between(comb, out))
    ss.local().new_job(dag).join()
    for name in ("read_files", "list_sink", "map_sink"):
        getattr(sources if name.startswith("read") else sinks, name)


def run_one(variant: str, a: argparse.Namespace) -> None:
    if "-plain" not in variant and variant != "wc-counter":
        warm_up()
    now = clock(a)
    t0 = now()
    if variant.startswith("rsf-"):
        sums = rsf_plain(a.rsf_dir) if variant == "rsf-plain" else rsf_engine(a.rsf_dir, a.threads)
        items = a.events
        check = sorted(sums.items())
    elif variant.startswith("wc-"):
        fn = {"wc-plain": wc_plain, "wc-counter": wc_counter}.get(variant)
        result = fn(a.dir) if fn else wc_engine(a.dir, a.threads, variant == "wc-pipeline")
        items = sum(result.values())
        check = sorted(result.items())[:50]
    else:
        evs = events(a.events)
        t0 = now()
        run_rs = {
            "rs-plain": lambda e, _t: rs_plain(e),
            "rs-pipeline": rs_pipeline,
            "rs-slipstream-tuned": lambda e, t: rs_engine(e, t, tuned=True),
        }.get(variant, rs_engine)
        rs = run_rs(evs, a.threads)
        items = len(rs)
        # the final sum per key must match whatever the order of events was
        finals: dict[int, int] = {}
        for k, s in rs:
            finals[k] = max(finals.get(k, 0), s)
        check = sorted(finals.items())
    seconds = now() - t0
    print(json.dumps({"name": variant, "seconds": seconds, "items": items,
                      "peak_mb": peak_rss_mb(), "check": check}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--words", type=int, default=5_000_000)
    ap.add_argument("--events", type=int, default=2_000_000)
    ap.add_argument("--threads", type=int, default=None, help="engine cooperative threads")
    ap.add_argument("--dir", default=None, help="corpus directory (default: a temp dir)")
    ap.add_argument("--repeat", type=int, default=3, help="rounds; the best run of each counts")
    ap.add_argument(
        "--clock", choices=["wall", "cpu"], default="wall",
        help="what 'seconds' measures: wall-clock time or the variant's CPU time",
    )
    ap.add_argument(
        "--only", default="wc,rs,rsf",
        help="comma-separated parts: wc (word count), rs (running sum over in-memory "
        "events), rsf (running sum over a CSV file, issue 12)",
    )
    ap.add_argument("--run-variant", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    set_input_dirs(a)
    if a.run_variant:
        run_one(a.run_variant, a)
        return
    parts = set(a.only.split(","))
    if "wc" in parts:
        print(f"writing/reusing corpus of {a.words:,} words in {a.dir} ...", flush=True)
        write_corpus(a.dir, a.words)
    if "rsf" in parts:
        print(f"writing/reusing {a.events:,} key,value lines in {a.rsf_dir} ...", flush=True)
        write_rsf_file(a.rsf_dir, a.events)
    common = ["--words", str(a.words), "--events", str(a.events), "--dir", a.dir]
    common += ["--clock", a.clock]
    if a.threads:
        common += ["--threads", str(a.threads)]
    def best_of(variants: tuple[str, ...]) -> list[dict[str, Any]]:
        # interleaved rounds, so a noisy moment hurts every variant alike
        best: dict[str, dict[str, Any]] = {}
        for _ in range(max(1, a.repeat)):
            for v in variants:
                print(f"running {v} ...", flush=True)
                r = run_variant(__file__, v, common)
                if v not in best or r["seconds"] < best[v]["seconds"]:
                    best[v] = r
        return [best[v] for v in variants]

    how = f"best of {a.repeat}, {a.clock} clock"
    if "wc" in parts:
        rows = best_of(("wc-plain", "wc-counter", "wc-slipstream", "wc-pipeline"))
        assert all(r["check"] == rows[0]["check"] for r in rows), "word counts differ"
        print_table(f"word count, {a.words:,} words ({how})", rows, "wc-plain")
    if "rsf" in parts:
        rows = best_of(("rsf-plain", "rsf-slipstream"))
        assert all(r["check"] == rows[0]["check"] for r in rows), "running sums differ"
        print_table(
            f"running sum from a CSV file, {a.events:,} lines, {N_KEYS} keys ({how})",
            rows, "rsf-plain",
        )
    if "rs" in parts:
        rows = best_of(("rs-plain", "rs-slipstream", "rs-slipstream-tuned", "rs-pipeline"))
        assert all(r["check"] == rows[0]["check"] for r in rows), "running sums differ"
        print_table(
            f"running sum, {a.events:,} in-memory events, {N_KEYS} keys ({how})", rows, "rs-plain"
        )


if __name__ == "__main__":
    main()
