"""The pieces of the bad-record policy (slipstream.core.item_errors, .dead_letters): the
item recorded on an error, the handler's three answers, the warning's rate limit and
text, the policy's validation and the dead-letter edges added to a DAG."""

from __future__ import annotations

import logging
from typing import Any

import pytest

import slipstream as ss
from slipstream import DAG, Edge, JobConfig, sinks, sources
from slipstream import processors as P
from slipstream.core.dead_letters import is_dead_letter_edge, with_dead_letters
from slipstream.core.item_errors import (
    DeadLetter,
    ItemErrorReport,
    ItemErrors,
    blame,
    blamed,
    check_policy,
    on_item,
)
from slipstream.core.outbox import Outbox
from slipstream.core.processor import Context

REPEAT = " (repeated at most once a minute while items fail)"


def test_the_first_blame_wins_and_the_item_repr_is_bounded() -> None:
    e = ValueError("bad")
    blame(e, "x" * 500, "data/a.csv:3")
    blame(e, "outer item")
    assert blamed(e) == ("x" * 500, "data/a.csv:3")
    assert on_item(e) == f", on item '{'x' * 199}... (502 characters) (data/a.csv:3)"
    assert on_item(ValueError("never blamed")) == ""


def test_fail_names_the_item_skip_counts_it_a_sink_gets_a_dead_letter() -> None:
    ctx = Context("parse")
    fail = ItemErrors(ctx)
    e = ValueError("no")
    assert fail.handle("a", e) is False and blamed(e) == ("a", None)
    assert "items_skipped" not in ctx.metrics

    skip = ItemErrors(ctx, skip=True)
    assert ctx.metrics == {"items_skipped": 0}  # there from the start
    assert skip.handle("b", KeyError("k")) is True
    assert ctx.metrics == {"items_skipped": 1}

    outbox = Outbox(2, capacity=1)
    dead = ItemErrors(ctx, side_ordinal=1, target="dead-letters")
    dead.bind(outbox)
    dead.bind(Outbox(1))  # a wrapped processor's private outbox: the first one stays
    outbox.buckets[1].append("already full")
    assert dead.handle("c", ZeroDivisionError("division by zero"), "f.csv:9") is True
    assert outbox.buckets[1] == [
        "already full",  # past the capacity: the engine hands the bucket on
        DeadLetter("parse", "c", "ZeroDivisionError: division by zero", "f.csv:9"),
    ]
    assert outbox.offer("data") and outbox.buckets[0] == ["data"]  # side left out
    assert ctx.metrics == {"items_skipped": 2}


def test_the_warning_at_once_then_once_a_minute_then_the_total(caplog: Any) -> None:
    now = [10.0]
    report = ItemErrorReport("etl", logging.getLogger("t"), clock=lambda: now[0])
    with caplog.at_level(logging.WARNING):
        report.add("parse", "a;b", ValueError("not enough values"))
        now[0] += 59.0
        report.add("parse", "c", ValueError("x"))  # within the minute: counted only
        now[0] += 1.0
        report.add("enrich", 7, KeyError(7), "data/in.csv:8", "dead-letters")
        now[0] += 5.0
        report.add("parse", "d", ValueError("y"))
        report.finish()
    assert [r.getMessage() for r in caplog.records] == [
        "job 'etl' skipped 1 item on which user code raised so far (vertex 'parse': 1); the "
        "last: vertex 'parse', item 'a;b': ValueError: not enough values. See "
        f"docs/troubleshooting.md{REPEAT}",
        "job 'etl' skipped 3 items on which user code raised so far (vertex 'enrich': 1 sent "
        "to 'dead-letters', vertex 'parse': 2); the last: vertex 'enrich', item 7 "
        f"(data/in.csv:8): KeyError: 7. See docs/troubleshooting.md{REPEAT}",
        "job 'etl' skipped 4 items on which user code raised in all (vertex 'enrich': 1 sent "
        "to 'dead-letters', vertex 'parse': 3); the last: vertex 'parse', item 'd': "
        "ValueError: y. See docs/troubleshooting.md",
    ]
    assert report.counts == {"parse": 3, "enrich": 1}


