"""The dashboard's endpoints on a running job: JSON, Prometheus text, the page, and
the server's lifecycle (loopback only, stopped by engine.shutdown())."""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from typing import Any

import pytest
from dashboard_support import get_json, member_pipeline, streaming_dag, wait_for
from prometheus_client.parser import text_string_to_metric_families

import slipstream as ss
from slipstream import DAG, Edge, JobConfig, ProcessingGuarantee, sinks, sources
from slipstream import processors as P
from slipstream.dashboard.server import LOOPBACK_NAMES, DashboardServer, host_allowed


def vertex(doc: dict[str, Any], name: str) -> dict[str, Any]:
    (job,) = doc["jobs"]
    return next(v for v in job["vertices"] if v["name"] == name)


def test_json_page_and_prometheus_while_a_job_runs(tmp_path: Any) -> None:
    engine = ss.local(dashboard=0)
    try:
        url = engine.dashboard_url
        assert url is not None and url.startswith("http://127.0.0.1:")
        assert engine.dashboard.host == "127.0.0.1"
        job = engine.new_job(
            streaming_dag(),
            JobConfig(
                name="watched",
                processing_guarantee=ProcessingGuarantee.AT_LEAST_ONCE,
                snapshot_interval_ms=200,
                snapshot_store=str(tmp_path / "snaps"),
            ),
        )
        api = url + "api/jobs"
        first = wait_for(lambda: vertex(get_json(api), "sink")["items_in"] > 0 and get_json(api))
        # counters move, rates appear, a watermark with wall-clock lag, late items dropped
        later = wait_for(
            lambda: (d := get_json(api))
            and vertex(d, "sink")["items_in"] > vertex(first, "sink")["items_in"]
            and vertex(d, "events")["out_rate"] > 0
            and vertex(d, "count-per-window")["late_items_dropped"] > 0
            and vertex(d, "timestamps")["watermark_lag_ms"] is not None
            and d["jobs"][0]["snapshot"] is not None
            and d,
            what="moving counters, rates, watermark lag, late items and a snapshot",
        )
        j = later["jobs"][0]
        assert j["name"] == "watched" and j["status"] == "running" and j["engine"] == "local"
        assert [v["name"] for v in j["vertices"]] == ["events", "timestamps", "count-per-window", "sink"]
        assert vertex(later, "count-per-window")["parallelism"] == 2
        win = vertex(later, "count-per-window")
        assert 0 <= win["queue_fill"] <= 1
        # the lag is the watermark's distance behind the clock: with_fixed_lag(50) plus
        # scheduling delay; never negative, and far below the late items' minute
        assert 0 <= vertex(later, "timestamps")["watermark_lag_ms"] < 60_000
        snap = j["snapshot"]
        assert snap["id"] >= 1 and snap["bytes"] > 0 and snap["duration_ms"] >= 0 and snap["age_s"] >= 0

        with urllib.request.urlopen(url + "metrics", timeout=10) as r:
            assert r.headers["Content-Type"].startswith("text/plain")
            text = r.read().decode()
        fams = {f.name: f for f in text_string_to_metric_families(text)}
        sample = {
            s.labels["vertex"]: s.value for s in fams["slipstream_vertex_items_in"].samples
            if s.name.endswith("_total")
        }
        assert sample["sink"] > 0
        lags = [s for s in fams["slipstream_vertex_watermark_lag_seconds"].samples]
        assert any(s.labels["vertex"] == "timestamps" for s in lags)
        assert fams["slipstream_snapshot_last_id"].samples[0].value >= 1

        with urllib.request.urlopen(url, timeout=10) as r:
            assert r.headers["Content-Type"].startswith("text/html")
            page = r.read().decode()
        assert "<svg" in page and 'data-vertex="count-per-window"' in page
        assert "partitioned by lambda" in page  # edge labels carry the routing
        with urllib.request.urlopen(f"{url}api/jobs/{job.id}/dag.svg", timeout=10) as r:
            assert r.read().decode().startswith("<svg")
        with pytest.raises(urllib.error.HTTPError) as ei:
            urllib.request.urlopen(url + "api/jobs/999/dag.svg", timeout=10)
        assert ei.value.code == 404
        job.cancel()
        wait_for(lambda: get_json(api)["jobs"][0]["status"] == "cancelled")
    finally:
        engine.shutdown()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url + "api/jobs", timeout=5)


class Boom(ss.AbstractProcessor):
    def try_process_item(self, ordinal: int, item: Any) -> bool:
        raise ValueError(f"bad item {item}")


