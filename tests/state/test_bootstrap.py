"""Seeding a job's state (issue 25, item 3): ``ss.state.bootstrap`` writes a signed
format-3 snapshot of a DAG from rows; a job started with ``restore_from=`` it continues
from that state (its output equals a plain-Python oracle of history + live input), at
the parallelism it was written with or another; ``offsets=`` sets where a generator
resumes; rows and vertices that do not fit are refused naming them; a tampered store or
another DAG fails the restore. ``sources.snapshot`` feeds a snapshot's rows to a
pipeline. Last, the backfill flow (item 4) on the embedded engine only: a batch job over
history, bootstrap from its output, a streaming job continues; equal to one
uninterrupted run."""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

import slipstream as ss
from slipstream import DAG, Edge, JobConfig, ProcessingGuarantee, sinks, sources
from slipstream.aggregate import counting
from slipstream.core.errors import JobCancelledError, SnapshotError
from slipstream.core.partition import key_routing
from slipstream.state.reader import StateRow
from slipstream.window import session_window_def, tumbling_window_def

HISTORY = list("aabbbcdddde")
LIVE = list("abcfaa")


def rolling(items: Iterable[Any], parallelism: int = -1) -> ss.Pipeline:
    p = ss.Pipeline()
    p.read_from(sources.items(list(items))).group_by(lambda x: x).rolling_aggregate(
        counting()
    ).set_local_parallelism(parallelism).write_to(sinks.list_sink("out"))
    return p


def config(store: Any, name: str = "counts", interval_ms: int = 10_000) -> JobConfig:
    """Exactly-once into ``store``; a job that must commit while it runs takes a short
    ``interval_ms`` (its list sink publishes at each commit, the first one after the
    interval: the default 10 s made each such test wait 10 s a snapshot)."""
    return JobConfig(
        name=name,
        processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE,
        snapshot_store=store,
        snapshot_interval_ms=interval_ms,
    )


def run(
    pipeline: ss.Pipeline, store: Any, restore_from: Any = None, name: str = "counts"
) -> list[Any]:
    engine = ss.local()
    job = engine.new_job(pipeline, config(store, name), restore_from=restore_from)
    job.join(120)
    return list(engine.get_list("out"))


def oracle(history: list[str], live: list[str]) -> list[tuple[str, int]]:
    """A rolling count over ``live`` that starts from the counts of ``history``."""
    counts = Counter(history)
    out = []
    for x in live:
        counts[x] += 1
        out.append((x, counts[x]))
    return out


def per_key(out: list[tuple[str, int]]) -> dict[str, list[int]]:
    """The output per key in order (order across keys depends on the processors)."""
    d: dict[str, list[int]] = {}
    for k, n in out:
        d.setdefault(k, []).append(n)
    return d


def event_of(seq: int) -> str:
    return "abcde"[seq % 5 if seq % 3 else 0]


def generator_pipeline(
    max_items: int | None, rate: float | None = None, parallelism: int = 1
) -> ss.Pipeline:
    """A rolling count over the generator's events (vertices ``events``,
    ``rolling_aggregate``, ``sink``), ``parallelism`` processors for the first two."""
    p = ss.Pipeline()
    p.read_from(sources.generator(event_of, rate, max_items=max_items)).set_name(
        "events"
    ).set_local_parallelism(parallelism).group_by(lambda x: x).rolling_aggregate(
        counting()
    ).set_local_parallelism(parallelism).write_to(sinks.list_sink("out"))
    return p


