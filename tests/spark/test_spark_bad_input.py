"""Bad input on the Spark engine fails with the embedded engine's messages (the tasks
run the same collectors and sources): a raising key function names the edge, the
function and the item, also on a narrow edge (parallelism 1, no shuffle)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import slipstream as ss
from slipstream import DAG, Edge, JobConfig, sinks, sources
from slipstream import processors as P

pytestmark = [pytest.mark.spark, pytest.mark.slow]

WORDS = ["apple", "pear", "fig", "plum"] * 50
THIS = Path(__file__).name


def key_of(word: str) -> str:
    if word == "fig":
        raise KeyError("no key for fig")
    return word[0]


def word_dag(lp: int) -> DAG:
    dag = DAG()
    src = dag.new_vertex("words", sources.items(WORDS)).local_parallelism(1)
    upper = dag.new_vertex("upper", P.map(str.upper)).local_parallelism(lp)
    out = dag.new_vertex("sink", sinks.list_sink("out")).local_parallelism(1)
    dag.edge(Edge.between(src, upper).partitioned(key_of)).edge(Edge.between(upper, out))
    return dag


def failure(engine: Any, dag: DAG, config: JobConfig | None = None) -> ss.JobFailedError:
    with pytest.raises(ss.JobFailedError) as info:
        engine.new_job(dag, config or JobConfig()).join(120)
    return info.value


@pytest.mark.parametrize("lp", [1, 2])
def test_a_raising_key_function_is_named_with_edge_and_item(spark_session: Any, lp: int) -> None:
    engine = ss.spark(spark_session)
    # lp 1 is a narrow edge: one consumer, so only with validate_keys is every key taken
    config = JobConfig(validate_keys=True) if lp == 1 else None
    err = failure(engine, word_dag(lp), config)
    line = key_of.__code__.co_firstlineno
    assert str(err).split("\n")[0].split(" failed: ", 1)[1] == (
        "vertex 'words', processor 0: KeyFunctionError: edge 'words' -> 'upper' (ordinal 0): "
        f"key function key_of ({THIS}:{line}) raised KeyError: 'no key for fig' on item 'fig'"
    )
