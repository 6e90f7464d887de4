"""Basic sinks: list_sink, map_sink, write_files, logger, noop, write_buffered."""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import Any

import cloudpickle
import pytest

import slipstream as ss
from slipstream import DAG, Edge, sinks, sources
from slipstream import processors as P
from slipstream.core.inbox import Inbox
from slipstream.core.items import Watermark
from slipstream.core.outbox import Outbox
from slipstream.core.processor import Context, Processor


def sink_dag(data: list[Any], sink_supplier: Any, *, lp: int = 2) -> DAG:
    dag = DAG()
    src = dag.new_vertex("source", sources.items(data)).local_parallelism(2)
    sink = dag.new_vertex("sink", sink_supplier).local_parallelism(lp)
    dag.edge(Edge.between(src, sink))
    return dag


def run(dag: DAG, members: int = 1) -> ss.LocalEngine:
    engine = ss.local(members=members)
    engine.new_job(dag).join(timeout=60)
    return engine


def feed(proc: Processor, batches: list[list[Any]], context: Context | None = None) -> Outbox:
    outbox = Outbox(0, 1)
    proc.init(outbox, context or Context())
    for batch in batches:
        inbox = Inbox(batch)
        proc.process(0, inbox)
        assert not inbox, "a sink consumes its whole inbox"
    while not proc.complete():
        pass
    return outbox


# -- list_sink / map_sink --------------------------------------------------------------


@pytest.mark.parametrize("members", [1, 2])
def test_list_sink_collects_everything(members: int) -> None:
    data = list(range(3000))
    engine = run(sink_dag(data, sinks.list_sink("out")), members)
    assert Counter(engine.get_list("out")) == Counter(data)


def test_list_sink_keeps_order_with_one_processor() -> None:
    ctx = Context()
    feed(sinks.list_sink("l")(), [[1, 2], [3], [4, 5]], ctx)
    assert ctx.get_list("l") == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("members", [1, 2])
def test_map_sink_puts_pairs(members: int) -> None:
    data = [(f"k{i}", i) for i in range(1000)]
    engine = run(sink_dag(data, sinks.map_sink("m")), members)
    assert dict(engine.get_map("m")) == dict(data)


def test_map_sink_later_put_wins() -> None:
    ctx = Context()
    feed(sinks.map_sink("m")(), [[("a", 1), ("b", 2)], [("a", 3)]], ctx)
    assert ctx.get_map("m") == {"a": 3, "b": 2}


@pytest.mark.parametrize("staging", [False, True])
def test_map_sink_rejects_non_pairs_naming_the_item(staging: bool) -> None:
    """Also when staging for a two-phase commit (exactly-once): the bad item fails the
    call that received it, not the later commit; also behind good items."""
    proc = sinks.map_sink("m")()
    ctx = Context(vertex_name="the-sink")
    proc.init(Outbox(0, 1), ctx)
    proc._staging = staging  # type: ignore[attr-defined]
    for bad in (["a", "b"], ("a", 1, 2), ("a",), "ab", 7):
        with pytest.raises(TypeError, match="the-sink") as info:
            proc.process(0, Inbox([("ok", 1), bad, ("ok", 2)]))
        assert repr(bad) in str(info.value)
    assert not proc._pending  # type: ignore[attr-defined]


def test_engine_map_sink_failure_names_vertex_and_item() -> None:
    dag = sink_dag([("ok", 1), "oops"], sinks.map_sink("m"), lp=1)
    with pytest.raises(ss.JobFailedError, match="sink.*'oops'") as info:
        run(dag)
    assert isinstance(info.value.cause, TypeError)


# -- write_files -----------------------------------------------------------------------


