"""A Spark task streams its input: it never materialises its partition (issue 8, 3).

These run the task function and the shuffle keys in this process (no JVM): a probe
iterator stands in for the partition and counts how far the task has read it whenever
the processor sees items.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from slipstream.core.config import ProcessingGuarantee
from slipstream.core.inbox import Inbox
from slipstream.core.items import DONE_ITEM, Watermark
from slipstream.core.processor import AbstractProcessor
from slipstream.core.suppliers import FactorySupplier
from slipstream.spark.feed import RESULT_TAG
from slipstream.spark.shuffle import MAX_SEQ, shuffle_key, target_of_key
from slipstream.spark.task import InboundSpec, VertexTask

CHUNK = 100
RECORDS = 200  # per producer


class _Probe:
    def __init__(self) -> None:
        self.read = 0  # records the task has taken from the partition iterator
        self.seen = 0  # items the processor has received
        self.max_ahead = 0  # most records read but not yet processed
        self.watermarks: list[int] = []

    def records(self, producers: int) -> Iterator[Any]:
        """Data records interleaved by sequence number, as the ordered shuffle delivers
        them, with a watermark and end-of-stream per producer."""
        for seq in range(RECORDS + 2):
            for p in range(producers):
                if seq < RECORDS:
                    entry: Any = list(range(seq * CHUNK, (seq + 1) * CHUNK))
                elif seq == RECORDS:
                    entry = Watermark(1000 + p)
                else:
                    entry = DONE_ITEM
                self.read += 1
                yield (0, (7, p, seq, entry))
        self.read += 1
        yield (0, (RESULT_TAG, {"upstream": True}))


class _CountP(AbstractProcessor):
    def __init__(self, probe: _Probe) -> None:
        self.probe = probe

    def process(self, ordinal: int, inbox: Inbox) -> None:
        probe = self.probe
        probe.seen += len(inbox)
        ahead = probe.read - probe.seen // CHUNK
        probe.max_ahead = max(probe.max_ahead, ahead)
        inbox.clear()

    def try_process_watermark(self, watermark: Watermark) -> bool:
        self.probe.watermarks.append(watermark.timestamp)
        return True


def _task(probe: _Probe, producers: int) -> VertexTask:
    return VertexTask(
        vertex="count",
        job_name="probe",
        local_parallelism=1,
        member_count=1,
        guarantee=ProcessingGuarantee.NONE,
        suppliers=[FactorySupplier(lambda: _CountP(probe))],
        inbound=[InboundSpec(7, 0, 0, "edge 'a' -> 'count'", [list(range(producers))])],
    )


def test_task_reads_its_partition_as_it_processes_it() -> None:
    probe = _Probe()
    out = list(_task(probe, 2)(0, probe.records(2)))
    assert probe.seen == 2 * RECORDS * CHUNK
    # never more than a couple of records held ahead of the processor (a materialising
    # task would read all 404 before the first process() call)
    assert probe.max_ahead <= 3, probe.max_ahead
    # coalesced over both producers; the second once producer 0 has ended
    assert probe.watermarks == [1000, 1001]
    tags = [payload[0] for _t, payload in out]
    assert tags.count(RESULT_TAG) == 2  # the upstream result travels on, then its own
    assert out[-1][1][1]["metrics"]["items_in"] == 2 * RECORDS * CHUNK


def test_incomplete_input_is_reported() -> None:
    probe = _Probe()
    records = [r for r in probe.records(2) if r[1][0] != 7 or r[1][3] is not DONE_ITEM or r[1][1]]
    try:
        list(_task(probe, 2)(0, iter(records)))
    except Exception as exc:  # noqa: BLE001 - the failure is encoded for the driver
        assert "incomplete" in str(exc)
    else:
        raise AssertionError("a queue without end-of-stream must fail the task")


@given(
    st.integers(0, 2**31 - 1),
    st.lists(st.tuples(st.integers(0, 7), st.integers(0, MAX_SEQ)), min_size=2, max_size=20),
)
def test_shuffle_keys_partition_by_target_and_sort_by_rank_then_seq(
    target: int, parts: list[tuple[int, int]]
) -> None:
    keys = [shuffle_key(target, rank, seq) for rank, seq in parts]
    for key in keys:
        assert 0 <= key < 2**63  # a positive Java long
        assert target_of_key(key) == target
        # Java's Long.hashCode, which HashPartitioner uses
        h = (key ^ (key >> 32)) & 0xFFFFFFFF
        assert h == target
    assert sorted(keys) == [shuffle_key(target, r, s) for r, s in sorted(parts)]
