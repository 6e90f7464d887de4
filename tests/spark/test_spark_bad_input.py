"""Bad input on the Spark engine fails with the embedded engine's messages (the tasks
run the same collectors and sources): a raising key function names the edge, the
function and the item, also on a narrow edge (parallelism 1, no shuffle); a CSV field
with an unclosed quote and undecodable bytes name the file and line."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

import slipstream as ss
from slipstream import DAG, Edge, JobConfig, sinks, sources
from slipstream import processors as P
from slipstream.core.item_errors import DeadLetter

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
    assert first_line(err) == (
        "vertex 'words', processor 0: KeyFunctionError: edge 'words' -> 'upper' (ordinal 0): "
        f"key function key_of ({THIS}:{line}) raised KeyError: 'no key for fig' on item 'fig'"
    )


def first_line(err: ss.JobFailedError) -> str:
    return str(err).split("\n")[0].split(" failed: ", 1)[1]


def read_dag(src: Any) -> DAG:
    dag = DAG()
    s = dag.new_vertex("src", src).local_parallelism(1)
    out = dag.new_vertex("sink", sinks.list_sink("out")).local_parallelism(1)
    dag.edge(Edge.between(s, out))
    return dag


def test_an_unclosed_csv_quote_and_undecodable_bytes_name_file_and_line(
    spark_session: Any, tmp_path: Path
) -> None:
    engine = ss.spark(spark_session)
    (tmp_path / "f.csv").write_bytes(b'a,b\r\n1,"x\r\n2,y\r\n3,z\r\n')
    assert first_line(failure(engine, read_dag(sources.read_csv(tmp_path)))) == (
        f"vertex 'src', processor 0: ValueError: read_csv (vertex 'src'): {tmp_path / 'f.csv'}:2: "
        "unclosed quote: the quoted field that starts on this line runs to the end of the file "
        "(line 4)"
    )
    # read_files splits by bytes: of the 2 processors' halves of the 17 bytes, the line
    # starting at offset 8 is processor 1's
    (tmp_path / "x.txt").write_bytes(b"ok\nfine\nab\xffcd\n")
    assert first_line(failure(engine, read_dag(sources.read_files(tmp_path, "*.txt")))) == (
        f"vertex 'src', processor 1: ValueError: read_files (vertex 'src'): {tmp_path / 'x.txt'}:3: "
        "invalid UTF-8 (byte 0xff at column 3, offset 10 in the file: invalid start byte)"
    )


def shout(word: str) -> str:
    if word == "fig":
        raise ValueError("no figs")
    return word.upper()


def test_a_failing_function_names_the_item_on_spark(spark_session: Any) -> None:
    """Issue 21, item 3 on Spark: the item travels in the failure marker."""
    engine = ss.spark(spark_session)
    err = failure(engine, shout_dag(), JobConfig(name="spark-items"))
    assert str(err).split("\n")[0] == (
        "job 'spark-items' failed: vertex 'shout', processor 0, on item 'fig': ValueError: "
        "no figs"
    )


def shout_dag(lp: int = 1) -> DAG:
    dag = DAG()
    src = dag.new_vertex("words", sources.items(WORDS)).local_parallelism(1)
    m = dag.new_vertex("shout", P.map(shout)).local_parallelism(lp)
    out = dag.new_vertex("sink", sinks.list_sink("out")).local_parallelism(1)
    dag.edge(Edge.between(src, m).distributed()).edge(Edge.between(m, out))
    return dag


def run_both(spark_session: Any, dag: Any, config: JobConfig) -> tuple[Any, Any, Any, Any]:
    local = ss.local(cooperative_threads=2)
    lj = local.new_job(dag(), config)
    lj.join(60)
    spark = ss.spark(spark_session, local_parallelism=2)
    sj = spark.new_job(dag(), config)
    sj.join(180)
    return local, lj, spark, sj


def test_skip_on_spark_gives_the_embedded_output_and_count(
    spark_session: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 21, item 4 on Spark: under "skip" the same DAG gives the same output and the
    same items_skipped on both engines (the Spark engine refused the policy before)."""
    config = JobConfig(name="skips", on_item_error="skip")
    with caplog.at_level(logging.WARNING, logger="slipstream.spark"):
        local, lj, spark, sj = run_both(spark_session, lambda: shout_dag(lp=2), config)
    assert [r.getMessage() for r in caplog.records if r.name == "slipstream.spark"] == [
        "job 'skips' skipped 50 items on which user code raised (vertex 'shout': 50). "
        "See docs/troubleshooting.md"
    ]
    expected = sorted(w.upper() for w in WORDS if w != "fig")
    assert sorted(local.get_list("out")) == expected
    assert sorted(spark.get_list("out")) == expected
    assert lj.metrics["shout"]["items_skipped"] == 50
    assert sj.metrics["shout"]["items_skipped"] == 50
    assert "items_skipped" not in sj.metrics["words"]


