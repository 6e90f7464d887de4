"""The examples of docs/reference.md hold: every ``run(...) == ...`` in its tables is
evaluated (the page is part of this repository)."""

from __future__ import annotations

import operator
import re
from operator import itemgetter
from pathlib import Path
from typing import Any

import pytest

import slipstream.aggregate as agg

DOC = Path(__file__).resolve().parent.parent / "docs" / "reference.md"


def run(op: Any, items: Any) -> Any:
    acc = op.create()
    for item in items:
        acc = op.accumulate(acc, item)
    return op.finish(acc)


def run2(op: Any, inputs: Any) -> Any:
    acc = op.create()
    for ordinal, items in enumerate(inputs):
        for item in items:
            acc = op.accumulate_fn(ordinal)(acc, item)
    return op.finish(acc)


def examples() -> list[str]:
    text = DOC.read_text(encoding="utf-8")
    return re.findall(r"\| `(run2?\(.*?)` \|\s*$", text, flags=re.M)


def test_the_page_has_an_example_for_every_aggregate_operation() -> None:
    found = " ".join(examples())
    public = [n for n in agg.__all__ if n[0].islower() and n not in ("identity", "to_map")]
    missing = [n for n in public if f"{n}(" not in found]
    assert not missing, f"docs/reference.md has no example for {missing}"


@pytest.mark.parametrize("example", examples())
def test_example(example: str) -> None:
    namespace = {**vars(agg), "run": run, "run2": run2, "operator": operator, "itemgetter": itemgetter}
    assert eval(example, namespace), example  # noqa: S307 - our own documentation
