"""Writing a format 2 snapshot store (one signed, pickled ``SnapshotData`` per file), as
slipstream wrote them before the chunked format 3: the store still restores them, and
tests write one with this copy of the old writer (test modules import it by its plain
name: pytest puts ``tests/``, the directory of the root conftest, on ``sys.path``)."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from slipstream.core.files import atomic_write
from slipstream.state.lineage import dag_fingerprint
from slipstream.state.signing import sign
from slipstream.state.store import DirectorySnapshotStore, SnapshotData, pickle_state

MAGIC_2 = b"SLIPSTREAM-SNAPSHOT 2\n"


def write_payload(store: DirectorySnapshotStore, snapshot_id: int, payload: bytes, dag: bool = True) -> None:
    """One format 2 snapshot file holding ``payload`` (signed with the store's key)."""
    store.ensure_directory()
    info: dict[str, Any] = {
        "snapshot_id": snapshot_id,
        "job": store.job_name or "",
        "execution": store.execution_id,
        "size": len(payload),
        "created": time.time(),
    }
    if dag and store.dag_shape is not None:
        info["dag"] = dag_fingerprint(store.dag_shape)
    header = json.dumps(info, sort_keys=True).encode("utf-8")
    mac = sign(store.key, header, b"\n", payload).encode("ascii")
    atomic_write(store._path(snapshot_id), [MAGIC_2, mac, b"\n", header, b"\n", payload])


def convert_to_format2(store_dir: str, old_version: bool = False) -> list[int]:
    """Rewrite the committed snapshots of the format 3 store in ``store_dir`` as format 2
    files (``old_version``: as the version before DAG shapes and ``extra``, too: no DAG
    fingerprint, no ``dag_shape`` attribute) and remove its chunk files. Returns the ids."""
    store = DirectorySnapshotStore(store_dir)
    ids = store.committed_ids()
    owner = store.owner()
    assert owner is not None
    store.job_name, store.execution_id = owner.job, owner.execution
    datas = [store.read(i) for i in ids]
    for data in datas:
        vars(data).pop("extra", None)
        if old_version:
            vars(data).pop("dag_shape", None)
        else:
            store.dag_shape = data.dag_shape
        write_payload(store, data.snapshot_id, pickle_state(data), dag=not old_version)
    for n in os.listdir(store_dir):
        if n.startswith("chunk-"):
            os.unlink(os.path.join(store_dir, n))
    manifest = json.loads(open(os.path.join(store_dir, "MANIFEST.json")).read())
    if old_version:
        manifest.pop("dag", None)
    manifest["format"] = 2
    manifest.pop("mac")
    body = json.dumps(manifest, sort_keys=True).encode("utf-8")
    manifest["mac"] = sign(store.key, body)
    atomic_write(os.path.join(store_dir, "MANIFEST.json"), json.dumps(manifest).encode("utf-8"))
    return ids


def is_format2(store_dir: str, snapshot_id: int) -> bool:
    with open(DirectorySnapshotStore(store_dir)._path(snapshot_id), "rb") as fh:
        return fh.read(len(MAGIC_2)) == MAGIC_2


__all__ = ["SnapshotData", "convert_to_format2", "is_format2", "write_payload"]
