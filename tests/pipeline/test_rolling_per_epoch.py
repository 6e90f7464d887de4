"""``rolling_aggregate(op, per_epoch=True)``: once per epoch (snapshot interval, or the
end of the input) the latest value of every key that changed, with the items
pre-aggregated per key before the shuffle (issue 23; Structured Streaming's update
mode). The default ``rolling_aggregate`` (one output per item) is unchanged."""

from __future__ import annotations

import operator
from collections import Counter, defaultdict
from typing import Any

import pytest

import slipstream as ss
from slipstream import sinks, sources
from slipstream.aggregate import AggregateOperation, counting, summing
from slipstream.pipeline import PipelineError
from slipstream.pipeline.keyed import rolling_latest, rolling_partials
from slipstream.testing import verify_processor

WORDS = "to be or not to be that is the question to be".split()


def _key(w: str) -> str:
    return w


def _sums_equal(expected: list[Any], actual: list[Any]) -> bool:
    """The partials emitted, whatever the snapshot points split them into, add up to
    each key's total."""
    got: Counter[Any] = Counter()
    for k, v in actual:
        got[k] += v
    return got == Counter(dict(expected))


def test_partials_add_up_to_each_keys_count_at_every_snapshot_point() -> None:
    expected = sorted(Counter(WORDS).items())
    verify_processor(rolling_partials(_key, counting())).input(WORDS).output_checker(
        _sums_equal
    ).expect_output(expected)


def test_partials_of_a_sum_and_of_an_operation_without_additive() -> None:
    items = [(w, i) for i, w in enumerate(WORDS)]
    totals: Counter[str] = Counter()
    for w, i in items:
        totals[w] += i
    plain_sum = AggregateOperation(lambda: 0, lambda a, x: a + x[1], operator.add)
    for op in (summing(operator.itemgetter(1)), plain_sum):
        verify_processor(rolling_partials(operator.itemgetter(0), op)).input(items).output_checker(
            _sums_equal
        ).expect_output(sorted(totals.items()))


def test_latest_emits_each_changed_key_once_with_its_combined_value() -> None:
    partials = [("a", 2), ("b", 1), ("a", 3), ("c", 4), ("b", 1)]
    # without snapshots the one epoch is the whole input: each key once, its total
    verify_processor(rolling_latest(counting())).input(partials).disable_snapshots().output_checker(
        lambda e, a: sorted(a) == sorted(e)
    ).expect_output([("a", 5), ("b", 2), ("c", 4)])

    def latest_per_key(expected: list[Any], actual: list[Any]) -> bool:
        # with snapshots each point emits the keys changed since the last one: per key
        # the running totals at those points, increasing, ending at the total
        seen: dict[str, list[int]] = defaultdict(list)
        for k, v in actual:
            seen[k].append(v)
        return all(vs == sorted(set(vs)) for vs in seen.values()) and {
            k: vs[-1] for k, vs in seen.items()
        } == dict(expected)

    verify_processor(rolling_latest(counting())).input(partials).output_checker(
        latest_per_key
    ).expect_output([("a", 5), ("b", 2), ("c", 4)])


def test_a_batch_pipeline_emits_each_keys_final_count_once() -> None:
    p = ss.Pipeline()
    (
        p.read_from(sources.items(WORDS))
        .map(str.upper)
        .group_by(_key)
        .rolling_aggregate(counting(), per_epoch=True)
        .write_to(sinks.list_sink("counts"))
    )
    dag = p.to_dag()
    assert [v.name for v in dag.vertices] == [
        "source",
        "map+rolling_aggregate-partials",  # the map runs inside the partials
        "rolling_aggregate",
        "sink",
    ]
    engine = ss.local()
    engine.new_job(p).join()
    assert sorted(engine.get_list("counts")) == sorted(Counter(w.upper() for w in WORDS).items())


def test_per_epoch_needs_an_operation_that_combines() -> None:
    no_combine = AggregateOperation(lambda: 0, lambda a, _x: a + 1)
    p = ss.Pipeline()
    stage = p.read_from(sources.items(WORDS)).group_by(_key)
    with pytest.raises(PipelineError) as info:
        stage.rolling_aggregate(no_combine, per_epoch=True)
    assert str(info.value) == (
        "rolling_aggregate(per_epoch=True): the operation cannot combine accumulators "
        "(op.combine is None), and the once-per-epoch form combines each epoch's per-key "
        "partials; give the AggregateOperation a combine"
    )
    stage.rolling_aggregate(no_combine)  # the per-item form needs no combine


def _upper(w: str) -> str:
    return w.upper()


def test_an_item_whose_key_function_raises_is_skipped_under_skip() -> None:
    """The partials apply the stage's bad-record policy (the C-speed count finds the
    failing item and goes on after it)."""
    items = [*WORDS[:5], None, *WORDS[5:], None]
    p = ss.Pipeline()
    (
        p.read_from(sources.items(items))
        .group_by(_upper)
        .rolling_aggregate(counting(), per_epoch=True)
        .on_item_error("skip")
        .write_to(sinks.list_sink("counts"))
    )
    engine = ss.local()
    job = engine.new_job(p)
    job.join()
    assert sorted(engine.get_list("counts")) == sorted(Counter(map(_upper, WORDS)).items())
    assert job.metrics["rolling_aggregate-partials"]["items_skipped"] == 2


def test_without_a_processing_guarantee_an_unbounded_job_emits_every_second() -> None:
    """No snapshots end its epochs: before, ``per_epoch=True`` on an unbounded embedded
    job with no processing guarantee emitted nothing until the input ended (never)."""
    import time

    p = ss.Pipeline()
    (
        p.read_from(sources.generator(lambda seq: seq % 3, 2000.0))
        .group_by(_key)
        .rolling_aggregate(counting(), per_epoch=True)
        .write_to(sinks.list_sink("latest"))
    )
    engine = ss.local()
    try:
        job = engine.new_job(p)
        latest = engine.get_list("latest")
        deadline = time.monotonic() + 60  # epochs of 1 s; the deadline is only a guard
        while len({k for k, _ in list(latest)}) < 3 or len(latest) < 6:  # two epochs
            assert not job.status.is_terminal, job.status
            assert time.monotonic() < deadline, list(latest)
            time.sleep(0.02)
        job.cancel()
        seen: dict[int, list[int]] = defaultdict(list)
        for k, n in list(latest):
            seen[k].append(n)
        assert set(seen) == {0, 1, 2}
        assert all(counts == sorted(set(counts)) for counts in seen.values()), seen
    finally:
        engine.shutdown()
