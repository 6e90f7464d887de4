"""slipstream.spark.failures: the signed failure channel and the short messages for
failures that are not a processor's. No JVM needed."""

from __future__ import annotations

import base64
import functools
import pickle
import zlib
from pathlib import Path
from typing import Any

import pytest

import slipstream as ss
from slipstream import DAG, Edge
from slipstream.core.suppliers import ProcessorMetaSupplier
from slipstream.spark.failures import (
    RemoteProcessorError,
    encode_failure,
    environment_problem,
    find_failure,
    new_failure_key,
    summarize_spark_error,
)

from .spark_engine_procs import Collect, ListSource
from .spark_fake_rdd import FakeSession


class _RunsCodeWhenUnpickled:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.path, "w"))


class CustomError(Exception):
    pass


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:  # noqa: BLE001 - to get a traceback
        return caught


def _spark_text(*parts: str) -> str:
    """Roughly what str() of PySpark's exception holds when a task raised."""
    return (
        "An exception was thrown from the Python worker. Please see the stack trace below.\n"
        + "\n".join(parts)
        + "\n\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException"
    )


def test_marker_round_trip_rebuilds_builtin_exceptions() -> None:
    key = new_failure_key()
    failure = encode_failure("mapper", 3, _raised(ValueError("bad 'x'")), key)
    info = find_failure(_spark_text("Traceback (most recent call last):", str(failure)), key)
    assert info is not None
    assert (info.vertex, info.processor_index, info.error_type) == ("mapper", 3, "ValueError")
    assert type(info.error) is ValueError and str(info.error) == "bad 'x'"
    assert "test_failures.py" in info.traceback


def test_other_exception_types_come_back_as_plain_data() -> None:
    key = new_failure_key()
    info = find_failure(str(encode_failure("v", 0, _raised(CustomError("nope")), key)), key)
    assert info is not None
    assert isinstance(info.error, RemoteProcessorError)
    assert info.error.error_type.endswith("CustomError")
    assert "nope" in str(info.error)


def test_forged_markers_are_ignored_and_never_unpickled(tmp_path: Path) -> None:
    key = new_failure_key()
    sentinel = tmp_path / "code-ran"
    evil = base64.urlsafe_b64encode(
        zlib.compress(pickle.dumps(_RunsCodeWhenUnpickled(str(sentinel))))
    ).decode()
    other_job = encode_failure("fake", 9, ValueError("from another job"), new_failure_key())
    real = encode_failure("parse", 1, _raised(ValueError("the real one")), key)
    text = _spark_text(
        f"ValueError: invalid literal for int() with base 10: '[slipstream-processor-failure:{evil}]'",
        f"ValueError: '[slipstream-processor-failure:{evil}:{'0' * 64}]'",
        str(other_job),
        str(real),
    )
    info = find_failure(text, key)
    assert not sentinel.exists()
    assert info is not None and info.vertex == "parse" and str(info.error) == "the real one"
    assert find_failure(text.replace(str(real), ""), key) is None
    assert find_failure(str(real), b"") is None


def test_summary_of_a_python_worker_failure_is_its_exception_line() -> None:
    text = (
        "An error occurred while calling z:org.apache.spark.api.python.PythonRDD.collectAndServe.\n"
        ": org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage "
        "1.0 failed 1 times, most recent failure: Lost task 0.0: "
        "org.apache.spark.api.python.PythonException: An exception was thrown from the Python "
        "worker:\nTraceback (most recent call last):\n  File \"worker.py\", line 3, in main\n"
        "    x = f()\n_pickle.PicklingError: Can't pickle <function <lambda>>\n"
        "\tat org.apache.spark.api.python.BasePythonRunner.handlePythonException\n"
    )
    assert summarize_spark_error(text) == "_pickle.PicklingError: Can't pickle <function <lambda>>"
    java = "An error occurred while calling o1.x.\n: java.lang.IllegalStateException: stopped\n\tat y"
    assert summarize_spark_error(java) == "java.lang.IllegalStateException: stopped"


def test_environment_problems_name_cause_and_fix() -> None:
    mismatch = environment_problem(
        _spark_text(
            "pyspark.errors.exceptions.base.PySparkRuntimeError: [PYTHON_VERSION_MISMATCH] Python "
            "in worker has different version: 3.12 than that in driver: 3.11, PySpark cannot run "
            "with different minor versions."
        )
    )
    assert mismatch is not None and "3.12" in mismatch and "PYSPARK_PYTHON" in mismatch
    missing = environment_problem(_spark_text("ModuleNotFoundError: No module named 'mylib'"))
    assert missing is not None and "'mylib'" in missing and "addPyFile" in missing
    no_python = environment_problem(
        'java.io.IOException: Cannot run program "python9": error=2, No such file or directory'
    )
    assert no_python is not None and "'python9'" in no_python and "PYSPARK_PYTHON" in no_python
    assert environment_problem(_spark_text("ValueError: x")) is None


