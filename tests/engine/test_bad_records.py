"""User code that raises on an item: the job's error names the item and shows the
processor's traceback once; ``on_item_error`` skips the item or sends it to a dead-letter
sink, counted and warned about, on every processor that handles item errors (bulk paths
included: only the good items' results come out, once, in order)."""

from __future__ import annotations

import functools
import logging
import traceback
from pathlib import Path
from typing import Any

import pytest

import slipstream as ss
from slipstream import DAG, Edge, JobConfig, ProcessingGuarantee, sinks, sources
from slipstream import processors as P
from slipstream.aggregate import counting, summing
from slipstream.core.dead_letters import refuse_policies
from slipstream.core.item_errors import DeadLetter
from slipstream.pipeline import PipelineError

THIS = Path(__file__).name
N = 60
BAD = {7, 23, 24, 59}  # two in a row, and the last item
GOOD = [x for x in range(N) if x not in BAD]


def invert(x: int) -> float:
    if x in BAD:
        raise ZeroDivisionError("division by zero")
    return 1000 / (x + 1)


def keep(x: int) -> bool:
    if x in BAD:
        raise ValueError(f"cannot judge {x}")
    return x % 2 == 0


def spread(x: int) -> list[int]:
    if x in BAD:
        raise ValueError(f"cannot spread {x}")
    return [x, -x - 1]


def spread_lazily(x: int) -> Any:
    yield x
    if x in BAD:
        raise ValueError(f"cannot spread {x}")  # after a result: nothing of it comes out
    yield -x - 1


def key_of(x: int) -> int:
    if x in BAD:
        raise KeyError(x)
    return x % 3


def line_dag(fn_supplier: Any, lp: int = 1, two_outputs: bool = False) -> DAG:
    dag = DAG()
    src = dag.new_vertex("numbers", sources.items(range(N))).local_parallelism(1)
    work = dag.new_vertex("work", fn_supplier).local_parallelism(lp)
    out = dag.new_vertex("sink", sinks.list_sink("out")).local_parallelism(1)
    dag.edge(Edge.between(src, work)).edge(Edge.from_(work, 0).to(out))
    if two_outputs:  # the processors' per-item path (every result to every ordinal)
        other = dag.new_vertex("other", sinks.list_sink("other")).local_parallelism(1)
        dag.edge(Edge.from_(work, 1).to(other))
    return dag


def failure(engine: Any, job: Any, config: JobConfig | None = None) -> ss.JobFailedError:
    with pytest.raises(ss.JobFailedError) as info:
        engine.new_job(job, config or JobConfig(name="bad")).join(60)
    return info.value


# -- the error names the item, the traceback is shown once ---------------------------------


def test_a_failing_map_names_the_item_and_its_traceback_starts_at_the_processor() -> None:
    err = failure(ss.local(), line_dag(P.map(invert)))
    assert str(err) == (
        "job 'bad' failed: vertex 'work', processor 0, on item 7: ZeroDivisionError: "
        "division by zero"
    )
    shown = "".join(traceback.format_exception(err))
    # the chained cause's traceback, then join()'s: nothing printed twice
    assert shown.count("Traceback (most recent call last)") == 2
    assert shown.count("ZeroDivisionError: division by zero") == 2  # its line, and err's
    tb = err.processor_traceback()
    assert tb is not None
    frames = [line for line in tb.splitlines() if line.startswith('  File "')]
    # the engine's worker loop and tasklet are left out: the processor, then the user
    assert [f.split('"')[1].rsplit("/", 1)[-1] for f in frames] == ["basic.py", THIS]
    assert frames[-1].endswith("in invert")


