"""The commit step of Spark epochs (slipstream.spark.epoch_commit) without Spark: which
processors a task reports as holding output, which the driver then commits, and the
Kafka sink's filing of an epoch's records under the snapshot the epoch commits."""

from __future__ import annotations

from typing import Any

from slipstream import sinks
from slipstream.core.config import ProcessingGuarantee
from slipstream.core.outbox import Outbox
from slipstream.core.processor import AbstractProcessor, Context
from slipstream.pipeline.fused import input_fused
from slipstream.sinks.kafka import KafkaSinkP
from slipstream.spark.epoch_commit import pending_commits
from slipstream.spark.task import _epoch_output_pending


def _sink(epoch_commit_id: int, guarantee: ProcessingGuarantee) -> KafkaSinkP:
    sink = sinks.kafka("out", {"bootstrap.servers": "127.0.0.1:1"})()
    ctx = Context("out", processing_guarantee=guarantee, job_name="j")
    ctx.epoch_commit_id = epoch_commit_id
    sink.init(Outbox(0), ctx)
    return sink


def test_the_sink_files_an_epochs_records_under_the_snapshot_the_epoch_commits() -> None:
    sink = _sink(7, ProcessingGuarantee.EXACTLY_ONCE)
    assert not sink.epoch_output_pending
    sink._held = [(None, b"a"), (None, b"b")]
    sink.context.current_snapshot_id = 1  # every epoch's barrier
    assert sink.save_to_snapshot()
    ((key, (lineage, sid, records)),) = sink.outbox.snapshot_bucket
    assert key.name == ("kafka-txn", 0)
    assert (lineage, sid, records) == (sink._lineage, 7, [(None, b"a"), (None, b"b")])
    assert sink.epoch_output_pending
    assert _epoch_output_pending(sink)


def test_without_exactly_once_the_sink_holds_nothing() -> None:
    sink = _sink(0, ProcessingGuarantee.EXACTLY_ONCE)  # not an exactly-once epoch
    assert not sink._exactly_once and not sink.epoch_output_pending
    sink.close()


def test_a_sink_inside_a_fused_chain_is_seen() -> None:
    class Holding(AbstractProcessor):
        epoch_output_pending = True

    fused = input_fused(lambda: Holding(), {0: None})()  # type: ignore[dict-item]
    assert _epoch_output_pending(fused)
    assert not _epoch_output_pending(object())
    assert not _epoch_output_pending(None)


def test_pending_commits_takes_full_chunks_of_processors_that_hold_output() -> None:
    chunk: dict[str, Any] = {"file": "c", "mac": "m", "snapshot": 3}
    results = [
        {"vertex": "out", "index": 0, "commit_pending": True, "snapshot": {"chunk": chunk, "base": None}},
        {"vertex": "out", "index": 1, "snapshot": {"chunk": chunk, "base": None}},
        {"vertex": "out", "index": 2, "commit_pending": True, "snapshot": {"chunk": None, "base": None}},
        {"vertex": "count", "index": 0, "snapshot": {"chunk": chunk, "base": 2}},
    ]
    assert pending_commits(results) == {"out": {0: chunk}}