@pytest.mark.parametrize("members", [1, 2])
def test_write_files_one_part_per_processor(tmp_path: Path, members: int) -> None:
    out_dir = tmp_path / "new" / "out"  # created by the sink
    data = [f"line {i} ✓" for i in range(2000)] + [42, ("t", 1)]
    run(sink_dag(data, sinks.write_files(out_dir)), members)
    names = sorted(p.name for p in out_dir.iterdir())
    assert names == [f"part-{i:05d}" for i in range(2 * members)]
    lines: list[str] = []
    for name in names:
        lines.extend((out_dir / name).read_text(encoding="utf-8").splitlines())
    assert Counter(lines) == Counter(str(x) for x in data)


def test_write_files_via_read_files_round_trip(tmp_path: Path) -> None:
    data = [f"{i}" for i in range(500)]
    run(sink_dag(data, sinks.write_files(tmp_path / "a")))
    dag = DAG()
    src = dag.new_vertex("source", sources.read_files(tmp_path / "a", "part-*"))
    sink = dag.new_vertex("sink", sinks.list_sink("back"))
    dag.edge(Edge.between(src, sink))
    engine = run(dag, members=2)
    assert sorted(engine.get_list("back"), key=int) == data


def test_write_files_uses_temp_file_until_complete(tmp_path: Path) -> None:
    proc = sinks.write_files(tmp_path)()
    proc.init(Outbox(0, 1), Context(global_processor_index=7))
    proc.process(0, Inbox(["a", "b"]))
    assert not (tmp_path / "part-00007").exists()
    temps = list(tmp_path.iterdir())
    assert len(temps) == 1 and temps[0].name.startswith(".")
    assert proc.complete()
    proc.close()
    assert [p.name for p in tmp_path.iterdir()] == ["part-00007"]
    assert (tmp_path / "part-00007").read_text() == "a\nb\n"


def test_write_files_removes_temp_file_on_failure(tmp_path: Path) -> None:
    proc = sinks.write_files(tmp_path)()
    proc.init(Outbox(0, 1), Context())
    proc.process(0, Inbox(["a"]))
    proc.close()  # the job failed before complete()
    assert list(tmp_path.iterdir()) == []


def test_write_files_two_phase_restore_drops_uncommitted_output(tmp_path: Path) -> None:
    ctx = Context(processing_guarantee=ss.ProcessingGuarantee.EXACTLY_ONCE)
    proc = sinks.write_files(tmp_path, roll_interval_ms=0)()  # publish at every snapshot
    outbox = Outbox(0, 1)
    proc.init(outbox, ctx)
    proc.process(0, Inbox(["before", "snapshot"]))
    assert proc.save_to_snapshot()  # no coordinator here: the snapshot commits the file
    (entry,) = outbox.snapshot_bucket
    proc.process(0, Inbox(["after", "snapshot"]))  # will be replayed after the restore
    proc.close()  # crash; the uncommitted temp file stays behind
    assert any(p.name.endswith(".tmp") for p in tmp_path.iterdir())
    restored = sinks.write_files(tmp_path, roll_interval_ms=0)()
    restored.init(Outbox(0, 1), ctx)
    restored.restore_from_snapshot(Inbox([entry]))
    assert restored.finish_snapshot_restore()
    assert not any(p.name.endswith(".tmp") for p in tmp_path.iterdir())
    restored.process(0, Inbox(["after", "snapshot", "more"]))
    assert restored.complete()
    restored.close()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["part-00000-000000", "part-00000-000001"]
    text = "".join((tmp_path / n).read_text() for n in names)
    assert text == "before\nsnapshot\nafter\nsnapshot\nmore\n"


def test_write_files_restore_commits_prepared_file_left_by_a_crash(tmp_path: Path) -> None:
    """A crash between the snapshot's commit and the rename: the restore renames."""
    from slipstream.state.keys import BroadcastKey

    (tmp_path / ".part-00000-000000.tmp").write_text("a\nb\n")
    entry = (BroadcastKey(("write-files", 0)), (1, [(".part-00000-000000.tmp", "part-00000-000000")]))
    ctx = Context(processing_guarantee=ss.ProcessingGuarantee.EXACTLY_ONCE)
    restored = sinks.write_files(tmp_path)()
    restored.init(Outbox(0, 1), ctx)
    restored.restore_from_snapshot(Inbox([entry]))
    assert restored.finish_snapshot_restore()
    assert (tmp_path / "part-00000-000000").read_text() == "a\nb\n"
    assert restored.finish_snapshot_restore()  # idempotent


