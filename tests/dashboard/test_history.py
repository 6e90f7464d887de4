"""Rates from the server's own readings, and the bounded history the dashboard's charts
and snapshot table draw: exact values on a fake job and a fake clock."""

from __future__ import annotations

from typing import Any

from slipstream import JobStatus
from slipstream.dashboard.history import History
from slipstream.dashboard.stats import Sampler


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class FakeJob:
    """What the Sampler reads of a job handle: counters, watch() and the submission time."""

    dag = None

    def __init__(self, submitted: float) -> None:
        self.id = "j1"
        self.name = "fake"
        self.status = JobStatus.RUNNING
        self.submission_time = submitted
        self.counts = {"src": (0, 0), "sink": (0, 0)}
        self.job_metrics: dict[str, int] = {"restarts": 0, "snapshots": 0}
        self.snapshot: dict[str, Any] | None = None

    @property
    def metrics(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {
            v: {"items_in": i, "items_out": o} for v, (i, o) in self.counts.items()
        }
        out["__job__"] = dict(self.job_metrics)
        return out

    def watch(self) -> dict[str, Any]:
        out: dict[str, Any] = {"queue_fill": {"sink": 0.25}, "watermarks": {}}
        if self.snapshot is not None:
            out["snapshot"] = dict(self.snapshot)
        return out


def rates(doc: dict[str, Any]) -> dict[str, tuple[float, float]]:
    return {v["name"]: (v["in_rate"], v["out_rate"]) for v in doc["vertices"]}


def test_the_first_reading_of_a_running_job_has_rates() -> None:
    # a page opened on a job that has run 10 s: its first request shows the job's rate
    # so far, not 0/s (on main every rate of a first reading was 0)
    clock = Clock(1010.0)
    job = FakeJob(submitted=1000.0)
    job.counts = {"src": (0, 5000), "sink": (5000, 0)}
    doc = Sampler(clock=clock).describe(job, "j1")
    assert rates(doc) == {"src": (0.0, 500.0), "sink": (500.0, 0.0)}


def test_rates_come_from_the_kept_readings_not_from_the_last_request() -> None:
    clock = Clock(1010.0)
    job = FakeJob(submitted=1000.0)
    sampler = Sampler(min_interval=0.5, clock=clock)
    job.counts = {"src": (0, 5000), "sink": (5000, 0)}
    sampler.describe(job, "j1")  # kept: t=1010
    clock.t, job.counts = 1011.0, {"src": (0, 5400), "sink": (5300, 0)}
    assert rates(sampler.describe(job, "j1")) == {"src": (0.0, 400.0), "sink": (300.0, 0.0)}
    # another viewer 0.2 s later: still measured from t=1010 (this reading is not kept)
    clock.t, job.counts = 1011.2, {"src": (0, 5500), "sink": (5300, 0)}
    assert rates(sampler.describe(job, "j1")) == {"src": (0.0, 416.7), "sink": (250.0, 0.0)}
    # 0.6 s after the kept t=1011: from there
    clock.t, job.counts = 1011.6, {"src": (0, 5700), "sink": (5600, 0)}
    assert rates(sampler.describe(job, "j1")) == {"src": (0.0, 500.0), "sink": (500.0, 0.0)}
    # a restart reset the counters: no negative rate
    clock.t, job.counts = 1012.6, {"src": (0, 100), "sink": (0, 0)}
    assert rates(sampler.describe(job, "j1")) == {"src": (0.0, 0.0), "sink": (0.0, 0.0)}
    job.status = JobStatus.COMPLETED
    clock.t = 1013.6
    assert rates(sampler.describe(job, "j1")) == {"src": (0.0, 0.0), "sink": (0.0, 0.0)}


def test_the_snapshot_carries_its_pause_when_the_metrics_describe_the_same_commit() -> None:
    clock = Clock(1010.0)
    job = FakeJob(submitted=1000.0)
    job.snapshot = {"id": 7, "duration_ms": 12.3, "bytes": 900, "entries": 6, "committed_at": 1009.5}
    job.job_metrics.update(
        snapshots=7, snapshot_duration_us=12_345, snapshot_bytes=900, snapshot_entries=6, snapshot_pause_us=420
    )
    snap = Sampler(clock=clock).describe(job, "j1")["snapshot"]
    assert snap == {
        "id": 7, "duration_ms": 12.3, "bytes": 900, "entries": 6, "committed_at": 1009.5,
        "age_s": 0.5, "pause_ms": 0.42,
    }
    # the metrics already describe the next commit: the pause is not this one's
    job.job_metrics.update(snapshot_duration_us=3_000)
    assert Sampler(clock=clock).describe(job, "j1")["snapshot"]["pause_ms"] is None


def doc(t_rate: float, status: str = "running", snapshot: dict[str, Any] | None = None,
        job_id: str = "j1") -> dict[str, Any]:
    return {
        "id": job_id,
        "status": status,
        "snapshot": snapshot,
        "vertices": [
            {"name": "src", "in_rate": 0.0, "out_rate": t_rate, "watermark_lag_ms": None, "queue_fill": 0.0},
            {"name": "sink", "in_rate": t_rate, "out_rate": 0.0, "watermark_lag_ms": 50.0, "queue_fill": 0.5},
        ],
    }


def test_history_is_a_bounded_ring_read_after_a_time() -> None:
    h = History(span_s=3.0, interval_s=1.0)
    for t in range(10):
        h.record(100.0 + t, [doc(float(t))])
    (full,) = h.attach([doc(0.0)])
    hist = full["history"]
    assert hist["t"] == [106.0, 107.0, 108.0, 109.0]  # 3 s at one point a second
    assert hist["span_s"] == 3.0 and hist["interval_s"] == 1.0
    assert hist["vertices"]["src"] == {
        "in_rate": [0.0] * 4, "out_rate": [6.0, 7.0, 8.0, 9.0],
        "watermark_lag_ms": [None] * 4, "queue_fill": [0.0] * 4,
    }
    assert hist["vertices"]["sink"]["watermark_lag_ms"] == [50.0] * 4
    (newer,) = h.attach([doc(0.0)], since=107.0)
    assert newer["history"]["t"] == [108.0, 109.0]
    assert newer["history"]["vertices"]["sink"]["in_rate"] == [8.0, 9.0]
    (none,) = h.attach([doc(0.0)], since=109.0)
    assert none["history"]["t"] == [] and none["history"]["vertices"]["sink"]["in_rate"] == []


def test_a_finished_job_keeps_its_last_point_and_a_gone_job_is_forgotten() -> None:
    h = History(span_s=60.0, interval_s=1.0)
    h.record(1.0, [doc(5.0), doc(1.0, job_id="j2")])
    h.record(2.0, [doc(0.0, status="completed"), doc(1.0, job_id="j2")])
    h.record(3.0, [doc(0.0, status="completed"), doc(1.0, job_id="j2")])
    h.record(4.0, [doc(0.0, status="completed")])  # j2 is no longer listed
    j1, j2 = h.attach([doc(0.0), doc(0.0, job_id="j2")])
    assert j1["history"]["t"] == [1.0, 2.0]
    assert j2["history"]["t"] == [] and j2["snapshot_history"] == []


def test_snapshot_history_lists_each_commit_once_and_learns_its_pause_later() -> None:
    h = History(span_s=60.0, interval_s=1.0, snapshots_kept=2)

    def snap(i: int, pause: float | None) -> dict[str, Any]:
        return {"id": i, "committed_at": 50.0 + i, "duration_ms": 3.5, "bytes": 800 + i,
                "entries": 6, "pause_ms": pause, "age_s": 0.1}

    h.record(1.0, [doc(1.0, snapshot=snap(1, None))])
    h.record(2.0, [doc(1.0, snapshot=snap(1, 0.25))])  # same commit, its pause now known
    h.record(3.0, [doc(1.0, snapshot=snap(1, 0.25))])
    (j,) = h.attach([doc(0.0)])
    assert j["snapshot_history"] == [
        {"id": 1, "committed_at": 51.0, "duration_ms": 3.5, "bytes": 801, "entries": 6, "pause_ms": 0.25}
    ]
    h.record(4.0, [doc(1.0, snapshot=snap(3, 0.5))])  # commit 2 happened between readings
    h.record(5.0, [doc(1.0, snapshot=snap(4, 0.5))])
    (j,) = h.attach([doc(0.0)])
    assert [s["id"] for s in j["snapshot_history"]] == [3, 4]  # the newest 2 kept
