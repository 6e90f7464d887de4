"""State beyond memory (issue 22, item 3): under an address-space limit
(``RLIMIT_AS``) a rolling count over 800k keys fails with MemoryError on the in-memory
backend and completes on ``state_backend="sqlite"``. Each run is a child process whose
limit is its address space after the imports plus 60 MB: the in-memory map fails past
~700k keys, where its table doubles (it completes at 500k; with 90 MB it fails past ~1M),
the disk-backed state needs its caches only (20k keys, 8 MB of SQLite pages), whatever
the number of keys (800k complete with 45 MB, not with 30). 1.5M keys with 90 MB made
the SQLite run 21 s at load 18, 800k with 60 MB 9-10 s."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

SRC = os.path.join(os.path.dirname(__file__), "..", "..", "src")

CHILD = r"""
import operator, resource, sys

backend, keys, headroom = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
import slipstream as ss
import slipstream.state.disk as disk
from slipstream import JobConfig, sinks, sources
from slipstream.aggregate import counting

disk.DEFAULT_CACHE_SIZE = 20_000
disk.DEFAULT_CACHE_KIB = 8 * 1024


def new_key(seq):
    return (seq, 1)


with open("/proc/self/status") as fh:
    size = next(int(x.split()[1]) for x in fh if x.startswith("VmSize:")) * 1024
limit = size + (headroom << 20)
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
p = ss.Pipeline()
(
    p.read_from(sources.generator(new_key, None, max_items=keys))
    .group_by(operator.itemgetter(0))
    .rolling_aggregate(counting())
    .write_to(sinks.noop())
)
engine = ss.local(cooperative_threads=1, work_dir=sys.argv[4])
job = engine.new_job(p, JobConfig(name="limit", state_backend=backend, auto_restart=False))
try:
    job.join()
    print("completed", flush=True)
except Exception as e:
    print("failed:", type(e).__name__, "MemoryError" in str(e), flush=True)
sys.stdout.flush()
import os
os._exit(0)
"""


def _run(backend: str, tmp: str) -> str:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(SRC), MALLOC_ARENA_MAX="1")
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, backend, "800000", "60", tmp],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    return proc.stdout.strip() + proc.stderr[-2000:]


@pytest.mark.slow
def test_rolling_count_beyond_memory_completes_only_on_disk(tmp_path: object) -> None:
    assert _run("memory", str(tmp_path)).startswith("failed: JobFailedError True")
    assert _run("sqlite", str(tmp_path)).startswith("completed")
    assert os.listdir(os.path.join(str(tmp_path), "state")) == []