def test_write_files_rejects_non_path() -> None:
    with pytest.raises(TypeError, match="directory"):
        sinks.write_files(3)  # type: ignore[arg-type]


# -- logger / noop ---------------------------------------------------------------------


def test_logger_logs_each_item_at_info(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="slipstream"):
        run(sink_dag(["hello", "world"], sinks.logger(), lp=1))
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert sorted(m for m in messages if m in ("hello", "world")) == ["hello", "world"]


def test_logger_custom_to_string(caplog: pytest.LogCaptureFixture) -> None:
    proc = sinks.logger(lambda x: f"<{x}>")()
    with caplog.at_level(logging.INFO):
        feed(proc, [[1, 2]], Context(vertex_name="logsink"))
    assert [r.getMessage() for r in caplog.records] == ["<1>", "<2>"]


def test_noop_discards() -> None:
    engine = run(sink_dag(list(range(100)), sinks.noop()))
    assert engine.services.lists == {}


def every_sink(tmp_path: Path) -> list[Any]:
    """A supplier of each kind of basic sink."""
    return [
        sinks.list_sink("l"),
        sinks.map_sink("m"),
        sinks.write_files(tmp_path),
        sinks.logger(),
        sinks.noop(),
        sinks.write_buffered(Recorder, add, flush, destroy),
    ]


def test_sinks_swallow_watermarks(tmp_path: Path) -> None:
    for supplier in every_sink(tmp_path):
        proc = supplier()
        outbox = Outbox(0, 1)
        proc.init(outbox, Context())
        assert proc.try_process_watermark(Watermark(10)) is True
        assert outbox.is_empty()
        proc.close()


# -- write_buffered --------------------------------------------------------------------


class Recorder:
    """A buffer whose life cycle is recorded in a shared log (one per processor)."""

    def __init__(self, context: Context) -> None:
        self.name = f"buf{context.global_processor_index}"
        self.pending: list[Any] = []
        self.flushed: list[list[Any]] = []
        self.destroyed = False
        context.get_list("buffers").append(self)


def add(buf: Recorder, item: Any) -> None:
    buf.pending.append(item)


def flush(buf: Recorder) -> None:
    buf.flushed.append(buf.pending)
    buf.pending = []


def destroy(buf: Recorder) -> None:
    buf.destroyed = True


def test_write_buffered_life_cycle() -> None:
    ctx = Context()
    proc = sinks.write_buffered(Recorder, add, flush, destroy)()
    assert not proc.is_cooperative()
    feed(proc, [[1, 2], [3]], ctx)
    (buf,) = ctx.get_list("buffers")
    assert buf.flushed == [[1, 2], [3]]  # one flush per inbox drain
    assert not buf.destroyed
    proc.close()
    assert buf.destroyed


@pytest.mark.parametrize("members", [1, 2])
def test_engine_write_buffered(members: int) -> None:
    data = list(range(1500))
    engine = run(sink_dag(data, sinks.write_buffered(Recorder, add, flush, destroy)), members)
    buffers = engine.get_list("buffers")
    assert len(buffers) == 2 * members
    assert all(b.destroyed and b.pending == [] for b in buffers)
    assert Counter(x for b in buffers for chunk in b.flushed for x in chunk) == Counter(data)


def test_write_buffered_without_destroy() -> None:
    proc = sinks.write_buffered(Recorder, add, flush)()
    feed(proc, [[1]])
    proc.close()


def test_factories_validate_arguments() -> None:
    with pytest.raises(TypeError, match="name"):
        sinks.list_sink(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="name"):
        sinks.map_sink("")
    with pytest.raises(TypeError, match="flush_buffer"):
        sinks.write_buffered(Recorder, add, "flush")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="destroy_buffer"):
        sinks.write_buffered(Recorder, add, flush, 5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="to_string"):
        sinks.logger(to_string=1)  # type: ignore[arg-type]


