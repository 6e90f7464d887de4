"""DAG construction and validation errors name the vertex, edge or ordinal at fault."""

from __future__ import annotations

import functools
import threading
import warnings
from typing import Any

import pytest

import slipstream as ss
from slipstream import DAG, DagError, Edge


class P(ss.AbstractProcessor):
    pass


def test_duplicate_vertex_name() -> None:
    dag = DAG()
    dag.new_vertex("a", P)
    with pytest.raises(DagError, match="duplicate vertex name 'a'"):
        dag.new_vertex("a", P)


def test_edge_to_vertex_not_in_dag() -> None:
    dag, other = DAG(), DAG()
    a = dag.new_vertex("a", P)
    b = other.new_vertex("b", P)
    with pytest.raises(DagError, match="'b' is not in this DAG"):
        dag.edge(Edge.between(a, b))


def test_same_name_different_vertex_object_rejected() -> None:
    dag, other = DAG(), DAG()
    a = dag.new_vertex("a", P)
    dag.new_vertex("b", P)
    b2 = other.new_vertex("b", P)
    with pytest.raises(DagError, match="not in this DAG"):
        dag.edge(Edge.between(a, b2))


def test_edge_without_destination() -> None:
    dag = DAG()
    a = dag.new_vertex("a", P)
    with pytest.raises(DagError, match="no destination"):
        dag.edge(Edge.from_(a))


def test_self_loop() -> None:
    dag = DAG()
    a = dag.new_vertex("a", P)
    with pytest.raises(DagError, match="itself"):
        dag.edge(Edge.between(a, a))


def test_cycle_names_vertices() -> None:
    dag = DAG()
    a, b, c = (dag.new_vertex(n, P) for n in "abc")
    dag.edge(Edge.between(a, b)).edge(Edge.between(b, c)).edge(Edge.from_(c).to(b, 1))
    with pytest.raises(DagError, match=r"cycle through vertices \['b', 'c'\]"):
        dag.validate()


def test_duplicate_inbound_ordinal() -> None:
    dag = DAG()
    a, b, c = (dag.new_vertex(n, P) for n in "abc")
    dag.edge(Edge.between(a, c))
    with pytest.raises(DagError, match="'c' already has an inbound edge at ordinal 0"):
        dag.edge(Edge.between(b, c))


def test_duplicate_outbound_ordinal() -> None:
    dag = DAG()
    a, b, c = (dag.new_vertex(n, P) for n in "abc")
    dag.edge(Edge.between(a, b))
    with pytest.raises(DagError, match="'a' already has an outbound edge at ordinal 0"):
        dag.edge(Edge.between(a, c))


def test_gap_in_inbound_ordinals() -> None:
    dag = DAG()
    a, b = dag.new_vertex("a", P), dag.new_vertex("b", P)
    dag.edge(Edge.from_(a).to(b, 1))
    with pytest.raises(DagError, match="vertex 'b': inbound ordinals .* ordinal 0 is missing"):
        dag.validate()


def test_gap_in_outbound_ordinals() -> None:
    dag = DAG()
    a, b = dag.new_vertex("a", P), dag.new_vertex("b", P)
    dag.edge(Edge.from_(a, 2).to(b))
    with pytest.raises(DagError, match="vertex 'a': outbound ordinals .* ordinal 0 is missing"):
        dag.validate()


def test_negative_ordinal() -> None:
    dag = DAG()
    a = dag.new_vertex("a", P)
    with pytest.raises(DagError, match="ordinal must be an int >= 0"):
        Edge.from_(a, -1)


def test_isolated_edge_unequal_parallelism() -> None:
    dag = DAG()
    a = dag.new_vertex("a", P).local_parallelism(2)
    b = dag.new_vertex("b", P).local_parallelism(3)
    dag.edge(Edge.between(a, b).isolated())
    with pytest.raises(DagError, match=r"edge 'a'\[0\] -> 'b'\[0\]: isolated edge .*\('a': 2, 'b': 3\)"):
        dag.validate()


def test_isolated_edge_with_default_parallelism_checked_at_submission() -> None:
    dag = DAG()
    a = dag.new_vertex("a", P).local_parallelism(1)
    b = dag.new_vertex("b", P)
    dag.edge(Edge.between(a, b).isolated())
    with pytest.raises(DagError, match="isolated"):
        ss.local(cooperative_threads=2).new_job(dag)


