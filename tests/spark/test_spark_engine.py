"""The Spark engine (slipstream.spark.engine): jobs, results, failures, cancellation.

All tests share the session-scoped local[2] ``spark_session`` fixture (conftest.py). The
word count on a standalone cluster is in test_standalone.py, on the one cluster the
suite starts.
"""

from __future__ import annotations

import functools
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import slipstream as ss
from slipstream import DAG, Edge, JobStatus

from .spark_engine_procs import (
    Blocking,
    Boom,
    Collect,
    ListSource,
    Mapper,
    MapWriter,
    NamedListSource,
    PerMemberMeta,
    Sleeper,
    WrongCountSupplier,
    map_filter_dag,
    word_count_dag,
    word_count_oracle,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]

LINES = [
    "the quick brown fox jumps over the lazy dog",
    "to be or not to be that is the question",
    "a stream is a batch that never ends",
] * 50


@pytest.fixture
def engine(spark_session: Any) -> Any:
    return ss.spark(spark_session)


# ------------------------------------------------------------------ engine shape


def test_engine_shape_from_local_session(spark_session: Any) -> None:
    engine = ss.spark(spark_session)
    # one member per task slot, one processor each: member-local edges stay narrow
    assert spark_session.sparkContext.defaultParallelism == 2
    assert (engine.member_count, engine.default_local_parallelism) == (2, 1)
    one = ss.spark(spark_session, members=1)
    assert (one.member_count, one.default_local_parallelism) == (1, 2)
    three = ss.spark(spark_session, local_parallelism=3)
    assert (three.member_count, three.default_local_parallelism) == (1, 3)
    assert "members=2" in repr(engine)


def test_engine_without_a_session_reuses_the_running_one(spark_session: Any) -> None:
    engine = ss.spark()  # getOrCreate: the shared session of this test run
    assert engine.spark_context is spark_session.sparkContext
    engine.new_job(map_filter_dag([1, 2, 3])).join(120)
    assert sorted(engine.get_list("out")) == ["n1", "n9"]
    engine.shutdown()  # must not stop a session it did not start
    assert spark_session.sparkContext.parallelize([1, 2], 2).sum() == 3


def test_engine_argument_errors(spark_session: Any) -> None:
    with pytest.raises(ValueError, match="members"):
        ss.spark(spark_session, members=0)
    with pytest.raises(ValueError, match="local_parallelism"):
        ss.spark(spark_session, local_parallelism=0)
    with pytest.raises(ValueError, match="master"):
        ss.spark(spark_session, master="local[1]")
    with pytest.raises(TypeError, match="SparkSession"):
        ss.spark(object())
    with pytest.raises(TypeError, match="DAG"):
        ss.spark(spark_session).new_job("not a dag")  # type: ignore[arg-type]


def test_ss_spark_stays_callable_after_submodule_imports() -> None:
    """``ss.spark`` is the plain factory function (``ss.spark_engine``), whatever of
    the package slipstream.spark is imported, in whatever order."""
    code = (
        "import sys, types\n"
        "import slipstream.spark.engine, slipstream.spark.io, slipstream.spark.compile\n"
        "import slipstream as ss\n"
        "from slipstream.spark import compile, task\n"
        "assert ss.spark is ss.spark_engine and isinstance(ss.spark, types.FunctionType)\n"
        "assert isinstance(sys.modules['slipstream.spark'], types.ModuleType)\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "from spark.spark_fake_rdd import FakeSession\n"
        "engine = ss.spark(FakeSession(), members=2)\n"
        "print(type(engine).__name__, engine.member_count)\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('pyspark', 'py4j'))\n"
        "print(bad)\n"
    )
    tests_dir = str(Path(__file__).resolve().parent.parent)
    result = subprocess.run(
        [sys.executable, "-c", code, tests_dir], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:2] == ["SparkEngine 2", "[]"]


# ------------------------------------------------------------------ batch jobs


