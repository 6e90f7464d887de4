"""SnapshotData.extra: an engine's metadata as plain data, and the Spark engine's
snapshots of older versions (pickled ``EpochSnapshot`` subclasses) read into it."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import format2_store
from slipstream.spark.streaming import (
    decode_watermarks,
    epoch_extra,
    snapshot_epoch,
    snapshot_finished,
    snapshot_no_data,
    snapshot_watermark_pending,
    snapshot_watermarks,
)
from slipstream.state.store import DirectorySnapshotStore, SnapshotData, VertexState

#: A Spark checkpoint's state store written by slipstream 9f393bb (before ``extra``): one
#: committed ``EpochSnapshot`` (snapshot 3, Spark epoch 1, a watermark pending).
V2_CHECKPOINT = Path(__file__).parent / "data" / "spark-checkpoint-v2"
V2_KEY = b"test-key-of-the-v2-fixture"

COALESCED = {
    "wm": [-400, 4400],
    "idle": [False, False],
    "last_emitted": -400,
    "top_observed": 4400,
    "all_idle": False,
    "idle_pending": False,
}
ONE_INPUT = {
    "wm": [-400],
    "idle": [False],
    "last_emitted": -400,
    "top_observed": -400,
    "all_idle": False,
    "idle_pending": False,
}


def test_an_older_spark_epoch_snapshot_reads_as_plain_snapshot_data(tmp_path: Path) -> None:
    store_dir = tmp_path / "slipstream-state"
    shutil.copytree(V2_CHECKPOINT, store_dir)
    store = DirectorySnapshotStore(store_dir, key=V2_KEY)
    assert store.committed_ids() == [3]
    data = store.latest()
    assert type(data) is SnapshotData
    assert (data.snapshot_id, data.job_name) == (3, "windows-job")
    assert data.vertices["windows"].total_parallelism == 2
    assert data.vertices["windows"].entries == {0: [("a", 2)], 1: []}
    assert (snapshot_epoch(data), snapshot_finished(data), snapshot_no_data(data)) == (
        1,
        False,
        False,
    )
    assert snapshot_watermark_pending(data)
    assert snapshot_watermarks(data) == {
        ("windows", 0): {
            "edges": {0: COALESCED},
            "ordinals": [0],
            "tasklet": ONE_INPUT,
            "sent": {1: -400},
        },
        ("windows", 1): {
            "edges": {0: COALESCED},
            "ordinals": [0],
            "tasklet": ONE_INPUT,
            "sent": {},
        },
    }
    # written again, it names no class of the Spark engine
    store.write(SnapshotData(4, data.job_name, data.vertices, extra=data.extra))
    raw = (store_dir / "snapshot-0000000004.bin").read_bytes()
    assert b"EpochSnapshot" not in raw and b"slipstream.spark" not in raw
    assert store.read(4).extra == data.extra


def test_a_snapshot_pickled_without_extra_reads_with_an_empty_one(tmp_path: Path) -> None:
    old = SnapshotData(1, "job", {"v": VertexState(1, {0: [("k", 1)]})})
    del old.__dict__["extra"]  # as pickled by a version without the field
    store = DirectorySnapshotStore(tmp_path, key=b"a-test-key-16-bytes-long")
    store.job_name = "job"
    format2_store.write_payload(store, 1, pickle.dumps(old))
    data = store.read(1)
    assert data.extra == {} and data.vertices["v"].entries == {0: [("k", 1)]}
    assert snapshot_epoch(data) == -1 and snapshot_watermarks(data) == {}


def test_the_epoch_extra_is_plain_data_that_survives_json() -> None:
    watermarks = {
        ("windows", 0): {
            "edges": {0: COALESCED, 2: ONE_INPUT},
            "ordinals": [0, 2],
            "tasklet": ONE_INPUT,
            "sent": {1: -400},
        },
        ("map", 1): {"edges": {}, "ordinals": [], "tasklet": ONE_INPUT, "sent": {}},
    }
    extra = epoch_extra(7, watermarks, no_data=True, watermark_pending=False)
    through_json = json.loads(json.dumps(extra))
    assert through_json["epoch_id"] == 7 and through_json["no_data"] is True
    assert decode_watermarks(through_json["watermarks"]) == watermarks
    assert decode_watermarks(extra["watermarks"]) == watermarks
