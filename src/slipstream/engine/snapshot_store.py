"""Durable snapshot storage: a directory that a later process can read.

Each committed snapshot is one file ``snapshot-<id>.bin``: a header line with the SHA-256
of the payload, then the cloudpickled payload. It is written to a temporary name, fsynced
and renamed, then ``MANIFEST.json`` (also temp + fsync + rename) names the committed ids.
A crash at any point leaves either the old or the new manifest, never a half file under a
committed name. On read a snapshot whose checksum does not match is skipped with a warning
and the previous committed one is used. The newest ``keep`` snapshots are kept.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass, field
from typing import Any

import cloudpickle

from slipstream.core.errors import SnapshotError
from slipstream.core.files import atomic_write

log = logging.getLogger("slipstream.snapshot")

MANIFEST = "MANIFEST.json"


@dataclass
class VertexState:
    """One vertex's part of a snapshot."""

    total_parallelism: int
    entries: dict[int, list[tuple[Any, Any]]] = field(default_factory=dict)
    completed: set[int] = field(default_factory=set)


@dataclass
class SnapshotData:
    """A committed snapshot: per vertex, each processor's saved entries."""

    snapshot_id: int
    job_name: str
    vertices: dict[str, VertexState] = field(default_factory=dict)

    def entry_count(self) -> int:
        return sum(len(es) for v in self.vertices.values() for es in v.entries.values())


class DirectorySnapshotStore:
    """Snapshots of one job in ``directory``."""

    def __init__(self, directory: str | os.PathLike[str], keep: int = 3) -> None:
        self.directory = os.fspath(directory)
        self.keep = max(2, keep)

    def __repr__(self) -> str:
        return f"DirectorySnapshotStore({self.directory!r})"

    def _path(self, snapshot_id: int) -> str:
        return os.path.join(self.directory, f"snapshot-{snapshot_id:010d}.bin")

    def committed_ids(self) -> list[int]:
        try:
            with open(os.path.join(self.directory, MANIFEST), encoding="utf-8") as fh:
                ids = json.load(fh)["committed"]
            return sorted(int(i) for i in ids)
        except FileNotFoundError:
            return []
        except (ValueError, KeyError, TypeError) as e:
            log.warning("snapshot manifest in %s is corrupt (%s); scanning files", self.directory, e)
            return sorted(
                int(n[len("snapshot-") : -len(".bin")])
                for n in os.listdir(self.directory)
                if n.startswith("snapshot-") and n.endswith(".bin")
            )

    def write(self, data: SnapshotData) -> None:
        """Commit ``data`` durably."""
        os.makedirs(self.directory, exist_ok=True)
        try:
            payload = cloudpickle.dumps(data)
        except Exception as e:  # noqa: BLE001
            raise SnapshotError(f"snapshot {data.snapshot_id} state cannot be pickled: {e}") from e
        digest = hashlib.sha256(payload).hexdigest().encode()
        atomic_write(self._path(data.snapshot_id), digest + b"\n" + payload)
        self.last_write_bytes = len(digest) + 1 + len(payload)
        ids = [i for i in self.committed_ids() if i != data.snapshot_id] + [data.snapshot_id]
        ids.sort()
        stale, ids = ids[: -self.keep], ids[-self.keep :]
        manifest = {"committed": ids, "latest": ids[-1], "job": data.job_name}
        atomic_write(
            os.path.join(self.directory, MANIFEST), json.dumps(manifest).encode("utf-8")
        )
        for i in stale:
            try:
                os.unlink(self._path(i))
            except OSError:
                pass

    def read(self, snapshot_id: int) -> SnapshotData:
        """Read one snapshot; :class:`SnapshotError` if missing or corrupt."""
        path = self._path(snapshot_id)
        try:
            with open(path, "rb") as fh:
                raw = fh.read()
        except OSError as e:
            raise SnapshotError(f"snapshot {snapshot_id} cannot be read from {path}: {e}") from e
        header, sep, payload = raw.partition(b"\n")
        if not sep or hashlib.sha256(payload).hexdigest().encode() != header:
            raise SnapshotError(f"snapshot {snapshot_id} in {path} is corrupt (checksum mismatch)")
        try:
            data = cloudpickle.loads(payload)
        except Exception as e:  # noqa: BLE001
            raise SnapshotError(f"snapshot {snapshot_id} in {path} cannot be loaded: {e}") from e
        if not isinstance(data, SnapshotData):
            raise SnapshotError(f"{path} does not hold a slipstream snapshot")
        return data

    def latest(self) -> SnapshotData | None:
        """The newest committed snapshot that reads back intact (older ones are tried
        when a newer one is corrupt), or ``None``."""
        for i in reversed(self.committed_ids()):
            try:
                return self.read(i)
            except SnapshotError as e:
                log.warning("%s; falling back to the previous snapshot", e)
        return None
