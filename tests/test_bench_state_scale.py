"""Smoke test of bench/state_scale.py (issue 22's yardstick): its --quick path at a toy
size, run as a user runs it, prints both tables with a row per key count and pattern.

It needs real time (snapshots are taken on a wall-clock interval), hence the slow mark.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_state_scale_quick_prints_both_tables() -> None:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    r = subprocess.run(
        [
            sys.executable,
            "bench/state_scale.py",
            "--quick",
            "--keys",
            "1000",
            "--items",
            "300000",
            "--interval-ms",
            "100",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    out = r.stdout
    for pattern in ("uniform", "skewed"):
        # throughput and memory: none/s, eo/s and its ratio, the CPU rates and ratio,
        # pause, commit mean and max, RSS none -> eo and its ratio
        assert re.search(
            rf"^\s+1k {pattern}\s+0\.3M(\s+[\d,]+){{2}}\s+[\d.]+x(\s+[\d,]+){{2}}\s+[\d.]+x"
            rf"\s+\d+ms\s+\d+ms\s+\d+ms\s+\d+\s+\d+\s+[\d.]+x",
            out,
            re.M,
        ), out
        # snapshots and restore: every one of the 1,000 keys restored from the eo run's store
        assert re.search(rf"^\s+1k {pattern}\s+\d+\s.*\s1,000(\s+[\d.]+){{3}}$", out, re.M), out
    assert "restore: read and verify its newest snapshot with state" in out
