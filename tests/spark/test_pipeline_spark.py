"""A Pipeline runs on the Spark engine as it does on the embedded one: the word-count
example's pipeline (fused tokenizer, two-stage aggregation) and a pipeline with a
window, a join and a rolling aggregate give the same results on both engines."""

from __future__ import annotations

import operator
import os
from typing import Any

import pytest

import slipstream as ss
from slipstream import sinks, sources
from slipstream.aggregate import counting, summing
from slipstream.window import tumbling_window_def

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = [pytest.mark.slow, pytest.mark.spark]

key0 = operator.itemgetter(0)


def load_wordcount_example() -> Any:
    import importlib.util
    import sys

    name = "slipstream_example_wordcount"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            name, os.path.join(ROOT, "examples", "wordcount.py")
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def both(job: Any, spark_session: Any, *names: str) -> tuple[list[Any], list[Any]]:
    local = ss.local(cooperative_threads=2)
    local.new_job(job, ss.JobConfig(name="pipeline-local")).join(timeout=120)
    spark = ss.spark(spark_session)
    spark.new_job(job, ss.JobConfig(name="pipeline-spark")).join(timeout=300)
    return (
        [sorted(local.get_list(n)) for n in names],
        [sorted(spark.get_list(n)) for n in names],
    )


def test_wordcount_pipeline_on_spark(spark_session: Any, tmp_path: Any) -> None:
    from pyspark import cloudpickle

    wc = load_wordcount_example()
    cloudpickle.register_pickle_by_value(wc)  # executors cannot import the example
    wc.generate_corpus(str(tmp_path), 10_000, files=3)
    local, spark = both(wc.build_pipeline(str(tmp_path)), spark_session, "counts")
    assert spark == local
    assert sum(n for _, n in spark[0]) > 9000


def test_window_join_rolling_pipeline_on_spark(spark_session: Any) -> None:
    evs = [(i % 4, 1000 + 10 * i, i % 9) for i in range(2000)]
    names = [(0, "zero"), (1, "one"), (2, "two")]
    p = ss.Pipeline()
    timed = p.read_from(sources.items(evs)).with_timestamps(operator.itemgetter(1), 0)
    timed.group_by(key0).window(tumbling_window_def(1000)).aggregate(
        summing(operator.itemgetter(2))
    ).write_to(sinks.list_sink("windows"))
    plain = p.read_from(sources.items(evs))
    plain.hash_join(p.read_from(sources.items(names)), key0, key0).map(
        lambda pair: (pair[0][0], pair[1] and pair[1][1])
    ).group_by(lambda x: x).aggregate(counting()).write_to(sinks.list_sink("joined"))
    plain.group_by(key0).rolling_aggregate(counting()).write_to(sinks.list_sink("rolling"))
    local, spark = both(p, spark_session, "windows", "joined", "rolling")
    assert spark == local
    assert local[1] == [((k, v), 500) for k, v in [(0, "zero"), (1, "one"), (2, "two"), (3, None)]]
    assert len(local[2]) == len(evs)