@pytest.mark.parametrize(
    ("supplier", "message"),
    [
        (P.map(invert), "on item 7: ZeroDivisionError: division by zero"),
        (P.filter(keep), "on item 7: ValueError: cannot judge 7"),
        (P.flat_map(spread), "on item 7: ValueError: cannot spread 7"),
        (P.flat_map(spread_lazily), "on item 7: ValueError: cannot spread 7"),
        (P.accumulate_by_key(key_of, counting()), "on item 7: KeyError: 7"),
        (P.aggregate(summing(invert)), "on item 7: ZeroDivisionError: division by zero"),
        (
            P.map_using_service(P.service_factory(lambda ctx: None), lambda s, x: invert(x)),
            "on item 7: ZeroDivisionError: division by zero",
        ),
        (
            P.map_using_service_async(
                P.service_factory(lambda ctx: None), lambda s, x: invert(x), mode="threads"
            ),
            "on item 7: ZeroDivisionError: division by zero",
        ),
    ],
    ids=["map", "filter", "flat_map", "flat_map-generator", "key_fn", "accumulate", "service", "async"],
)
@pytest.mark.parametrize("capacity", [2048, 3])
def test_every_per_item_processor_names_the_item(supplier: Any, message: str, capacity: int) -> None:
    for two in (False, True):
        err = failure(ss.local(outbox_capacity=capacity), line_dag(supplier, two_outputs=two))
        assert str(err) == f"job 'bad' failed: vertex 'work', processor 0, {message}"


def test_a_pipeline_stage_names_the_item_the_vertex_took_in() -> None:
    p = ss.Pipeline()
    words = p.read_from(sources.items(["1 2", "3 x 4", "5"])).flat_map(str.split).map(int)
    words.group_by(lambda x: x % 2).aggregate(counting()).write_to(sinks.list_sink("out"))
    err = failure(ss.local(), p)
    assert str(err) == (
        "job 'bad' failed: vertex 'flat_map+map+aggregate-accumulate', processor 0, on item "
        "'3 x 4': ValueError: invalid literal for int() with base 10: 'x'"
    )


def test_map_stateful_and_hash_join_name_the_item() -> None:
    def count_up(state: list[int], key: int, x: int) -> int:
        state[0] += 1
        return invert(x)

    p = ss.Pipeline()
    p.read_from(sources.items(range(N))).group_by(lambda x: x % 2).map_stateful(
        lambda: [0], count_up
    ).write_to(sinks.list_sink("out"))
    assert str(failure(ss.local(), p)).endswith(
        "on item 7: ZeroDivisionError: division by zero"
    )
    p = ss.Pipeline()
    names = p.read_from(sources.items([(0, "zero"), (1, "one")]))
    p.read_from(sources.items(range(N))).hash_join(
        names, key_of, lambda kv: kv[0], lambda x, m: (x, m)
    ).write_to(sinks.list_sink("out"))
    assert str(failure(ss.local(), p)).endswith("on item 7: KeyError: 7")


# -- skipping ---------------------------------------------------------------------------------


def expected(fn: Any) -> list[Any]:
    out: list[Any] = []
    for x in GOOD:
        if fn is keep:
            if keep(x):
                out.append(x)
        elif fn in (spread, spread_lazily):
            out.extend(spread(x))
        else:
            out.append(fn(x))
    return out


@pytest.mark.parametrize("capacity", [2048, 3, 1])
@pytest.mark.parametrize(
    ("factory", "fn"),
    [(P.map, invert), (P.filter, keep), (P.flat_map, spread), (P.flat_map, spread_lazily)],
    ids=["map", "filter", "flat_map", "flat_map-generator"],
)
def test_skip_gives_the_good_items_results_once_in_order(factory: Any, fn: Any, capacity: int) -> None:
    for two in (False, True):
        engine = ss.local(outbox_capacity=capacity)
        job = engine.new_job(
            line_dag(factory(fn), two_outputs=two), JobConfig(on_item_error="skip")
        )
        job.join(60)
        assert engine.get_list("out") == expected(fn)
        if two:
            assert engine.get_list("other") == expected(fn)
        assert job.metrics["work"]["items_skipped"] == len(BAD)


@pytest.mark.parametrize("capacity", [2048, 3])
def test_skip_in_fused_pipeline_chains(capacity: int) -> None:
    seen: list[int] = []
    for chain in ("one-to-one", "flat_map"):
        p = ss.Pipeline()
        stage = p.read_from(sources.items(range(N)))
        if chain == "flat_map":
            stage = stage.flat_map(spread).filter(lambda x: x >= 0)  # x, not -x - 1
        stage = stage.map(invert).peek(seen.append).set_local_parallelism(1)
        stage.write_to(sinks.list_sink("out"))
        engine = ss.local(outbox_capacity=capacity)
        job = engine.new_job(p, JobConfig(on_item_error="skip"))
        job.join(60)
        assert engine.get_list("out") == [invert(x) for x in GOOD]
        assert sum(m.get("items_skipped", 0) for m in job.metrics.values()) == len(BAD)
    # a chain of one-to-one steps never runs a function twice for one item
    assert seen[: len(GOOD)] == [invert(x) for x in GOOD]