def test_dead_letters_on_spark_as_on_the_embedded_engine(spark_session: Any) -> None:
    """A dead-letter sink is one more vertex and edge of the DAG (job.dag), compiled to
    Spark like any other: the same DeadLetter records on both engines."""
    config = JobConfig(on_item_error=sinks.list_sink("bad"))
    local, lj, spark, sj = run_both(spark_session, lambda: shout_dag(lp=2), config)
    assert sorted(spark.get_list("out")) == sorted(local.get_list("out"))
    letters = [DeadLetter("shout", "fig", "ValueError: no figs", None)] * 50
    assert local.get_list("bad") == letters
    assert spark.get_list("bad") == letters
    assert sj.metrics["shout"]["items_skipped"] == 50
    assert sj.metrics["dead-letters"]["items_in"] == 50
    assert [v.name for v in sj.dag.vertices] == [v.name for v in lj.dag.vertices]


def test_dead_letters_in_a_micro_batch_job(spark_session: Any, tmp_path: Path) -> None:
    """A micro-batch job (streaming=True) commits each epoch's dead letters with it."""
    engine = ss.spark(spark_session, local_parallelism=2)
    job = engine.new_job(
        shout_dag(lp=2),
        JobConfig(name="mb-bad", on_item_error=sinks.list_sink("bad")),
        streaming=True,
        epoch_ms=200,
        checkpoint_location=str(tmp_path),
    )
    job.join(120)
    assert job.status is ss.JobStatus.COMPLETED
    assert sorted(engine.get_list("out")) == sorted(w.upper() for w in WORDS if w != "fig")
    assert engine.get_list("bad") == [DeadLetter("shout", "fig", "ValueError: no figs", None)] * 50
    assert job.metrics["shout"]["items_skipped"] == 50


def event_key(e: tuple[str, int]) -> str:
    if e[0] == "fig":
        raise KeyError("no key for fig")
    return e[0]


def window_dag() -> DAG:
    from slipstream.aggregate import counting
    from slipstream.window import tumbling_window_def

    events = [(w, i) for i, w in enumerate(WORDS)]
    dag = DAG()
    src = dag.new_vertex("words", sources.items(events)).local_parallelism(1)
    win = dag.new_vertex(
        "window",
        P.aggregate_to_sliding_window(
            key_fn=event_key,
            timestamp_fn=lambda e: e[1],
            window_def=tumbling_window_def(20),
            agg_op=counting(),
        ),
    )
    out = dag.new_vertex("sink", sinks.list_sink("out")).local_parallelism(1)
    dag.edge(Edge.between(src, win).distributed().partitioned(lambda e: e[0]))
    dag.edge(Edge.between(win, out).distributed().all_to_one())
    return dag


@pytest.mark.filterwarnings("ignore:.*emits windows on watermarks")
def test_a_window_skips_on_spark_as_on_the_embedded_engine(spark_session: Any) -> None:
    """A window's key function under "skip" (issue 21, item 4) on both engines."""
    local, lj, spark, sj = run_both(spark_session, window_dag, JobConfig(on_item_error="skip"))
    assert sorted(spark.get_list("out")) == sorted(local.get_list("out"))
    assert len(local.get_list("out")) == 30  # 10 windows x 3 good keys
    assert lj.metrics["window"]["items_skipped"] == sj.metrics["window"]["items_skipped"] == 50
