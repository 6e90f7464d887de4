"""Where a job's CPU goes, layer by layer: the thread CPU of each tasklet's calls (and of
a few steps inside them) per item, in the job's process with ``processes=1`` and in
each member with ``processes=N``.

    python bench/layers.py [--job rsf|wc|win] [--processes 1,2] [--events 2000000]
                           [--words 5000000] [--rounds 2] [--src OTHER/src ...]

Jobs: ``rsf``, the CSV running sum with a user's ``AbstractProcessor``
(bench/wordcount.py's ``rsf_dag`` over ``--events`` lines in 8 files, as
bench/processes.py); ``wc``, examples/wordcount.py's ``build_dag`` over bench/processes.py's
corpus; ``win``, bench/processes.py's tumbling 1 s windows (bench/windowing.py's
``window_pipeline`` over ``--events`` generated events). Each run is a fresh interpreter whose ``sitecustomize`` (written here to a
private temporary directory put first on ``PYTHONPATH``, so that the forkserver and the
members load it too) wraps ``ProcessorTasklet.call``, the channel tasklets' ``call``, the
tasklet's ``_fill_inbox`` / ``_flush`` and ``AbstractProcessor.process`` in
``time.thread_time()``; a process writes its sums each time one of its tasklets ends.
Thread CPU leaves out the time a thread waited for a core, so the figures hold on a
busy machine better than wall or process times; the wrappers' own clock reads (a few
per tasklet call, each a system call of ~2 us on some machines) are calibrated when
the hook loads and taken off each figure (with the reads made inside a span). The last
rows of a member process account for the rest of its CPU (``time.process_time()`` when
its last tasklet ended, a spare member's bootstrap before its job included): what it
spent outside the tasklets' calls, and of that its main thread's
(``/proc/self/task/<id>/schedstat``: a member's set-up and its reports to the
coordinator); the rest is the worker's own loop and idle waits, the wrappers' clock
reads and the other threads. ``--src`` runs each
round once per source tree given (before / after, interleaved), the best of
``--rounds`` per figure. Figures: ns per item the member's (or the process's)
``--per`` vertex took in (``running-sum`` / ``tokenize``: lines; ``win``: events).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
#: the windows job's vertex whose items in are the events (the Pipeline fuses
#: with_timestamps into the accumulator)
WIN_PER = "with_timestamps+window-accumulate"

HOOK = """
import json, os, time
_out = os.environ.get("SLIPSTREAM_LAYERS_OUT")
if _out:
    _acc = {}
    _tt = time.thread_time
    _reads = [0]  # clock reads made by the wrappers so far

    def _read_cost():
        # one thread_time() read (a system call: ~2 us on some VMs, more than a
        # tasklet call's work on a small chunk): taken off each figure below
        best = 1.0
        for _ in range(5):
            t0 = _tt()
            for _ in range(200):
                _tt()
            best = min(best, (_tt() - t0) / 201)
        return best

    _cost = _read_cost()

    import multiprocessing
    import threading

    def _thread_cpu(tid):
        # ns on the CPU (schedstat's first field: exact, not the 10 ms ticks of stat)
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as fh:
                return int(fh.read().split()[0]) / 1e9
        except (OSError, ValueError, IndexError):
            return 0.0

    def _dump():
        # a member's whole CPU too, so the rows add up to it: since it started (a spare
        # member's bootstrap before its job included) and its main thread's (its set-up
        # and reports to the coordinator); not the job's own process with processes=1,
        # whose CPU holds the interpreter's start and imports
        if multiprocessing.parent_process() is not None:
            _acc["@process"] = time.process_time()
            _acc["@main thread"] = _thread_cpu(threading.main_thread().native_id)
        with open(os.path.join(_out, f"{os.getpid()}.json"), "w") as fh:
            json.dump(_acc, fh)

    def _wrap(cls, name, key, ends=False):
        orig = getattr(cls, name)

        def wrapper(self, *args):
            before = _reads[0]
            t0 = _tt()
            r = orig(self, *args)
            t1 = _tt()
            inner = _reads[0] - before  # reads of the wrappers called inside
            _reads[0] += 2
            k = key(self) + " ." + name
            _acc[k] = _acc.get(k, 0.0) + (t1 - t0) - (inner + 1) * _cost
            if ends and r == 2:  # DONE
                if hasattr(self, "streams"):
                    _acc[key(self) + " in"] = self.items_in
                _dump()
            return r

        setattr(cls, name, wrapper)

    from slipstream.core import processor as _p
    from slipstream.execution import remote as _r, tasklet as _t

    def _name(t):
        return f"{t.vertex_name}#{t.index}"

    _wrap(_t.ProcessorTasklet, "call", _name, ends=True)
    _wrap(_t.ProcessorTasklet, "_fill_inbox", _name)
    _wrap(_t.ProcessorTasklet, "_flush", _name)
    _wrap(_p.AbstractProcessor, "process",
          lambda s: f"{s.context.vertex_name}#{s.context.global_processor_index}")
    _wrap(_r.ChannelSender, "call", lambda s: "channel sender", ends=True)
    _wrap(_r.ChannelReceiver, "call", lambda s: "channel receiver", ends=True)
