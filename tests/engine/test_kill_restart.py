"""Kill -9 a job's process mid-stream and restart it from the snapshot store in a new
process: the final output is the same as an uninterrupted run (exactly-once)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from typing import Any

import pytest

from store_support import committed_ids, part_lines

N = 6000

SCRIPT = textwrap.dedent(
    """
    import sys
    import slipstream as ss
    from slipstream import DAG, Edge, JobConfig, ProcessingGuarantee
    from slipstream import processors as P, sinks, sources
    from slipstream.aggregate import summing

    store, out, mode, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    dag = DAG()
    # the run that is killed is paced; the restore produces what is left unpaced
    src = dag.new_vertex("gen", sources.generator(lambda seq: seq, 4000 if mode == "fresh" else None, max_items=n))
    ident = dag.new_vertex("map", P.map(lambda x: x * 3))
    agg = dag.new_vertex("sum", P.aggregate_by_key(lambda x: x % 10, summing()))
    # files roll every 100 ms: each spans snapshots (resumed after the kill) and some
    # are published before it
    items = dag.new_vertex("items-out", sinks.write_files(out + "/items", roll_interval_ms=100))
    sums = dag.new_vertex("sums-out", sinks.write_files(out + "/sums"))
    dag.edge(Edge.between(src, ident))
    dag.edge(Edge.from_(ident, 0).to(agg).partitioned(lambda x: x % 10).distributed())
    dag.edge(Edge.from_(ident, 1).to(items))
    dag.edge(Edge.between(agg, sums))
    cfg = JobConfig(name="killme", processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE,
                    snapshot_interval_ms=50, snapshot_store=store)
    engine = ss.local()
    job = engine.new_job(dag, cfg, restore_from=store if mode == "restore" else None)
    print("started", flush=True)
    job.join(120)
    print("done", flush=True)
    """
)


@pytest.mark.slow
def test_sigkill_then_restart_from_store_gives_same_output(tmp_path: Any) -> None:
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    store, out = str(tmp_path / "store"), str(tmp_path / "out")
    args = [sys.executable, str(script), store, out]
    p = subprocess.Popen([*args, "fresh", str(N)], stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60

        def published() -> bool:
            items = os.path.join(out, "items")
            return os.path.isdir(items) and any(n.startswith("part-") for n in os.listdir(items))

        # wait for events, not time: under load the first snapshots can precede any output
        while not (len(committed_ids(store)) >= 3 and published()) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert committed_ids(store), "no snapshot was committed before the kill"
        p.send_signal(signal.SIGKILL)
        p.wait(10)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == -signal.SIGKILL
    killed_at = max(committed_ids(store))
    assert not os.listdir(os.path.join(out, "sums")) or not [
        n for n in os.listdir(os.path.join(out, "sums")) if n.startswith("part-")
    ]  # it was mid-stream: the aggregation had not emitted yet
    # a streaming sink's output appears snapshot by snapshot, before the job ends
    assert [n for n in os.listdir(os.path.join(out, "items")) if n.startswith("part-")]

    r = subprocess.run([*args, "restore", str(N)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert max(committed_ids(store)) > killed_at or "done" in r.stdout

    items = part_lines(os.path.join(out, "items"))
    assert sorted(int(x) for x in items) == [3 * i for i in range(N)]  # no loss, no duplicates
    sums = dict(eval(line) for line in part_lines(os.path.join(out, "sums")))  # noqa: S307
    expected: dict[int, int] = {}
    for i in range(N):
        expected[(3 * i) % 10] = expected.get((3 * i) % 10, 0) + 3 * i
    assert sums == expected
    assert not [n for n in os.listdir(os.path.join(out, "items")) if n.endswith(".tmp")]


DEAD_LETTER_SCRIPT = textwrap.dedent(
    """
    import sys
    import slipstream as ss
    from slipstream import DAG, Edge, JobConfig, ProcessingGuarantee
    from slipstream import processors as P, sinks, sources

    def triple(x):
        if x % 97 == 0:
            raise ValueError(f"no {x}")
        return x * 3

    store, out, mode, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    dag = DAG()
    # the run that is killed is paced; the restore produces what is left unpaced
    src = dag.new_vertex("gen", sources.generator(lambda seq: seq, 4000 if mode == "fresh" else None, max_items=n))
    work = dag.new_vertex("map", P.map(triple))
    items = dag.new_vertex("items-out", sinks.write_files(out + "/items", roll_interval_ms=100))
    dag.edge(Edge.between(src, work)).edge(Edge.between(work, items))
    cfg = JobConfig(name="dead-letters", processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE,
                    snapshot_interval_ms=50, snapshot_store=store,
                    on_item_error=sinks.write_files(out + "/dead", roll_interval_ms=100))
    job = ss.local().new_job(dag, cfg, restore_from=store if mode == "restore" else None)
    print("started", flush=True)
    job.join(120)
    print("done", flush=True)
    """
)


@pytest.mark.slow
def test_dead_letters_exactly_once_across_a_kill_and_restore(tmp_path: Any) -> None:
    """Issue 21, item 4: dead letters go through the DAG, so the snapshots cover them: a
    job killed with SIGKILL and restored writes each one once, as its other output."""
    script = tmp_path / "job.py"
    script.write_text(DEAD_LETTER_SCRIPT)
    store, out = str(tmp_path / "store"), str(tmp_path / "out")
    args = [sys.executable, str(script), store, out]
    p = subprocess.Popen([*args, "fresh", str(N)], stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60

        def published(kind: str) -> bool:
            d = os.path.join(out, kind)
            return os.path.isdir(d) and any(n.startswith("part-") for n in os.listdir(d))

        while not (len(committed_ids(store)) >= 3 and published("dead")) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert published("dead"), "no dead letter was published before the kill"
        p.send_signal(signal.SIGKILL)
        p.wait(10)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == -signal.SIGKILL
    before = len(part_lines(os.path.join(out, "dead")))
    r = subprocess.run([*args, "restore", str(N)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "done" in r.stdout
    bad = [i for i in range(N) if i % 97 == 0]
    dead = part_lines(os.path.join(out, "dead"))
    assert 0 < before < len(dead)  # some before the kill, the rest after the restore
    assert sorted(dead) == sorted(
        f"DeadLetter(vertex='map', item={i}, error='ValueError: no {i}', source=None)"
        for i in bad
    )
    items = part_lines(os.path.join(out, "items"))
    assert sorted(int(x) for x in items) == [3 * i for i in range(N) if i % 97]
