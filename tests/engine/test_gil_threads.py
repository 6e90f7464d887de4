"""cooperative_threads > 1 on a GIL build: one thread and a warning, unless allowed
(issue 12: extra threads never make a job slower than one; bench/threads.py measures)."""

from __future__ import annotations

import warnings
from collections import Counter

import pytest

import slipstream as ss
from slipstream import DAG, Edge, sinks, sources
from slipstream import processors as P
from slipstream.aggregate import counting
from slipstream.engine.local import ALLOW_GIL_THREADS_ENV, GilThreadsWarning, gil_enabled

pytestmark = pytest.mark.skipif(not gil_enabled(), reason="free-threaded build: no clamp")

WORDS = [f"w{i * 7 % 50}" for i in range(5000)]


@pytest.fixture(autouse=True)
def _default_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    """The user's default, not the suite's (tests/conftest.py allows GIL threads)."""
    monkeypatch.delenv(ALLOW_GIL_THREADS_ENV, raising=False)


def word_count(engine: ss.LocalEngine) -> list[tuple[str, int]]:
    dag = DAG()
    src = dag.new_vertex("words", sources.items(WORDS))
    acc = dag.new_vertex("acc", P.accumulate_by_key(str, counting()))
    comb = dag.new_vertex("comb", P.combine_by_key(counting()))
    out = dag.new_vertex("sink", sinks.list_sink("counts")).local_parallelism(1)
    dag.edge(Edge.between(src, acc).partitioned(str))
    dag.edge(Edge.between(acc, comb).distributed().partitioned(ss.entry_key))
    dag.edge(Edge.between(comb, out))
    engine.new_job(dag).join(60)
    return sorted(engine.get_list("counts"))


def test_two_threads_run_as_one_and_warn_naming_the_setting() -> None:
    with pytest.warns(GilThreadsWarning) as caught:
        engine = ss.local(cooperative_threads=2)
    message = str(caught[0].message)
    assert "cooperative_threads=2" in message and "allow_gil_threads=True" in message
    assert caught[0].filename == __file__  # points at the user's ss.local(...) call
    assert engine.cooperative_threads == 1 and engine.default_parallelism == 1
    assert engine.requested_cooperative_threads == 2


def test_results_with_two_threads_equal_one_thread() -> None:
    expected = sorted(Counter(WORDS).items())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one thread asked for: no warning
        assert word_count(ss.local(cooperative_threads=1)) == expected
    with pytest.warns(GilThreadsWarning):
        clamped = ss.local(cooperative_threads=2)
    assert word_count(clamped) == expected
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        allowed = ss.local(cooperative_threads=2, allow_gil_threads=True)
    assert allowed.cooperative_threads == 2 and allowed.default_parallelism == 2
    assert word_count(allowed) == expected


def test_environment_variable_allows_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ALLOW_GIL_THREADS_ENV, "1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        engine = ss.local(cooperative_threads=3)
    assert engine.cooperative_threads == 3
    with pytest.warns(GilThreadsWarning):  # an explicit False wins over the variable
        assert ss.local(cooperative_threads=3, allow_gil_threads=False).cooperative_threads == 1