def by_key(values: Any) -> list[tuple[int, int]]:
    """``(key, sum of values)`` of the good items per key."""
    sums: dict[int, int] = {}
    for x in GOOD:
        sums[x % 3] = sums.get(x % 3, 0) + values(x)
    return sorted(sums.items())


def test_skip_in_aggregations_and_services() -> None:
    factory = P.service_factory(lambda ctx: None)
    cases: list[tuple[Any, Any]] = [
        (P.aggregate_by_key(key_of, counting()), by_key(lambda x: 1)),
        (P.accumulate_by_key(key_of, summing()), by_key(lambda x: x)),
        (P.aggregate(summing(lambda x: invert(x) and x)), [sum(GOOD)]),
        (P.map_using_service(factory, lambda s, x: invert(x)), [invert(x) for x in GOOD]),
        (
            P.map_using_service_async(factory, lambda s, x: invert(x), mode="threads"),
            [invert(x) for x in GOOD],
        ),
        (P.flat_map_using_service(factory, lambda s, x: spread_lazily(x)), expected(spread)),
    ]
    for supplier, want in cases:
        engine = ss.local()
        engine.new_job(line_dag(supplier), JobConfig(on_item_error="skip")).join(60)
        assert sorted(engine.get_list("out")) == sorted(want), supplier


def test_skip_in_map_stateful_and_rolling_aggregate() -> None:
    p = ss.Pipeline()
    grouped = p.read_from(sources.items(range(N))).group_by(key_of)
    grouped.rolling_aggregate(summing()).on_item_error("skip").write_to(sinks.list_sink("out"))
    engine = ss.local()
    job = engine.new_job(p)
    job.join(60)
    out = engine.get_list("out")
    assert len(out) == len(GOOD)
    assert sorted(max(v for k, v in out if k == key) for key in range(3)) == sorted(
        v for _, v in by_key(lambda x: x)
    )
    assert job.metrics["rolling_aggregate"]["items_skipped"] == len(BAD)


# -- dead letters -----------------------------------------------------------------------------


def test_dead_letters_carry_vertex_item_and_error(caplog: Any) -> None:
    engine = ss.local()
    with caplog.at_level(logging.WARNING, logger="slipstream"):
        job = engine.new_job(
            line_dag(P.map(invert)),
            JobConfig(name="dl", on_item_error=sinks.list_sink("dead")),
        )
        job.join(60)
    assert engine.get_list("out") == [invert(x) for x in GOOD]
    assert engine.get_list("dead") == [
        DeadLetter("work", x, "ZeroDivisionError: division by zero", None) for x in sorted(BAD)
    ]
    assert job.metrics["work"]["items_skipped"] == len(BAD)
    assert job.metrics["dead-letters"]["items_in"] == len(BAD)
    warnings = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert warnings[0] == (
        "job 'dl' skipped 1 item on which user code raised so far (vertex 'work': 1 sent to "
        "'dead-letters'); the last: vertex 'work', item 7: ZeroDivisionError: division by "
        "zero. See docs/troubleshooting.md (repeated at most once a minute while items fail)"
    )
    assert warnings[-1].startswith("job 'dl' skipped 4 items on which user code raised in all")


def test_a_vertex_setting_overrides_the_job_and_a_dag_vertex_can_take_them() -> None:
    dag = DAG()
    src = dag.new_vertex("numbers", sources.items(range(N))).local_parallelism(1)
    a = dag.new_vertex("a", P.map(invert)).local_parallelism(1)
    b = dag.new_vertex("b", P.filter(lambda x: 1 / (x - 100.0) > 0)).local_parallelism(1)
    out = dag.new_vertex("sink", sinks.list_sink("out")).local_parallelism(1)
    dead = dag.new_vertex("dead", sinks.list_sink("dead")).local_parallelism(1)
    dag.edge(Edge.between(src, a)).edge(Edge.between(a, b)).edge(Edge.between(b, out))
    a.on_item_error(dead)
    engine = ss.local()
    # the job fails at b (the job's policy), not at a (its own)
    err = failure(engine, dag, JobConfig(name="bad", on_item_error="fail"))
    assert str(err) == (
        "job 'bad' failed: vertex 'b', processor 0, on item 100.0: ZeroDivisionError: float "
        "division by zero"
    )
    b.on_item_error("skip")
    job = engine.new_job(dag)
    job.join(60)
    assert [d.item for d in engine.get_list("dead")][-4:] == sorted(BAD)
    assert job.metrics["b"]["items_skipped"] == 1


