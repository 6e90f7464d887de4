"""Per-epoch state cost follows the change on Spark (issue 23, item 2): a task restored
from its own chain writes a delta chunk, the driver appends it to the committed chain,
compacts long chains in the background and the store removes what no manifest names.
Driven through the in-process RDD stand-in, as tests/spark/test_spark_executor_state.py."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path
from typing import Any

import pytest

import slipstream as ss

from .chunk_support import damage_chunk, error_text
from .spark_fake_rdd import FakeSession
from .test_spark_executor_state import KEYS, _counts, _embedded, _job, _run, _store

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def skewed(seed: int, n: int, hot: int = 10, size: int = 400) -> list[list[tuple[str, int]]]:
    """Epoch 0 touches every key once; each later epoch ``size`` events over ``hot`` keys."""
    rng = random.Random(seed)
    out = [[(f"k{k}", k) for k in range(KEYS)]]
    for i in range(1, n):
        keys = rng.sample(range(KEYS), hot)
        out.append([(f"k{rng.choice(keys)}", i * size + j) for j in range(size)])
    return out


def _chains(tmp_path: Path, sid: int) -> dict[int, Any]:
    return _store(tmp_path).read_manifest(sid).vertices["count"].chains


def _wait_idle(job: Any) -> None:
    """Wait for the driver's background compaction to finish what it was given."""
    deadline = time.monotonic() + 120
    while job._compactor is not None and not job._compactor.idle():
        assert time.monotonic() < deadline, "compaction did not finish in 120 s"
        time.sleep(0.01)


def test_tasks_write_deltas_after_the_first_epoch_and_a_restart_is_exact(tmp_path: Path) -> None:
    data = skewed(5, 10)
    first = ss.spark(FakeSession())
    job1 = _job(first, tmp_path)
    store = _store(tmp_path)
    for epoch_id in range(4):
        _run(first, job1, data[epoch_id], epoch_id)
        sid = epoch_id + 1
        for i, chain in _chains(tmp_path, sid).items():
            # the committed chain continued: the full chunk of epoch 0, then one delta per epoch
            assert [(r.mode, r.snapshot_id) for r in chain] == [("full", 1)] + [
                ("delta", s) for s in range(2, sid + 1)
            ], i
            # a delta holds the few keys the epoch changed, not the state
            assert chain[-1].mode == "full" or chain[-1].size * 10 < chain[0].size
    # a new driver from the checkpoint: its tasks read their chains and continue them
    second = ss.spark(FakeSession())
    job2 = _job(second, tmp_path)
    for epoch_id in range(4, 7):
        _run(second, job2, data[epoch_id], epoch_id)
    for i, chain in _chains(tmp_path, 5).items():
        assert chain[-1].mode == "delta" and chain[-2].snapshot_id == 4, i
    # more than DEFAULT_MAX_DELTAS deltas: compacted in the background, named by a later
    # manifest in place of the chunks it merged
    _wait_idle(job2)
    _run(second, job2, data[7], 7)
    for i, chain in _chains(tmp_path, 8).items():
        assert chain[0].file.endswith("-c.bin"), (i, chain)
        assert len(chain) <= 4
    assert job2.compactions >= 2
    for epoch_id in range(8, 10):
        _run(second, job2, data[epoch_id], epoch_id)
    assert _counts(first, second) == _embedded([e for batch in data for e in batch])
    # the store keeps only what its retained manifests name
    job2._finish_reports()
    named: set[str] = set()
    for sid in store.committed_ids():
        named |= store.read_manifest(sid).files()
    chunks = {n for n in os.listdir(store.directory) if n.startswith("chunk-")}
    assert chunks <= named, sorted(chunks - named)


def test_a_damaged_delta_fails_the_epoch_naming_the_file(tmp_path: Path) -> None:
    data = skewed(6, 4)
    engine = ss.spark(FakeSession())
    job = _job(engine, tmp_path)
    for epoch_id in range(3):
        _run(engine, job, data[epoch_id], epoch_id)
    store = _store(tmp_path)
    ref = _chains(tmp_path, 3)[1][-1]
    assert ref.mode == "delta"
    path = damage_chunk(store, ref)
    with pytest.raises(ss.JobFailedError) as info:
        _run(engine, job, data[3], 3)
    text = error_text(info.value)
    assert (
        f"snapshot 3: chunk {path} (vertex 'count', processor 1) fails its signature check" in text
    )
    assert store.committed_ids()[-1] == 3  # nothing committed