def test_bootstrap_from_pairs_then_restore_continues_the_counts(tmp_path: Path) -> None:
    seed = tmp_path / "seed"
    sid = ss.state.bootstrap(
        rolling([]), "rolling_aggregate", Counter(HISTORY).items(), seed, job_name="counts"
    )
    assert sid == 1
    rows = ss.state.read(seed, "rolling_aggregate")
    assert sorted((r.key, r.value, r.kind) for r in rows) == sorted(
        (k, n, "keyed") for k, n in Counter(HISTORY).items()
    )
    out = run(rolling(LIVE), tmp_path / "live", restore_from=seed)
    assert per_key(out) == per_key(oracle(HISTORY, LIVE))
    # every vertex of the DAG is in the snapshot; the others hold no state
    store = ss.state.bootstrap.__globals__["_as_store"](seed)
    manifest = store.read_manifest(sid)
    assert set(manifest.vertices) == {v.name for v in rolling([]).to_dag().vertices}
    assert [n for n, vm in manifest.vertices.items() if vm.chains] == ["rolling_aggregate"]
    header = store.read_header(sid)
    from slipstream.state.lineage import dag_fingerprint, dag_shape

    assert header["dag"] == dag_fingerprint(dag_shape(rolling([]).to_dag()))


def test_bootstrap_at_parallelism_1_restored_at_3(tmp_path: Path) -> None:
    seed = tmp_path / "seed"
    ss.state.bootstrap(
        rolling([]), "rolling_aggregate", Counter(HISTORY).items(), seed, parallelism=1
    )
    assert {r.processor for r in ss.state.read(seed, "rolling_aggregate")} == {0}
    out = run(rolling(LIVE, parallelism=3), tmp_path / "live", restore_from=seed)
    assert per_key(out) == per_key(oracle(HISTORY, LIVE))


def test_entries_are_placed_on_the_processor_that_owns_the_key(tmp_path: Path) -> None:
    seed = tmp_path / "seed"
    ss.state.bootstrap(
        rolling([]), "rolling_aggregate", Counter(HISTORY).items(), seed, parallelism=3
    )
    owner = key_routing(None, 1, 3).owner
    rows = ss.state.read(seed, "rolling_aggregate")
    assert len({r.processor for r in rows}) > 1
    assert all(r.processor == owner(r.key) for r in rows)
    out = run(rolling(LIVE, parallelism=3), tmp_path / "live", restore_from=seed)
    assert per_key(out) == per_key(oracle(HISTORY, LIVE))


def test_read_bootstrap_restore_round_trip(tmp_path: Path) -> None:
    """The state a streaming job left (cancelled after two committed snapshots), read as
    rows and bootstrapped into a new store with the generator's offset, restores to the
    same outputs as restoring the job's own store, and as the oracle."""
    first = tmp_path / "first"
    engine = ss.local()
    job = engine.new_job(generator_pipeline(None, rate=20000.0), config(first, "first", 100))
    deadline = time.monotonic() + 120
    while job.metrics["__job__"]["snapshots"] < 2:
        assert not job.status.is_terminal and time.monotonic() < deadline
        time.sleep(0.005)
    job.cancel()
    with pytest.raises(JobCancelledError):
        job.join(60)
    rows = ss.state.read(first, "rolling_aggregate")
    assert rows and all(isinstance(r, StateRow) for r in rows)
    (offset,) = [r for r in ss.state.read(first, "events") if r.kind == "offset"]
    cut = offset.value["next_seq"]
    total = cut + 200
    seed = tmp_path / "seed"
    ss.state.bootstrap(
        generator_pipeline(total), "rolling_aggregate", rows, seed, offsets={"events": cut}
    )
    outs = []
    for restore, store in ((seed, "a"), (first, "b")):
        e = ss.local()
        e.new_job(generator_pipeline(total), config(tmp_path / store), restore_from=restore).join(
            120
        )
        outs.append(per_key(list(e.get_list("out"))))
    fn = event_of
    assert (
        outs[0]
        == outs[1]
        == per_key(oracle([fn(s) for s in range(cut)], [fn(s) for s in range(cut, total)]))
    )


def test_map_stateful_state_is_seeded(tmp_path: Path) -> None:
    def build(items: list[int]) -> ss.Pipeline:
        p = ss.Pipeline()
        p.read_from(sources.items(items)).group_by(lambda x: x % 2).map_stateful(
            lambda: [0], lambda s, k, x: (s.__setitem__(0, s[0] + x), (k, s[0]))[1]
        ).write_to(sinks.list_sink("out"))
        return p

    seed = tmp_path / "seed"
    ss.state.bootstrap(build([]), "map_stateful", [(0, [100]), (1, [1000])], seed)
    out = run(build([1, 2, 3]), tmp_path / "live", restore_from=seed)
    assert sorted(out) == [(0, 102), (1, 1001), (1, 1004)]