def test_suppliers_pickle(tmp_path: Path) -> None:
    for supplier in every_sink(tmp_path):
        assert isinstance(cloudpickle.loads(cloudpickle.dumps(supplier))(), Processor)


def test_sink_after_map_in_engine() -> None:
    dag = DAG()
    src = dag.new_vertex("source", sources.items(range(10)))
    m = dag.new_vertex("map", P.map(str))
    sink = dag.new_vertex("sink", sinks.list_sink("out"))
    dag.edge(Edge.between(src, m)).edge(Edge.between(m, sink))
    assert sorted(run(dag).get_list("out"), key=int) == [str(i) for i in range(10)]


# -- the processor test harness (slipstream.testing) ------------------------------------


def test_verify_processor_harness(tmp_path: Path) -> None:
    from slipstream.core.services import InMemoryServices
    from slipstream.testing import verify_processor

    services = InMemoryServices()
    verify_processor(sinks.list_sink("l"), services=services).execute_before_each_run(
        lambda: services.get_list("l").clear()
    ).input([1, 2, 3]).expect_outputs([])
    assert services.get_list("l") == [1, 2, 3]

    verify_processor(sinks.map_sink("m"), services=services).input(
        [("a", 1), ("b", 2), ("a", 3)]
    ).expect_outputs([])
    assert services.get_map("m") == {"a": 3, "b": 2}

    verify_processor(sinks.noop()).input([1, Watermark(5), 2]).expect_outputs([])

    # every mode starts from an empty directory; the last one (snapshots on, never
    # restored) leaves its committed part files: together they hold every line once
    def wipe() -> None:
        for p in tmp_path.iterdir():
            p.unlink()

    verify_processor(sinks.write_files(tmp_path)).execute_before_each_run(wipe).input(
        ["x", 1, "y"]
    ).expect_outputs([])
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names and all(n.startswith("part-00000-") for n in names)
    assert "".join((tmp_path / n).read_text() for n in names) == "x\n1\ny\n"


def test_list_sink_batches_with_equal_items_are_each_published_once_across_a_failover() -> None:
    """Two snapshots' batches of equal items, both prepared when a failover comes: the
    first published at its commit, the second not yet (its member died). The restored
    processor publishes the second once, the first not again: a restore tells batches
    apart by the snapshot id they are saved under and the publish marks (per vertex,
    processor lineage and index), never by their items; and PreparedCommits.remove is
    only given the very batch it filed, out of the due ones, which are the oldest (a
    removal by equality would remove an equal due one, which is published too)."""
    ctx = Context(
        vertex_name="sink",
        processing_guarantee=ss.ProcessingGuarantee.EXACTLY_ONCE,
        job_name="equal-batches",
    )
    ctx.commits_snapshots = True
    proc = sinks.list_sink("equal")()
    outbox = Outbox(0)
    proc.init(outbox, ctx)
    for sid in (1, 2):
        proc.process(0, Inbox(["a", "b"]))
        ctx.current_snapshot_id = sid
        outbox.snapshot_bucket.clear()
        assert proc.save_to_snapshot()
    entries = list(outbox.snapshot_bucket)  # snapshot 2's: both batches, equal items
    assert [v for _k, v in entries] == [("a", "b"), ("a", "b")]
    ctx.committed_snapshot_id = 1  # snapshot 1 commits; snapshot 2 commits after the crash
    assert proc.snapshot_commit_finish(True)
    published = ctx.services.get_list("equal")
    assert published == ["a", "b"]
    assert [sid for sid, _batch in proc._prepared.entries()] == [2]  # the other batch left
    # the member dies before snapshot 2's commit reaches it; a new one restores from it
    restored = sinks.list_sink("equal")()
    restored.init(Outbox(0), ctx)
    restored.restore_from_snapshot(Inbox(entries))
    assert restored.finish_snapshot_restore()
    assert published == ["a", "b", "a", "b"]
