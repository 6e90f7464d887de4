"""``slipstream run --engine spark``: the CLI drives the Spark engine (in this process, on
the shared test session, which it must not stop), ships the target file's code to the
executors by value, and serves the dashboard for the Spark job."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from slipstream import cli

pytestmark = [pytest.mark.spark, pytest.mark.slow]

TARGET = textwrap.dedent(
    """
    from slipstream import DAG, Edge
    from slipstream import processors as P, sinks, sources

    def triple(x):
        return 3 * x

    def build(n: int, out: str):
        dag = DAG()
        s = dag.new_vertex("numbers", sources.items(range(n)))
        m = dag.new_vertex("triple", P.map(triple))
        o = dag.new_vertex("out", sinks.write_files(out))
        dag.edge(Edge.between(s, m).partitioned(triple)).edge(Edge.between(m, o))
        return dag
    """
)


def test_run_on_spark_with_dashboard(
    spark_session: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "spark_cli_target.py").write_text(TARGET)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "spark_cli_target", raising=False)
    out = tmp_path / "out"
    code = cli.main(
        ["run", "spark_cli_target.py:build", "--engine", "spark", "--dashboard", "0", "--quiet",
         "--arg", f"out={out}", "--", "40"]
    )
    err = capsys.readouterr().err
    assert code == 0, err
    assert "dashboard: http://127.0.0.1:" in err and "completed" in err
    got = sorted(int(x) for p in out.iterdir() if not p.name.startswith((".", "_")) for x in p.read_text().split())
    assert got == [3 * x for x in range(40)]
    assert not spark_session.sparkContext._jsc.sc().isStopped()  # the shared session lives on
