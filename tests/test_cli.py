"""The command line runs a DAG named as module:function and prints its Graphviz form."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

MODULE = textwrap.dedent(
    """
    from slipstream import DAG, Edge
    from slipstream import processors as P, sinks, sources

    def build():
        dag = DAG()
        s = dag.new_vertex("numbers", sources.items(range(1000)))
        m = dag.new_vertex("square", P.map(lambda x: x * x))
        out = dag.new_vertex("out", sinks.write_files("out"))
        dag.edge(Edge.between(s, m)).edge(Edge.between(m, out))
        return dag
    """
)


def run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "mydag.py").write_text(MODULE)
    return subprocess.run(
        [sys.executable, "-m", "slipstream.cli", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_run_module_function(tmp_path: Path) -> None:
    r = run(tmp_path, "run", "mydag:build")
    assert r.returncode == 0, r.stderr
    assert "completed" in r.stderr
    lines = [int(x) for p in (tmp_path / "out").iterdir() for x in p.read_text().split()]
    assert sorted(lines) == [x * x for x in range(1000)]


def test_dot(tmp_path: Path) -> None:
    r = run(tmp_path, "dot", "mydag:build")
    assert r.returncode == 0 and '"numbers" -> "square"' in r.stdout


def test_bad_spec_is_a_clear_error(tmp_path: Path) -> None:
    r = run(tmp_path, "run", "mydag")
    assert r.returncode != 0 and "MODULE:FUNCTION" in r.stderr
    r = run(tmp_path, "run", "nosuchmodule:build")
    assert r.returncode != 0 and "cannot import module 'nosuchmodule'" in r.stderr
