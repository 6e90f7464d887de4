"""Cooperative threads on a GIL build: does a second thread make a job slower?

    python bench/threads.py [--words 2000000] [--events 2000000] [--repeat 3] [--clock cpu]
                            [--variants t1,t2,t2-allow,t2-switch,t1-lp2] [--src DIR]

The jobs are bench/wordcount.py's (word count wired by hand, the same as a pipeline,
the running sum over in-memory events and the running sum over a CSV file as issue 12
writes it), each run on ``ss.local()`` with these engine settings:

* ``t1``: ``cooperative_threads=1`` (one worker thread, local parallelism 1);
* ``t2``: ``cooperative_threads=2`` as a user writes it (on a GIL build the engine runs it
  with one thread and warns, unless ``allow_gil_threads=True``);
* ``t2-allow``: ``cooperative_threads=2, allow_gil_threads=True``: two worker threads
  and local parallelism 2, whatever the GIL;
* ``t2-switch``: as ``t2-allow`` with ``sys.setswitchinterval(0.02)`` (the GIL changes
  hands every 20 ms instead of 5 ms: fewer forced switches between the two workers);
* ``t1-lp2``: one worker thread but local parallelism 2 (the cost of the wider job
  shape alone, without a second thread).

``--src DIR`` adds every setting once more on another slipstream source tree (an older
checkout's ``src``, put first on ``PYTHONPATH``), interleaved with the rest: a before/after
comparison in one run, of the settings ``--src-variants`` (default ``t1,t2``: an older tree
knows neither ``allow_gil_threads`` nor a separate default parallelism).

Every variant runs in a fresh process, in interleaved rounds; the table shows the best
round of each, as a ratio to ``t1`` (1.00 = as fast as one thread, lower is slower).
``--clock cpu`` measures the process's CPU time (all threads) instead of wall-clock time.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import run_variant, set_input_dirs, write_corpus  # noqa: E402

SETTINGS: dict[str, dict[str, Any]] = {
    "t1": {"cooperative_threads": 1},
    "t2": {"cooperative_threads": 2},
    "t2-allow": {"cooperative_threads": 2, "allow_gil_threads": True},
    "t2-switch": {"cooperative_threads": 2, "allow_gil_threads": True},
    "t1-lp2": {"cooperative_threads": 1},
}
JOBS = ("wc-slipstream", "wc-pipeline", "rs-slipstream", "rsf-slipstream")


def run_one(job: str, setting: str, a: argparse.Namespace) -> None:
    import warnings

    import wordcount  # bench/wordcount.py: the jobs themselves

    import slipstream as ss

    kwargs = SETTINGS[setting]
    if setting == "t2-switch":
        sys.setswitchinterval(0.02)
    make = ss.local

    def local(cooperative_threads: int | None = None, **kw: Any) -> Any:
        # bench/wordcount.py builds its engine with ss.local(cooperative_threads=...):
        # the setting's arguments replace that
        args = {**kw, **kwargs}
        try:
            engine = make(**args)
        except TypeError:  # a slipstream without allow_gil_threads (a "before" run)
            args.pop("allow_gil_threads", None)
            engine = make(**args)
        if setting == "t1-lp2":
            engine.default_parallelism = 2
        return engine

    ss.local = local  # type: ignore[assignment]
    clock = time.process_time if a.clock == "cpu" else time.perf_counter
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if hasattr(wordcount, "warm_up"):  # imports before the clock starts
            wordcount.warm_up()
        if job.startswith("rsf-"):
            t0 = clock()
            final = wordcount.rsf_engine(a.rsf_dir, None)
            seconds = clock() - t0
            items, check = a.events, sorted(final.items())
        elif job.startswith("wc-"):
            t0 = clock()
            counts = wordcount.wc_engine(a.dir, None, job == "wc-pipeline")
            seconds = clock() - t0
            items, check = sum(counts.values()), sorted(counts.items())[:50]
        else:
            evs = wordcount.events(a.events)
            t0 = clock()
            sums = wordcount.rs_engine(evs, None)
            seconds = clock() - t0
            finals: dict[int, int] = {}
            for k, s in sums:
                finals[k] = max(finals.get(k, 0), s)
            items, check = len(sums), sorted(finals.items())
    print(json.dumps({"name": f"{job} {setting}", "seconds": seconds, "items": items,
                      "check": check, "warned": any("allow_gil_threads" in str(w.message)
                                                    for w in caught)}))


def run_in(tree: str | None, variant: str, args: list[str]) -> dict[str, Any]:
    """One variant in a fresh process, on this slipstream or on the source tree ``tree``."""
    if tree is None:
        return run_variant(__file__, variant, args)
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = tree
    try:
        r = run_variant(__file__, variant, args)
    finally:
        if old is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = old
    r["name"] += " [src]"
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--words", type=int, default=2_000_000)
    ap.add_argument("--events", type=int, default=2_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall")
    ap.add_argument("--variants", default=",".join(SETTINGS))
    ap.add_argument("--jobs", default=",".join(JOBS))
    ap.add_argument("--dir", default=None, help="corpus directory (default: a temp dir)")
    ap.add_argument("--src", default=None, help="another slipstream source tree to compare")
    ap.add_argument("--src-variants", default="t1,t2", help="the settings run on --src")
    ap.add_argument("--run-variant", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    set_input_dirs(a)
    if a.run_variant:
        job, setting = a.run_variant.split(" ")
        run_one(job, setting, a)
        return
    write_corpus(a.dir, a.words)
    jobs = a.jobs.split(",")
    if any(j.startswith("rsf-") for j in jobs):
        import wordcount

        wordcount.write_rsf_file(a.rsf_dir, a.events)
    settings = a.variants.split(",")
    trees = [None, os.path.abspath(a.src)] if a.src else [None]
    common = ["--words", str(a.words), "--events", str(a.events), "--dir", a.dir,
              "--clock", a.clock]
    best: dict[str, dict[str, Any]] = {}
    for _ in range(max(1, a.repeat)):  # interleaved: a noisy moment hurts every variant
        for job in jobs:
            for s in settings:
                for tree in trees:
                    if tree is not None and s not in a.src_variants.split(","):
                        continue
                    r = run_in(tree, f"{job} {s}", common)
                    if r["name"] not in best or r["seconds"] < best[r["name"]]["seconds"]:
                        best[r["name"]] = r
    gil = getattr(sys, "_is_gil_enabled", lambda: True)()
    what = "CPU" if a.clock == "cpu" else "wall-clock"
    print(f"\ncooperative threads, GIL {'on' if gil else 'off'}, {what} seconds, best of "
          f"{a.repeat} interleaved rounds (load average {os.getloadavg()[0]:.1f} at the end)")
    header = f"{'job':<16}{'setting':<18}{'seconds':>9}{'vs t1':>8}  warned"
    print(header)
    print("-" * len(header))
    for job in jobs:
        names = [n for tag in ("", " [src]")[: len(trees)] for s in settings
                 if (n := f"{job} {s}{tag}") in best]
        rows = [best[n] for n in names]
        assert all(r["check"] == rows[0]["check"] for r in rows), f"{job}: results differ"
        for n, r in zip(names, rows, strict=True):
            tag = " [src]" if n.endswith(" [src]") else ""
            base = best.get(f"{job} t1{tag}", r)["seconds"]  # the same tree's one thread
            print(f"{job:<16}{n[len(job) + 1:]:<18}{r['seconds']:>9.2f}"
                  f"{base / r['seconds']:>7.2f}x  {'yes' if r['warned'] else ''}")
    if a.src:
        print(f"[src] = {a.src}; each ratio is to the same tree's t1")


if __name__ == "__main__":
    main()