class _CloseDies(ProcessorMetaSupplier):
    """A meta-supplier whose close() raises what no handler expects."""

    def __init__(self, data: list[int]) -> None:
        self.data = data

    def get(self, addresses: Any) -> Any:
        return lambda _address: functools.partial(ListSource, self.data)

    def close(self, error: BaseException | None) -> None:
        raise SystemExit("close() gave up")


@pytest.mark.spark
@pytest.mark.timeout(60)
def test_a_driver_thread_that_dies_fails_the_job_instead_of_hanging() -> None:
    engine = ss.spark(FakeSession())
    dag = DAG()
    src = dag.new_vertex("src", _CloseDies([1, 2, 3]))
    out = dag.new_vertex("sink", functools.partial(Collect, "out"))
    dag.edge(Edge.between(src, out))
    job = engine.new_job(dag, ss.JobConfig(name="dies"))
    with pytest.raises(ss.JobFailedError, match="driver thread") as info:
        job.join(30)
    assert isinstance(info.value.__cause__, SystemExit)
    assert job.status is ss.JobStatus.FAILED


class _Word(str):
    pass


def test_a_shuffle_chunk_of_strings_travels_as_one_joined_string_and_comes_back_exact() -> None:
    from slipstream.execution.remote import _TEXT_SEP
    from slipstream.spark.task import ShuffleChunk

    where = ("maker", 0, "edge 'maker' -> 'count' (ordinal 0)")
    words = [f"k{i % 97}" for i in range(1000)]
    data = pickle.dumps((1, (0, 0, 3, ShuffleChunk(words, where=where, key=b"k"))), 5)
    # one string of the items joined, not an opcode, a length and a memo entry per item
    assert len(data) < len(_TEXT_SEP.join(words).encode()) + 100
    assert pickle.loads(data) == (1, (0, 0, 3, words))
    for items in (
        ["a", "", "b\ud800c", "\udfff", ""],  # empty items, lone surrogates
        [""],
        [f"a{_TEXT_SEP}b", "c"],  # an item holds the separator: item by item
        ["a", _Word("b")],  # a str subclass keeps its type
        ["a", 1, None],
    ):
        back = pickle.loads(pickle.dumps(ShuffleChunk(items, where=where, key=b"k"), 5))
        assert back == items and type(back) is list
        assert [type(x) for x in back] == [type(x) for x in items]


def test_a_shuffle_chunk_of_window_results_comes_back_as_the_same_named_tuples() -> None:
    from slipstream.spark.task import ShuffleChunk, named_rows
    from slipstream.window import KeyedWindowResult

    where = ("windows", 0, "edge 'windows' -> 'sink' (ordinal 0)")
    items = [KeyedWindowResult(i * 1000, i * 1000 + 1000, f"k{i % 7}", i) for i in range(300)]
    chunk = ShuffleChunk(items, where=where, key=b"k")
    assert chunk.__reduce__()[0] is named_rows  # as the class and plain tuples
    back = pickle.loads(pickle.dumps(chunk, 5))
    assert back == items and type(back) is list
    assert all(type(x) is KeyedWindowResult for x in back)


def test_shuffle_chunks_unpickle_as_lists_and_name_the_edge_of_an_unpicklable_item() -> None:
    import threading

    from slipstream.spark.failures import ProcessorFailure
    from slipstream.spark.task import ShuffleChunk

    key = new_failure_key()
    where = ("maker", 1, "edge 'maker' -> 'sink' (ordinal 0)")
    record = (3, (0, 1, 7, ShuffleChunk([1, "a", (2, 3)], where=where, key=key)))
    back = pickle.loads(pickle.dumps(record))
    assert back == (3, (0, 1, 7, [1, "a", (2, 3)])) and type(back[1][3]) is list

    bad = (3, (0, 1, 8, ShuffleChunk([1, threading.Lock()], where=where, key=key)))
    with pytest.raises(ProcessorFailure) as caught:
        pickle.dumps(bad)
    info = find_failure(str(caught.value), key)
    assert info is not None and (info.vertex, info.processor_index) == ("maker", 1)
    assert "edge 'maker' -> 'sink'" in info.message and "_thread.lock" in info.message
