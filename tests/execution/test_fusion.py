"""Engine fusion (execution/fusion.py): a ``P.map`` / ``P.filter`` / ``P.flat_map`` vertex
runs inside its only consumer's tasklet. What it must keep: the output, each vertex's
figures, the vertex an error names, the removed edge's key check, and snapshots that
restore across fused and unfused executions."""

from __future__ import annotations

import functools
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import slipstream as ss
from slipstream import DAG, Edge, JobConfig, sinks, sources
from slipstream import processors as P
from slipstream.aggregate import counting
from slipstream.core.config import ProcessingGuarantee
from slipstream.execution.plan import build_vertex_plans, wire
from slipstream.processors.basic import MapP
from slipstream.sinks.basic import MapSinkP

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "engine"))

import snapshot_test_procs as stp  # noqa: E402
from test_engine_random_dags import KINDS, Apply, build, dags, oracle  # noqa: E402
from test_processes import CsvSum, identity, word_count_dag  # noqa: E402

EO = ProcessingGuarantee.EXACTLY_ONCE


def planned(dag: DAG, config: JobConfig, members: int = 1) -> dict[str, str]:
    """Vertex -> processor type of each tasklet the plan makes (member 0's)."""
    plans = build_vertex_plans(dag, config, members, 1, None, "plan", check_pickle=False)
    specs = wire(dag, plans, config.processing_guarantee)
    return {s.vertex.vertex.name: type(s.processor).__name__ for s in specs if s.global_index == 0}


def test_word_count_runs_tokenize_inside_accumulate(monkeypatch: pytest.MonkeyPatch) -> None:
    dag = word_count_dag(["a b"])
    fused = planned(dag, JobConfig())
    assert sorted(fused) == ["accumulate", "combine", "sink", "source"]
    assert fused["accumulate"] == "FusedPairP"
    unfused = planned(dag, JobConfig(fuse_vertices=False))
    assert unfused["tokenize"] == "FlatMapP" and unfused["accumulate"] != "FusedPairP"
    monkeypatch.setenv("SLIPSTREAM_FUSE_VERTICES", "0")
    assert planned(dag, JobConfig()) == unfused


class StatefulMap(MapP):
    """A subclass of the built-in may keep state: never fused."""


class Blocking(ss.AbstractProcessor):
    def is_cooperative(self) -> bool:
        return False

    def process(self, ordinal: int, inbox: Any) -> None:
        inbox.clear()


def shape(kind: str) -> tuple[DAG, JobConfig]:
    """A map -> consumer pair that must not fuse, for the reason ``kind`` says."""
    dag = DAG()
    src = dag.new_vertex("src", sources.items([1, 2])).local_parallelism(1)
    lp_map, lp_out = (2, 2) if kind in ("unicast-lp2", "isolated") else (1, 1)
    if kind == "lp-differs":
        lp_out = 2
    sup: Any = functools.partial(StatefulMap, identity) if kind == "subclass" else P.map(identity)
    m = dag.new_vertex("map", sup).local_parallelism(lp_map)
    out = dag.new_vertex("out", Blocking if kind == "blocking" else sinks.noop())
    out.local_parallelism(lp_out)
    dag.edge(Edge.between(src, m))
    e = Edge.between(m, out)
    if kind == "distributed":
        e.distributed()
    if kind == "isolated":
        e.isolated()
    dag.edge(e)
    if kind == "two-outputs":
        dag.edge(Edge.from_(m, 1).to(dag.new_vertex("other", sinks.noop())))
    if kind == "two-inputs":
        dag.edge(Edge.from_(src, 1).to(out, 1))
    if kind == "policy":
        m.on_item_error("skip")
    return dag, JobConfig()


@pytest.mark.parametrize(
    "kind",
    [
        "isolated",
        "subclass",
        "blocking",
        "distributed",
        "unicast-lp2",
        "lp-differs",
        "two-outputs",
        "two-inputs",
        "policy",
    ],
)
def test_what_fuses_and_what_does_not(kind: str) -> None:
    dag, config = shape(kind)
    plan = planned(dag, config, members=2)
    if kind in ("isolated", "policy"):  # each applies its own bad-record policy
        assert "map" not in plan and plan["out"] == "FusedPairP"
    else:
        assert "map" in plan and plan["out"] != "FusedPairP"


