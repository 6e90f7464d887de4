"""The public names (docs/guide.md) (tests outside this repository rely on them)."""

from __future__ import annotations

import subprocess
import sys

import slipstream as ss


def test_top_level_names() -> None:
    for name in [
        "DAG", "Vertex", "Edge", "Processor", "AbstractProcessor", "Inbox", "Outbox",
        "Context", "Watermark", "JobConfig", "ProcessingGuarantee", "Job", "JobStatus",
        "DagError", "JobFailedError", "JobCancelledError", "entry_key", "entry_value",
        "local", "spark",
    ]:
        assert hasattr(ss, name), name
    assert ss.entry_key(("k", 1)) == "k" and ss.entry_value(("k", 1)) == 1
    for g in ("NONE", "AT_LEAST_ONCE", "EXACTLY_ONCE"):
        assert hasattr(ss.ProcessingGuarantee, g)


def test_library_modules() -> None:
    from slipstream import aggregate, processors, sinks, sources, testing, watermark, window

    for name in ["map", "filter", "flat_map", "aggregate", "accumulate", "combine",
                 "aggregate_by_key", "accumulate_by_key", "combine_by_key", "insert_watermarks",
                 "accumulate_by_frame", "combine_to_sliding_window",
                 "aggregate_to_sliding_window", "aggregate_to_session_window"]:
        assert callable(getattr(processors, name)), name
    for name in ["items", "list_source", "map_source", "read_files", "stream_files",
                 "stream_socket", "generator", "spark_dataframe", "spark_stream",
                 "read_csv", "read_jsonl", "read_parquet"]:
        assert callable(getattr(sources, name)), name
    for name in ["list_sink", "map_sink", "write_files", "write_socket", "logger", "noop",
                 "write_buffered", "spark_dataframe", "write_csv", "write_jsonl", "write_parquet",
                 "stdout"]:
        assert callable(getattr(sinks, name)), name
    for name in ["AggregateOperation", "counting", "summing", "averaging", "min_by", "max_by",
                 "to_list", "all_of"]:
        assert hasattr(aggregate, name), name
    for name in ["with_fixed_lag", "limiting_lag_and_delay", "limiting_lag_and_lull",
                 "limiting_timestamp_and_wall_clock_lag", "IDLE"]:
        assert hasattr(watermark, name), name
    for name in ["sliding_window_def", "tumbling_window_def", "KeyedWindowResult"]:
        assert hasattr(window, name), name
    assert callable(testing.verify_processor)
    r = window.KeyedWindowResult(0, 10, "k", 3)
    assert (r.start, r.end, r.key, r.value) == (0, 10, "k", 3)


def test_edge_and_job_api_shape() -> None:
    dag = ss.DAG()
    a = dag.new_vertex("a", ss.AbstractProcessor)
    b = dag.new_vertex("b", ss.AbstractProcessor).local_parallelism(1)
    e = ss.Edge.from_(a, ordinal=0).to(b, ordinal=0)
    assert e.partitioned(lambda x: x, partitioner=None).distributed().priority(1).queue_size(8) is e
    assert dag.edge(e) is dag
    job = ss.local().new_job(dag, ss.JobConfig(name="shape"))
    job.join(10)
    for attr in ("join", "cancel", "suspend", "resume", "restart", "status", "metrics", "id"):
        assert hasattr(job, attr), attr
    assert job.status is ss.JobStatus.COMPLETED


def test_import_does_not_import_pyspark() -> None:
    code = "import sys, slipstream, slipstream.sources, slipstream.sinks; print('pyspark' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_pipeline_api_names() -> None:
    """The pipeline layer (docs/guide.md): ss.Pipeline and the stage methods it lists."""
    from slipstream import sources
    from slipstream.pipeline import Pipeline, PipelineError

    assert ss.Pipeline is Pipeline and issubclass(PipelineError, ss.DagError)
    stage = Pipeline().read_from(sources.items([]))
    for name in ["map", "filter", "flat_map", "peek", "map_stateful", "group_by", "aggregate",
                 "rolling_aggregate", "with_timestamps", "window", "hash_join", "merge",
                 "write_to"]:
        assert callable(getattr(stage, name)), name
    grouped = stage.group_by(str)
    for name in ["aggregate", "rolling_aggregate", "map_stateful", "window"]:
        assert callable(getattr(grouped, name)), name
    assert callable(Pipeline.to_dag)


# The optional heavy dependencies: `import slipstream` (and a job that needs none of
# them) must not load them (start-up time, issue 12; slipstream/_lazy.py).
HEAVY = ("cloudpickle", "pyspark", "rich", "prometheus_client", "pyarrow", "psycopg",
         "confluent_kafka")


