"""The two-phase file sink (sinks/files.py) across restores at another parallelism: a job
suspended on two members, restored on one and then on two again, writes every item once."""

from __future__ import annotations

import functools
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import slipstream as ss
from process_support import functions_by_value
from slipstream import DAG, Edge, JobConfig, ProcessingGuarantee, sinks
from slipstream.core.errors import SnapshotStoreRolledBackError
from slipstream.core.inbox import Inbox
from slipstream.core.outbox import Outbox
from slipstream.core.processor import Context
from slipstream.state.keys import BroadcastKey

N = 300
STEPS = (100, 200, 250)  # the source stops at each of these until its gate file allows more


class GatedSource(ss.AbstractProcessor):
    """Processor 0 emits ``range(n)`` up to the number in the file ``gate`` (read again
    only when it got there), saving its offset; it writes that offset to ``reached``
    when it waits at the gate, so a test suspends once every item before it was
    emitted. The other processors emit nothing and end when the gate is ``n``."""

    def __init__(self, n: int, gate: str, reached: str) -> None:
        self.n = n
        self.gate = gate
        self.reached = reached
        self.offset = 0
        self.limit = 0

    def _reach(self) -> None:
        with open(self.gate) as f:
            self.limit = min(self.n, int(f.read()))
        if self.offset >= self.limit:
            tmp = self.reached + ".tmp"
            with open(tmp, "w") as f:
                f.write(str(self.offset))
            os.replace(tmp, self.reached)

    def complete(self) -> bool:
        if self.context.global_processor_index != 0:
            # ends with processor 0 (a finished processor could not restore elsewhere)
            time.sleep(0.005)
            with open(self.gate) as f:
                return int(f.read()) >= self.n
        if self.offset >= self.limit:
            self._reach()
            if self.offset >= self.limit:
                time.sleep(0.005)
                return self.offset >= self.n
        while self.offset < self.limit:
            if not self.try_emit(self.offset):
                return False
            self.offset += 1
        return False

    def save_to_snapshot(self) -> bool:
        if self.context.global_processor_index != 0:
            return True
        return self.try_emit_to_snapshot(BroadcastKey(("offset", 0)), self.offset)

    def restore_from_snapshot_entry(self, key: Any, value: Any) -> None:
        if self.context.global_processor_index == 0:
            self.offset = value


def _dag(out: str, gate: str, reached: str, roll_interval_ms: int) -> DAG:
    dag = DAG()
    src = dag.new_vertex("numbers", functools.partial(GatedSource, N, gate, reached)).local_parallelism(1)
    sink = dag.new_vertex("out", sinks.write_files(out, roll_interval_ms=roll_interval_ms))
    dag.edge(Edge.between(src, sink.local_parallelism(2)).distributed().partitioned(lambda x: x))
    return dag


def _wait_reached(reached: str, value: int) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            with open(reached) as f:
                if f.read() == str(value):
                    return
        except FileNotFoundError:
            pass
        assert time.monotonic() < deadline, f"the source never reached {value}"
        time.sleep(0.01)


def published_lines(out: Path) -> list[int]:
    lines: list[int] = []
    for name in sorted(os.listdir(out)):
        if name.startswith("part-"):
            lines += [int(x) for x in (out / name).read_text().splitlines()]
    return lines


@pytest.fixture
def by_value() -> Iterator[None]:
    """This module's classes travel to member processes by value (they need not import
    it, and pytest with it)."""
    with functions_by_value(sys.modules[__name__]):
        yield


@pytest.mark.parametrize(
    "kind, roll_interval_ms",
    [
        ("members", 0),
        ("members", 60_000),
        pytest.param("processes", 0, marks=pytest.mark.slow),
        pytest.param("processes", 60_000, marks=pytest.mark.slow),
    ],
)
def test_write_files_restores_from_two_members_to_one_and_back(
    tmp_path: Path, by_value: None, kind: str, roll_interval_ms: int
) -> None:
    """2 -> 1 -> 2 members (4, 2, then 4 sink processors), each stop exported and restored
    by a new job, the last one also suspended and resumed: every item is published once;
    alike with members in 2, 1 and 2 processes.
    On main processors 2 and 3 of the third job had no entry in the snapshot of two
    processors, so they started again at part 000000 and replaced the files their first
    incarnation had published: with roll_interval_ms=0 they replaced those files (50
    items lost), with 60 s the resume after the suspension failed "the snapshot store
    was rolled back" (part-00003-000000 newer than the snapshot)."""
    out, gate, reached = tmp_path / "out", str(tmp_path / "gate"), str(tmp_path / "reached")

    def open_gate(upto: int) -> None:
        with open(gate, "w") as f:
            f.write(str(upto))

    snapshot = None
    for step, members in enumerate((2, 1, 2)):
        open_gate(STEPS[step])
        cfg = JobConfig(
            name=f"files-{step}",
            processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE,
            snapshot_interval_ms=50,
            snapshot_store=str(tmp_path / f"store-{step}"),
        )
        with ss.local(**{kind: members}) as engine:
            job = engine.new_job(_dag(str(out), gate, reached, roll_interval_ms), cfg, restore_from=snapshot)
            _wait_reached(reached, STEPS[step])
            job.suspend()
            if step < 2:
                snapshot = job.export_snapshot()
                assert snapshot is not None
                job.cancel()
                continue
            job.resume()
            open_gate(N)
            job.join(60)
    assert sorted(published_lines(out)) == list(range(N))
    assert not [n for n in os.listdir(out) if n.endswith(".tmp")]


def test_a_new_index_meeting_its_published_part_files_is_a_rolled_back_store(tmp_path: Path) -> None:
    """Processor 1 of 2 restored from a snapshot with no entry of index 1 (one written by
    one processor, before processor 0 kept the next sequence of vanished indices, or an
    older snapshot than the files): it would start at part 000000 again. On main it
    replaced the published part-00001-000000 (its items lost); now the store counts as
    rolled back (JobConfig.allow_rollback continues after the published file)."""
    (tmp_path / "part-00001-000000").write_text("1\n3\n")
    entry = (BroadcastKey(("write-files", 0)), (1, [], None))
    for allow in (False, True):
        ctx = Context(
            processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE,
            global_processor_index=1,
            total_parallelism=2,
            vertex_name="out",
        )
        ctx.allow_rollback = allow
        proc = sinks.write_files(tmp_path, roll_interval_ms=0)()
        proc.init(Outbox(0, 1), ctx)
        proc.restore_from_snapshot(Inbox([entry]))
        if not allow:
            with pytest.raises(SnapshotStoreRolledBackError) as e:
                proc.finish_snapshot_restore()
            assert str(e.value) == (
                f"write_files (vertex 'out'): the snapshot store was rolled back: {tmp_path} holds "
                "the published part file part-00001-000000 of processor 1, newer than the "
                "snapshot the job resumes from (which has no part files of processor 1): "
                "resuming would write the items after it again. Put the store's newest "
                "snapshots back, or pass JobConfig(allow_rollback=True) to accept that replay "
                "(into new part files: duplicates downstream)."
            )
            continue
        assert proc.finish_snapshot_restore()
        proc.process(0, Inbox([5]))
        assert proc.complete()
        proc.close()
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == {
        "part-00001-000000": "1\n3\n",
        "part-00001-000001": "5\n",
    }