def test_failed_job_shows_its_error() -> None:
    with ss.local(dashboard=0) as engine:
        dag = DAG()
        s = dag.new_vertex("src", sources.items([1, 2, 3]))
        b = dag.new_vertex("explode", Boom)
        dag.edge(Edge.between(s, b))
        job = engine.new_job(dag)
        with pytest.raises(ss.JobFailedError):
            job.join(30)
        (j,) = get_json(engine.dashboard_url + "api/jobs")["jobs"]
        assert j["status"] == "failed"
        assert "explode" in j["error"] and "ValueError: bad item" in j["error"]


def test_batch_source_reports_progress_and_no_dashboard_by_default(tmp_path: Any) -> None:
    engine = ss.local()
    assert engine.dashboard_url is None
    for i in range(3):
        (tmp_path / f"f{i}.txt").write_text("".join(f"line {n}\n" for n in range(500)))
    dag = DAG()
    s = dag.new_vertex("read", sources.read_files(str(tmp_path), "*.txt")).local_parallelism(2)
    m = dag.new_vertex("upper", P.map(str.upper))
    o = dag.new_vertex("out", sinks.noop())
    dag.edge(Edge.between(s, m)).edge(Edge.between(m, o))
    job = engine.new_job(dag)
    job.join(30)
    done, total = job.watch()["progress"]["read"]
    assert done == total == sum(p.stat().st_size for p in tmp_path.iterdir())


def _get_with_host(port: int, path: str, host: str) -> tuple[int, str, str]:
    """GET over real HTTP with ``host`` as the Host header (as a browser sends a page's
    own domain after DNS rebinding points it at 127.0.0.1)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.putrequest("GET", path, skip_host=True)
        conn.putheader("Host", host)
        conn.endheaders()
        r = conn.getresponse()
        return r.status, r.getheader("Content-Type") or "", r.read().decode()
    finally:
        conn.close()


def test_requests_for_another_host_are_refused() -> None:
    """DNS rebinding: a page on attacker.example makes the browser send its requests to
    127.0.0.1 with ``Host: attacker.example``; before the Host check this returned the
    jobs as JSON (200)."""
    with ss.local(dashboard=0) as engine:
        engine.new_job(streaming_dag(rate=50), JobConfig(name="secret"))
        port = engine.dashboard.port
        names = "127.0.0.1, [::1], localhost"
        for path in ("/api/jobs", "/", "/metrics", "/api/jobs/1/dag.svg"):
            for host in (f"attacker.example:{port}", "attacker.example",
                         f"127.0.0.1.attacker.example:{port}", "localhost.attacker.example",
                         f"[::1]x:{port}", f"localhost:{port}x"):
                status, ctype, body = _get_with_host(port, path, host)
                assert (status, ctype) == (403, "text/plain"), (path, host)
                assert body == (
                    f"this dashboard answers only requests for {names}; "
                    f"the request was for host {host!r}\n"
                )
                assert "secret" not in body
        for host in (f"127.0.0.1:{port}", "127.0.0.1", f"localhost:{port}", "LocalHost",
                     f"[::1]:{port}", "[::1]"):
            status, _ctype, body = _get_with_host(port, "/api/jobs", host)
            assert status == 200, host
            assert json.loads(body)["jobs"][0]["name"] == "secret"


def test_configured_and_allowed_host_names() -> None:
    server = DashboardServer(lambda: [], 0, allowed_hosts=["dash.example.com"])
    try:
        assert _get_with_host(server.port, "/api/jobs", f"dash.example.com:{server.port}")[0] == 200
        assert _get_with_host(server.port, "/api/jobs", "Dash.Example.Com")[0] == 200
        assert _get_with_host(server.port, "/api/jobs", "other.example.com")[0] == 403
    finally:
        server.close()


def test_host_allowed_rules() -> None:
    names = LOOPBACK_NAMES | {"[fe80::1]"}
    assert host_allowed(None, names)  # HTTP/1.0 without a Host header: not a browser page
    assert host_allowed("[FE80::1]:8080", names)
    assert not host_allowed("10.1.2.3:8080", names)
    assert not host_allowed("", names)
    # a server bound to every address (0.0.0.0) also answers for any IP address: a
    # rebinding page always has a domain name as its host
    assert host_allowed("10.1.2.3:8080", names, any_ip=True)
    assert host_allowed("[2001:db8::7]", names, any_ip=True)
    assert not host_allowed("10.1.2.3.nip.io", names, any_ip=True)
    assert not host_allowed("10.1.2.3:http", names, any_ip=True)


def test_first_request_has_rates_and_the_server_keeps_history(tmp_path: Any) -> None:
    with ss.local(dashboard=0) as engine:
        job = engine.new_job(
            streaming_dag(),
            JobConfig(
                name="kept",
                processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE,
                snapshot_interval_ms=200,
                snapshot_store=str(tmp_path / "snaps"),
            ),
        )
        wait_for(lambda: job.metrics.get("events", {}).get("items_out", 0) >= 100, what="the job to emit")
        api = engine.dashboard_url + "api/jobs"
        # the page's first request: rates from the server's readings (on main: 0/s)
        first = get_json(api)
        assert vertex(first, "events")["out_rate"] > 0 and vertex(first, "timestamps")["in_rate"] > 0

        def kept() -> Any:
            (j,) = get_json(api)["jobs"]
            return len(j["history"]["t"]) >= 3 and len(j["snapshot_history"]) >= 2 and j

        j = wait_for(kept, what="three history points and two snapshot commits")
        hist = j["history"]
        assert hist["span_s"] == 300.0 and hist["interval_s"] == 1.0
        assert hist["t"] == sorted(hist["t"])
        assert list(hist["vertices"]) == ["events", "timestamps", "count-per-window", "sink"]
        n = len(hist["t"])
        for series in hist["vertices"].values():
            assert sorted(series) == ["in_rate", "out_rate", "queue_fill", "watermark_lag_ms"]
            assert all(len(values) == n for values in series.values())
        assert max(hist["vertices"]["events"]["out_rate"]) > 0
        assert hist["vertices"]["events"]["watermark_lag_ms"] == [None] * n  # a source: none
        ids = [s["id"] for s in j["snapshot_history"]]
        assert ids == sorted(set(ids))
        for s in j["snapshot_history"]:
            assert sorted(s) == ["bytes", "committed_at", "duration_ms", "entries", "id", "pause_ms"]
            assert s["bytes"] > 0 and s["entries"] > 0 and s["duration_ms"] >= 0
        # a page asks only for the points after the newest it has
        newer = get_json(f"{api}?since={hist['t'][-1]}")["jobs"][0]["history"]
        assert all(t > hist["t"][-1] for t in newer["t"])
        with pytest.raises(urllib.error.HTTPError) as ei:
            urllib.request.urlopen(api + "?since=yesterday", timeout=10)
        assert ei.value.code == 400
        assert ei.value.read().decode() == "since='yesterday': expected seconds since the epoch\n"


def half_bad(x: int) -> int:
    if x % 2:
        raise ValueError(f"odd {x}")
    return x


def test_items_set_aside_by_on_item_error_are_shown_per_vertex() -> None:
    """Issue 21, item 4: the skipped items are counted per vertex in the JSON, the
    Prometheus text, the page and the console's progress line."""
    from slipstream.dashboard.console import Progress

    with ss.local(dashboard=0) as engine:
        dag = DAG()
        s = dag.new_vertex("src", sources.items(range(10)))
        m = dag.new_vertex("parse", P.map(half_bad))
        dag.edge(Edge.between(s, m)).edge(Edge.between(m, dag.new_vertex("out", sinks.noop())))
        job = engine.new_job(dag, JobConfig(name="skips", on_item_error="skip"))
        job.join(30)
        d = get_json(engine.dashboard_url + "api/jobs")
        assert vertex(d, "parse")["items_skipped"] == 5
        assert vertex(d, "src")["items_skipped"] == 0
        with urllib.request.urlopen(engine.dashboard_url + "metrics") as r:
            families = {f.name: f for f in text_string_to_metric_families(r.read().decode())}
        samples = {s.labels["vertex"]: s.value for s in families["slipstream_vertex_items_skipped"].samples}
        assert samples["parse"] == 5.0
        with urllib.request.urlopen(engine.dashboard_url + f"api/jobs/{job.id}/section") as r:
            assert '<td class="num" data-f="skipped">' in r.read().decode()
        line = Progress(job, interval=1.0).line(d["jobs"][0])
        assert [x for x in line.splitlines() if x.strip().startswith("parse")][0].endswith(
            "skipped 5"
        )


