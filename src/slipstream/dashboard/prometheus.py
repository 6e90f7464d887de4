"""The ``/metrics`` endpoint: the dashboard's numbers in Prometheus' text format.

A custom collector reads the jobs at scrape time (nothing is pushed from the hot path),
registered in a private registry so two engines in one process do not collide.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class JobsCollector(Collector):
    def __init__(self, describe_all: Callable[[], list[dict[str, Any]]]) -> None:
        self._describe_all = describe_all

    def collect(self) -> Iterator[Any]:
        jobs = self._describe_all()
        labels = ["job", "job_id"]
        vlabels = [*labels, "vertex"]
        status = GaugeMetricFamily(
            "slipstream_job_running", "1 while the job runs, else 0", labels=[*labels, "status"]
        )
        restarts = CounterMetricFamily("slipstream_job_restarts", "Restarts of the job", labels=labels)
        snaps = CounterMetricFamily(
            "slipstream_snapshots_committed", "Snapshots committed by the job", labels=labels
        )
        snap_id = GaugeMetricFamily("slipstream_snapshot_last_id", "Id of the last committed snapshot", labels=labels)
        snap_dur = GaugeMetricFamily(
            "slipstream_snapshot_last_duration_seconds", "Duration of the last snapshot", labels=labels
        )
        snap_bytes = GaugeMetricFamily("slipstream_snapshot_last_bytes", "Size of the last snapshot", labels=labels)
        snap_age = GaugeMetricFamily(
            "slipstream_snapshot_last_age_seconds", "Seconds since the last snapshot committed", labels=labels
        )
        items_in = CounterMetricFamily("slipstream_vertex_items_in", "Items received", labels=vlabels)
        items_out = CounterMetricFamily("slipstream_vertex_items_out", "Items emitted", labels=vlabels)
        late = CounterMetricFamily(
            "slipstream_vertex_late_items_dropped", "Late items dropped", labels=vlabels
        )
        skipped = CounterMetricFamily(
            "slipstream_vertex_items_skipped",
            "Items set aside because user code raised on them (on_item_error)",
            labels=vlabels,
        )
        in_rate = GaugeMetricFamily("slipstream_vertex_items_in_per_second", "Items received per second", labels=vlabels)
        out_rate = GaugeMetricFamily("slipstream_vertex_items_out_per_second", "Items emitted per second", labels=vlabels)
        fill = GaugeMetricFamily(
            "slipstream_vertex_queue_fill_ratio", "Fill of the fullest inbound queue (0..1)", labels=vlabels
        )
        wm = GaugeMetricFamily("slipstream_vertex_watermark", "Watermark passed on (event time)", labels=vlabels)
        lag = GaugeMetricFamily(
            "slipstream_vertex_watermark_lag_seconds", "Watermark lag behind the wall clock", labels=vlabels
        )
        unavailable = GaugeMetricFamily(
            "slipstream_sink_unavailable_seconds",
            "How long a sink of the job has been retrying its server (0: every sink reaches it)",
            labels=labels,
        )
        retries = CounterMetricFamily(
            "slipstream_commit_retries",
            "Failed attempts of the job's sinks to reach their server (current execution)",
            labels=labels,
        )
        warnings = GaugeMetricFamily(
            "slipstream_job_warnings",
            "Warnings about what keeps the job from making progress (a sink retrying, a stall)",
            labels=labels,
        )
        stage_tasks = GaugeMetricFamily(
            "slipstream_spark_stage_tasks",
            "Tasks of the job's recent Spark stages, by state (done, active, failed, total)",
            labels=[*labels, "stage", "state"],
        )
        state_bytes = GaugeMetricFamily(
            "slipstream_vertex_state_bytes",
            "Bytes on disk of the chunks holding the vertex's state in the last committed snapshot",
            labels=vlabels,
        )
        state_entries = GaugeMetricFamily(
            "slipstream_vertex_state_entries",
            "Entries of the vertex's state (rows of ss.state.read) in the last counted snapshot",
            labels=vlabels,
        )
        state_keys = GaugeMetricFamily(
            "slipstream_vertex_state_keys",
            "Distinct keys of the vertex's keyed state in the last counted snapshot",
            labels=vlabels,
        )
        members = MemberFamilies(labels)
        for j in jobs:
            lv = [j["name"], j["id"]]
            members.add(lv, j)
            for sv in (j.get("state") or {}).get("vertices") or ():
                vl = [*lv, sv["name"]]
                state_bytes.add_metric(vl, sv["bytes"])
                if sv["entries"] is not None:
                    state_entries.add_metric(vl, sv["entries"])
                    state_keys.add_metric(vl, sv["keys"])
            for st in j.get("stages") or ():
                for state in ("done", "active", "failed", "total"):
                    stage_tasks.add_metric([*lv, str(st["id"]), state], st[f"tasks_{state}"])
            status.add_metric([*lv, j["status"]], 1.0 if j["status"] == "running" else 0.0)
            restarts.add_metric(lv, j["restarts"])
            snaps.add_metric(lv, j["snapshots"])
            unavailable.add_metric(lv, j.get("sink_unavailable_s", 0))
            retries.add_metric(lv, j.get("commit_retries", 0))
            warnings.add_metric(lv, len(j.get("warnings") or ()))
            s = j.get("snapshot")
            if s:
                snap_id.add_metric(lv, s["id"])
                snap_dur.add_metric(lv, s["duration_ms"] / 1000.0)
                if s.get("bytes") is not None:
                    snap_bytes.add_metric(lv, s["bytes"])
                snap_age.add_metric(lv, s["age_s"])
            for v in j["vertices"]:
                vl = [*lv, v["name"]]
                items_in.add_metric(vl, v["items_in"])
                items_out.add_metric(vl, v["items_out"])
                late.add_metric(vl, v["late_items_dropped"])
                skipped.add_metric(vl, v.get("items_skipped", 0))
                in_rate.add_metric(vl, v["in_rate"])
                out_rate.add_metric(vl, v["out_rate"])
                if v["queue_fill"] is not None:
                    fill.add_metric(vl, v["queue_fill"])
                if v["watermark"] is not None:
                    wm.add_metric(vl, v["watermark"])
                if v["watermark_lag_ms"] is not None:
                    lag.add_metric(vl, v["watermark_lag_ms"] / 1000.0)
        yield from (status, restarts, snaps, snap_id, snap_dur, snap_bytes, snap_age, stage_tasks)
        yield from (unavailable, retries, warnings, state_bytes, state_entries, state_keys)
        yield from (items_in, items_out, late, skipped, in_rate, out_rate, fill, wm, lag)
        yield from members.families()


class MemberFamilies:
    """The ``slipstream_member_*`` series of jobs whose members run in processes (one
    per member, label ``member``) and their totals (``slipstream_job_processes_*``);
    nothing for other jobs."""

    def __init__(self, labels: list[str]) -> None:
        ml = [*labels, "member"]
        self.up = GaugeMetricFamily(
            "slipstream_member_running", "1 while the member process runs, else 0", labels=[*ml, "state"]
        )
        self.seen = False
        self.items_in = CounterMetricFamily(
            "slipstream_member_items_in", "Items received by the member's processors", labels=ml
        )
        self.items_out = CounterMetricFamily(
            "slipstream_member_items_out", "Items emitted by the member's processors", labels=ml
        )
        self.cpu = CounterMetricFamily("slipstream_member_cpu_seconds", "CPU time of the member process", labels=ml)
        self.rss = GaugeMetricFamily("slipstream_member_rss_bytes", "Resident set of the member process", labels=ml)
        self.peak = GaugeMetricFamily(
            "slipstream_member_peak_rss_bytes", "Peak resident set of the member process", labels=ml
        )
        self.n = GaugeMetricFamily("slipstream_job_processes", "Member processes of the job", labels=labels)
        self.cpu_total = CounterMetricFamily(
            "slipstream_job_processes_cpu_seconds", "CPU time of the job's member processes together", labels=labels
        )
        self.rss_total = GaugeMetricFamily(
            "slipstream_job_processes_rss_bytes", "Resident sets of the job's member processes, summed", labels=labels
        )
        self.peak_total = GaugeMetricFamily(
            "slipstream_job_processes_peak_rss_bytes",
            "Peak resident sets of the job's member processes, summed (an upper bound of what they held at once)",
            labels=labels,
        )

    def add(self, lv: list[str], job: dict[str, Any]) -> None:
        rows = job.get("members")
        if not rows:
            return
        self.seen = True
        for r in rows:
            ml = [*lv, str(r["member"])]
            self.up.add_metric([*ml, r["state"]], 1.0 if r["state"] == "running" else 0.0)
            self.items_in.add_metric(ml, r["items_in"])
            self.items_out.add_metric(ml, r["items_out"])
            self.cpu.add_metric(ml, r["cpu_ms"] / 1000.0)
            self.rss.add_metric(ml, r["rss_kb"] * 1024)
            self.peak.add_metric(ml, r["peak_rss_kb"] * 1024)
        t = job["members_total"]
        self.n.add_metric(lv, t["members"])
        self.cpu_total.add_metric(lv, t["cpu_ms"] / 1000.0)
        self.rss_total.add_metric(lv, t["rss_kb"] * 1024)
        self.peak_total.add_metric(lv, t["peak_rss_kb"] * 1024)

    def families(self) -> Iterator[Any]:
        if not self.seen:  # no job has member processes: no empty families either
            return
        yield from (self.up, self.items_in, self.items_out, self.cpu, self.rss, self.peak)
        yield from (self.n, self.cpu_total, self.rss_total, self.peak_total)


def metrics_text(describe_all: Callable[[], list[dict[str, Any]]]) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(JobsCollector(describe_all))
    return generate_latest(registry)