def test_word_count_matches_oracle_and_reports_metrics(spark_session: Any) -> None:
    engine = ss.spark(spark_session, members=1)  # one member: accumulate sees every word once
    job = engine.new_job(word_count_dag(LINES), ss.JobConfig(name="wc"))
    job.join(120)
    assert job.status is JobStatus.COMPLETED
    assert job.name == "wc" and isinstance(job.id, int)
    assert sorted(engine.get_list("counts")) == word_count_oracle(LINES)

    words = sum(len(line.split()) for line in LINES)
    vocab = len(word_count_oracle(LINES))
    m = job.metrics
    assert m["source"] == {"items_in": 0, "items_out": len(LINES)}
    assert m["split"] == {"items_in": len(LINES), "items_out": words}
    assert m["accumulate"] == {"items_in": words, "items_out": vocab}
    assert m["combine"] == {"items_in": vocab, "items_out": vocab}
    assert m["sink"] == {"items_in": vocab, "items_out": 0}


def test_lists_accumulate_across_jobs_like_the_embedded_engine(engine: Any) -> None:
    for _ in range(2):
        engine.new_job(map_filter_dag(list(range(10)))).join(120)
    expected = sorted(f"n{x * x}" for x in range(10) if x % 2 == 1) * 2
    assert sorted(engine.get_list("out")) == sorted(expected)


def test_map_sink_and_driver_list_source(engine: Any) -> None:
    engine.get_list("input").extend(range(100))
    engine.get_map("squares")["old"] = -1
    dag = DAG()
    src = dag.new_vertex("read", functools.partial(NamedListSource, "input"))
    sq = dag.new_vertex("square", functools.partial(Mapper, lambda x: (x, x * x)))
    out = dag.new_vertex("write", functools.partial(MapWriter, "squares"))
    dag.edge(Edge.between(src, sq)).edge(Edge.between(sq, out).partitioned(ss.entry_key))
    engine.new_job(dag).join(120)
    assert dict(engine.get_map("squares")) == {"old": -1, **{x: x * x for x in range(100)}}
    assert engine.get_list("input") == list(range(100))  # reading did not duplicate it


def test_meta_supplier_sees_one_address_per_member(spark_session: Any) -> None:
    blocks = [[1, 2, 3], [10, 20], [100]]
    engine = ss.spark(spark_session, members=3)
    dag = DAG()
    src = dag.new_vertex("src", PerMemberMeta(blocks)).local_parallelism(1)
    out = dag.new_vertex("sink", functools.partial(Collect, "out", True)).local_parallelism(1)
    dag.edge(Edge.between(src, out).distributed())
    engine.new_job(dag).join(120)
    from slipstream.execution.plan import member_addresses

    got = sorted(item for _g, item in engine.get_list("out"))
    expected = sorted(
        (str(a), x) for a, block in zip(member_addresses(3), blocks, strict=True) for x in block
    )
    assert got == expected
    assert {g for g, _ in engine.get_list("out")} <= {0, 1, 2}  # 1 sink per member


def test_non_cooperative_processor(engine: Any) -> None:
    dag = DAG()
    src = dag.new_vertex("src", functools.partial(ListSource, list(range(5000))))
    b = dag.new_vertex("blocking", Blocking)
    out = dag.new_vertex("sink", functools.partial(Collect, "out"))
    dag.edge(Edge.between(src, b)).edge(Edge.between(b, out))
    engine.new_job(dag).join(120)
    assert sorted(engine.get_list("out")) == [x * 10 for x in range(5000)]


def test_vertex_with_two_consumers_runs_once(spark_session: Any) -> None:
    """A vertex feeding two vertices is persisted, so its processors run once (their
    results are not duplicated and metrics count each processor once)."""
    engine = ss.spark(spark_session, members=1)  # two processors per member
    dag = DAG()
    src = dag.new_vertex("src", functools.partial(ListSource, list(range(300))))
    a = dag.new_vertex("a", functools.partial(Collect, "a"))
    b = dag.new_vertex("b", functools.partial(Collect, "b"))
    dag.edge(Edge.from_(src, 0).to(a)).edge(Edge.from_(src, 1).to(b).broadcast())
    job = engine.new_job(dag)
    job.join(120)
    assert sorted(engine.get_list("a")) == list(range(300))
    assert sorted(engine.get_list("b")) == sorted(list(range(300)) * 2)  # broadcast to 2
    assert job.metrics["src"]["items_out"] == 600  # 300 per ordinal
    assert job.metrics["b"]["items_in"] == 600


