"""Smoke test of bench/state_scale.py (issue 22's yardstick): its --quick path at a toy
size, run as a user runs it, prints both markdown tables with a row per key count and
pattern (the store's size on disk and the restore columns filled in), and leaves no file
behind: not in the temporary directory, not in the home directory (the stores' signing
keys and generation files go to ~/.local/state unless the key directory is pointed
elsewhere).

It needs real time (snapshots are taken on a wall-clock interval), hence the slow mark.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench_support import run_bench


@pytest.mark.slow
def test_state_scale_quick_prints_both_tables_and_leaves_no_files(tmp_path: Path) -> None:
    # 2M items with 20 ms snapshots: 10-12 snapshots a run at load 9 (a snapshot waits
    # for the previous commit, ~150 ms), as 4M with 50 ms gave 16-19, in 13 s instead of 19
    out = run_bench(
        tmp_path, "state_scale.py", "--quick", "--keys", "1k", "--items", "2000000", "--interval-ms", "20"
    )
    for pattern in ("uniform", "skewed"):
        # throughput, snapshots, pause, commit and memory
        assert re.search(
            rf"^\| 1,000 \| {pattern} \| 2\.0M \| [\d.]+M/s \| [\d.]+M/s \([\d.]+x\) \| [\d.]+x "
            rf"\| [\d.]+M / [\d.]+M/s \([\d.]+x\) "  # the steady state
            rf"\| \d+\*? \| [\d,]+ / [\d,]+ ms \([\d,.]+ ms\) \| [\d,]+ / [\d,]+ ms "
            rf"\| [\d,]+ -> [\d,]+ MB \([\d.]+x\) \|$",
            out,
            re.M,
        ), out
        # per-snapshot bytes against what changed, and both restores
        assert re.search(
            rf"^\| 1,000 \| {pattern} \| \d+ of \d+ \| [\d.]+ / [\d.]+ \| [\d,]+ \([\d.]+ %\) "
            rf"\| [\d.]+ / [\d.]+ \| [\d.]+x / [\d.]+x "
            rf"\| [\d.]+ \([\d.]+x\) "  # the store on disk, over one full snapshot
            rf"\| [\d.]+ \+ [\d.]+ = [\d.]+ s \| [\d.]+ \+ [\d.]+ = [\d.]+ s \| [\d.]+x \|$",
            out,
            re.M,
        ), out
    assert "- written / changed: each snapshot's bytes over" in out
    assert "- store on disk: the largest size of the store's files after a commit" in out
    assert "- steady state: the same rates over the items after every key exists" in out