# -- fused against unfused on random DAGs ------------------------------------------------------


def builtin(kind: str, c: int) -> Any:
    """The random DAGs' vertex functions as the built-in processors."""
    fn = functools.partial(KINDS[kind], c)
    if kind == "map":
        return P.map(lambda x: fn(x)[0])
    if kind == "filter":
        return P.filter(lambda x: bool(fn(x)))
    return P.flat_map(fn)


def builtin_supplier(v: dict[str, Any]) -> Any:
    """The built-in processors where a vertex is cooperative (a non-cooperative vertex
    stays the random DAGs' own processor)."""
    if v["coop"]:
        return builtin(v["kind"], v["c"])
    return functools.partial(Apply, functools.partial(KINDS[v["kind"]], v["c"]), False)


def build_builtin(spec: dict[str, Any]) -> tuple[DAG, list[str]]:
    """test_engine_random_dags.build with :func:`builtin_supplier`."""
    return build(spec, builtin_supplier)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=dags(), capacity=st.sampled_from([1, 2048]))
def test_random_dags_fused_and_unfused_give_the_oracles_output_and_figures(
    spec: dict[str, Any], capacity: int
) -> None:
    dag, names = build_builtin(spec)
    expected = oracle(spec)
    figures = []
    for fuse in (True, False):
        engine = ss.local(members=spec["members"], outbox_capacity=capacity)
        job = engine.new_job(dag, JobConfig(fuse_vertices=fuse))
        job.join(timeout=20)
        for name in names:
            assert Counter(engine.get_list(f"out-{name}")) == expected[name], (fuse, name)
        figures.append({v: m for v, m in job.metrics.items() if v != "__job__"})
    assert figures[0] == figures[1]


def test_a_chain_of_three_fuses_into_one_tasklet_with_each_vertexs_figures() -> None:
    dag = DAG()
    src = dag.new_vertex("src", sources.items(["a b", "c", "", "d e f"]))
    split = dag.new_vertex("split", P.flat_map(str.split))
    upper = dag.new_vertex("upper", P.map(str.upper))
    not_c = dag.new_vertex("not-c", P.filter(lambda w: w != "C"))
    out = dag.new_vertex("sink", sinks.list_sink("out"))
    dag.edge(Edge.between(src, split)).edge(Edge.between(split, upper))
    dag.edge(Edge.between(upper, not_c)).edge(Edge.between(not_c, out))
    plan = planned(dag, JobConfig())
    assert sorted(plan) == ["sink", "src"] and plan["sink"] == "FusedPairP"
    engine = ss.local()
    job = engine.new_job(dag)
    job.join(20)
    assert list(engine.get_list("out")) == ["A", "B", "D", "E", "F"]
    assert {
        v: (m["items_in"], m["items_out"]) for v, m in job.metrics.items() if v != "__job__"
    } == {
        "src": (0, 4),
        "split": (4, 6),
        "upper": (6, 6),
        "not-c": (6, 5),
        "sink": (5, 0),
    }


def test_under_skip_the_fused_producer_sets_its_bad_items_aside_and_counts_them() -> None:
    """Under a policy other than "fail" the producer runs its own process() (an item's
    results whole, each function once per item), fused all the same."""
    dag = DAG()
    src = dag.new_vertex("numbers", sources.items(list(range(8))))
    inv = dag.new_vertex("invert", P.flat_map(lambda x: [1 / (x % 4), x]))
    out = dag.new_vertex("sink", sinks.list_sink("out"))
    dag.edge(Edge.between(src, inv)).edge(Edge.between(inv, out))
    config = JobConfig(on_item_error="skip")
    assert planned(dag, config)["sink"] == "FusedPairP"
    engine = ss.local()
    job = engine.new_job(dag, config)
    job.join(20)
    assert sorted(engine.get_list("out")) == sorted(
        y for x in range(8) if x % 4 for y in (1 / (x % 4), x)
    )
    m = job.metrics
    assert m["invert"]["items_skipped"] == 2 and m["invert"]["items_out"] == 12
    assert m["sink"]["items_in"] == 12