# ------------------------------------------------------------------ compilation


def test_narrow_edges_do_not_shuffle(spark_session: Any) -> None:
    from slipstream.execution.plan import member_addresses
    from slipstream.spark.compile import compile_dag

    sc = spark_session.sparkContext

    def shuffles(dag: DAG) -> int:
        compiled = compile_dag(
            sc,
            dag,
            ss.JobConfig(),
            job_name="x",
            member_count=1,
            default_parallelism=2,
            addresses=member_addresses(1),
        )
        debug = compiled.result_rdd.toDebugString().decode()
        return debug.count("ShuffledRDD")

    # source -> isolated -> unicast (same parallelism) -> partitioned: one shuffle
    assert shuffles(map_filter_dag(list(range(10)))) == 1
    # word count: partitioned, distributed partitioned, combine (2) -> sink (1); the
    # source -> split unicast edge stays narrow
    assert shuffles(word_count_dag(LINES)) == 3
    # unicast into a different parallelism must shuffle
    dag = DAG()
    s = dag.new_vertex("s", functools.partial(ListSource, [1]))
    c = dag.new_vertex("c", functools.partial(Collect, "x")).local_parallelism(1)
    dag.edge(Edge.between(s, c))
    assert shuffles(dag) == 1


# ------------------------------------------------------------------ failures


def test_processor_exception_fails_job_naming_vertex_and_index(engine: Any) -> None:
    dag = DAG()
    src = dag.new_vertex("src", functools.partial(ListSource, list(range(100)))).local_parallelism(
        1
    )
    bad = dag.new_vertex("mapper", functools.partial(Boom, 42)).local_parallelism(2)
    out = dag.new_vertex("sink", functools.partial(Collect, "out"))
    dag.edge(Edge.between(src, bad).partitioned(lambda x: x)).edge(Edge.between(bad, out))
    job = engine.new_job(dag, ss.JobConfig(name="failing"))
    with pytest.raises(ss.JobFailedError) as info:
        job.join(120)
    err = info.value
    from slipstream.core.partition import (
        DEFAULT_PARTITION_COUNT,
        default_partitioner,
        partition_table,
    )

    owner = partition_table(DEFAULT_PARTITION_COUNT, 1, 2, False, 0)[
        default_partitioner(42, DEFAULT_PARTITION_COUNT)
    ]
    assert err.vertex == "mapper"
    assert err.processor_index == owner
    assert isinstance(err.__cause__, ValueError)
    assert str(err.__cause__) == "boom on 42"
    assert "vertex 'mapper'" in str(err) and "boom on 42" in str(err)
    assert "failing" in str(err)
    assert err.remote_traceback and "spark_engine_procs.py" in err.remote_traceback
    assert job.status is JobStatus.FAILED
    assert engine.get_list("out") == []  # a failed job publishes nothing


def test_supplier_returning_wrong_count_fails_naming_vertex(engine: Any) -> None:
    dag = DAG()
    src = dag.new_vertex("src", functools.partial(ListSource, [1, 2]))
    m = dag.new_vertex("odd-supplier", WrongCountSupplier()).local_parallelism(2)
    dag.edge(Edge.between(src, m))
    job = engine.new_job(dag)
    with pytest.raises(ss.JobFailedError, match="odd-supplier") as info:
        job.join(120)
    assert info.value.vertex == "odd-supplier"
    assert "expected local parallelism 2" in str(info.value)


