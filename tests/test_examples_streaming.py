"""Smoke tests of the streaming example and benchmark: they run as a user runs them (a
subprocess of the project's interpreter) and must print real window output.

Both need real time (the example runs for a wall-clock duration, the benchmark measures
latency at a fixed rate), hence the slow mark.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WINDOW_LINE = re.compile(
    r"^\[(\d\d:\d\d:\d\d\.\d{3}) - (\d\d:\d\d:\d\d\.\d{3})\)\s+([\d,]+) trades\s+\$\s*\S+\s+top: (.*?)(?:\s+\(\+(-?\d+) ms\))?$"
)


def _run(args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env
    )


@pytest.mark.slow
def test_trade_monitor_prints_windows_and_a_summary() -> None:
    r = _run(
        [
            "examples/trade_monitor.py",
            "--duration",
            "3",
            "--window-ms",
            "500",
            "--slide-ms",
            "250",
            "--rate",
            "2000",
        ],
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    windows = [m for m in map(WINDOW_LINE.match, lines) if m]
    # 3 s at a 250 ms slide with a 300 ms lag: about ten windows close; demand a few
    assert len(windows) >= 4, r.stdout
    ends = [m.group(2) for m in windows]
    assert ends == sorted(ends), "windows must be printed in order of their end"
    # windows 500 ms long whose ends step by 250 ms
    for m in windows:
        start, end = (_ms(m.group(i)) for i in (1, 2))
        assert (end - start) % 86_400_000 == 500
    for a, b in zip(ends, ends[1:], strict=False):
        assert (_ms(b) - _ms(a)) % 86_400_000 == 250
    # a full window holds ~rate * 0.5 s = 1,000 trades; at most 5 tickers are listed
    counts = [int(m.group(3).replace(",", "")) for m in windows]
    assert max(counts) > 500
    assert all(1 <= len(m.group(4).split("  ")) <= 5 for m in windows)
    # each window is printed after the watermark passed its end: at least the 300 ms lag
    # after it on the wall clock (the trades carry wall-clock timestamps)
    assert all(m.group(5) is not None and int(m.group(5)) >= 300 for m in windows), r.stdout
    summary = [ln for ln in lines if ln.startswith("summary:")]
    assert len(summary) == 1, r.stdout
    trades = int(re.search(r"summary: ([\d,]+) trades", summary[0]).group(1).replace(",", ""))  # type: ignore[union-attr]
    assert 2000 <= trades <= 8000  # ~3 s at 2,000 trades/s
    assert f"{len(windows)} windows printed" in summary[0]
    assert "0 late trades dropped" in summary[0]


def _ms(clock: str) -> int:
    h, m, s = clock.split(":")
    return (int(h) * 3600 + int(m) * 60) * 1000 + round(float(s) * 1000)


@pytest.mark.slow
def test_windowing_bench_quick_prints_every_table() -> None:
    r = _run(["bench/windowing.py", "--quick"], timeout=300)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    for title in (
        "(a) tumbling 1 s window",
        "(b) sliding 10 s window",
        "(c) end-to-end latency",
        "(d) exactly-once cost",
    ):
        assert title in out, out
    # every variant row of (a), (b) and (d) printed a ratio; the baselines are 1.00x
    for name in ("tumbling-plain", "sliding-plain", "eo-none"):
        assert re.search(rf"^{name}\s.*\s1\.00x\s", out, re.M), out
    for name in (
        "tumbling-single-stage",
        "tumbling-two-stage",
        "sliding-single-stage",
        "sliding-two-stage",
        "eo-1000",
        "eo-100",
    ):
        assert re.search(rf"^{name}\s+[\d.]+\s+[\d,]+\s+[\d.]+x\s+\d+$", out, re.M), out
    # the results of every variant were checked equal (the bench exits non-zero otherwise)
    assert out.count("(equal in every variant)") == 2
    for name in ("latency-single-stage", "latency-two-stage"):
        assert re.search(rf"^{name}\s+[\d,]+\s+[\d,]+(\s+-?[\d.]+){{6}}$", out, re.M), out