def test_resume_under_the_bootstrapped_job_name(tmp_path: Path) -> None:
    """``resume=True`` on the bootstrapped store itself continues from it."""
    seed = tmp_path / "seed"
    ss.state.bootstrap(
        rolling([]), "rolling_aggregate", Counter(HISTORY).items(), seed, job_name="counts"
    )
    engine = ss.local()
    cfg = config(seed)
    cfg.resume = True
    engine.new_job(rolling(LIVE), cfg).join(120)
    assert per_key(list(engine.get_list("out"))) == per_key(oracle(HISTORY, LIVE))


def test_generator_offsets_resume_where_history_ends(tmp_path: Path) -> None:
    total, cut = 300, 120
    history = [event_of(s) for s in range(cut)]
    live = [event_of(s) for s in range(cut, total)]
    seed = tmp_path / "seed"
    ss.state.bootstrap(
        generator_pipeline(total, parallelism=2), "rolling_aggregate", Counter(history).items(), seed,
        offsets={"events": cut},
    )  # fmt: skip
    offsets = [r for r in ss.state.read(seed, "events") if r.kind == "offset"]
    assert sorted((r.detail["processor"], r.value["next_seq"]) for r in offsets) == [
        (0, 120),
        (1, 121),
    ]
    for parallelism in (1, 2, 3):
        engine = ss.local()
        p = generator_pipeline(total, parallelism=parallelism)
        job = engine.new_job(p, config(tmp_path / f"live{parallelism}"), restore_from=seed)
        job.join(120)
        assert per_key(list(engine.get_list("out"))) == per_key(oracle(history, live))


def timed_event(seq: int) -> tuple[str, int]:
    return ("abc"[seq % 3 if seq % 4 else 0], seq * 7)


def windowed(items: list[Any]) -> ss.Pipeline:
    """A 1 s tumbling count per key (vertices ``with_timestamps+window-accumulate`` and
    ``window-combine``: the frames)."""
    p = ss.Pipeline()
    p.read_from(sources.items(items)).with_timestamps(lambda e: e[1], 0).group_by(
        lambda e: e[0]
    ).window(tumbling_window_def(1000)).aggregate(counting()).write_to(sinks.list_sink("out"))
    return p


