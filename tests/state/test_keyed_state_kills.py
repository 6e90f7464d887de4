"""A custom keyed processor on ``keyed_state(context)`` under exactly-once, its process
killed with SIGKILL at random moments (some runs twice) and resumed from its snapshot
store in a new process: the output holds every item's result exactly once (issue 22:
incremental snapshots must lose and duplicate nothing, whenever the process dies: while
a base or a delta is written, between them, during a compaction)."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from seed_pool import SeedRuns, seed_runs
from store_support import part_lines

N = 16_000
KEYS = 2_000  # even: key parity = sequence parity = the generator processor emitting it

SCRIPT = textwrap.dedent(
    """
    import sys
    import slipstream as ss
    from slipstream import DAG, Edge, JobConfig, ProcessingGuarantee, sinks, sources
    from slipstream.state.keyed import keyed_state

    class RollingCount(ss.AbstractProcessor):
        # per key: how many of its items arrived since it was last reset; an item whose
        # sequence number is divisible by 37 resets (removes) its key
        def init_processor(self, context):
            self.counts = keyed_state(context)

        def process(self, ordinal, inbox):
            counts, dirty = self.counts, self.counts.dirty
            while inbox:
                seq = inbox[0]
                key = seq % KEYS
                if seq % 37 == 0:
                    out = (key, 0)
                else:
                    out = (key, counts.get(key, 0) + 1)
                if not self.try_emit(out):
                    return
                inbox.popleft()
                if out[1]:
                    counts[key] = out[1]
                else:
                    counts.pop(key, None)
                if dirty is not None:
                    dirty.add(key)

        def save_to_snapshot(self):
            return self.outbox.offer_to_snapshot(*self.counts.snapshot_entry())

        def restore_from_snapshot_entry(self, key, value):
            self.counts[key] = value

    store, out = sys.argv[1], sys.argv[2]
    dag = DAG()
    # the runs the test kills are paced; the last one, resumed to the end, is not
    rate = 8000 if sys.argv[4] == "paced" else None
    gen = dag.new_vertex("gen", sources.generator(lambda seq: seq, rate, max_items=N_ITEMS))
    gen.local_parallelism(2)
    counts = dag.new_vertex("counts", RollingCount).local_parallelism(3)
    sink = dag.new_vertex("out", sinks.write_files(out, roll_interval_ms=50)).local_parallelism(1)
    dag.edge(Edge.between(gen, counts).partitioned(lambda seq: seq % KEYS).distributed())
    dag.edge(Edge.between(counts, sink))
    cfg = JobConfig(name="keyed-kill", processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE,
                    snapshot_interval_ms=20, snapshot_store=store, resume=True,
                    snapshot_writer=sys.argv[3])
    job = ss.local().new_job(dag, cfg)
    seen = None
    while True:
        # report committed snapshots and items emitted (the test kills at a point of
        # its choosing), until the end
        try:
            job.join(0.005)
            break
        except TimeoutError:
            pass
        m = job.metrics
        now = (m["__job__"]["snapshots"], m["gen"]["items_out"])
        if now != seen:
            seen = now
            print("progress", *now, flush=True)
    print("done", flush=True)
    """
).replace("N_ITEMS", str(N)).replace("KEYS", str(KEYS))


def expected() -> Counter[str]:
    counts: dict[int, int] = {}
    out: Counter[str] = Counter()
    for seq in range(N):
        key = seq % KEYS
        if seq % 37 == 0:
            counts.pop(key, None)
            out[str((key, 0))] += 1
        else:
            counts[key] = counts.get(key, 0) + 1
            out[str((key, counts[key]))] += 1
    return out


def run_until_killed(args: list[str], rnd: random.Random, share: float) -> bool:
    """Start the job; once it committed a snapshot and its generator emitted ``share`` of
    the items (this execution's count), wait a random moment (0..50 ms) and SIGKILL it.
    Returns whether it was killed (it may complete first). Chains are compacted once they
    hold more than a few deltas, so most kills come while compactions run or between
    them; the late ones while the job completes."""
    threshold = share * N
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert p.stdout is not None
        for line in p.stdout:
            if line.startswith("done"):
                break
            if line.startswith("progress"):
                snapshots, emitted = map(int, line.split()[1:])
                if snapshots >= 1 and emitted >= threshold:
                    time.sleep(rnd.uniform(0, 0.05))  # a random moment, not a wait for an outcome
                    p.send_signal(signal.SIGKILL)
                    break
        p.wait(60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
    return p.returncode == -signal.SIGKILL


def kill_and_resume(tmp_path: Path, seed: int, writer: str) -> None:
    """One seed's scenario: kill once or twice, resume, check the output."""
    rnd = random.Random(seed)
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    store, out = str(tmp_path / "store"), str(tmp_path / "out")
    args = [sys.executable, str(script), store, out, writer]
    # the first run dies before its generator is through (so every seed kills), after
    # 2%..95% of the items; odd seeds kill the resumed run too, anywhere up to its end
    # (it may complete first: then it is not run again, a completed store starts fresh)
    killed = run_until_killed([*args, "paced"], rnd, rnd.uniform(0.02, 0.95))
    assert killed, "the job completed before it could be killed"
    if seed % 2:
        killed = run_until_killed([*args, "paced"], rnd, rnd.uniform(0.0, 1.0))
    if killed:
        r = subprocess.run([*args, "free"], capture_output=True, text=True, timeout=180)
        assert r.returncode == 0, r.stderr[-3000:]
        assert "done" in r.stdout
    got = Counter(part_lines(out))
    want = expected()
    assert got == want, (
        f"lost {sum((want - got).values())} (e.g. {sorted(want - got)[:3]}), "
        f"duplicated {sum((got - want).values())} (e.g. {sorted(got - want)[:3]})"
    )


@pytest.fixture(scope="module")
def seeds(request: pytest.FixtureRequest) -> Iterator[SeedRuns]:
    yield from seed_runs(request, kill_and_resume)  # two seeds at a time


@pytest.mark.slow
@pytest.mark.parametrize("writer", ["thread", "fork"])
# 12 seeds a writer: six kill once and six twice (odd seeds), at random shares of the items
@pytest.mark.parametrize("seed", range(12))
def test_sigkill_at_random_moments_loses_and_duplicates_nothing(
    seeds: SeedRuns, seed: int, writer: str
) -> None:
    seeds.result(seed=seed, writer=writer)
