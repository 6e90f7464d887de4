"""File sources never read nothing silently (issue 21, item 6): a glob that matches none
of a directory's data files fails the job naming the directory, the glob and the files
that are there; a directory without any data file is empty input, with a warning; a glob
written into the directory argument is understood. Before, ``read_csv(dir)`` over
``data.CSV`` gave ``[]`` and ``read_files("data/*.txt")`` said the directory does not
exist."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

import slipstream as ss
from slipstream import DAG, Edge, sinks, sources


def run(source: Any) -> list[Any]:
    dag = DAG()
    src = dag.new_vertex("source", source)
    dag.edge(Edge.between(src, dag.new_vertex("sink", sinks.list_sink("out"))))
    engine = ss.local(cooperative_threads=2)
    engine.new_job(dag).join(30)
    return sorted(engine.get_list("out"))


def failure(source: Any) -> str:
    with pytest.raises(ss.JobFailedError) as info:
        run(source)
    return str(info.value.__cause__)


def test_a_glob_that_differs_in_case_fails_naming_the_files(tmp_path: Path) -> None:
    (tmp_path / "data.CSV").write_text("a,b\n1,2\n")
    assert failure(sources.read_csv(tmp_path)) == (
        f"read_csv (vertex 'source'): no file in '{tmp_path}' matches glob '*.csv'; the "
        "directory holds data.CSV (globs are case-sensitive: glob='*.CSV' matches data.CSV)"
    )
    assert run(sources.read_csv(tmp_path, "*.CSV")) == [{"a": "1", "b": "2"}]


def test_the_error_lists_a_few_names_and_points_at_subdirectories(tmp_path: Path) -> None:
    for i in range(7):
        (tmp_path / f"f{i}.txt").write_text("x\n")
    (tmp_path / ".hidden.json").write_text("{}\n")  # never data: not listed
    (tmp_path / "2024").mkdir()
    (tmp_path / "2024" / "a.jsonl").write_text('{"n": 1}\n')
    assert failure(sources.read_jsonl(tmp_path)) == (
        f"read_jsonl (vertex 'source'): no file in '{tmp_path}' matches glob '*.jsonl'; the "
        "directory holds 2024/, f0.txt, f1.txt, f2.txt, f3.txt and 3 more (files in "
        "subdirectories match glob='**/*.jsonl')"
    )
    assert run(sources.read_jsonl(tmp_path, "**/*.jsonl")) == [{"n": 1}]


def test_a_directory_without_data_files_is_empty_input_with_a_warning(
    tmp_path: Path, caplog: Any
) -> None:
    (tmp_path / "_SUCCESS").write_text("")
    with caplog.at_level(logging.WARNING):
        assert run(sources.read_csv(tmp_path)) == []
    assert [r.getMessage() for r in caplog.records] == [
        f"read_csv (vertex 'source'): directory '{tmp_path}' holds no data file (names "
        "starting with '.' or '_' are never read): the source emits nothing"
    ]


def test_a_glob_in_the_directory_argument_is_understood(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "2024-01").mkdir(parents=True)
    (data / "a.txt").write_text("a1\na2\n")
    (data / "b.log").write_text("b1\n")
    (data / "2024-01" / "c.txt").write_text("c1\n")
    assert run(sources.read_files(f"{data}/*.txt")) == ["a1", "a2"]
    assert run(sources.read_files(f"{data}/2024-*/*.txt")) == ["c1"]
    assert run(sources.read_files(str(data / "*"))) == ["a1", "a2", "b1"]
    watcher = sources.stream_files(f"{data}/*.log")
    assert watcher.args[:2] == (str(data), "*.log")
    # a real directory whose name has wildcard characters is taken as it is
    odd = tmp_path / "run[1]"
    odd.mkdir()
    (odd / "x.txt").write_text("x\n")
    assert run(sources.read_files(odd)) == ["x"]


def test_a_glob_in_both_arguments_is_explained() -> None:
    with pytest.raises(ValueError) as info:
        sources.read_files("data/*.txt", "*.log")
    assert str(info.value) == (
        "read_files(): the directory argument 'data/*.txt' holds a glob pattern and "
        "glob='*.log' is given too; pass the directory and the pattern apart, e.g. "
        "read_files('data', '*.txt')"
    )
