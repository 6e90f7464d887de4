"""A preview of member processes (issue 24): word count's DAG split over 2 OS processes
with the kernel's pieces, before ``ss.local(processes=N)`` exists.

    python bench/member_split.py [--words 5000000] [--repeat 3]

Each member process builds the DAG (examples/wordcount.py's ``build_dag`` with
``str.split``, as ``bench/wordcount.py``), its plan for 2 members, wires its own side
(``plan.wire(..., queue_factory=MemberChannels(...), member=m)``) and runs its processor
tasklets and its channel senders/receivers on one ``WorkerPool`` worker thread. Only the
distributed edge (accumulate -> combine: the partial counts) crosses processes. The
``1 process`` row runs the same harness with one member in one child process; ``plain``
is the dict loop of ``bench/wordcount.py``. Time: from "go" (every child built and
initialised its tasklets, the start-up is not counted) until every member finished; CPU:
the members' own, summed, and the busiest member's: on a machine whose cores are busy
with other work the wall time says little, and ``plain cpu / busiest member cpu`` is
what the split would give with a core per member. The counts are checked equal to the
plain loop's.

Internals, not the documented API: this measures what the channel seam allows, not a
user's job; ``bench/wordcount.py`` stays the reference for the engine.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import threading
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import cache_path, count_words, load_example, write_corpus  # noqa: E402

from slipstream.core.config import JobConfig, ProcessingGuarantee  # noqa: E402
from slipstream.core.services import InMemoryServices  # noqa: E402
from slipstream.engine.workers import WorkerPool  # noqa: E402
from slipstream.execution.plan import build_vertex_plans, wire  # noqa: E402
from slipstream.execution.remote import MemberChannels, channel_sockets  # noqa: E402
from slipstream.execution.tasklet import ProcessorTasklet  # noqa: E402

build_dag = load_example("wordcount").build_dag


def plain(directory: str) -> tuple[dict[str, int], float, float, float]:
    t0, c0 = time.perf_counter(), time.process_time()
    counts = count_words(directory)
    cpu = time.process_time() - c0
    return counts, time.perf_counter() - t0, cpu, cpu


def member(directory: str, m: int, members: int, sockets: dict[Any, Any], control: Any) -> None:
    dag = build_dag(directory, "*.txt", str.split)
    services = InMemoryServices()
    plans = build_vertex_plans(dag, JobConfig(), members, 1, services, "wc-split")
    if members == 1:
        specs = wire(dag, plans, ProcessingGuarantee.NONE)
        channel_tasklets: list[Any] = []
    else:
        channels = MemberChannels(m, dag, plans, sockets)
        specs = wire(dag, plans, ProcessingGuarantee.NONE, channels, member=m)
        channel_tasklets = channels.tasklets
    tasklets = [ProcessorTasklet(s.processor, s.context, s.inbound, s.outbound) for s in specs]
    for t in tasklets:
        t.init()
    finished = threading.Event()
    failures: list[Any] = []
    pool = WorkerPool([*tasklets, *channel_tasklets], 1, failures.append, finished.set)
    control.send("ready")
    assert control.recv() == "go"
    c0, t0 = time.process_time(), time.perf_counter()
    pool.start()
    finished.wait()
    cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    if failures:
        control.send(("failed", failures[0].traceback))
        return
    control.send(("done", (cpu, wall)))
    control.send(dict(services.get_list("counts")))


def split(directory: str, members: int) -> tuple[dict[str, int], float, float, float]:
    ctx = multiprocessing.get_context("forkserver")
    ends: dict[Any, Any] = {}
    if members > 1:
        dag = build_dag(directory, "*.txt", str.split)
        plans = build_vertex_plans(dag, JobConfig(), members, 1, InMemoryServices(), "wc-split")
        ends = channel_sockets(dag, plans)
    children = []
    for m in range(members):
        mine = {k: e[0] if k[1] == m else e[1] for k, e in ends.items() if m in k[1:]}
        parent, child = ctx.Pipe()
        p = ctx.Process(target=member, args=(directory, m, members, mine, child), daemon=True)
        p.start()
        child.close()
        children.append((p, parent))
    for e in ends.values():
        for s in e:
            s.close()
    for _, c in children:
        assert c.recv() == "ready"
    t0 = time.perf_counter()
    for _, c in children:
        c.send("go")
    cpus = []
    for _, c in children:
        status, value = c.recv()
        if status != "done":
            raise RuntimeError(value)
        cpus.append(value[0])
    wall = time.perf_counter() - t0
    counts: dict[str, int] = {}
    for p, c in children:
        counts.update(c.recv())
        p.join()
    return counts, wall, sum(cpus), max(cpus)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--words", type=int, default=5_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    directory = cache_path(f"corpus-{a.words}")
    write_corpus(directory, a.words)  # reused when present
    print(f"load: {os.getloadavg()[0]:.2f} (1 min), {os.cpu_count()} cores; {a.words:,} words")
    rows = {
        "plain": lambda: plain(directory),
        "1 process": lambda: split(directory, 1),
        "2 processes": lambda: split(directory, 2),
    }
    best: dict[str, tuple[float, float, float]] = {}
    want: dict[str, int] | None = None
    for _ in range(a.repeat):  # interleaved rounds
        for name, fn in rows.items():
            counts, wall, cpu, busiest = fn()
            if want is None:
                want = counts
            assert counts == want, f"{name}: the counts differ from the plain loop's"
            if name not in best or wall < best[name][0]:
                best[name] = (wall, cpu, busiest)
    wall0, _, cpu0 = best["plain"]
    print(
        f"{'variant':<14}{'wall s':>8}{'cpu s':>8}{'busiest member cpu s':>22}"
        f"{'vs plain, wall':>16}{'vs plain, busiest cpu':>23}"
    )
    for name, (wall, cpu, busiest) in best.items():
        print(
            f"{name:<14}{wall:>8.2f}{cpu:>8.2f}{busiest:>22.2f}{wall0 / wall:>15.2f}x"
            f"{cpu0 / busiest:>22.2f}x"
        )


if __name__ == "__main__":
    main()
