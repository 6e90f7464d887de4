"""The dashboard's state view (issue 25): each stateful vertex's size in ``/api/jobs``
and ``/metrics``, and the key search ``/api/jobs/ID/state``, answered from the last
committed snapshot as ``job.state(vertex, key)`` answers.

The exact answers come from a store seeded by ``ss.state.bootstrap`` (known keys and
values) behind a minimal job handle; the refusals from real jobs of the engine."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from dashboard_support import get_json, wait_for
from prometheus_client.parser import text_string_to_metric_families

import slipstream as ss
from slipstream import JobConfig, JobStatus, ProcessingGuarantee, sinks, sources
from slipstream.core.dag import as_dag
from slipstream.core.errors import JobCancelledError
from slipstream.dashboard.server import DashboardServer
from slipstream.dashboard.statequery import REPR_CHARS, parse_key, plain, shown
from slipstream.state.store import DirectorySnapshotStore

HTML = "<img src=x onerror=alert(1)>"
SEEDED: list[tuple[Any, Any]] = [
    (42, [1, 2]),
    ("42", "the string"),
    (("a", 1), {"total": 3}),
    (HTML, f"</td>{HTML}"),
    ("alice", 7),
]


def pipeline() -> ss.Pipeline:
    p = ss.Pipeline()
    p.read_from(sources.items([])).group_by(lambda x: x).map_stateful(
        lambda: 0, lambda s, k, x: (s, x)
    ).set_local_parallelism(2).write_to(sinks.noop())
    return p


class SeededJob:
    """What the dashboard needs of a job handle: a running job whose store holds the
    seeded snapshot."""

    id = "seeded-1"
    name = "seeded"
    status = JobStatus.RUNNING
    metrics: dict[str, Any] = {}
    submission_time = None

    def __init__(self, directory: str) -> None:
        self.store = DirectorySnapshotStore(directory)
        self.dag = as_dag(pipeline())


@pytest.fixture
def seeded(tmp_path: Path) -> Any:
    directory = str(tmp_path / "store")
    ss.state.bootstrap(pipeline(), "map_stateful", SEEDED, directory, parallelism=2)
    job = SeededJob(directory)
    server = DashboardServer(lambda: [job], port=0)
    try:
        yield server, job, directory
    finally:
        server.close()


def search(url: str, job_id: str, vertex: str | None, key: str | None) -> tuple[int, Any]:
    q = {k: v for k, v in (("vertex", vertex), ("key", key)) if v is not None}
    target = f"{url}api/jobs/{urllib.parse.quote(job_id)}/state?{urllib.parse.urlencode(q)}"
    try:
        with urllib.request.urlopen(target, timeout=30) as r:
            assert r.headers["Content-Type"] == "application/json"
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        assert e.headers["Content-Type"] == "application/json"
        return e.code, json.load(e)


def owner(job: SeededJob, key: Any) -> int:
    (row,) = job_rows(job, key)
    return int(row.processor)


def job_rows(job: SeededJob, key: Any) -> list[Any]:
    return [r for r in ss.state.read(job.store.directory, "map_stateful") if r.key == key]


def test_sizes_in_the_json_and_the_metrics(seeded: Any) -> None:
    server, job, directory = seeded
    api = server.url + "api/jobs"
    doc = wait_for(
        lambda: (d := get_json(api)) and d["jobs"][0]["state"]["counted_snapshot_id"] is not None and d,
        what="the state counted",
    )
    manifest = job.store.read_manifest(1)
    files = [r.file for c in manifest.vertices["map_stateful"].chains.values() for r in c]
    on_disk = sum(os.path.getsize(os.path.join(directory, f)) for f in files)
    assert doc["jobs"][0]["state"] == {
        "snapshot_id": 1,
        "counted_snapshot_id": 1,
        "vertices": [
            {"name": "map_stateful", "processors": 2, "chunks": 2, "bytes": on_disk, "entries": 5, "keys": 5}
        ],
    }
    with urllib.request.urlopen(server.url + "metrics", timeout=10) as r:
        fams = {f.name: f for f in text_string_to_metric_families(r.read().decode())}
    for name, value in (("bytes", on_disk), ("entries", 5), ("keys", 5)):
        (sample,) = fams[f"slipstream_vertex_state_{name}"].samples
        assert sample.labels == {"job": "seeded", "job_id": "seeded-1", "vertex": "map_stateful"}
        assert sample.value == value


def test_key_search_answers_exact_json(seeded: Any) -> None:
    server, job, directory = seeded
    url = server.url
    status, body = search(url, job.id, "map_stateful", "42")
    assert status == 200
    assert body == {
        "job": "seeded-1",
        "vertex": "map_stateful",
        "key": 42,
        "key_repr": "42",
        "snapshot_id": 1,
        "found": True,
        "rows": [
            {"processor": owner(job, 42), "kind": "keyed", "detail": None, "value": [1, 2], "value_repr": "[1, 2]"}
        ],
    }
    # "42" typed with its quotes is the string; a JSON array is a tuple; plain text a string
    status, body = search(url, job.id, "map_stateful", '"42"')
    assert (status, body["key_repr"], [r["value_repr"] for r in body["rows"]]) == (200, "'42'", ["'the string'"])
    status, body = search(url, job.id, "map_stateful", '["a", 1]')
    assert status == 200 and body["rows"][0]["value"] == {"total": 3}
    assert body["rows"][0]["processor"] == owner(job, ("a", 1))
    status, body = search(url, job.id, "map_stateful", "alice")
    assert (status, body["key"], body["rows"][0]["value"]) == (200, "alice", 7)
    # the answer is job.state's: the same rows
    assert [r["value_repr"] for r in body["rows"]] == [repr(r.value) for r in job_rows(job, "alice")]
    status, body = search(url, job.id, "map_stateful", HTML)
    assert status == 200 and body["rows"][0]["value"] == f"</td>{HTML}"
    # not there
    status, body = search(url, job.id, "map_stateful", "43")
    assert (status, body) == (
        200,
        {
            "job": "seeded-1",
            "vertex": "map_stateful",
            "key": 43,
            "key_repr": "43",
            "snapshot_id": 1,
            "found": False,
            "rows": [],
            "message": "no such key: 43 in vertex 'map_stateful' as of snapshot 1",
        },
    )
    # asked wrongly
    assert search(url, job.id, None, "42") == (400, {"error": "choose a vertex (?vertex=NAME)"})
    assert search(url, job.id, "map_stateful", " ") == (
        400,
        {"error": 'type a key (?key=TEXT: a JSON literal such as 42 or "42", or plain text)'},
    )
    assert search(url, job.id, "nope", "42") == (
        404,
        {"error": f"snapshot 1 in {directory} has no vertex 'nope'; its vertices: 'map_stateful', 'sink', 'source'"},
    )
    # a vertex without state: no key is there
    status, body = search(url, job.id, "sink", "42")
    assert (status, body["found"], body["message"]) == (200, False, "no such key: 42 in vertex 'sink' as of snapshot 1")


def test_key_search_before_any_snapshot_and_without_snapshots(tmp_path: Path) -> None:
    engine = ss.local(dashboard=0)
    try:
        url = engine.dashboard_url
        assert url is not None
        none = engine.new_job(pipeline_forever(), JobConfig(name="nostate"))
        directory = str(tmp_path / "store")
        later = engine.new_job(
            pipeline_forever(),
            JobConfig(
                name="later",
                processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE,
                snapshot_interval_ms=3_600_000,
                snapshot_store=directory,
            ),
        )
        assert search(url, str(none.id), "map_stateful", "1") == (
            409,
            {"error": "job 'nostate' takes no snapshots (processing_guarantee NONE): it has no state to read"},
        )
        assert search(url, str(later.id), "map_stateful", "1") == (
            409,
            {
                "error": f"job 'later' has committed no snapshot yet (its store is {directory}): "
                "there is no state to read"
            },
        )
        states = {j["name"]: j["state"] for j in get_json(url + "api/jobs")["jobs"]}
        assert states == {
            "nostate": None,
            "later": {"snapshot_id": None, "counted_snapshot_id": None, "vertices": []},
        }
        for job in (none, later):
            job.cancel()
            with pytest.raises(JobCancelledError):
                job.join(60)
    finally:
        engine.shutdown()


def pipeline_forever() -> ss.Pipeline:
    p = ss.Pipeline()
    p.read_from(sources.generator(lambda i: i % 7, 50.0)).group_by(lambda x: x).map_stateful(
        lambda: [0], lambda s, k, x: (s.__setitem__(0, s[0] + 1), (k, s[0]))[1]
    ).write_to(sinks.noop())
    return p


def test_parse_key_and_plain() -> None:
    assert parse_key("42") == 42 and type(parse_key("42")) is int
    assert parse_key('"42"') == "42"
    assert parse_key("4.5") == 4.5
    assert parse_key('[1, ["a", 2]]') == (1, ("a", 2))
    assert parse_key("true") is True and parse_key("null") is None
    assert parse_key("alice") == "alice" and parse_key("a b") == "a b"
    assert plain((1, "a", None)) == [1, "a", None]
    assert plain({"x": (1.5,)}) == {"x": [1.5]}
    assert plain({1: 2}) == "{1: 2}" and plain(float("nan")) == "nan" and plain({1, 2}) == "{1, 2}"
    assert shown([1, 2]) == "[1, 2]"
    big = list(range(10_000))
    assert shown(big) == repr(big)[:REPR_CHARS] + f"\u2026 ({len(repr(big)):,} characters in all)"


def test_counts_are_made_once_per_snapshot_within_the_budget(tmp_path: Path) -> None:
    """Bytes follow every commit; a count that took 0.5 s (on a fake clock) is followed
    by the next one 5 s later at the earliest with budget 0.1, then counts the newest."""
    from slipstream.dashboard.statesize import StateSizes
    from slipstream.state.reader import newest_size_counts

    directory = str(tmp_path / "store")
    ss.state.bootstrap(pipeline(), "map_stateful", SEEDED, directory, parallelism=2)
    job = SeededJob(directory)
    now = [0.0]
    calls: list[int] = []

    def counter(store: Any) -> Any:
        now[0] += 0.5
        sid, counts = newest_size_counts(store)
        calls.append(sid)
        return sid, counts

    sizes = StateSizes(budget=0.1, clock=lambda: now[0], counter=counter)

    def state() -> Any:
        return sizes.describe(job, job.id)

    try:
        first = wait_for(lambda: (s := state())["counted_snapshot_id"] == 1 and s, what="the first count")
        assert calls == [1] and first["vertices"][0]["entries"] == 5
        ss.state.transform(directory, "map_stateful", lambda r: None if r.key == "alice" else r)
        second = state()  # at 0.5 s: the new manifest's bytes, no count before 5.5 s
        assert (second["snapshot_id"], second["counted_snapshot_id"]) == (2, 1)
        assert second["vertices"][0]["entries"] == 5
        assert second["vertices"][0]["bytes"] < first["vertices"][0]["bytes"]
        now[0] = 5.4
        assert state()["counted_snapshot_id"] == 1 and calls == [1]
        now[0] = 5.5
        third = wait_for(lambda: (s := state())["counted_snapshot_id"] == 2 and s, what="the second count")
        assert third["vertices"][0]["entries"] == third["vertices"][0]["keys"] == 4
        now[0] = 100.0
        for _ in range(3):
            assert state()["counted_snapshot_id"] == 2
        assert calls == [1, 2]  # not counted again: no new snapshot
    finally:
        sizes.close()


def test_close_while_a_count_is_being_started(tmp_path: Path, monkeypatch: Any) -> None:
    """A dashboard closed just as a count's thread is created (its job's page was being
    read) waits for that count instead of failing with "cannot join thread before it is
    started" (a shutdown failed so in CI)."""
    import threading
    from types import SimpleNamespace

    from slipstream.dashboard import statesize

    directory = str(tmp_path / "store")
    ss.state.bootstrap(pipeline(), "map_stateful", SEEDED, directory, parallelism=2)
    job = SeededJob(directory)
    sizes = statesize.StateSizes()
    errors: list[BaseException] = []
    closers: list[threading.Thread] = []

    def close() -> None:
        try:
            sizes.close()
        except BaseException as e:  # noqa: BLE001 - what the test reports
            errors.append(e)

    class CloseFirst(threading.Thread):
        def start(self) -> None:
            if self.name == "slipstream-dashboard-state" and not closers:
                closer = threading.Thread(target=close, daemon=True)
                closers.append(closer)
                closer.start()
                closer.join(timeout=0.5)  # finishes at once without the fix; blocks with it
            super().start()

    # only this module's threads: statesize.threading becomes a stand-in
    monkeypatch.setattr(statesize, "threading", SimpleNamespace(Thread=CloseFirst, Lock=threading.Lock))
    sizes.describe(job, job.id)
    assert closers, "no count was started"
    closers[0].join(timeout=30)
    assert not closers[0].is_alive()
    assert errors == []
