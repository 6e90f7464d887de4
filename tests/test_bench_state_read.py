"""Smoke test of bench/state_read.py (issue 25's read figures): at toy sizes, run as a user
runs it, it prints its table with a row per key count (every variant timed, their answers
checked against DuckDB over Parquet by the bench itself) and leaves no file behind, in the
temporary directory or the home directory (the stores' signing keys go to the bench's
own directory).

It starts ~13 Python processes, hence the slow mark."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_state_read_quick_prints_its_table_and_leaves_no_files(tmp_path: Path) -> None:
    pytest.importorskip("duckdb")
    pytest.importorskip("pyarrow")
    home, tmp = tmp_path / "home", tmp_path / "tmp"
    home.mkdir()
    tmp.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("SLIPSTREAM_KEY_DIR", "XDG_STATE_HOME")}
    env.update(PYTHONUNBUFFERED="1", HOME=str(home), TMPDIR=str(tmp))
    r = subprocess.run(
        [sys.executable, "bench/state_read.py", "--quick", "--keys", "2k,5k"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    cell = r"[\d.]+ s \([\d,]+ MB\)"
    for keys in ("2,000", "5,000"):
        assert re.search(
            rf"^\| {keys} \| [\d.]+ / [\d.]+ MB \| {cell} \| {cell} \| {cell} \| {cell} "
            rf"\| [\d.]+ s \| {cell} \| \d+x \|$",
            r.stdout,
            re.M,
        ), r.stdout
    assert "| keys | store / parquet | read | to_arrow(read) | read_arrow | sql |" in r.stdout
    assert list(home.rglob("*")) == [] and list(tmp.rglob("*")) == []
