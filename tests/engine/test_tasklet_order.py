"""The processor tasklet's ordering of watermarks and snapshots, driven by hand."""

from __future__ import annotations

from typing import Any

from slipstream.core.config import ProcessingGuarantee
from slipstream.core.items import DONE_ITEM, SnapshotBarrier, Watermark
from slipstream.core.processor import AbstractProcessor, Context
from slipstream.execution.inbound import InboundEdgeStream
from slipstream.execution.queues import SpscQueue
from slipstream.execution.tasklet import ProcessorTasklet


class Log(AbstractProcessor):
    def __init__(self) -> None:
        self.log: list[Any] = []

    def try_process_watermark(self, watermark: Watermark) -> bool:
        self.log.append(("wm", watermark.timestamp))
        return True

    def save_to_snapshot(self) -> bool:
        self.log.append("save")
        return True


def test_watermark_released_with_the_barrier_is_processed_before_the_snapshot() -> None:
    """Queue 1 sent watermark 5 and barrier 1; queue 0 then finishes without a watermark.
    That releases 5 (queue 0 no longer holds it back) and completes the barrier in the
    same drain. Watermark 5 came before the barrier, so the processor must see it before
    it saves: otherwise processors of one vertex that drained in another order save
    different watermarks under exactly-once."""
    q0, q1 = SpscQueue(16), SpscQueue(16)
    stream = InboundEdgeStream(0, 0, [q0, q1], exactly_once=True)
    proc = Log()
    t = ProcessorTasklet(
        proc,
        Context(processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE),
        [stream],
        [],
        guarantee=ProcessingGuarantee.EXACTLY_ONCE,
    )
    t.init()
    q1.offer(Watermark(5), 1)
    q1.offer(SnapshotBarrier(1), 1)
    for _ in range(10):
        t.call()
    assert proc.log == []
    q0.offer(DONE_ITEM, 1)
    for _ in range(20):
        t.call()
    assert proc.log == [("wm", 5), "save"]
