"""How long the steps of a copy-on-write save take (issue 22: a step holds the GIL, and a
tasklet on the same worker thread counts it in its pause), in CPU time of this thread,
so that the machine's load does not count.

    python bench/live_save_steps.py [--keys 3M] [--batch 2048] [--saves 2]

One process, no job: a ``KeyedState`` of K int keys (values 1, ``values_replaced``) as a
rolling count keeps it, saved copy-on-write the way the engine's tasklet drives it
(``LiveSave.step(LIVE_SAVE_STEP)``, then one "process()" batch of ``--batch`` items
between two steps), in three patterns:

    writes    full saves while the batches add 1 to keys in turn (the uniform pattern:
              existing keys written after the barrier)
    inserts   full saves while the batches create new keys (keys being created)
    delta     deltas of 1 % of the keys, spread evenly over the map (the skewed
              pattern's hot keys), while the batches write them

For each save: the steps' total and longest CPU time, and the batches' CPU time (what the
processor's items cost while the save is in progress). Run it with ``PYTHONPATH=src``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from types import SimpleNamespace
from typing import Any

from slipstream.state import live
from slipstream.state.keyed import KeyedState

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import count  # noqa: E402


def run(pattern: str, keys: int, batch: int, saves: int) -> None:
    ctx = SimpleNamespace(
        incremental_snapshots=True, current_snapshot_id=0, committed_snapshot_id=0, live_saves=[]
    )
    state = KeyedState(context=ctx)
    state.values_replaced = True
    dict.update(state, dict.fromkeys(range(keys), 1))
    hot = [j * 100 for j in range(keys // 100)]
    pos = 0
    new = keys

    def one_batch() -> None:
        nonlocal pos, new
        get = state.get
        if pattern == "writes":
            for k in range(pos, pos + batch):
                k %= keys
                state[k] = get(k, 0) + 1
            pos += batch
        elif pattern == "inserts":
            for k in range(new, new + batch):
                state[k] = get(k, 0) + 1
            new += batch
        else:
            for i in range(pos, pos + batch):
                k = hot[i % len(hot)]
                state[k] = get(k, 0) + 1
            pos += batch

    for sid in range(1, saves + 2):
        ctx.current_snapshot_id = sid
        ctx.committed_snapshot_id = sid - 1
        if pattern == "delta" and sid > 1:
            assert state.dirty is not None
            state.dirty.update(hot)
        else:
            state.mark_all()
        save: Any = state.snapshot_entry()[1].upserts
        if type(save) is not live.LiveSave:
            print(f"{pattern:8s} save {sid}: copied at the barrier (a small map or delta)")
            continue
        if sid == 1 and pattern == "delta":  # the first save is full: the base
            save.finish()
            ctx.live_saves.clear()
            continue
        steps = 0
        step_s = longest = batches_s = 0.0
        while True:
            t = time.thread_time()
            done = save.step(live.LIVE_SAVE_STEP)
            dt = time.thread_time() - t
            step_s += dt
            longest = max(longest, dt)
            steps += 1
            if done:
                break
            t = time.thread_time()
            one_batch()
            batches_s += time.thread_time() - t
        ctx.live_saves.clear()
        print(
            f"{pattern:8s} {save.mode:5s} save of {save.size:>10,} keys: {steps:4d} steps, "
            f"{step_s * 1e3:7.1f} ms (longest {longest * 1e3:5.1f} ms); "
            f"{steps - 1} batches {batches_s * 1e3:6.1f} ms",
            flush=True,
        )


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--keys", default="3M")
    ap.add_argument("--batch", type=int, default=2048)
    ap.add_argument("--saves", type=int, default=2)
    ap.add_argument("--patterns", default="writes,inserts,delta")
    a = ap.parse_args()
    for pattern in a.patterns.split(","):
        run(pattern, count(a.keys), a.batch, a.saves)


if __name__ == "__main__":
    main()