class Gate(ss.AbstractProcessor):
    """Takes its input only once ``open``."""

    def __init__(self) -> None:
        self.open = False
        self.got: list[Any] = []

    def process(self, ordinal: int, inbox: Any) -> None:
        if self.open:
            self.got.extend(inbox)
            inbox.clear()


def test_a_chains_save_waits_for_every_item_between_its_vertices() -> None:
    """A snapshot is saved only once nothing is left between any two fused vertices:
    with two maps fused in front of a consumer, the inner pair's items too."""
    from slipstream.core.inbox import Inbox
    from slipstream.core.outbox import Outbox

    dag = DAG()
    src = dag.new_vertex("src", sources.items([1]))
    a = dag.new_vertex("a", P.map(identity))
    b = dag.new_vertex("b", P.map(identity))
    gate = dag.new_vertex("gate", Gate)
    dag.edge(Edge.between(src, a)).edge(Edge.between(a, b)).edge(Edge.between(b, gate))
    config = JobConfig()
    plans = build_vertex_plans(dag, config, 1, 1, None, "plan", check_pickle=False)
    (spec,) = [
        s for s in wire(dag, plans, config.processing_guarantee) if s.vertex.vertex.name == "gate"
    ]
    fused = spec.processor
    # no commit phase of its own: the tasklet runs one only where the consumer has one
    for name in ("snapshot_commit_prepare", "snapshot_commit_finish"):
        assert getattr(fused, name).__func__ is getattr(ss.Processor, name)
    fused.init(Outbox(1, 4), spec.context)  # 4 a bucket: b hands on 4 items at a time
    inbox = Inbox()
    inbox.extend(range(10))
    fused.process(0, inbox)
    assert not inbox and not fused.save_to_snapshot()  # the gate holds 4, b 6
    assert not fused.drain_between()  # what the tasklet asks before an idle mark
    fused.second.open = True
    for _ in range(10):
        if fused.save_to_snapshot():
            break
    assert fused.second.got == list(range(10))
    assert fused.drain_between()
    fused.second.drain_between = lambda: False  # a consumer running two, a PipeP
    assert not fused.drain_between()


# -- errors --------------------------------------------------------------------------------------


def invert(x: int) -> float:
    return 1 / (x - 3)