def test_a_pipeline_stage_sends_its_dead_letters_to_its_sink() -> None:
    p = ss.Pipeline()
    numbers = p.read_from(sources.items(range(N)))
    numbers.map(invert).on_item_error(sinks.list_sink("dead")).write_to(sinks.list_sink("out"))
    engine = ss.local()
    job = engine.new_job(p)
    job.join(60)
    assert sorted(engine.get_list("out")) == sorted(invert(x) for x in GOOD)
    assert sorted(d.item for d in engine.get_list("dead")) == sorted(BAD)
    assert "map-dead-letters" in job.metrics
    with pytest.raises(PipelineError) as info:
        numbers.on_item_error("skip")
    assert str(info.value) == (
        "on_item_error(): stage 'source' (source) runs no function that a bad-record policy "
        "applies to; it applies to map, filter, flat_map, peek, the *_using_service, "
        "with_timestamps, aggregate, rolling_aggregate, map_stateful and hash_join stages"
    )


def test_stages_of_different_policies_are_not_fused() -> None:
    p = ss.Pipeline()
    s = p.read_from(sources.items(range(3))).map(str).on_item_error("skip").map(len)
    s.write_to(sinks.list_sink("out"))
    assert [v.name for v in p.to_dag().vertices] == ["source", "map", "map-2", "sink"]
    assert p.to_dag().vertex("map").get_on_item_error() == "skip"
    assert p.to_dag().vertex("map-2").get_on_item_error() is None


# -- restarts ---------------------------------------------------------------------------------


def poison_dag() -> DAG:
    dag = DAG()
    src = dag.new_vertex("numbers", sources.items(range(N))).local_parallelism(1)
    work = dag.new_vertex("work", P.map(invert)).local_parallelism(2)
    out = dag.new_vertex("sink", sinks.list_sink("out")).local_parallelism(1)
    dag.edge(Edge.between(src, work)).edge(Edge.between(work, out))
    return dag


def test_a_poison_pill_fails_every_restart_unless_it_is_skipped(tmp_path: Path) -> None:
    config = functools.partial(
        JobConfig,
        processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE,
        snapshot_interval_ms=5,
        auto_restart=True,
        max_restarts=2,
        restart_delay_ms=1,
    )
    engine = ss.local()
    err = failure(engine, poison_dag(), config(name="bad", snapshot_store=str(tmp_path / "a")))
    assert str(err).startswith("job 'bad' failed after 2 restart(s): vertex 'work', processor ")
    assert str(err).endswith(", on item 7: ZeroDivisionError: division by zero")
    assert engine.get_list("out") == []  # nothing committed past the pill

    engine = ss.local()
    job = engine.new_job(
        poison_dag(), config(name="ok", on_item_error="skip", snapshot_store=str(tmp_path / "b"))
    )
    job.join(60)
    assert sorted(engine.get_list("out")) == sorted(invert(x) for x in GOOD)
    assert job.metrics["__job__"]["restarts"] == 0


def test_an_engine_without_the_policy_refuses_it() -> None:
    dag = line_dag(P.map(invert))
    refuse_policies(dag, "fail", "Spark")
    with pytest.raises(ss.DagError) as info:
        refuse_policies(dag, "skip", "Spark")
    assert str(info.value) == (
        "on_item_error is set (the job), but the Spark engine does not apply a bad-record "
        "policy: an item whose code raises fails the job there. Run the job on the embedded "
        "engine (ss.local()) to skip such items or send them to a dead-letter sink"
    )
    dag.vertex("work").on_item_error("skip")
    with pytest.raises(ss.DagError, match=r"is set \(vertex 'work'\)"):
        refuse_policies(dag, "fail", "Spark")
