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