def test_an_error_in_the_fused_producer_names_it_and_the_consumers_names_the_consumer() -> None:
    dag = DAG()
    src = dag.new_vertex("numbers", sources.items(range(6)))
    inv = dag.new_vertex("invert", P.map(invert))
    acc = dag.new_vertex("count", P.accumulate_by_key(lambda x: x // 0, counting()))
    dag.edge(Edge.between(src, inv)).edge(Edge.between(inv, acc))
    dag.edge(Edge.between(acc, dag.new_vertex("sink", sinks.noop())))
    assert planned(dag, JobConfig())["count"] == "FusedPairP"
    with pytest.raises(ss.JobFailedError) as e:
        ss.local().new_job(dag, JobConfig(name="bad")).join(20)
    assert e.value.vertex == "invert" and e.value.processor_index == 0
    assert str(e.value).startswith(
        "job 'bad' failed: vertex 'invert', processor 0, on item 3: ZeroDivisionError"
    )
    # the consumer's own function: the consumer is named
    dag2 = DAG()
    src2 = dag2.new_vertex("numbers", sources.items(range(2)))
    inv2 = dag2.new_vertex("invert", P.map(lambda x: x + 10))
    acc2 = dag2.new_vertex("count", P.accumulate_by_key(lambda x: x // 0, counting()))
    dag2.edge(Edge.between(src2, inv2)).edge(Edge.between(inv2, acc2))
    dag2.edge(Edge.between(acc2, dag2.new_vertex("sink", sinks.noop())))
    with pytest.raises(ss.JobFailedError) as e2:
        ss.local().new_job(dag2).join(20)
    assert e2.value.vertex == "count"


# -- a flat_map into a counting consumer: counted line by line ----------------------------------

LINES = ["the cat", "", "a cat and the dog", "dog", "the the the", "z"] * 40


def words_made_one_by_one(line: str) -> Iterator[str]:
    """A generator: its words are made while the consumer counts."""
    yield from line.split()


def bad_line(line: str) -> list[str]:
    if line == "dog":
        raise ValueError("no dogs")
    return line.split()


def dies_half_way(line: str) -> Iterator[str]:
    words = line.split()
    yield from words[:1]
    if line == "dog":
        raise ValueError("no dogs")
    yield from words[1:]


def unhashable_words(line: str) -> list[Any]:
    return [[w] for w in line.split()]


def counted_line_by_line(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Notes the items of each call of the line-by-line counting path."""
    from slipstream.execution import fusion

    calls: list[int] = []
    real = fusion.count_flat_mapped

    def spy(fn: Any, items: Any, *rest: Any) -> int:
        calls.append(len(items))
        return real(fn, items, *rest)

    monkeypatch.setattr(fusion, "count_flat_mapped", spy)
    return calls


@pytest.mark.parametrize("tokenize", [str.split, words_made_one_by_one])
@pytest.mark.parametrize("members", [1, 2])
def test_a_flat_map_into_a_count_counts_line_by_line_with_the_unfused_output_and_figures(
    monkeypatch: pytest.MonkeyPatch, tokenize: Any, members: int
) -> None:
    calls = counted_line_by_line(monkeypatch)
    runs = []
    for fuse in (True, False):
        engine = ss.local(members=members, outbox_capacity=7)  # many small chunks
        job = engine.new_job(word_count_dag(LINES, tokenize), JobConfig(fuse_vertices=fuse))
        job.join(20)
        figures = {v: m for v, m in job.metrics.items() if v != "__job__"}
        runs.append((sorted(engine.get_list("counts")), figures))
        if fuse:
            assert sum(calls) == len(LINES)  # every line went this way, none other
    assert runs[0] == runs[1]
    assert runs[0][0] == sorted(Counter(w for line in LINES for w in line.split()).items())
    assert runs[0][1]["tokenize"]["items_out"] == runs[0][1]["accumulate"]["items_in"] == 480


@pytest.mark.parametrize(
    "tokenize,vertex",
    [(bad_line, "tokenize"), (dies_half_way, "tokenize"), (unhashable_words, "accumulate")],
)
def test_an_error_counting_line_by_line_is_the_one_unfused(
    monkeypatch: pytest.MonkeyPatch, tokenize: Any, vertex: str
) -> None:
    """The tokenizer's error names it and its line; the counting's own (an unhashable
    word) names the consumer: the same error as unfused."""
    calls = counted_line_by_line(monkeypatch)
    errors = []
    for fuse in (True, False):
        job = ss.local().new_job(
            word_count_dag(LINES, tokenize), JobConfig(name="wc", fuse_vertices=fuse)
        )
        with pytest.raises(ss.JobFailedError) as e:
            job.join(20)
        errors.append((e.value.vertex, e.value.processor_index, str(e.value)))
    assert calls
    assert errors[0] == errors[1]
    assert errors[0][0] == vertex
    if vertex == "tokenize":
        assert "on item 'dog': ValueError: no dogs" in errors[0][2]


def broken_key(word: str) -> str:
    raise KeyError(f"no key for {word}")


def test_a_broken_key_function_of_the_fused_edge_still_fails_the_job() -> None:
    dag = DAG()
    src = dag.new_vertex("words", sources.items(["fig"]))
    upper = dag.new_vertex("upper", P.map(str.upper))
    out = dag.new_vertex("sink", sinks.list_sink("out"))
    dag.edge(Edge.between(src, upper)).edge(Edge.between(upper, out).partitioned(broken_key))
    assert planned(dag, JobConfig())["sink"] == "FusedPairP"
    with pytest.raises(ss.JobFailedError) as e:
        ss.local().new_job(dag).join(20)
    assert isinstance(e.value.cause, ss.KeyFunctionError)
    assert e.value.vertex == "upper"
    assert str(e.value.cause) == (
        "edge 'upper' -> 'sink' (ordinal 0): key function broken_key "
        f"({Path(__file__).name}:{broken_key.__code__.co_firstlineno}) raised KeyError: "
        "'no key for FIG' on item 'FIG'"
    )


# -- snapshots -------------------------------------------------------------------------------------


def running_sum_dag(n: int, rate: float, min_snapshots: int = 0, batch: int = 16) -> DAG:
    """PacedSource -> P.map (fused) -> RunningSum -> list_sink("out"). Each key's items
    come from one source processor (x % 10 keeps x's parity), so the sums are exact."""
    dag = DAG()
    paced = functools.partial(stp.PacedSource, n, rate, batch, min_snapshots=min_snapshots)
    src = dag.new_vertex("src", paced).local_parallelism(2)
    m = dag.new_vertex("shift", P.map(lambda x: x + 10)).local_parallelism(1)
    rs = dag.new_vertex("sum", functools.partial(stp.RunningSum, 10)).local_parallelism(1)
    dag.edge(Edge.between(src, m).partitioned(lambda x: x % 10).distributed())
    dag.edge(Edge.between(m, rs).partitioned(lambda x: x % 10))
    dag.edge(Edge.between(rs, dag.new_vertex("sink", sinks.list_sink("out"))))
    return dag


def expected_sums(n: int) -> Counter:
    return stp.expected_running_sums(n, shift=10)  # the "shift" vertex adds 10


@pytest.mark.parametrize("first,second", [(True, False), (False, True)])
def test_a_snapshot_written_fused_restores_unfused_and_the_reverse(
    tmp_path: Any, first: bool, second: bool
) -> None:
    n = 20_000
    engine = ss.local()
    # the sources do not complete before the suspension: it comes after two snapshots
    dag = running_sum_dag(n, rate=2000.0, min_snapshots=10**9)
    assert planned(dag, JobConfig())["sum"] == "FusedPairP"
    config = JobConfig(
        processing_guarantee=EO,
        snapshot_store=str(tmp_path / "a"),
        snapshot_interval_ms=20,
        fuse_vertices=first,
    )
    job = engine.new_job(dag, config)
    stp.wait_for(lambda: job.metrics["__job__"]["snapshots"] >= 2, what="two snapshots")
    job.suspend()
    snap = job.export_snapshot()
    assert snap is not None
    # the stateless vertex is recorded as unfused: one processor, no state
    assert snap.vertices["shift"].total_parallelism == 1
    assert not any(snap.vertices["shift"].entries.values())
    before = Counter(engine.get_list("out"))
    assert 0 < sum(before.values()) < n
    engine2 = ss.local()
    job2 = engine2.new_job(
        running_sum_dag(n, rate=1e9, batch=4096),
        JobConfig(
            processing_guarantee=EO, snapshot_store=str(tmp_path / "b"), fuse_vertices=second
        ),
        restore_from=snap,
    )
    job2.join(60)
    assert before + Counter(engine2.get_list("out")) == expected_sums(n)


# -- a sink in its producer's tasklet --------------------------------------------------------------


class KeyedSum(CsvSum):
    """A user's running sum over ``key,value`` lines, as bench/wordcount.py's
    ``CsvRunningSum`` (test_processes.CsvSum); notes the state backend its context was
    given."""

    backends: list[str] = []

    def init_processor(self, context: ss.Context) -> None:
        super().init_processor(context)
        KeyedSum.backends.append(context.state_backend)


def line_key(line: str) -> str:
    return line.split(",", 1)[0]


def keyed_sum_dag(lines: list[str], sink: Any = None, kind: str = "") -> DAG:
    """items -> distributed partitioned -> KeyedSum -> local partitioned -> sink (the
    bench's running sum), or a variant that must not fuse (``kind``)."""
    dag = DAG()
    src = dag.new_vertex("read", sources.items(lines))
    rs_sup: Any = KeyedSum
    if kind == "blocking":
        rs_sup = Blocking
    rs = dag.new_vertex("running-sum", rs_sup)
    sink_sup = sink if sink is not None else sinks.map_sink("sums")
    if kind == "subclass":
        sink_sup = functools.partial(SubclassedSink, "sums")
    out = dag.new_vertex("sink", sink_sup)
    if kind == "sink-backend":
        out.state_backend("sqlite")
    dag.edge(Edge.between(src, rs).distributed().partitioned(line_key))
    if kind == "source":  # the sink behind the source itself
        rs = src
        dag = DAG()
        src = dag.new_vertex("read", sources.items(lines))
        out = dag.new_vertex("sink", sinks.list_sink("out"))
        dag.edge(Edge.between(src, out))
        return dag
    dag.edge(Edge.between(rs, out).partitioned(ss.entry_key))
    if kind == "two-inputs":
        dag.edge(Edge.from_(src, 1).to(out, 1))
    return dag


class SubclassedSink(MapSinkP):
    """A subclass of the built-in sink may do more: never run in its producer."""


def planned_without_snapshots(dag: DAG, members: int = 2) -> dict[str, str]:
    plans = build_vertex_plans(
        dag, JobConfig(), members, 1, None, "plan", check_pickle=False, snapshots=False
    )
    specs = wire(dag, plans, ProcessingGuarantee.NONE)
    return {s.vertex.vertex.name: type(s.processor).__name__ for s in specs if s.global_index == 0}


@pytest.mark.parametrize(
    "kind", ["", "snapshots", "blocking", "subclass", "sink-backend", "source", "two-inputs"]
)
def test_a_sink_runs_in_its_stateful_producers_tasklet_only_in_a_job_without_snapshots(
    kind: str,
) -> None:
    dag = keyed_sum_dag(["a,1"], kind=kind)
    if kind == "snapshots":  # a job that saves or restores: the producer's state, a
        # sink's two-phase output
        plan = planned(dag, JobConfig(), members=2)
    else:
        plan = planned_without_snapshots(dag)
    if kind == "":
        assert plan == {"read": "ItemsP", "sink": "FusedPairP"}
    else:
        assert plan["sink"] != "FusedPairP", kind


@st.composite
def keyed_lines(draw: Any) -> list[str]:
    """``key,value`` lines, one value per key: with several source processors a key's
    lines interleave in any order, and its running sums are the same in every order."""
    values = draw(st.fixed_dictionaries({k: st.integers(-5, 50) for k in "abcdefg"}))
    keys = draw(st.lists(st.sampled_from("abcdefg"), max_size=60))
    return [f"{k},{values[k]}" for k in keys]


def sums_oracle(lines: list[str]) -> tuple[dict[str, int], Counter]:
    """The map's last value per key, and every ``(key, running sum)`` emitted."""
    sums: dict[str, int] = {}
    emitted: Counter = Counter()
    for line in lines:
        k, v = line.split(",", 1)
        sums[k] = sums.get(k, 0) + int(v)
        emitted[(k, sums[k])] += 1
    return sums, emitted


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=keyed_lines(), capacity=st.sampled_from([1, 3, 2048]), members=st.sampled_from([1, 2]))
def test_a_user_processor_into_map_and_list_sinks_fused_and_unfused_gives_the_oracles_output(
    lines: list[str], capacity: int, members: int
) -> None:
    sums, emitted = sums_oracle(lines)
    for sink in (None, sinks.list_sink("out")):
        figures = []
        for fuse in (True, False):
            engine = ss.local(members=members, outbox_capacity=capacity)
            job = engine.new_job(keyed_sum_dag(lines, sink), JobConfig(fuse_vertices=fuse))
            job.join(20)
            if sink is None:
                assert dict(engine.get_map("sums")) == sums, fuse
            else:
                assert Counter(engine.get_list("out")) == emitted, fuse
            figures.append({v: m for v, m in job.metrics.items() if v != "__job__"})
        assert figures[0] == figures[1]
        assert (
            figures[0]["running-sum"]["items_out"] == figures[0]["sink"]["items_in"] == len(lines)
        )


@pytest.mark.parametrize("processes", [1, 2])
def test_the_running_sum_with_processes_matches_one_process_and_the_oracle(processes: int) -> None:
    lines = [f"{k},{v}" for v in range(300) for k in "pqrstu"[: 1 + v % 6]]
    sums, _ = sums_oracle(lines)
    engine = ss.local(processes=processes, outbox_capacity=16)
    job = engine.new_job(keyed_sum_dag(lines), JobConfig())
    job.join(60)
    assert dict(engine.get_map("sums")) == sums
    m = job.metrics
    assert m["running-sum"]["items_in"] == m["sink"]["items_in"] == len(lines)


class FailsOn(KeyedSum):
    def try_process_item(self, ordinal: int, line: Any) -> bool:
        if line == "bad,0":
            raise ValueError("a bad line")
        return super().try_process_item(ordinal, line)


class NotAPair(KeyedSum):
    def try_process_item(self, ordinal: int, line: Any) -> bool:
        return self.try_emit(("a", 1, 2) if line == "bad,0" else (line, 1))


@pytest.mark.parametrize("producer,vertex", [(FailsOn, "running-sum"), (NotAPair, "sink")])
def test_an_error_names_the_vertex_whose_code_raised_fused_as_unfused(
    producer: Any, vertex: str
) -> None:
    errors = []
    for fuse in (True, False):
        dag = DAG()
        src = dag.new_vertex("read", sources.items(["a,1", "bad,0", "b,2"]))
        rs = dag.new_vertex("running-sum", producer)
        out = dag.new_vertex("sink", sinks.map_sink("sums"))
        dag.edge(Edge.between(src, rs)).edge(Edge.between(rs, out))
        with pytest.raises(ss.JobFailedError) as e:
            ss.local().new_job(dag, JobConfig(name="rs", fuse_vertices=fuse)).join(20)
        errors.append((e.value.vertex, e.value.processor_index, type(e.value.cause).__name__))
    assert errors[0] == errors[1] and errors[0][0] == vertex


@pytest.mark.parametrize("vertex_backend", [None, "memory"])
def test_a_fused_producer_keeps_its_own_or_the_jobs_state_backend(
    vertex_backend: str | None,
) -> None:
    KeyedSum.backends.clear()
    dag = keyed_sum_dag(["a,1", "b,2", "a,3"])
    if vertex_backend is not None:
        dag.vertex("running-sum").state_backend(vertex_backend)
    engine = ss.local()
    job = engine.new_job(dag, JobConfig(state_backend="sqlite"))
    job.join(20)
    assert planned_without_snapshots(dag, members=1)["sink"] == "FusedPairP"
    assert dict(engine.get_map("sums")) == {"a": 4, "b": 2}
    assert KeyedSum.backends == [vertex_backend or "sqlite"]


def window_event(seq: int) -> tuple[int, int]:
    """In order per generator processor; every 9th event of a key after a gap."""
    return (seq * 2 + (seq // 45) * 30, seq % 5)


def test_windows_into_a_list_sink_fused_give_the_unfused_windows() -> None:
    """A stateful producer that holds its output until watermarks close windows (and
    emits the rest at its end), into a list sink: a generator's watermarks flow while it
    runs and reach the fused pair's producer as they reach it unfused."""
    from slipstream.window import tumbling_window_def

    outs = []
    for fuse in (True, False):
        p = ss.Pipeline()
        (
            p.read_from(sources.generator(window_event, None, max_items=900))
            .with_timestamps(lambda e: e[0], 0)
            .group_by(lambda e: e[1])
            .window(tumbling_window_def(40))
            .aggregate(counting())
            .write_to(sinks.list_sink("win"))
        )
        engine = ss.local(outbox_capacity=5)
        job = engine.new_job(p, JobConfig(fuse_vertices=fuse))
        job.join(20)
        outs.append(sorted(map(tuple, engine.get_list("win"))))
    assert outs[0] == outs[1]
    assert sum(r[-1] for r in outs[0]) == 900


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("SLIPSTREAM_FUSE_VERTICES", raising=False)
    yield