def test_window_frames_are_seeded(tmp_path: Path) -> None:
    """The open window's frame at the cutoff (per key, the count of history's events in
    it), seeded as (key, frame_end, count) at parallelism 2: the windows the restored
    job emits over the live events equal those of one run over history + live that end
    after the cutoff; and the frames read back as window rows seed the same again."""
    events = [timed_event(s) for s in range(1000)]
    cut = 400  # the last history event at ts 2793: the window [2000, 3000) is open
    history, live = events[:cut], events[cut:]
    whole = ss.local()
    whole.new_job(windowed(events)).join(120)
    open_end = (history[-1][1] // 1000 + 1) * 1000
    expected = sorted(repr(r) for r in whole.get_list("out") if r.end >= open_end)
    frames = Counter(k for k, ts in history if ts >= open_end - 1000)
    seed = tmp_path / "seed"
    ss.state.bootstrap(
        windowed([]), "window-combine", [(k, open_end, n) for k, n in frames.items()], seed,
        parallelism=2,
    )  # fmt: skip
    rows = [r for r in ss.state.read(seed, "window-combine") if r.kind == "window"]
    assert sorted((r.key, r.detail["frame_end"], r.value) for r in rows) == sorted(
        (k, open_end, n) for k, n in frames.items()
    )
    again = tmp_path / "again"
    ss.state.bootstrap(windowed([]), "window-combine", rows, again)
    for store in (seed, again):
        engine = ss.local()
        engine.new_job(
            windowed(live), config(tmp_path / f"live-{store.name}"), restore_from=store
        ).join(120)
        assert sorted(repr(r) for r in engine.get_list("out")) == expected


def _named_generator() -> ss.Pipeline:
    p = ss.Pipeline()
    p.read_from(sources.generator(event_of, None, max_items=10)).group_by(
        lambda x: x
    ).rolling_aggregate(counting()).write_to(sinks.noop())
    return p


def test_rows_and_vertices_that_do_not_fit_are_refused(tmp_path: Path) -> None:
    p = rolling([])
    seed = tmp_path / "seed"
    with pytest.raises(TypeError, match=r"row 1 \(\(\['x'\], 2\)\): its key is unhashable"):
        ss.state.bootstrap(p, "rolling_aggregate", [("a", 1), (["x"], 2)], seed)
    with pytest.raises(ValueError, match=r"row 2 \(\('a', 3\)\): key 'a' is already in row 0"):
        ss.state.bootstrap(p, "rolling_aggregate", [("a", 1), ("b", 2), ("a", 3)], seed)
    with pytest.raises(ValueError, match=r"row 0 \(\('a', 1, 2\)\) is not a \(key, value\) pair"):
        ss.state.bootstrap(p, "rolling_aggregate", [("a", 1, 2)], seed)
    with pytest.raises(TypeError, match=r"row 0 \(5\) is a int, not a \(key, value\) pair"):
        ss.state.bootstrap(p, "rolling_aggregate", [5], seed)
    with pytest.raises(
        ValueError,
        match=r"the DAG has no vertex 'nope'; its vertices: 'rolling_aggregate', 'sink', 'source'",
    ):
        ss.state.bootstrap(p, "nope", [("a", 1)], seed)
    with pytest.raises(
        ValueError,
        match=r"vertex 'sink' is not a keyed vertex bootstrap can seed \(its processor is slipstream.sinks.basic.ListSinkP\)",
    ):
        ss.state.bootstrap(p, "sink", [("a", 1)], seed)
    session = ss.Pipeline()
    session.read_from(sources.items([])).with_timestamps(lambda x: 0, 0).group_by(
        lambda x: x
    ).window(session_window_def(10)).aggregate(counting()).write_to(sinks.noop())
    with pytest.raises(
        ValueError,
        match=r"row 0 \(\('a', 1\)\) is not a \(key, start, end, accumulator\) tuple",
    ):
        ss.state.bootstrap(session, "window", [("a", 1)], seed)
    window = windowed([])
    with pytest.raises(
        ValueError, match=r"row 0 \(\('a', 1\)\) is not a \(key, frame_end, accumulator\) tuple"
    ):
        ss.state.bootstrap(window, "window-combine", [("a", 1)], seed)
    with pytest.raises(ValueError, match=r"row 1 .*: key 'a' in frame 1000 is already in row 0"):
        ss.state.bootstrap(window, "window-combine", [("a", 1000, 1), ("a", 1000, 2)], seed)
    with pytest.raises(
        ValueError,
        match=r"vertex 'with_timestamps\+window-accumulate' is not a keyed vertex bootstrap "
        r"can seed \(its processor is slipstream.pipeline.fused.PipeP\)",
    ):
        ss.state.bootstrap(window, "with_timestamps+window-accumulate", [("a", 1)], seed)
    window_row = StateRow("w", 0, "a", {"frame_end": 10}, 1, "window")
    with pytest.raises(
        ValueError, match=r"row 0 .* is 'window' state with detail \{'frame_end': 10\}"
    ):
        ss.state.bootstrap(p, "rolling_aggregate", [window_row], seed)
    with pytest.raises(
        ValueError,
        match=r"offsets: vertex 'source' is not a source whose offsets bootstrap can set",
    ):
        ss.state.bootstrap(p, "rolling_aggregate", [("a", 1)], seed, offsets={"source": 3})
    k = ss.Pipeline()
    k.read_from(sources.kafka("t", {"bootstrap.servers": "127.0.0.1:1"})).group_by(
        lambda r: r[0]
    ).rolling_aggregate(counting()).write_to(sinks.noop())
    with pytest.raises(
        ValueError, match=r"offsets\['source'\]: a Kafka source's offsets are a dict"
    ):
        ss.state.bootstrap(k, "rolling_aggregate", [], seed, offsets={"source": 5})
    with pytest.raises(
        ValueError, match=r"offsets\['source'\]: \('t', '0'\): 5 is not \(topic, partition\)"
    ):
        ss.state.bootstrap(k, "rolling_aggregate", [], seed, offsets={"source": {("t", "0"): 5}})
    with pytest.raises(
        ValueError, match=r"offsets\['source'\]: a generator's offset is the number"
    ):
        ss.state.bootstrap(
            _named_generator(),
            "rolling_aggregate", [], seed, offsets={"source": -1},
        )  # fmt: skip
    assert not seed.exists() or not any(n.endswith(".bin") for n in os.listdir(seed))
    ss.state.bootstrap(p, "rolling_aggregate", [("a", 1)], seed)
    with pytest.raises(
        SnapshotError,
        match=r"already holds snapshots; bootstrap writes the first snapshot of an empty store",
    ):
        ss.state.bootstrap(p, "rolling_aggregate", [("a", 1)], seed)


def test_tampered_chunk_and_another_dag_fail_the_restore(tmp_path: Path) -> None:
    seed = tmp_path / "seed"
    ss.state.bootstrap(rolling([]), "rolling_aggregate", Counter(HISTORY).items(), seed)
    other = ss.Pipeline()
    other.read_from(sources.items(LIVE)).group_by(lambda x: x).rolling_aggregate(
        counting()
    ).set_name("counts").write_to(sinks.list_sink("out"))
    with pytest.raises(
        SnapshotError, match=r"vertices \['rolling_aggregate'\] that this DAG does not have"
    ):
        run(other, tmp_path / "other", restore_from=seed)
    chunk = next(n for n in os.listdir(seed) if n.startswith("chunk-"))
    raw = bytearray((seed / chunk).read_bytes())
    raw[-3] ^= 0xFF
    (seed / chunk).write_bytes(bytes(raw))
    with pytest.raises(SnapshotError, match=rf"chunk {seed / chunk} .* fails its signature check"):
        run(rolling(LIVE), tmp_path / "live", restore_from=seed)


def test_snapshot_source_feeds_a_pipeline_that_reaggregates_state(tmp_path: Path) -> None:
    first = tmp_path / "first"
    ss.state.bootstrap(
        rolling([]), "rolling_aggregate", Counter(HISTORY).items(), first, parallelism=2
    )
    p = ss.Pipeline()
    p.read_from(sources.snapshot(first, "rolling_aggregate")).filter(
        lambda r: r.kind == "keyed"
    ).group_by(lambda r: r.value >= 2).aggregate(counting()).write_to(sinks.list_sink("out"))
    engine = ss.local()
    engine.new_job(p).join(120)
    counts = Counter(HISTORY)
    expected = Counter(n >= 2 for n in counts.values())
    assert sorted(engine.get_list("out")) == sorted(expected.items())
    p2 = ss.Pipeline()
    p2.read_from(sources.snapshot(first)).write_to(sinks.list_sink("rows"))
    engine.new_job(p2).join(120)
    rows = list(engine.get_list("rows"))
    assert sorted(rows) == sorted(ss.state.read(first))
    # a DAG reads it as any source vertex
    dag = DAG()
    src = dag.new_vertex("state", sources.snapshot(first, "rolling_aggregate"))
    out = dag.new_vertex("out", sinks.list_sink("dag-rows")).local_parallelism(1)
    dag.edge(Edge.between(src, out))
    engine.new_job(dag).join(120)
    assert sorted(engine.get_list("dag-rows")) == sorted(ss.state.read(first, "rolling_aggregate"))
    with pytest.raises(ValueError, match=r"has no vertex 'nope'"):
        sources.snapshot(first, "nope")


def test_backfill_then_continue_live_embedded(tmp_path: Path) -> None:
    """Issue 25 item 4's flow by hand on the embedded engine (ss.state.backfill and its Spark
    leg: tests/state/test_backfill.py, tests/spark/test_spark_backfill.py): a
    batch group-by count over history, bootstrap the streaming job's rolling count from
    its output with the generator's offset where history ends, then the streaming job
    continues; its output equals the tail of one uninterrupted run over history + live."""
    total, cut = 400, 150
    fn = event_of
    batch = ss.Pipeline()
    batch.read_from(sources.items([fn(s) for s in range(cut)])).group_by(lambda x: x).aggregate(
        counting()
    ).write_to(sinks.list_sink("history"))
    engine = ss.local()
    engine.new_job(batch).join(120)
    history_counts = list(engine.get_list("history"))
    seed = tmp_path / "seed"
    ss.state.bootstrap(
        generator_pipeline(total), "rolling_aggregate", history_counts, seed,
        offsets={"events": cut},
    )  # fmt: skip
    live = ss.local()
    live.new_job(generator_pipeline(total), config(tmp_path / "live"), restore_from=seed).join(120)
    whole = ss.local()
    whole.new_job(generator_pipeline(total)).join(120)
    uninterrupted = per_key(list(whole.get_list("out")))
    continued = per_key(list(live.get_list("out")))
    hist = Counter(fn(s) for s in range(cut))
    assert continued == {k: v[hist[k] :] for k, v in uninterrupted.items() if v[hist[k] :]}
    assert sum(map(len, continued.values())) == total - cut  # nothing before the cutoff again


def test_kafka_offsets_resume_where_history_ends(kafka: Any, tmp_path: Path) -> None:
    """A Kafka source seeded with the offsets where history ends reads only the records
    after them: the restored rolling count over the live records continues the counts
    of the history (a record before the cutoff read again would break the per-key
    sequence), and it consumes exactly the live records."""
    from confluent_kafka import Producer

    topic = f"boot-{time.monotonic_ns() % 10**9}"
    kafka.create_topic(topic, 2)
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    for i in range(300):
        producer.produce(topic, value=str(i).encode(), partition=i % 2)
    assert producer.flush(30) == 0
    conf = {"bootstrap.servers": kafka.bootstrap, "group.id": f"g-{topic}"}

    def key(record: Any) -> int:
        return int(record[1]) % 3

    def build() -> ss.Pipeline:
        p = ss.Pipeline()
        p.read_from(sources.kafka(topic, conf)).set_name("events").group_by(key).rolling_aggregate(
            counting()
        ).write_to(sinks.list_sink("out"))
        return p

    history = [i % 3 for i in range(200)]  # offsets 0..99 of each partition
    seed = tmp_path / "seed"
    ss.state.bootstrap(
        build(), "rolling_aggregate", Counter(history).items(), seed, parallelism=2,
        offsets={"events": {(topic, 0): 100, (topic, 1): 100}},
    )  # fmt: skip
    offsets = sorted(
        (r.detail["partition"], r.value["offset"], r.processor)
        for r in ss.state.read(seed, "events")
    )
    from slipstream.sources.kafka import partition_owner

    assert offsets == [(p, 100, partition_owner(topic, p, 2)) for p in (0, 1)]
    engine = ss.local()
    out = engine.get_list("out")
    job = engine.new_job(build(), config(tmp_path / "live", interval_ms=100), restore_from=seed)
    deadline = time.monotonic() + 120
    while len(out) < 100:
        assert not job.status.is_terminal and time.monotonic() < deadline, len(out)
        time.sleep(0.01)
    job.cancel()
    with pytest.raises(JobCancelledError):
        job.join(60)
    live_keys: dict[int, list[int]] = {}
    counts = Counter(history)
    for i in range(200, 300):
        counts[i % 3] += 1
        live_keys.setdefault(i % 3, []).append(counts[i % 3])
    # per partition in order; across partitions any interleaving: compare per key as sets
    got = per_key(list(out))
    assert {k: sorted(v) for k, v in got.items()} == live_keys
    assert len(out) == 100
