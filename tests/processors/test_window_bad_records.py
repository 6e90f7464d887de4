"""Windows under the bad-record policy (issue 21, item 4): an item on which a window's
key, timestamp or value function raises is skipped, sent to the dead letters, or fails
the job with its own exception naming the item, as in the other processors. Each
window shape (sliding: the summing, counting, accumulate and itemgetter loops; stage 1 of
a two-stage window; session windows) gives, under "skip", exactly the windows of the
good items alone."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import pytest

import slipstream as ss
from slipstream import DAG, Edge, JobConfig, sinks, sources
from slipstream import processors as P
from slipstream.aggregate import AggregateOperation, counting, summing, to_list
from slipstream.core.item_errors import DeadLetter
from slipstream.window import session_window_def, sliding_window_def, tumbling_window_def

# batch jobs without watermarks: the windows come out when the input ends
pytestmark = pytest.mark.filterwarnings("ignore:.*emits windows on watermarks")

# (key, timestamp, value); the bad ones make a function raise
GOOD = [(f"k{i % 3}", i * 7, i) for i in range(60)]
BAD_KEY = ("bad-key", 100, 1)
BAD_TS = ("k0", "no time", 1)
BAD_VALUE = ("k1", 50, None)


def key_of(item: tuple[Any, ...]) -> Any:
    if item[0] == "bad-key":
        raise KeyError("no key for it")
    return item[0]


def ts_of(item: tuple[Any, ...]) -> int:
    if item[1] == "no time":
        raise ValueError("no time in it")
    return item[1]


def value_of(item: tuple[Any, ...]) -> int:
    if item[2] is None:
        raise LookupError("no value in it")
    return item[2]




def sliding(op: Any) -> Callable[[], Any]:
    return P.aggregate_to_sliding_window(
        key_fn=key_of, timestamp_fn=ts_of, window_def=sliding_window_def(40, 20), agg_op=op
    )


def run(items: list[Any], window: Any, config: JobConfig, stage2: Any = None) -> tuple[Any, Any]:
    """``items`` through ``window`` (and ``stage2``) on the embedded engine: (engine, job)."""
    dag = DAG()
    src = dag.new_vertex("src", sources.items(items)).local_parallelism(1)
    w = dag.new_vertex("window", window).local_parallelism(1)
    last = w
    dag.edge(Edge.between(src, w))
    if stage2 is not None:
        last = dag.new_vertex("stage2", stage2).local_parallelism(1)
        dag.edge(Edge.between(w, last))
    dag.edge(Edge.between(last, dag.new_vertex("out", sinks.list_sink("out"))))
    engine = ss.local()
    job = engine.new_job(dag, config)
    job.join(60)
    return engine, job


SHAPES: dict[str, tuple[Any, list[Any], Any]] = {
    # name: (window supplier, bad items, stage 2)
    "summing": (sliding(summing(value_of)), [BAD_KEY, BAD_TS, BAD_VALUE], None),
    "counting": (sliding(counting()), [BAD_KEY, BAD_TS], None),
    "accumulate": (
        sliding(AggregateOperation(list, lambda a, x: a + [value_of(x)], operator.add)),
        [BAD_KEY, BAD_TS, BAD_VALUE],
        None,
    ),
    "itemgetters": (
        # the one-pass loop for itemgetter functions: a short item raises IndexError
        P.aggregate_to_sliding_window(
            key_fn=operator.itemgetter(0),
            timestamp_fn=operator.itemgetter(1),
            window_def=tumbling_window_def(20),
            agg_op=summing(operator.itemgetter(2)),
        ),
        [("k0", 30)],
        None,
    ),
    "two-stage": (
        P.accumulate_by_frame(
            key_fn=key_of,
            timestamp_fn=ts_of,
            window_def=sliding_window_def(40, 20),
            agg_op=summing(value_of),
        ),
        [BAD_KEY, BAD_TS, BAD_VALUE],
        P.combine_to_sliding_window(window_def=sliding_window_def(40, 20), agg_op=summing(value_of)),
    ),
    "session": (
        P.aggregate_to_session_window(
            session_timeout=10, key_fn=key_of, timestamp_fn=ts_of, agg_op=to_list()
        ),
        [BAD_KEY, BAD_TS],
        None,
    ),
}


def mixed(bad: list[Any]) -> list[Any]:
    out = list(GOOD)
    for n, b in zip((5, 20, 40), bad, strict=False):
        out.insert(n, b)
    return out


@pytest.mark.parametrize("shape", list(SHAPES))
def test_skip_gives_the_windows_of_the_good_items(shape: str) -> None:
    window, bad, stage2 = SHAPES[shape]
    engine, _ = run(GOOD, window, JobConfig(), stage2)
    expected = engine.get_list("out")
    assert expected  # windows came out
    engine, job = run(mixed(bad), window, JobConfig(on_item_error="skip"), stage2)
    assert engine.get_list("out") == expected
    assert job.metrics["window"]["items_skipped"] == len(bad)


def test_dead_letters_of_a_window_carry_item_and_own_error() -> None:
    window, bad, _ = SHAPES["summing"]
    engine, job = run(mixed(bad), window, JobConfig(on_item_error=sinks.list_sink("bad")))
    assert job.metrics["window"]["items_skipped"] == 3
    # an inbox's timestamps are taken first (one pass), then keys and values
    assert engine.get_list("bad") == [
        DeadLetter("window", BAD_TS, "ValueError: no time in it", None),
        DeadLetter("window", BAD_KEY, "KeyError: 'no key for it'", None),
        DeadLetter("window", BAD_VALUE, "LookupError: no value in it", None),
    ]


@pytest.mark.parametrize(
    ("shape", "bad", "error"),
    [
        ("summing", BAD_KEY, "KeyError: 'no key for it'"),
        ("summing", BAD_TS, "ValueError: no time in it"),
        ("counting", BAD_KEY, "KeyError: 'no key for it'"),
        ("accumulate", BAD_VALUE, "LookupError: no value in it"),
        ("two-stage", BAD_TS, "ValueError: no time in it"),
        ("session", BAD_KEY, "KeyError: 'no key for it'"),
        ("session", BAD_TS, "ValueError: no time in it"),
        ("itemgetters", ("k0", 30), "IndexError: tuple index out of range"),
    ],
)
def test_fail_raises_the_functions_own_error_naming_the_item(
    shape: str, bad: Any, error: str
) -> None:
    window, _, stage2 = SHAPES[shape]
    with pytest.raises(ss.JobFailedError) as info:
        run(mixed([bad]), window, JobConfig(name="w"), stage2)
    assert str(info.value).split("\n")[0] == (
        f"job 'w' failed: vertex 'window', processor 0, on item {bad!r}: {error}"
    )
    # the original exception, not a TypeError around it
    assert type(info.value.__cause__).__name__ == error.split(":")[0]


def test_stage_2_of_a_two_stage_window_takes_no_policy() -> None:
    """Stage 2 runs no key or timestamp function of the user's, only combine, which the
    policy does not cover: setting one on its vertex says so."""
    dag = DAG()
    v = dag.new_vertex(
        "stage2", P.combine_to_sliding_window(window_def=tumbling_window_def(20), agg_op=counting())
    )
    with pytest.raises(ss.DagError, match="^vertex 'stage2': on_item_error needs processors"):
        v.on_item_error("skip")


@pytest.mark.parametrize("window_def", [sliding_window_def(40, 20), session_window_def(10)])
def test_a_pipeline_window_skips_items_whose_key_function_raises(window_def: Any) -> None:
    """The Pipeline's window (one or two stages, whichever it compiles to) under a
    job-wide "skip": the windows of the good items, the bad key counted."""

    def build(items: list[Any]) -> ss.Pipeline:
        p = ss.Pipeline()
        timed = p.read_from(sources.items(items)).with_timestamps(operator.itemgetter(1), 0)
        timed.group_by(key_of).window(window_def).aggregate(summing(value_of)).write_to(
            sinks.list_sink("out")
        )
        return p

    engine = ss.local()
    engine.new_job(build(GOOD)).join(60)
    expected = sorted(engine.get_list("out"))
    engine = ss.local()
    job = engine.new_job(build(mixed([BAD_KEY, BAD_VALUE])), JobConfig(on_item_error="skip"))
    job.join(60)
    assert sorted(engine.get_list("out")) == expected
    skipped = {v: m["items_skipped"] for v, m in job.metrics.items() if m.get("items_skipped")}
    assert sum(skipped.values()) == 2
