"""A partitioned edge whose key function (or partitioner) raises fails the job with an
error naming the edge, the function and the item, at any parallelism (the Spark
engine's: tests/spark/test_spark_bad_input.py)."""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import pytest

import slipstream as ss
from slipstream import DAG, Edge, JobConfig, sinks, sources
from slipstream import processors as P

WORDS = ["apple", "pear", "fig", "plum"] * 50

THIS = Path(__file__).name


def first_letter_upper(word: str) -> str:
    if word == "fig":
        raise KeyError("no key for fig")
    return word[0].upper()


def always_fails(word: str) -> str:
    raise AttributeError(f"{type(word).__name__!r} object has no attribute 'key'")


def line_of(fn: Any) -> int:
    return fn.__code__.co_firstlineno


def word_dag(key_fn: Any, lp: int, partitioner: Any = None, distributed: bool = False) -> DAG:
    dag = DAG()
    src = dag.new_vertex("words", sources.items(WORDS)).local_parallelism(1)
    upper = dag.new_vertex("upper", P.map(str.upper)).local_parallelism(lp)
    out = dag.new_vertex("sink", sinks.list_sink("out")).local_parallelism(1)
    e = Edge.between(src, upper).partitioned(key_fn, partitioner)
    if distributed:
        e.distributed()
    dag.edge(e).edge(Edge.between(upper, out))
    return dag


def run(engine: Any, dag: DAG, config: JobConfig | None = None) -> list[Any]:
    engine.new_job(dag, config or JobConfig()).join(60)
    return sorted(engine.get_list("out"))


def failure(engine: Any, dag: DAG, config: JobConfig | None = None) -> ss.JobFailedError:
    with pytest.raises(ss.JobFailedError) as info:
        engine.new_job(dag, config or JobConfig()).join(60)
    return info.value


def cause_text(err: ss.JobFailedError) -> str:
    """The error's message without the job prefix and the traceback."""
    first = str(err).split("\n--- processor traceback ---")[0]
    return first.split(": ", 1)[1]


ALWAYS = (
    "vertex 'words', processor 0: KeyFunctionError: edge 'words' -> 'upper' (ordinal 0): "
    f"key function always_fails ({THIS}:{line_of(always_fails)}) raised AttributeError: "
    "'str' object has no attribute 'key' on item 'apple'"
)
ON_FIG = (
    "vertex 'words', processor 0: KeyFunctionError: edge 'words' -> 'upper' (ordinal 0): "
    f"key function first_letter_upper ({THIS}:{line_of(first_letter_upper)}) raised "
    "KeyError: 'no key for fig' on item 'fig'"
)


@pytest.mark.parametrize("lp", [1, 2, 3])
def test_a_key_function_failing_on_every_item_is_named_at_any_parallelism(lp: int) -> None:
    # at parallelism 1 the key is not needed, but the first item of each chunk is checked
    err = failure(ss.local(), word_dag(always_fails, lp))
    assert cause_text(err) == ALWAYS
    assert isinstance(err.cause, ss.KeyFunctionError)
    assert isinstance(err.cause.__cause__, AttributeError)


def test_a_key_function_failing_on_some_items() -> None:
    # several consumers call it on every item
    assert cause_text(failure(ss.local(), word_dag(first_letter_upper, 2))) == ON_FIG
    assert cause_text(failure(ss.local(members=2), word_dag(first_letter_upper, 1, distributed=True))) == ON_FIG
    # one consumer checks each chunk's first item only ...
    assert run(ss.local(), word_dag(first_letter_upper, 1)) == sorted(w.upper() for w in WORDS)
    # ... unless asked to validate every key
    err = failure(ss.local(), word_dag(first_letter_upper, 1), JobConfig(validate_keys=True))
    assert cause_text(err) == ON_FIG


def test_unhashable_keys_still_route() -> None:
    out = run(ss.local(), word_dag(lambda w: [w[0]], 2), JobConfig(validate_keys=True))
    assert out == sorted(w.upper() for w in WORDS)


def test_a_failing_or_wrong_partitioner_is_named() -> None:
    def no_partition(key: Any, count: int) -> int:
        raise ValueError(f"cannot place {key!r}")

    err = failure(ss.local(), word_dag(len, 1, partitioner=no_partition))
    line = line_of(no_partition)
    assert cause_text(err) == (
        "vertex 'words', processor 0: KeyFunctionError: edge 'words' -> 'upper' (ordinal 0): "
        f"partitioner test_a_failing_or_wrong_partitioner_is_named.<locals>.no_partition "
        f"({THIS}:{line}) raised ValueError: cannot place 5 on item 'apple' (its key 5)"
    )
    err = failure(ss.local(), word_dag(len, 2, partitioner=lambda key, count: count + key))
    assert re.fullmatch(
        r"vertex 'words', processor 0: KeyFunctionError: edge 'words' -> 'upper' \(ordinal 0\): "
        rf"partitioner test_a_failing_or_wrong_partitioner_is_named.<locals>.<lambda> \({THIS}:\d+\) "
        r"returned 276 for the key 5 of item 'apple', not a partition number in 0..270",
        cause_text(err),
    )


def test_a_long_item_is_cut_in_the_message() -> None:
    dag = DAG()
    src = dag.new_vertex("words", sources.items(["x" * 1000]))
    out = dag.new_vertex("sink", sinks.list_sink("out")).local_parallelism(2)
    dag.edge(Edge.between(src, out).partitioned(functools.partial(divmod, 1)))
    text = cause_text(failure(ss.local(), dag))
    assert text.endswith(
        "key function functools.partial(<built-in function divmod>, 1) raised TypeError: "
        "unsupported operand type(s) for divmod(): 'int' and 'str' on item "
        f"'{'x' * 199}... (1002 characters)"
    )


def test_an_empty_chunk_to_one_consumer_checks_nothing() -> None:
    from slipstream.execution.collectors import PerTargetCollector
    from slipstream.execution.queues import SpscQueue

    c = PerTargetCollector([SpscQueue(16)], key_fn=always_fails, partition_to_target=[0] * 271)
    c.add_chunk([])  # the engine never hands one over, but a collector must take it
    assert c.flush() and c.items_out == 0
