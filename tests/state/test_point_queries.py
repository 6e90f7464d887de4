"""Point queries on a running job (issue 25, "Done when"): ``job.state(vertex, key)``
asked again and again while the job runs answers, each time, exactly the state of one
snapshot committed around the question (a count equal to the oracle of the items that
snapshot covers, by its generator offset), never going back; the job runs on. Once a
snapshot covers every item of the stream (which then goes quiet but stays open), the
answers for a rolling count, a tumbling window's open frame and an open session are the
exact values, with the job still running."""

from __future__ import annotations

import operator
import time
from pathlib import Path

import pytest

import slipstream as ss
from slipstream import JobConfig, ProcessingGuarantee, sinks, sources
from slipstream.aggregate import counting
from slipstream.core.errors import JobCancelledError
from slipstream.state.reader import StateRow
from slipstream.state.store import DirectorySnapshotStore
from slipstream.window import session_window_def, tumbling_window_def

N = 600  # clicks; then the stream stays open and quiet


def click(seq: int) -> tuple[str, int] | None:
    """Click ``seq``: (user, timestamp in ms), every user every 30 ms; none after N."""
    return ("abc"[seq % 3], seq * 10) if seq < N else None


def build() -> ss.Pipeline:
    p = ss.Pipeline()
    clicks = (
        p.read_from(sources.generator(click, 1500.0))
        .set_name("events")
        .filter(lambda c: c is not None)
        .with_timestamps(operator.itemgetter(1), 0)
    )
    users = clicks.group_by(operator.itemgetter(0))
    users.rolling_aggregate(counting()).write_to(sinks.noop())
    users.window(tumbling_window_def(1000)).aggregate(counting()).write_to(sinks.noop())
    users.window(session_window_def(50)).aggregate(counting()).set_name("sessions").write_to(
        sinks.noop()
    )
    return p


def count_of_a(store: str, sid: int) -> int:
    """The oracle: how many of the clicks snapshot ``sid`` covers are user a's."""
    (offset,) = [r for r in ss.state.read(store, "events", snapshot_id=sid) if r.kind == "offset"]
    assert offset.value["parallelism"] == 1
    return len([s for s in range(min(offset.value["next_seq"], N)) if s % 3 == 0])


def test_point_queries_while_the_job_runs(tmp_path: Path) -> None:
    directory = str(tmp_path / "store")
    store = DirectorySnapshotStore(directory, keep=100_000)
    engine = ss.local()
    job = engine.new_job(
        build(),
        JobConfig(
            name="clicks",
            processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE,
            snapshot_interval_ms=20,
            snapshot_store=store,
        ),
    )
    answers: list[tuple[int, list[StateRow], int]] = []
    final: dict[str, list[StateRow]] = {}
    try:
        deadline = time.monotonic() + 120
        while True:
            assert not job.status.is_terminal, job.status
            assert time.monotonic() < deadline, "timed out waiting for a snapshot of all clicks"
            ids = DirectorySnapshotStore(directory).committed_ids_read_only()
            if not ids:
                time.sleep(0.005)
                continue
            rows = job.state("rolling_aggregate", "a")
            answers.append((ids[-1], rows, DirectorySnapshotStore(directory).committed_ids_read_only()[-1]))
            if count_of_a(directory, answers[-1][2]) == N // 3 and rows and rows[0].value == N // 3:
                final = {
                    v: job.state(v, "a")
                    for v in ("rolling_aggregate", "window-combine", "sessions")
                }
                final["absent"] = job.state("rolling_aggregate", "nobody")
                assert job.status is ss.JobStatus.RUNNING  # the queries did not stop it
                break
            time.sleep(0.01)
    finally:
        job.cancel()
        with pytest.raises(JobCancelledError):
            job.join(60)
        engine.shutdown()

    assert len(answers) >= 2
    committed = DirectorySnapshotStore(directory).committed_ids()
    previous = 0
    for before, rows, after in answers:
        value = rows[0].value if rows else 0
        assert rows == [] or rows == [
            StateRow("rolling_aggregate", 0, "a", None, value, "keyed")
        ], rows
        # the state of one snapshot committed between the question and the answer
        around = [sid for sid in committed if before <= sid <= after]
        assert value in {count_of_a(directory, sid) for sid in around}, (before, after, value)
        assert value >= previous
        previous = value
    assert final == {
        "rolling_aggregate": [StateRow("rolling_aggregate", 0, "a", None, 200, "keyed")],
        # the open window [5000, 6000): a's clicks 501, 504, ..., 597
        "window-combine": [
            StateRow(
                "window-combine", 0, "a", {"start": 5000, "end": 6000, "frame_end": 6000}, 33,
                "window",
            )
        ],
        # one session: a clicks every 30 ms, the last at 5970 (+ the 50 ms timeout)
        "sessions": [StateRow("sessions", 0, "a", {"start": 0, "end": 6020}, 200, "session")],
        "absent": [],
    }