def _modules_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", code + "\nimport sys; print(' '.join(sys.modules))"],
        capture_output=True, text=True, check=True,
    )
    return set(out.stdout.split())


def test_import_loads_no_heavy_dependency() -> None:
    loaded = _modules_after("import slipstream")
    assert not loaded & set(HEAVY), sorted(loaded & set(HEAVY))
    # nor the engine, the connectors, the dashboard or the Spark engine's modules
    assert not {m for m in loaded if m.startswith("slipstream.")} - {"slipstream._lazy"}


def test_job_without_lambdas_loads_no_heavy_dependency() -> None:
    """A DAG job whose suppliers plain pickle accepts runs without cloudpickle (and without
    the snapshot modules, having no processing guarantee); the names still all resolve."""
    loaded = _modules_after(
        "import slipstream as ss\n"
        "from slipstream import processors as P, sinks, sources\n"
        "dag = ss.DAG()\n"
        "src = dag.new_vertex('src', sources.items(range(10)))\n"
        "m = dag.new_vertex('abs', P.map(abs))\n"
        "out = dag.new_vertex('out', sinks.list_sink('out'))\n"
        "dag.edge(ss.Edge.between(src, m)).edge(ss.Edge.between(m, out))\n"
        "e = ss.local()\n"
        "e.new_job(dag).join()\n"
        "assert sorted(e.get_list('out')) == list(range(10))\n"
    )
    assert not loaded & set(HEAVY), sorted(loaded & set(HEAVY))
    assert "slipstream.state.store" not in loaded
    assert "slipstream.processors.services" not in loaded  # asyncio and threads pools


def test_pipeline_of_maps_loads_no_window_or_aggregate_module() -> None:
    loaded = _modules_after(
        "import slipstream as ss\n"
        "from slipstream import sinks, sources\n"
        "p = ss.Pipeline()\n"
        "p.read_from(sources.items(range(10))).map(abs).write_to(sinks.list_sink('out'))\n"
        "e = ss.local()\n"
        "e.new_job(p).join()\n"
        "assert sorted(e.get_list('out')) == list(range(10))\n"
    )
    assert not loaded & set(HEAVY), sorted(loaded & set(HEAVY))
    for module in ("slipstream.aggregate", "slipstream.window", "slipstream.watermark",
                   "slipstream.pipeline.keyed"):
        assert module not in loaded, module


def test_lazy_names_resolve() -> None:
    """Every name in every lazy package's __all__ resolves, to the object its module
    defines; a function named like a submodule keeps its name after the submodule is
    imported (sinks.kafka, sources.sql, ss.spark)."""
    import importlib
    import types

    import slipstream.sinks
    import slipstream.sources
    from slipstream import core, engine, pipeline, processors, sinks, sources

    for pkg in (ss, core, engine, pipeline, processors, sinks, sources):
        for name in pkg.__all__:
            value = getattr(pkg, name)
            assert not isinstance(value, types.ModuleType), (pkg.__name__, name)
            assert name in dir(pkg)
    importlib.import_module("slipstream.sinks.kafka")
    importlib.import_module("slipstream.sources.sql")
    importlib.import_module("slipstream.spark.engine")
    assert callable(slipstream.sinks.kafka) and not isinstance(sinks.kafka, types.ModuleType)
    assert not isinstance(sources.sql, types.ModuleType)
    assert not isinstance(ss.spark, types.ModuleType) and ss.spark is ss.spark_engine
    assert isinstance(ss.sources, types.ModuleType) and ss.sources is sources
    from slipstream.sinks.kafka import kafka as kafka_sink

    assert sinks.kafka is kafka_sink


def test_a_script_function_that_names_the_package_can_be_shipped() -> None:
    """A lambda in a user's script is pickled by value, with the globals it uses; the
    lazy package among them must pickle as a reference to the module (it failed with
    "cannot pickle 'LazyModule' object", so new_job rejected the DAG on both engines)."""
    import pickle
    import textwrap

    from slipstream.core.pickling import cloudpickle

    for pkg in (ss, ss.sources, ss.sinks, ss.processors):
        assert pickle.loads(pickle.dumps(pkg)) is pkg
        assert cloudpickle.loads(cloudpickle.dumps(pkg)) is pkg
    script = textwrap.dedent(
        """
        import slipstream as ss
        from slipstream import sinks, sources

        p = ss.Pipeline()
        p.read_from(sources.items([1, 2, 3])).map(
            lambda x: ss.Watermark(x).timestamp * 2
        ).write_to(sinks.list_sink("out"))
        engine = ss.local()
        engine.new_job(p).join()
        print(sorted(engine.get_list("out")))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[2, 4, 6]"