def test_a_job_with_member_processes_shows_each_member_and_the_total() -> None:
    """``processes=2``: ``/api/jobs`` and ``/metrics`` give per member its pid, state,
    items, CPU and resident set, and their totals (on main: neither had members)."""
    engine = ss.local(processes=2, dashboard=0)
    try:
        job = engine.new_job(member_pipeline(), JobConfig(name="members"))
        api = engine.dashboard_url + "api/jobs"

        def busy() -> Any:
            (j,) = get_json(api)["jobs"]
            rows = j["members"] or []
            return (
                len(rows) == 2
                and all(r["items_in"] > 0 and r["cpu_share"] is not None for r in rows)
                and j
            )

        j = wait_for(busy, what="both members' figures")
        pids = [p.pid for p in job._execution._procs]
        rows = j["members"]
        assert [(r["member"], r["pid"], r["state"]) for r in rows] == [
            (0, pids[0], "running"),
            (1, pids[1], "running"),
        ]
        for r in rows:
            assert r["items_out"] > 0 and r["cpu_ms"] > 0 and r["cpu_share"] >= 0
            assert 0 < r["rss_kb"] <= r["peak_rss_kb"]
        total = j["members_total"]
        assert total["members"] == 2
        for k in ("items_in", "items_out", "cpu_ms", "rss_kb", "peak_rss_kb"):
            assert total[k] == sum(r[k] for r in rows), k

        with urllib.request.urlopen(engine.dashboard_url + "metrics", timeout=10) as r:
            text = r.read().decode()
        fams = {f.name: f for f in text_string_to_metric_families(text)}

        def per_member(name: str) -> dict[str, float]:
            return {s.labels["member"]: s.value for s in fams[name].samples if s.labels["job"] == "members"}

        assert set(per_member("slipstream_member_items_in")) == {"0", "1"}
        assert all(v > 0 for v in per_member("slipstream_member_cpu_seconds").values())
        assert all(v > 0 for v in per_member("slipstream_member_rss_bytes").values())
        running = {s.labels["member"]: (s.labels["state"], s.value) for s in fams["slipstream_member_running"].samples}
        assert running == {"0": ("running", 1.0), "1": ("running", 1.0)}
        (n,) = fams["slipstream_job_processes"].samples
        assert n.value == 2
        (rss,) = fams["slipstream_job_processes_rss_bytes"].samples
        assert rss.value == sum(per_member("slipstream_member_rss_bytes").values())
        (cpu,) = [s for s in fams["slipstream_job_processes_cpu_seconds"].samples if s.name.endswith("_total")]
        assert cpu.value == pytest.approx(sum(per_member("slipstream_member_cpu_seconds").values()))

        job.cancel()
        ended = wait_for(
            lambda: (d := get_json(api)["jobs"][0])["status"] == "cancelled" and d, what="the cancel"
        )
        assert [r["state"] for r in ended["members"]] == ["cancelled", "cancelled"]
    finally:
        engine.shutdown()


