"""Smoke test of bench/live_save_steps.py (the CPU time of copy-on-write save steps): at
a toy size, run as a user runs it, a line per save and pattern with its steps' figures
(at 40k keys the delta pattern's changed keys are copied at the barrier instead)."""

from __future__ import annotations

import re
from pathlib import Path

from bench_support import run_bench


def test_live_save_steps_prints_a_line_per_save(tmp_path: Path) -> None:
    out = run_bench(tmp_path, "live_save_steps.py", "--keys", "40k", "--saves", "1")
    line = r" save of +[\d,]+ keys: +\d+ steps, +[\d.]+ ms \(longest +[\d.]+ ms\); \d+ batches +[\d.]+ ms$"
    assert len(re.findall(r"^writes   full " + line, out, re.M)) == 2, out
    assert len(re.findall(r"^inserts  full " + line, out, re.M)) == 2, out
    # 1 % of 40k keys is under LIVE_SAVE_MIN_KEYS: that delta is copied at the barrier
    assert re.search(r"^delta    save 2: copied at the barrier", out, re.M), out
