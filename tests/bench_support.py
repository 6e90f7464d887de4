"""Running a bench script as a user runs it, for the smoke tests of bench/ (the benches
print markdown tables and must leave no file behind)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_bench(tmp_path: Path, script: str, *args: str) -> str:
    """Run ``bench/<script>`` with ``args`` from the checkout, its home and temporary
    directories fresh ones under ``tmp_path`` (the stores' signing keys and generation
    files go under the home directory unless the key directory is set, so neither
    variable is passed on); asserts that it succeeded and that it left no file in either
    directory. Returns its standard output."""
    home, tmp = tmp_path / "home", tmp_path / "tmp"
    home.mkdir()
    tmp.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("SLIPSTREAM_KEY_DIR", "XDG_STATE_HOME")}
    env.update(PYTHONUNBUFFERED="1", HOME=str(home), TMPDIR=str(tmp))
    r = subprocess.run(
        [sys.executable, f"bench/{script}", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    assert list(home.rglob("*")) == [] and list(tmp.rglob("*")) == []
    return r.stdout