def test_a_job_in_one_process_has_no_members() -> None:
    engine = ss.local(dashboard=0)
    try:
        job = engine.new_job(member_pipeline(), JobConfig(name="one"))
        wait_for(lambda: job.metrics.get("sink", {}).get("items_in", 0) > 0, what="output")
        (j,) = get_json(engine.dashboard_url + "api/jobs")["jobs"]
        assert j["members"] is None and j["members_total"] is None
        with urllib.request.urlopen(engine.dashboard_url + "metrics", timeout=10) as r:
            assert "slipstream_member_" not in r.read().decode()
        job.cancel()
    finally:
        engine.shutdown()


def test_watermarks_and_queue_fill_of_member_processes() -> None:
    """``processes=2``: the vertices' watermarks (lowest over the members) and queue fill
    (fullest over the members) reach the JSON (on main both were empty with processes)."""
    engine = ss.local(processes=2, dashboard=0)
    try:
        job = engine.new_job(member_streaming_dag(), JobConfig(name="member-watermarks"))
        api = engine.dashboard_url + "api/jobs"
        d = wait_for(
            lambda: (d := get_json(api))
            and vertex(d, "timestamps")["watermark_lag_ms"] is not None
            and vertex(d, "count-per-window")["watermark"] is not None
            and d,
            what="watermarks from the members",
        )
        for name in ("timestamps", "count-per-window", "sink"):
            assert 0 <= vertex(d, name)["queue_fill"] <= 1, name
        assert 0 <= vertex(d, "timestamps")["watermark_lag_ms"] < 60_000
        assert vertex(d, "events")["watermark"] is None  # the source has none
        watched = job.watch()
        assert watched["watermarks"]["timestamps"] is not None
        assert set(watched["queue_fill"]) == {"events", "timestamps", "count-per-window", "sink"}
        job.cancel()
    finally:
        engine.shutdown()


def member_streaming_dag() -> DAG:
    """dashboard_support.streaming_dag's shape with the window behind a distributed
    partitioned edge (keys must meet on one processor of all members)."""
    from dashboard_support import event

    from slipstream.aggregate import counting
    from slipstream.watermark import with_fixed_lag
    from slipstream.window import tumbling_window_def

    dag = DAG()
    src = dag.new_vertex("events", sources.generator(event, 400.0)).local_parallelism(1)
    wm = dag.new_vertex("timestamps", P.insert_watermarks(event_ts, lambda: with_fixed_lag(50)))
    win = dag.new_vertex(
        "count-per-window",
        P.aggregate_to_sliding_window(
            key_fn=event_key, timestamp_fn=event_ts, window_def=tumbling_window_def(100), agg_op=counting()
        ),
    )
    out = dag.new_vertex("sink", sinks.noop()).local_parallelism(1)
    dag.edge(Edge.between(src, wm).isolated())
    dag.edge(Edge.between(wm, win).distributed().partitioned(event_key))
    dag.edge(Edge.between(win, out))
    return dag


def event_ts(e: tuple[int, int]) -> int:
    return e[0]


def event_key(e: tuple[int, int]) -> int:
    return e[1] % 4
