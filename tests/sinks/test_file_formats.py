"""File formats: read_csv/read_jsonl/read_parquet and write_csv/write_jsonl/
write_parquet/write_files(formatter), stdout, and write_files rolling under snapshots.

Sources run under the processor harness (restore after every record re-opens the file
and skips to the saved position); sinks by hand and through the engine, checked by
reading their output back with the matching source and with a plain-Python oracle.
"""

from __future__ import annotations

import csv
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import slipstream as ss
from slipstream import DAG, Edge, sinks, sources
from slipstream import processors as P
from slipstream.core.inbox import Inbox
from slipstream.core.outbox import Outbox
from slipstream.core.processor import Context
from slipstream.testing import verify_processor

ROWS = [
    {"name": "ann", "city": "Zürich", "n": "1"},
    {"name": 'bo "b", jr', "city": "line\nbreak", "n": "2"},
    {"name": "", "city": "x", "n": "3"},
]


def run_dag(src: Any, sink: Any, lp: int = 2, members: int = 1) -> ss.LocalEngine:
    dag = DAG()
    s = dag.new_vertex("source", src).local_parallelism(lp)
    k = dag.new_vertex("sink", sink).local_parallelism(lp)
    dag.edge(Edge.between(s, k))
    engine = ss.local(members=members)
    engine.new_job(dag).join(60)
    return engine


def collect(src: Any, lp: int = 2) -> list[Any]:
    return list(run_dag(src, sinks.list_sink("out"), lp).get_list("out"))


# -- sources -----------------------------------------------------------------------------


def write_csv_file(path: Path, rows: list[list[str]], dialect: str = "excel") -> None:
    with open(path, "w", encoding="utf-8", newline="") as fh:
        csv.writer(fh, dialect).writerows(rows)


def test_read_csv_dicts_and_tuples_with_restore_after_every_row(tmp_path: Path) -> None:
    header = list(ROWS[0])
    write_csv_file(tmp_path / "a.csv", [header] + [list(r.values()) for r in ROWS[:2]])
    write_csv_file(tmp_path / "b.csv", [header] + [list(ROWS[2].values())])
    verify_processor(sources.read_csv(tmp_path)).expect_output(ROWS)
    tuples = [tuple(r.values()) for r in ROWS]
    verify_processor(sources.read_csv(tmp_path, as_dicts=False)).expect_output(tuples)
    # without a header the header row is data
    got = collect(sources.read_csv(tmp_path, header=False, as_dicts=False), lp=1)
    assert Counter(got) == Counter(tuples + [tuple(header)] * 2)


def test_read_csv_dialect_and_blank_lines(tmp_path: Path) -> None:
    write_csv_file(tmp_path / "t.tsv", [["a", "b"], ["1", "x,y"], [], ["2", "z"]], "excel-tab")
    got = collect(sources.read_csv(tmp_path, "*.tsv", dialect="excel-tab"))
    assert got == [{"a": "1", "b": "x,y"}, {"a": "2", "b": "z"}]


def test_read_csv_malformed_row_names_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "bad.csv").write_text("a,b\n1,2\n3,4,5\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad\.csv:3: malformed CSV row: 3 fields"):
        verify_processor(sources.read_csv(tmp_path)).disable_snapshots().expect_output([])
    engine = ss.local()
    dag = DAG()
    s = dag.new_vertex("src", sources.read_csv(tmp_path))
    k = dag.new_vertex("sink", sinks.noop())
    dag.edge(Edge.between(s, k))
    with pytest.raises(ss.JobFailedError, match=r"bad\.csv:3"):
        engine.new_job(dag).join(60)