"""


def run_job(a: argparse.Namespace) -> None:
    """In the fresh interpreter: run the job once."""
    sys.path.insert(0, HERE)
    import wordcount
    from benchlib import cache_path, load_example

    import slipstream as ss
    from slipstream.core.pickling import cloudpickle

    cloudpickle.register_pickle_by_value(wordcount)
    if a.job == "rsf":
        dag = wordcount.rsf_dag(cache_path(f"rsf-{a.events}-8"))
    elif a.job == "win":
        import windowing

        cloudpickle.register_pickle_by_value(windowing)
        fn = windowing.HashedEvent(1000, 10_000)  # bench/processes.py's WIN_KEYS, rate
        source = ss.sources.generator(fn, None, max_items=a.events)
        dag = windowing.window_pipeline(
            source, windowing.WINDOWS["tumbling"], ss.sinks.list_sink("windows")
        )
    else:
        example = load_example("wordcount")
        cloudpickle.register_pickle_by_value(example)
        dag = example.build_dag(cache_path(f"corpus-{a.words}"), "*.txt", str.split)
    engine = ss.local(processes=a.run)
    engine.new_job(dag, ss.JobConfig(name="bench-layers")).join()


def layers(out: str, per: str) -> dict[str, dict[str, float]]:
    """Per process that wrote figures: ns per item ``per`` took in, per layer."""
    rows: dict[str, dict[str, float]] = {}
    for path in glob.glob(os.path.join(out, "*.json")):
        with open(path, encoding="utf-8") as fh:
            acc: dict[str, float] = json.load(fh)
        # "a|b": the first vertex of them with a tasklet (the running sum runs in its
        # sink's tasklet when the engine fuses the two)
        ins = []
        for name in per.split("|"):
            ins = ins or [k for k in acc if k.startswith(name + "#") and k.endswith(" in")]
        if not ins:
            continue
        n = acc[ins[0]]
        row: dict[str, float] = {"items": n}
        total = 0.0
        for k in sorted(acc, key=lambda k: (k.split(" .")[0], not k.endswith(" .call"))):
            if k.endswith(" in") or k.startswith("@"):
                continue
            ns = acc[k] * 1e9 / n
            if k.endswith(" .call"):
                name = k[: -len(" .call")]
                row[name] = ns
                total += ns
            else:
                row["  " + k] = ns
        row["in all"] = total
        if "@process" in acc:
            process = acc["@process"] * 1e9 / n
            row["the process's CPU"] = process
            row["  outside the tasklets' calls"] = process - total
            row["    of it the main thread"] = acc["@main thread"] * 1e9 / n
        rows[ins[0][: -len(" in")]] = row
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--job", choices=("rsf", "wc", "win"), default="rsf")
    ap.add_argument("--processes", default="1,2")
    ap.add_argument("--events", type=int, default=2_000_000)
    ap.add_argument("--words", type=int, default=5_000_000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--src", nargs="*", default=None, help="source trees to compare")
    ap.add_argument("--run", type=int, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.run:
        run_job(a)
        return
    sys.path.insert(0, HERE)
    import wordcount
    from benchlib import cache_path, write_corpus

    if a.job == "rsf":
        wordcount.write_rsf_file(cache_path(f"rsf-{a.events}-8"), a.events, 8)
    elif a.job == "wc":
        write_corpus(cache_path(f"corpus-{a.words}"), a.words)
    per = {"rsf": "running-sum|sink", "wc": "tokenize", "win": WIN_PER}[a.job]
    srcs = a.src or [os.path.join(os.path.dirname(HERE), "src")]
    load = os.getloadavg()
    print(f"load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at the start")
    best: dict[tuple[str, int, str], dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:  # private (0700): the hook runs from here
        with open(os.path.join(tmp, "sitecustomize.py"), "w", encoding="utf-8") as fh:
            fh.write(HOOK)
        for _ in range(a.rounds):
            for src in srcs:
                for p in (int(x) for x in a.processes.split(",")):
                    out = tempfile.mkdtemp(dir=tmp)
                    env = dict(os.environ, SLIPSTREAM_LAYERS_OUT=out, PYTHONPATH=f"{tmp}:{src}")
                    cmd = [sys.executable, __file__, "--run", str(p), "--job", a.job]
                    cmd += ["--events", str(a.events), "--words", str(a.words)]
                    subprocess.run(cmd, env=env, check=True)
                    time.sleep(0.2)  # the members' last writes
                    for who, row in layers(out, per).items():
                        old = best.get((src, p, who))
                        best[(src, p, who)] = (
                            row
                            if old is None
                            else {k: min(v, old.get(k, v)) for k, v in row.items()}
                        )
    for (src, p, who), row in sorted(best.items()):
        print(f"\n{src}, processes={p}, {who} ({row['items']:,.0f} items in), ns per item:")
        for k, v in row.items():
            if k != "items":
                print(f"  {k:<40}{v:>8.0f}")
    load = os.getloadavg()
    print(f"\nload {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at the end")


if __name__ == "__main__":
    main()