def test_unpicklable_supplier_fails_before_the_job_starts(engine: Any) -> None:
    import threading

    lock = threading.Lock()
    dag = DAG()
    src = dag.new_vertex("src", functools.partial(ListSource, [1, 2]))
    m = dag.new_vertex("locked", functools.partial(Mapper, lambda x: (lock, x)[1]))
    dag.edge(Edge.between(src, m))
    sc = engine.spark_context
    jobs_before = len(sc.statusTracker().getJobIdsForGroup())
    with pytest.raises(ss.DagError, match="'locked'"):
        engine.new_job(dag)
    assert engine.jobs == []
    assert len(sc.statusTracker().getJobIdsForGroup()) == jobs_before


def test_join_timeout_and_cancel(engine: Any) -> None:
    dag = DAG()
    src = dag.new_vertex("forever", Sleeper)
    out = dag.new_vertex("sink", functools.partial(Collect, "out"))
    dag.edge(Edge.between(src, out))
    job = engine.new_job(dag)
    with pytest.raises(TimeoutError):
        job.join(1.0)
    deadline = time.monotonic() + 60
    while job.status is not JobStatus.RUNNING and time.monotonic() < deadline:
        time.sleep(0.05)
    assert job.status is JobStatus.RUNNING
    job.cancel()
    with pytest.raises(ss.JobCancelledError):
        job.join(60)
    assert job.status is JobStatus.CANCELLED
    job.cancel()  # harmless when already cancelled
    # the engine (and the shared session) still run jobs afterwards
    engine.new_job(map_filter_dag([1, 2, 3])).join(120)
    assert sorted(engine.get_list("out")) == ["n1", "n9"]


# ------------------------------------------------------------------ DataFrames


def test_dataframe_source_and_sink(engine: Any, spark_session: Any) -> None:
    from slipstream.spark.io import spark_dataframe_sink, spark_dataframe_source

    df = spark_session.createDataFrame(
        [(w, len(w)) for w in "alpha beta gamma delta epsilon zeta eta theta".split()],
        "word string, n long",
    ).repartition(3)
    dag = DAG()
    src = dag.new_vertex("df", spark_dataframe_source(df, lambda r: (r.word, r.n)))
    double = dag.new_vertex("double", functools.partial(Mapper, lambda t: (t[0], t[1] * 2)))
    out = dag.new_vertex("out", spark_dataframe_sink("doubled", "word string, n2 long"))
    dag.edge(Edge.between(src, double)).edge(Edge.between(double, out).partitioned(ss.entry_key))
    engine.new_job(dag).join(120)
    result = engine.get_dataframe("doubled")
    assert result.columns == ["word", "n2"]
    assert sorted(tuple(r) for r in result.collect()) == sorted(
        (w, 2 * len(w)) for w in "alpha beta gamma delta epsilon zeta eta theta".split()
    )
    assert engine.get_list("doubled") == []  # DataFrame rows stay on the executors
    with pytest.raises(KeyError, match="nope"):
        engine.get_dataframe("nope")

    # the same DAG on the embedded engine: rows are fetched to the driver, sink -> list
    local = ss.local(cooperative_threads=2)
    local.new_job(dag).join(60)
    assert sorted(local.get_list("doubled")) == sorted(tuple(r) for r in result.collect())


def test_dataframe_sink_without_schema_or_rows(engine: Any) -> None:
    from slipstream.spark.io import spark_dataframe_sink

    dag = DAG()
    src = dag.new_vertex("src", functools.partial(ListSource, [("a", 1), ("b", 2)]))
    out = dag.new_vertex("out", spark_dataframe_sink("inferred"))
    dag.edge(Edge.between(src, out))
    empty = DAG()
    s2 = empty.new_vertex("src", functools.partial(ListSource, []))
    o2 = empty.new_vertex("out", spark_dataframe_sink("empty"))
    empty.edge(Edge.between(s2, o2))
    engine.new_job(dag).join(120)
    engine.new_job(empty).join(120)
    assert sorted(tuple(r) for r in engine.get_dataframe("inferred").collect()) == [
        ("a", 1),
        ("b", 2),
    ]
    with pytest.raises(ValueError, match="schema"):
        engine.get_dataframe("empty")