def test_read_jsonl_values_blank_lines_and_malformed_line(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text('{"k": "ü", "v": [1, 2]}\n\n3\n"s"\n', encoding="utf-8")
    verify_processor(sources.read_jsonl(tmp_path)).expect_output([{"k": "ü", "v": [1, 2]}, 3, "s"])
    (tmp_path / "b.jsonl").write_text('{"ok": 1}\n{"broken": \n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"b\.jsonl:2: malformed JSON line"):
        verify_processor(sources.read_jsonl(tmp_path)).disable_snapshots().expect_output([])


def test_read_parquet_rows_as_dicts(tmp_path: Path) -> None:
    rows = [{"k": f"key{i}", "v": i, "f": i / 2} for i in range(50)]
    pq.write_table(pa.Table.from_pylist(rows[:30]), tmp_path / "a.parquet", row_group_size=7)
    pq.write_table(pa.Table.from_pylist(rows[30:]), tmp_path / "b.parquet")
    verify_processor(sources.read_parquet(tmp_path)).expect_output(rows)
    (tmp_path / "c.parquet").write_bytes(b"not parquet")
    with pytest.raises(ValueError, match=r"c\.parquet: not a readable Parquet file"):
        verify_processor(sources.read_parquet(tmp_path)).disable_snapshots().expect_output(rows)


def test_readers_skip_hidden_and_underscore_files(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("data\n")
    (tmp_path / ".part-00000.abc.tmp").write_text("in progress\n")
    (tmp_path / "_SUCCESS").write_text("")
    (tmp_path / "_meta.txt").write_text("meta\n")
    (tmp_path / ".hidden.txt").write_text("hidden\n")
    assert collect(sources.read_files(tmp_path)) == ["data"]
    assert collect(sources.read_files(tmp_path, "*.txt")) == ["data"]


def test_source_argument_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="as_dicts=True needs header=True"):
        sources.read_csv(tmp_path, header=False)
    with pytest.raises(ValueError, match="unknown CSV dialect 'nope'"):
        sources.read_csv(tmp_path, dialect="nope")
    with pytest.raises(TypeError, match="glob"):
        sources.read_jsonl(tmp_path, "")


# -- sinks -------------------------------------------------------------------------------


def part_files(d: Path) -> list[Path]:
    return sorted(p for p in d.iterdir() if not p.name.startswith((".", "_")))


@pytest.mark.parametrize("members", [1, 2])
def test_write_csv_dicts_round_trip_with_header_in_key_order(tmp_path: Path, members: int) -> None:
    data = [{"z": str(i), "a": f"v,{i}\n", "m": "ü"} for i in range(500)]
    run_dag(sources.items(data), sinks.write_csv(tmp_path / "out"), members=members)
    files = part_files(tmp_path / "out")
    assert [p.suffix for p in files] == [".csv"] * 2 * members
    for p in files:
        raw = p.read_bytes()
        if raw:
            assert raw.startswith(b"z,a,m\n") and b"\r" not in raw
    assert Counter(map(repr, collect(sources.read_csv(tmp_path / "out")))) == Counter(
        map(repr, data)
    )


def test_write_csv_tuples_explicit_header_and_bad_dict(tmp_path: Path) -> None:
    proc = sinks.write_csv(tmp_path, header=["x", "y"])()
    proc.init(Outbox(0, 1), Context())
    proc.process(0, Inbox([(1, "a b"), {"y": 2, "x": 3}, ("q",)]))
    assert proc.complete()
    assert (tmp_path / "part-00000.csv").read_text(encoding="utf-8") == "x,y\n1,a b\n3,2\nq\n"
    proc = sinks.write_csv(tmp_path / "t")()  # tuples: no header
    proc.init(Outbox(0, 1), Context())
    proc.process(0, Inbox([(1, 2), [3, 4], {"a": 5}]))  # a dict after rows: no header
    with pytest.raises(ValueError, match=r"item \{'b': 2\} does not have the file's columns"):
        proc.process(0, Inbox([{"b": 2}]))
    assert proc.complete()
    assert (tmp_path / "t" / "part-00000.csv").read_text() == "1,2\n3,4\n5\n"
    proc.close()
    with pytest.raises(TypeError, match="header"):
        sinks.write_csv(tmp_path, header="xy")


def test_write_jsonl_round_trip_and_unserialisable_item(tmp_path: Path) -> None:
    data = [{"k": i, "s": "ü\n", "l": [i, None, True]} for i in range(300)] + ["x", 1.5, None]
    run_dag(sources.items(data), sinks.write_jsonl(tmp_path / "out"))
    texts = [p.read_text(encoding="utf-8") for p in part_files(tmp_path / "out")]
    assert all(t.endswith("\n") for t in texts if t) and "ü" in "".join(texts)
    got = collect(sources.read_jsonl(tmp_path / "out"))
    assert Counter(map(json.dumps, got)) == Counter(map(json.dumps, data))
    proc = sinks.write_jsonl(tmp_path / "bad")()
    proc.init(Outbox(0, 1), Context(vertex_name="j"))
    with pytest.raises(TypeError, match=r"write_jsonl \(vertex 'j'\): item \{1, 2\} cannot"):
        proc.process(0, Inbox([1, {1, 2}]))
    proc.close()


def test_write_parquet_round_trip_and_schema_mismatch(tmp_path: Path) -> None:
    data = [{"k": f"key{i}", "v": i} for i in range(3000)]
    run_dag(sources.items(data), sinks.write_parquet(tmp_path / "out"))
    assert all(p.suffix == ".parquet" for p in part_files(tmp_path / "out"))
    got = collect(sources.read_parquet(tmp_path / "out"))
    assert sorted(got, key=lambda r: r["v"]) == data
    tuples = collect(sources.read_parquet(tmp_path / "out"))  # readable twice
    assert len(tuples) == 3000
    proc = sinks.write_parquet(tmp_path / "bad")()
    proc.init(Outbox(0, 1), Context())
    proc.process(0, Inbox([(1, "a"), (2, "b")]))
    with pytest.raises(ValueError, match="do not fit the file's schema"):
        proc.process(0, Inbox([("x", "c")]))
    proc.close()


def test_write_files_formatter(tmp_path: Path) -> None:
    run_dag(
        sources.items([(1, "a"), (2, "b")]),
        sinks.write_files(tmp_path, "{0[0]}:{0[1]}".format),
        lp=1,
    )
    assert (tmp_path / "part-00000").read_text() == "1:a\n2:b\n"
    proc = sinks.write_files(tmp_path / "x", formatter=len)()  # type: ignore[arg-type]
    proc.init(Outbox(0, 1), Context())
    with pytest.raises(TypeError, match=r"the formatter returned 2 for item 'ab'"):
        proc.process(0, Inbox(["ab"]))
    proc.close()


def test_stdout_prints_every_item(capsys: pytest.CaptureFixture[str]) -> None:
    verify_processor(sinks.stdout()).disable_snapshots().input([1, "ü", (2, 3)]).expect_outputs([])
    out = capsys.readouterr().out
    assert out.count("1\n") >= 1 and "ü\n" in out and "(2, 3)\n" in out


def test_round_trip_through_a_pipeline_of_formats(tmp_path: Path) -> None:
    """CSV -> map -> JSONL -> Parquet -> CSV again, checked against plain Python."""
    rows = [{"id": str(i), "word": f"w{i % 7}"} for i in range(1000)]
    (tmp_path / "in").mkdir()
    with open(tmp_path / "in" / "x.csv", "w", encoding="utf-8", newline="") as fh:
        w = csv.DictWriter(fh, ["id", "word"], lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    dag = DAG()
    s = dag.new_vertex("csv", sources.read_csv(tmp_path / "in"))
    m = dag.new_vertex("typed", P.map(lambda r: {"id": int(r["id"]), "word": r["word"]}))
    k = dag.new_vertex("jsonl", sinks.write_jsonl(tmp_path / "j"))
    dag.edge(Edge.between(s, m)).edge(Edge.between(m, k))
    ss.local().new_job(dag).join(60)
    run_dag(sources.read_jsonl(tmp_path / "j"), sinks.write_parquet(tmp_path / "p"))
    run_dag(sources.read_parquet(tmp_path / "p"), sinks.write_csv(tmp_path / "c"))
    got = collect(sources.read_csv(tmp_path / "c"))
    assert sorted(got, key=lambda r: int(r["id"])) == rows


# -- write_files rolling under snapshots ------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


def snapshot(proc: Any, outbox: Outbox) -> Any:
    outbox.snapshot_bucket.clear()
    assert proc.save_to_snapshot()
    (entry,) = outbox.snapshot_bucket
    return entry


def published(d: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in part_files(d)}


def test_write_files_rolls_by_age_and_size_not_per_snapshot(tmp_path: Path) -> None:
    from slipstream.sinks.files import WriteFilesP

    clock = Clock()
    ctx = Context(processing_guarantee=ss.ProcessingGuarantee.EXACTLY_ONCE)
    proc = WriteFilesP(str(tmp_path), str, 1000, 5000, clock)
    outbox = Outbox(0, 1)
    proc.init(outbox, ctx)
    for t in range(4):  # 4 snapshots within 5 s: one unfinished file, nothing published
        clock.now = t * 1000
        proc.process(0, Inbox([f"s{t}"]))
        snapshot(proc, outbox)
    assert published(tmp_path) == {}
    clock.now = 5000  # old enough: the next snapshot publishes it
    snapshot(proc, outbox)
    assert published(tmp_path) == {"part-00000-000000": "s0\ns1\ns2\ns3\n"}
    proc.process(0, Inbox(["x" * 2000]))  # big enough
    snapshot(proc, outbox)
    assert published(tmp_path)["part-00000-000001"] == "x" * 2000 + "\n"
    snapshot(proc, outbox)  # nothing new: no empty file
    proc.process(0, Inbox(["y"]))  # a new file starts small and young: no roll
    snapshot(proc, outbox)
    assert len(published(tmp_path)) == 2
    proc.process(0, Inbox(["last"]))
    assert proc.complete()
    proc.close()
    assert published(tmp_path) == {
        "part-00000-000000": "s0\ns1\ns2\ns3\n",
        "part-00000-000001": "x" * 2000 + "\n",
        "part-00000-000002": "y\nlast\n",
    }
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(published(tmp_path))


@pytest.mark.parametrize("factory", ["write_files", "write_csv", "write_jsonl"])
def test_restore_continues_the_unfinished_file_from_its_snapshot_length(
    tmp_path: Path, factory: str
) -> None:
    """A crash after a snapshot that did not roll: the restore cuts the unfinished file
    back to the snapshot's length and writes on; the replay then gives every item once
    (and a CSV file still has one header)."""
    make = getattr(sinks, factory)
    ctx = Context(processing_guarantee=ss.ProcessingGuarantee.EXACTLY_ONCE)
    items = [{"a": i, "b": f"v{i}"} for i in range(6)]
    proc = make(tmp_path)()
    outbox = Outbox(0, 1)
    proc.init(outbox, ctx)
    proc.process(0, Inbox(items[:2]))
    entry = snapshot(proc, outbox)
    proc.process(0, Inbox(items[2:4]))  # after the snapshot: replayed after the restore
    proc.close()  # crash
    assert published(tmp_path) == {}
    restored = make(tmp_path)()
    restored.init(Outbox(0, 1), ctx)
    restored.restore_from_snapshot(Inbox([entry]))
    assert restored.finish_snapshot_restore()
    restored.process(0, Inbox(items[2:]))
    assert restored.complete()
    restored.close()
    files = part_files(tmp_path)
    assert len(files) == 1 and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    ok = make(tmp_path / "oracle")()
    ok.init(Outbox(0, 1), Context())
    ok.process(0, Inbox(items))
    assert ok.complete()
    assert files[0].read_bytes() == part_files(tmp_path / "oracle")[0].read_bytes()


def test_restore_at_lower_parallelism_publishes_unfinished_files_of_gone_indices(
    tmp_path: Path,
) -> None:
    ctx1 = Context(
        processing_guarantee=ss.ProcessingGuarantee.EXACTLY_ONCE,
        global_processor_index=1,
        total_parallelism=2,
    )
    proc = sinks.write_files(tmp_path)()
    outbox = Outbox(0, 1)
    proc.init(outbox, ctx1)
    proc.process(0, Inbox(["kept", "too"]))
    entry = snapshot(proc, outbox)
    proc.process(0, Inbox(["replayed"]))
    proc.close()
    restored = sinks.write_files(tmp_path)()
    restored.init(Outbox(0, 1), Context(processing_guarantee=ss.ProcessingGuarantee.EXACTLY_ONCE))
    restored.restore_from_snapshot(Inbox([entry]))
    assert restored.finish_snapshot_restore()
    restored.close()
    assert published(tmp_path) == {"part-00001-000000": "kept\ntoo\n"}


def test_restore_fails_loudly_when_the_unfinished_file_is_gone(tmp_path: Path) -> None:
    ctx = Context(processing_guarantee=ss.ProcessingGuarantee.EXACTLY_ONCE)
    proc = sinks.write_files(tmp_path)()
    outbox = Outbox(0, 1)
    proc.init(outbox, ctx)
    proc.process(0, Inbox(["a"]))
    entry = snapshot(proc, outbox)
    proc.close()
    for p in tmp_path.iterdir():
        p.unlink()
    restored = sinks.write_files(tmp_path)()
    restored.init(Outbox(0, 1), ctx)
    restored.restore_from_snapshot(Inbox([entry]))
    with pytest.raises(FileNotFoundError, match="recorded in the snapshot is gone"):
        restored.finish_snapshot_restore()


def test_exactly_once_streaming_job_writes_few_files_each_item_once(tmp_path: Path) -> None:
    n = 20_000
    dag = DAG()
    s = dag.new_vertex("gen", sources.generator(lambda seq: seq, 40_000, max_items=n))
    k = dag.new_vertex("out", sinks.write_jsonl(tmp_path / "out")).local_parallelism(1)
    dag.edge(Edge.between(s, k))
    cfg = ss.JobConfig(
        name="roll",
        processing_guarantee=ss.ProcessingGuarantee.EXACTLY_ONCE,
        snapshot_interval_ms=20,
    )
    job = ss.local(work_dir=str(tmp_path / "work")).new_job(dag, cfg)
    job.join(120)
    assert job.metrics["__job__"]["snapshots"] >= 2
    files = part_files(tmp_path / "out")
    assert len(files) == 1  # not one per snapshot
    got = collect(sources.read_jsonl(tmp_path / "out"), lp=1)
    assert sorted(got) == list(range(n))