def test_isolated_distributed_edge() -> None:
    dag = DAG()
    a, b = dag.new_vertex("a", P), dag.new_vertex("b", P)
    dag.edge(Edge.between(a, b).isolated().distributed())
    with pytest.raises(DagError, match="isolated edges must be local"):
        dag.validate()


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "2"])
def test_bad_parallelism(bad: object) -> None:
    dag = DAG()
    with pytest.raises(DagError, match="vertex 'a': local parallelism"):
        dag.new_vertex("a", P).local_parallelism(bad)  # type: ignore[arg-type]


def test_unpicklable_supplier_named_at_submission() -> None:
    lock = threading.Lock()

    def make() -> ss.Processor:
        _ = lock
        return P()

    dag = DAG()
    dag.new_vertex("locked", make)
    with pytest.raises(DagError, match="vertex 'locked': its processor supplier cannot be pickled"):
        ss.local().new_job(dag)


def test_processor_instance_is_not_a_supplier() -> None:
    dag = DAG()
    with pytest.raises(DagError, match="vertex 'a'.*Processor instance"):
        dag.new_vertex("a", P())


def test_not_callable_supplier() -> None:
    with pytest.raises(DagError, match="vertex 'a'"):
        DAG().new_vertex("a", 42)


def test_empty_dag() -> None:
    with pytest.raises(DagError, match="no vertices"):
        DAG().validate()


def test_bad_queue_size_and_partitioner() -> None:
    dag = DAG()
    a, b = dag.new_vertex("a", P), dag.new_vertex("b", P)
    with pytest.raises(DagError, match="queue size"):
        Edge.between(a, b).queue_size(0)
    with pytest.raises(DagError, match="callable key function"):
        Edge.between(a, b).partitioned(42)  # type: ignore[arg-type]


def test_edge_returns_dag_for_chaining_and_dot_and_str() -> None:
    dag = DAG()
    a, b, c = dag.new_vertex("a", P), dag.new_vertex("b", P).local_parallelism(2), dag.new_vertex("c", P)
    assert dag.edge(Edge.between(a, b).partitioned(lambda x: x)) is dag
    dag.edge(Edge.between(b, c).distributed().broadcast().priority(1))
    dot = dag.to_dot()
    assert dot.startswith("digraph DAG {") and '"a" -> "b"' in dot and "partitioned" in dot
    assert '"b" [label="b [2]"]' in dot and "distributed" in dot
    text = str(dag)
    assert "vertex 'b' (local parallelism 2)" in text and "broadcast" in text
    assert [v.name for v in dag] == ["a", "b", "c"]


def _diamond(hi_path: Any = None, lo_path: Any = None) -> DAG:
    """``s`` feeds ``j`` twice: ordinal 0 at priority -1 (through ``hi_path`` if given),
    ordinal 1 at priority 0 (through ``lo_path`` if given)."""
    dag = DAG()
    s, j = dag.new_vertex("s", P), dag.new_vertex("j", P)
    for ordinal, (supplier, name) in enumerate(((hi_path, "h"), (lo_path, "l"))):
        edge_to_j = Edge.from_(s, ordinal)
        if supplier is not None:
            mid = dag.new_vertex(name, supplier)
            dag.edge(Edge.from_(s, ordinal).to(mid))
            edge_to_j = Edge.from_(mid)
        dag.edge(edge_to_j.to(j, ordinal).priority(-1 if ordinal == 0 else 0))
    return dag


def _diamond_error(lo: str, hi: str, path: str) -> str:
    return (
        f"vertex 'j' can hang (a priority diamond): it reads {lo} (priority 0) only after "
        f"{hi} (priority -1) has ended, but vertex 's' feeds both, and nothing on the path "
        f"{path} takes its whole input: once that path's queues are full, 's' waits for "
        "'j', which waits for 's' to end. Put a vertex that takes its whole input before it "
        "emits (an aggregation, P.sort) on that path, or give the two edges the same "
        "priority; if fewer items ever take that path than its queues hold, call "
        f".allow_priority_diamond() on {lo}"
    )


