"""Differential tests: each example's pipeline gives the same results as the example's
hand-wired Core API DAG, and both agree with a plain-Python oracle."""

from __future__ import annotations

import importlib.util
import os
import sys
from collections import Counter
from typing import Any

import pytest

import slipstream as ss
from slipstream import sinks, sources
from slipstream.window import sliding_window_def

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_example(name: str) -> Any:
    """``examples/<name>.py`` as a module (the examples are scripts, not a package)."""
    module_name = f"slipstream_example_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(
        module_name, os.path.join(ROOT, "examples", f"{name}.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


def run(job: Any, name: str, members: int = 1) -> list[Any]:
    engine = ss.local(members=members, cooperative_threads=2 if members > 1 else None)
    engine.new_job(job, ss.JobConfig(name="example")).join(timeout=120)
    return engine.get_list(name)


@pytest.mark.parametrize("members", [1, 2])
def test_wordcount_pipeline_equals_the_hand_wired_dag(tmp_path: Any, members: int) -> None:
    wc = load_example("wordcount")
    wc.generate_corpus(str(tmp_path), 20_000, files=3)
    by_pipeline = run(wc.build_pipeline(str(tmp_path)), "counts", members)
    by_dag = run(wc.build_dag(str(tmp_path)), "counts", members)
    oracle: Counter[str] = Counter()
    for f in sorted(os.listdir(tmp_path)):
        with open(tmp_path / f, encoding="utf-8") as fh:
            for line in fh:
                oracle.update(wc.tokenize(line))
    assert sorted(by_pipeline) == sorted(by_dag) == sorted(oracle.items())


def test_wordcount_pipeline_fuses_the_tokenizer() -> None:
    dag = load_example("wordcount").build_pipeline("/nonexistent").to_dag()
    assert [v.name for v in dag.vertices] == [
        "source",
        "tokenize+count-accumulate",
        "count-combine",
        "sink",
    ]


class FixedTrades:
    """Deterministic trades: ticker, price and quantity from the example's hash, the
    timestamp 2 ms apart with up to 150 ms of disorder (covered by the 300 ms lag)."""

    def __init__(self, tm: Any) -> None:
        self.tm = tm

    def __call__(self, seq: int) -> Any:
        tm = self.tm
        t = tm.TradeMaker(0)(seq)
        h = tm._mix(seq)
        return t._replace(timestamp_ms=1_000_000 + 2 * seq - (h >> 40) % 150)


def test_trade_monitor_pipeline_equals_the_hand_wired_dag() -> None:
    tm = load_example("trade_monitor")
    wd = sliding_window_def(2000, 500)
    trades = [FixedTrades(tm)(i) for i in range(8000)]

    def build(builder: Any) -> Any:
        return builder(0, wd, 300, 150, sink=sinks.list_sink("w"), trades=sources.items(trades))

    by_pipeline = sorted(run(build(tm.build_pipeline), "w"))
    by_dag = sorted(run(build(tm.build_dag), "w"))
    oracle: dict[tuple[int, str], list[Any]] = {}
    for t in trades:
        frame_end = t.timestamp_ms - t.timestamp_ms % 500 + 500
        for end in range(frame_end, frame_end + 2000, 500):
            acc = oracle.setdefault((end, t.ticker), [0, 0.0])
            acc[0] += 1
            acc[1] += t.price * t.quantity
    expected = sorted((e - 2000, e, k, n, v) for (e, k), (n, v) in oracle.items())
    for results in (by_pipeline, by_dag):
        got = [(r.start, r.end, r.key, r.value[0], r.value[1]) for r in results]
        assert [g[:4] for g in got] == [x[:4] for x in expected]
        # volumes are float sums: the order of additions differs between the jobs
        assert [g[4] for g in got] == pytest.approx([x[4] for x in expected])