def test_one_item_is_one_warning(caplog: Any) -> None:
    report = ItemErrorReport("etl", logging.getLogger("t"))
    with caplog.at_level(logging.WARNING):
        report.add("parse", "x", ValueError("v"))
        report.finish()  # nothing new since the first warning
    assert len(caplog.records) == 1


def test_the_policy_is_checked() -> None:
    assert check_policy("skip", "JobConfig") == "skip"
    with pytest.raises(ValueError) as info:
        JobConfig(on_item_error="ignore")
    assert str(info.value) == (
        "JobConfig: on_item_error must be 'fail', 'skip' or a sink to send the items to "
        "(e.g. sinks.list_sink('bad'), or a sink vertex of the DAG), got 'ignore'"
    )
    with pytest.raises(TypeError) as info2:
        JobConfig(on_item_error=P.map(str))
    assert str(info2.value).startswith("JobConfig: on_item_error=functools.partial(")
    assert str(info2.value).endswith(
        "is not a sink; give a sink (e.g. sinks.list_sink('bad'), sinks.write_jsonl('bad/')) "
        "to send the items to"
    )
    with pytest.raises(TypeError, match="must be 'fail', 'skip' or a sink"):
        JobConfig(on_item_error=42)


def test_a_vertex_policy_needs_processors_that_apply_it() -> None:
    dag = DAG()
    src = dag.new_vertex("src", sources.items([1]))
    with pytest.raises(ss.DagError) as info:
        src.on_item_error("skip")
    assert str(info.value).startswith(
        "vertex 'src': on_item_error needs processors that handle item errors (map, filter, "
        "flat_map, service calls, aggregations, a Pipeline's stages; a processor of your own "
        "declares handles_item_errors = True), and functools.partial("
    )
    m = dag.new_vertex("m", P.map(str))
    assert m.on_item_error("skip") is m and m.get_on_item_error() == "skip"
    with pytest.raises(ss.DagError, match="vertex 'm': on_item_error must be"):
        m.on_item_error("drop")


def _dag() -> tuple[DAG, Any, Any, Any]:
    dag = DAG()
    src = dag.new_vertex("src", sources.items([1]))
    a = dag.new_vertex("a", P.map(str))
    b = dag.new_vertex("b", P.filter(bool))
    out = dag.new_vertex("out", sinks.list_sink("out"))
    dag.edge(Edge.between(src, a)).edge(Edge.between(a, b)).edge(Edge.between(b, out))
    return dag, a, b, out


def test_no_sink_no_new_dag() -> None:
    dag, a, _b, _out = _dag()
    a.on_item_error("skip")
    assert with_dead_letters(dag, "fail") is dag
    assert with_dead_letters(dag, "skip") is dag


def test_dead_letter_edges_go_on_the_next_free_ordinals_of_a_copy() -> None:
    dag, a, b, _out = _dag()
    own = sinks.list_sink("a-bad")
    a.on_item_error(own)
    job_sink = sinks.list_sink("bad")
    run = with_dead_letters(dag, job_sink)
    assert run is not dag and len(dag.edges) == 3  # the user's DAG is left as it was
    added = [e for e in run.edges if is_dead_letter_edge(e)]
    assert [(e.source.name, e.source_ordinal, e.dest.name, e.dest_ordinal) for e in added] == [  # type: ignore[union-attr]
        ("a", 1, "a-dead-letters", 0),
        ("b", 1, "dead-letters", 0),
    ]
    assert run.vertex("dead-letters").supplier is job_sink
    assert run.vertex("a-dead-letters").supplier is own
    run.validate(default_parallelism=1)


def test_a_sink_vertex_of_the_dag_takes_the_dead_letters() -> None:
    dag, a, b, _out = _dag()
    bad = dag.new_vertex("bad", sinks.list_sink("bad"))
    a.on_item_error(bad)
    b.on_item_error(bad)
    run = with_dead_letters(dag, "fail")
    assert [
        (e.source.name, e.dest_ordinal) for e in run.inbound_edges("bad")
    ] == [("a", 0), ("b", 1)]
    other = DAG().new_vertex("elsewhere", sinks.list_sink("x"))
    a.on_item_error(other)
    with pytest.raises(ss.DagError) as info:
        with_dead_letters(dag, "fail")
    assert str(info.value) == (
        "vertex 'a': on_item_error is vertex 'elsewhere', which is not in this DAG (add it "
        "with dag.new_vertex first)"
    )
