"""Malformed records of read_csv and read_jsonl under ``on_item_error``: set aside with
their file and line (the dead letter's ``source``), the good records read on; a restored
position does not set aside again the bad records it skips (they were before the
snapshot)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import slipstream as ss
from slipstream import DAG, Edge, JobConfig, sinks, sources
from slipstream.core.item_errors import DeadLetter, ItemErrors
from slipstream.core.outbox import Outbox
from slipstream.core.processor import Context


@pytest.fixture
def data(tmp_path: Path) -> Path:
    d = tmp_path / "data"
    d.mkdir()
    (d / "a.csv").write_text('k,v\na,1\nb,2,extra\nc,3\n"d,4\ne,5\n', encoding="utf-8")
    (d / "b.csv").write_text("k,v\nf,6\ng\nh,8\n", encoding="utf-8")
    (d / "c.jsonl").write_text('{"a": 1}\n{bad json\n\n{"a": 2}\n', encoding="utf-8")
    return d


def run(src: Any, policy: Any) -> tuple[list[Any], list[Any], Any]:
    dag = DAG()
    s = dag.new_vertex("src", src).local_parallelism(1)
    dag.edge(Edge.between(s, dag.new_vertex("sink", sinks.list_sink("rows"))))
    engine = ss.local()
    job = engine.new_job(dag, JobConfig(on_item_error=policy))
    job.join(60)
    return engine.get_list("rows"), engine.get_list("dead"), job.metrics["src"]


def test_malformed_csv_rows_go_to_the_dead_letters_with_file_and_line(data: Path) -> None:
    rows, dead, metrics = run(sources.read_csv(str(data)), sinks.list_sink("dead"))
    assert rows == [{"k": "a", "v": "1"}, {"k": "c", "v": "3"}, {"k": "f", "v": "6"}, {"k": "h", "v": "8"}]
    a, b = data / "a.csv", data / "b.csv"
    assert dead == [
        DeadLetter(
            "src",
            ["b", "2", "extra"],
            f"ValueError: read_csv (vertex 'src'): {a}:3: malformed CSV row: 3 fields where "
            "the header has 2 (['b', '2', 'extra'])",
            f"{a}:3",
        ),
        DeadLetter(
            "src",
            ["d,4\ne,5\n"],
            f"ValueError: read_csv (vertex 'src'): {a}:5: unclosed quote: the quoted field "
            "that starts on this line runs to the end of the file (line 6)",
            f"{a}:5",
        ),
        DeadLetter(
            "src",
            ["g"],
            f"ValueError: read_csv (vertex 'src'): {b}:3: malformed CSV row: 1 fields where "
            "the header has 2 (['g'])",
            f"{b}:3",
        ),
    ]
    assert metrics["items_skipped"] == 3


def test_malformed_json_lines_are_skipped(data: Path) -> None:
    rows, dead, metrics = run(sources.read_jsonl(str(data)), "skip")
    assert rows == [{"a": 1}, {"a": 2}]
    assert dead == [] and metrics["items_skipped"] == 1


def test_the_default_still_fails_naming_file_and_line(data: Path) -> None:
    dag = DAG()
    s = dag.new_vertex("src", sources.read_jsonl(str(data)))
    dag.edge(Edge.between(s, dag.new_vertex("sink", sinks.noop())))
    with pytest.raises(ss.JobFailedError) as info:
        ss.local().new_job(dag, JobConfig(name="j")).join(60)
    assert str(info.value) == (
        f"job 'j' failed: vertex 'src', processor 0: ValueError: read_jsonl (vertex 'src'): "
        f"{data / 'c.jsonl'}:2: malformed JSON line: Expecting property name enclosed in "
        "double quotes (column 2): '{bad json'"
    )


def test_a_restored_position_sets_no_record_aside_twice(data: Path) -> None:
    (data / "b.csv").unlink()
    (data / "c.jsonl").unlink()
    proc = sources.read_csv(str(data))()
    ctx = Context("src")
    ctx.item_errors = ItemErrors(ctx, side_ordinal=1, target="dead")
    outbox = Outbox(2, 100)
    proc.init(outbox, ctx)
    # as restored from a snapshot taken after the first record (a,1): the bad row b
    # after it is set aside, once
    proc._seek((0, 1))  # what restore_from_snapshot does with the saved position
    assert proc.complete()
    assert outbox.buckets[0] == [{"k": "c", "v": "3"}]
    assert [d.source for d in outbox.buckets[1]] == [f"{data / 'a.csv'}:3", f"{data / 'a.csv'}:5"]
    # restored after the second record (c,3): the bad row before it is not set aside again
    proc = sources.read_csv(str(data))()
    ctx = Context("src")
    ctx.item_errors = ItemErrors(ctx, side_ordinal=1, target="dead")
    outbox = Outbox(2, 100)
    proc.init(outbox, ctx)
    proc._seek((0, 2))
    assert proc.complete()
    assert outbox.buckets[0] == []
    assert [d.source for d in outbox.buckets[1]] == [f"{data / 'a.csv'}:5"]
    assert ctx.metrics["items_skipped"] == 1


def test_a_pipeline_source_stage_takes_the_policy(data: Path) -> None:
    p = ss.Pipeline()
    p.read_from(sources.read_jsonl(str(data))).on_item_error(sinks.list_sink("dead")).write_to(
        sinks.list_sink("rows")
    )
    engine = ss.local()
    engine.new_job(p).join(60)
    assert engine.get_list("rows") == [{"a": 1}, {"a": 2}]
    assert [(d.vertex, d.item, d.source) for d in engine.get_list("dead")] == [
        ("source", "{bad json", f"{data / 'c.jsonl'}:2")
    ]
