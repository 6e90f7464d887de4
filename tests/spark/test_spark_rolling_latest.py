"""``rolling_aggregate(counting(), per_epoch=True)`` on a Structured Streaming job emits
what native Structured Streaming's update mode emits (``groupBy(key).count()``): in each
micro-batch, every key the batch changed, once, with its running count (issue 23). Both
run over the same small files, one file per micro-batch; slipstream's rows are read per
epoch from the partitions its DataFrame sink writes (``slipstream_epoch=<n>``)."""

from __future__ import annotations

import os
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import slipstream as ss
from slipstream import sinks, sources
from slipstream.aggregate import counting

pytestmark = [pytest.mark.spark, pytest.mark.slow]

FILES = 2
LINES = 400
KEYS = 30

PerEpoch = dict[int, Counter[tuple[str, int]]]


def _write_files(directory: Path) -> None:
    """Key ``k<i>`` per line; file 1 holds only keys of the first half (so its epoch
    changes only those)."""
    rng = random.Random(23)
    directory.mkdir()
    for i in range(FILES):
        keys = KEYS // 2 if i == 1 else KEYS
        tmp = directory.parent / f".tmp-{i}"
        tmp.write_text("\n".join(f"k{rng.randrange(keys)}" for _ in range(LINES)))
        os.utime(tmp, (1_700_000_000 + i, 1_700_000_000 + i))  # read oldest first
        tmp.rename(directory / f"part-{i}.txt")


def _stream(spark_session: Any, directory: Path) -> Any:
    return spark_session.readStream.option("maxFilesPerTrigger", 1).text(str(directory))


def _native(spark_session: Any, directory: Path, checkpoint: Path) -> PerEpoch:
    got: PerEpoch = {}

    def collect(df: Any, epoch: int) -> None:
        got[epoch] = Counter((r["value"], r["count"]) for r in df.collect())

    query = (
        _stream(spark_session, directory)
        .groupBy("value")
        .count()
        .writeStream.outputMode("update")
        .foreachBatch(collect)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(240)
    assert not query.isActive and query.exception() is None
    return got


def _same(key: str) -> str:
    return key


@pytest.mark.timeout(600)
def test_latest_count_per_epoch_equals_native_update_mode(
    spark_session: Any, tmp_path: Path
) -> None:
    directory = tmp_path / "in"
    _write_files(directory)
    native = _native(spark_session, directory, tmp_path / "native")
    assert sorted(native) == list(range(FILES))
    assert sum(len(c) for c in native.values()) < FILES * LINES  # one row per key, not line

    out = tmp_path / "out"
    p = ss.Pipeline()
    (
        # the column's values as the items (no Row per line), as the bench's latest rows
        p.read_from(sources.spark_stream(_stream(spark_session, directory), column="value"))
        .group_by(_same)
        .rolling_aggregate(counting(), per_epoch=True)
        .write_to(
            sinks.spark_dataframe(
                "latest", "value string, count long", path=str(out), format="json"
            )
        )
    )
    engine = ss.spark(spark_session)
    job = engine.new_job(
        p,
        ss.JobConfig(name="rolling-latest"),
        checkpoint_location=str(tmp_path / "checkpoint"),
        trigger={"availableNow": True},
    )
    job.join(300)
    assert job.status is ss.JobStatus.COMPLETED
    got: PerEpoch = {}
    for r in spark_session.read.json(str(out)).collect():
        got.setdefault(r["slipstream_epoch"], Counter())[(r["value"], r["count"])] += 1
    assert got == native
