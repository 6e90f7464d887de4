"""Smoke test of bench/state_read.py (issue 25's read figures): at toy sizes, run as a user
runs it, it prints its table with a row per key count (every variant timed, their answers
checked against DuckDB over Parquet by the bench itself) and leaves no file behind, in the
temporary directory or the home directory (the stores' signing keys go to the bench's
own directory).

It starts ~13 Python processes, hence the slow mark."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench_support import run_bench


@pytest.mark.slow
def test_state_read_quick_prints_its_table_and_leaves_no_files(tmp_path: Path) -> None:
    out = run_bench(tmp_path, "state_read.py", "--quick", "--keys", "2k,5k")
    cell = r"[\d.]+ s \([\d,]+ MB\)"
    for keys in ("2,000", "5,000"):
        assert re.search(
            rf"^\| {keys} \| [\d.]+ / [\d.]+ MB \| {cell} \| {cell} \| {cell} \| {cell} "
            rf"\| [\d.]+ s \| {cell} \| \d+x \|$",
            out,
            re.M,
        ), out
    assert "| keys | store / parquet | read | to_arrow(read) | read_arrow | sql |" in out
