"""Smoke test of bench/channels.py's serialisation part (issue 24's choice of the channel's
serialisation): at a toy size, run as a user runs it, every variant delivers each payload's
items equal and of the same types as sent (the bench asserts it before timing) and the
table has a row per payload with a figure for every variant that can carry it."""

from __future__ import annotations

import re
from pathlib import Path

from bench_support import run_bench

#: the variants that cannot carry a payload (marshal would turn a bytearray into bytes)
CANNOT = {"row": ["marshal+scan"], "object": ["marshal+scan"], "bytearray": ["marshal+scan"]}


def test_serialisation_variants_round_trip_and_print_a_row_per_payload(tmp_path: Path) -> None:
    out = run_bench(
        tmp_path,
        "channels.py",
        "--skip-throughput",
        "--skip-latency",
        "--skip-start",
        "--ser-frames",
        "1",
        "--ser-rounds",
        "1",
    )
    header = re.search(r"^payload\s+items\s+(.*)$", out, re.M)
    assert header, out
    variants = re.split(r"\s{2,}", header.group(1).strip())
    assert variants == [
        "pickle 5",
        "p5 sendmsg",
        "p5 oob",
        "p5 oob 1 buf",
        "p5 oob joined",
        "arrow",
        "marshal+scan",
    ]
    for kind, items in [
        ("int", 1024),
        ("tuple", 1024),
        ("row", 1024),
        ("line", 1024),
        ("object", 1024),
        ("bytes", 16),
        ("bytearray", 16),
    ]:
        row = re.search(rf"^{kind}\s+{items}\s+(.*)$", out, re.M)
        assert row, (kind, out)
        cells = dict(zip(variants, row.group(1).split(), strict=True))
        for name, cell in cells.items():
            if name in CANNOT.get(kind, []):
                assert cell == "-", (kind, name, out)
            else:
                assert re.fullmatch(r"[\d,]+", cell), (kind, name, out)