def test_priority_diamond_is_refused() -> None:
    """On main these only warned, and the job hung once the lower-priority path's
    queues filled (tests/engine/test_engine_routing.py runs the shapes)."""
    for dag, lo, hi, path in (
        (_diamond(), "edge 's'[1] -> 'j'[1]", "edge 's'[0] -> 'j'[0]", "'s' -> 'j'"),
        (_diamond(lo_path=P), "edge 'l'[0] -> 'j'[1]", "edge 's'[0] -> 'j'[0]", "'s' -> 'l' -> 'j'"),
        # buffering on the higher-priority path does not help: s still waits for j
        (_diamond(hi_path=ss.processors.sort()), "edge 's'[1] -> 'j'[1]", "edge 'h'[0] -> 'j'[0]",
         "'s' -> 'j'"),
    ):
        with pytest.raises(DagError) as info:
            dag.validate()
        assert str(info.value) == _diamond_error(lo, hi, path)
    # one level further up: the shared vertex is two steps away on both paths
    dag = DAG()
    a, s, h, j = (dag.new_vertex(n, P) for n in "ashj")
    dag.edge(Edge.between(a, s)).edge(Edge.from_(s, 0).to(h)).edge(Edge.from_(s, 1).to(j, 1))
    dag.edge(Edge.between(h, j).priority(-5))
    with pytest.raises(DagError, match=r"vertex 'j' can hang .* vertex 's' feeds both"):
        dag.validate()


def test_priority_diamond_with_a_buffering_lower_path_and_independent_inputs_pass() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for buffering in (
            ss.processors.sort(),
            ss.processors.aggregate(ss.aggregate.counting()),
            ss.processors.accumulate_by_key(lambda x: x, ss.aggregate.counting()),
        ):
            _diamond(lo_path=buffering).validate()
        # a hash join: the build side (higher priority) from a source of its own
        ok = DAG()
        a, b, c = ok.new_vertex("a", P), ok.new_vertex("b", P), ok.new_vertex("c", P)
        ok.edge(Edge.from_(a).to(c, 0).priority(-1)).edge(Edge.from_(b).to(c, 1))
        ok.validate()
        # the user's word that the lower-priority path stays small
        dag = _diamond(lo_path=P)
        dag.inbound_edges("j")[1].allow_priority_diamond()
        dag.validate()
        # Spark's queues are unbounded: its validation lets the diamond through
        _diamond().validate(bounded_queues=False)


class _Counted:
    """An item that counts how often it is pickled."""

    pickled = 0

    def __init__(self, n: int) -> None:
        self.n = n

    def __reduce__(self) -> tuple[Any, ...]:
        _Counted.pickled += 1
        return _Counted, (self.n,)


def test_the_embedded_engine_samples_the_data_a_supplier_holds() -> None:
    """The embedded engine ships nothing: new_job checks the first and last items of a
    long ``sources.items`` list, not all of them (a full pickle of 2 M events took a third
    of a windowed job); ``DAG.validate()`` and the Spark engine check everything."""
    events = [_Counted(i) for i in range(20_000)]
    dag = DAG()
    src = dag.new_vertex("src", ss.sources.items(events))
    dag.edge(Edge.between(src, dag.new_vertex("sink", ss.sinks.list_sink("out"))))
    _Counted.pickled = 0
    engine = ss.local()
    engine.new_job(dag).join()
    assert len(engine.get_list("out")) == 20_000
    assert 0 < _Counted.pickled <= 2 * 256
    _Counted.pickled = 0
    dag.validate()
    assert _Counted.pickled == 20_000
    # a lambda supplier goes to cloudpickle, which samples the same way
    dag = DAG()
    dag.new_vertex("by-value", functools.partial(lambda items: P(), events))
    _Counted.pickled = 0
    dag.validate(sample_data=True)
    assert 0 < _Counted.pickled <= 2 * 256


def test_sampling_the_data_still_checks_the_code_in_full() -> None:
    lock = threading.Lock()

    def make(items: list[int], guard: Any = lock) -> ss.Processor:
        return P()

    dag = DAG()
    dag.new_vertex("locked", functools.partial(make, list(range(20_000))))
    with pytest.raises(DagError, match="vertex 'locked': its processor supplier cannot be pickled"):
        ss.local().new_job(dag)
    # an unpicklable item inside long data passes the sample, but not the full check
    data: list[Any] = list(range(20_000))
    data[10_000] = lock
    dag = DAG()
    dag.new_vertex("data", ss.sources.items(data))
    dag.validate(sample_data=True)
    with pytest.raises(DagError, match="vertex 'data': its processor supplier cannot be pickled"):
        dag.validate()