def test_rdd_source(engine: Any, spark_session: Any) -> None:
    from slipstream.spark.io import spark_rdd_source

    rdd = spark_session.sparkContext.parallelize(LINES, 5)  # 5 partitions -> 2 processors
    dag = word_count_dag(LINES, source=spark_rdd_source(rdd))
    engine.new_job(dag).join(120)
    assert sorted(engine.get_list("counts")) == word_count_oracle(LINES)


# ------------------------------------------------------------------ security


class _RunsCodeWhenUnpickled:
    """Unpickling this creates ``path``: proof that the driver ran code from data."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.path, "w"))


def _forged_marker(sentinel: Path) -> str:
    """A record's text that looks like the engine's failure marker and carries a pickle
    whose loading runs code (the format the engine used before the signed channel)."""
    import base64
    import pickle
    import zlib

    blob = base64.urlsafe_b64encode(
        zlib.compress(pickle.dumps(_RunsCodeWhenUnpickled(str(sentinel))))
    ).decode("ascii")
    return f"[slipstream-processor-failure:{blob}]"


def test_a_record_forging_the_failure_marker_runs_no_code(
    spark_session: Any, tmp_path: Path
) -> None:
    engine = ss.spark(spark_session, members=1)  # one 'parse' processor: index 0
    sentinel = tmp_path / "code-ran"
    dag = DAG()
    src = dag.new_vertex("src", functools.partial(ListSource, ["1", _forged_marker(sentinel)]))
    parse = dag.new_vertex("parse", functools.partial(Mapper, int)).local_parallelism(1)
    out = dag.new_vertex("sink", functools.partial(Collect, "out"))
    dag.edge(Edge.between(src, parse)).edge(Edge.between(parse, out))
    job = engine.new_job(dag, ss.JobConfig(name="forged"))
    # int('<marker>') quotes the record in its message, ahead of the engine's own marker
    with pytest.raises(ss.JobFailedError) as info:
        job.join(120)
    assert not sentinel.exists(), "the driver unpickled a marker forged by a record"
    err = info.value
    assert err.vertex == "parse" and err.processor_index == 0
    assert isinstance(err.__cause__, ValueError)
    assert "invalid literal for int()" in str(err.__cause__)
    assert job.status is JobStatus.FAILED


class _EmitsALock(ListSource):
    """Emits a lock it makes on the executor (the supplier pickles; the item cannot)."""

    def init_processor(self, context: Any) -> None:
        import threading

        self.data = [1, 2, threading.Lock(), 4]
        super().init_processor(context)


def test_an_unpicklable_item_on_a_shuffled_edge_names_vertex_and_edge(engine: Any) -> None:
    dag = DAG()
    src = dag.new_vertex("maker", functools.partial(_EmitsALock, [], whole=True))
    src.local_parallelism(1)
    out = dag.new_vertex("sink", functools.partial(Collect, "out")).local_parallelism(2)
    dag.edge(Edge.between(src, out).partitioned(repr))
    job = engine.new_job(dag, ss.JobConfig(name="locks"))
    with pytest.raises(ss.JobFailedError) as info:
        job.join(120)
    err = info.value
    assert err.vertex == "maker" and err.processor_index in range(job.watch()["parallelism"]["maker"])
    assert "edge 'maker' -> 'sink'" in str(err) and "cannot be pickled" in str(err)


def test_python_version_mismatch_fails_with_one_short_message(engine: Any) -> None:
    """The executors' Python differs from the driver's (simulated: the driver claims
    another version, which PySpark's worker checks first thing)."""
    sc = engine.spark_context
    real = sc.pythonVer
    sc.pythonVer = "3.99"
    try:
        job = engine.new_job(map_filter_dag([1, 2, 3]), ss.JobConfig(name="versions"))
        with pytest.raises(ss.JobFailedError) as info:
            job.join(120)
    finally:
        sc.pythonVer = real
    message = str(info.value)
    assert "executors run Python" in message and "driver runs Python 3.99" in message
    assert "PYSPARK_PYTHON" in message
    assert len(message.splitlines()) == 1 and len(message) < 600
    assert "\tat " not in message and not message.rstrip().endswith(":")
