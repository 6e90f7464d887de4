"""Readers of a store only ever see committed snapshots and never write to it: between
the moment a job's first snapshot file is in place and the moment its ``MANIFEST.json``
is, ``ss.state.read`` / ``read_arrow`` / ``sql`` / ``changes``, ``slipstream state
STORE``, ``sources.snapshot``, ``job.state()`` (and the dashboard's key search, which
asks the same) and the dashboard's state sizes report that there is no committed
snapshot yet, rather than rebuilding the manifest from the uncommitted file and reading
it. The rebuild stays the job's: a store whose manifest was lost is still restored from
its files."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import slipstream as ss
from slipstream import sources
from slipstream.cli import main
from slipstream.core.errors import SnapshotError, SnapshotStoreDamagedError
from slipstream.dashboard.statesize import StateSizes
from slipstream.state.reader import point_query
from slipstream.state.store import MANIFEST, DirectorySnapshotStore, SnapshotData, VertexState


def snapshot(sid: int, value: int) -> SnapshotData:
    return SnapshotData(sid, "job", {"v": VertexState(1, {0: [("k", value)]})})


def not_yet(directory: str) -> str:
    return (
        f"snapshot store {directory} holds no committed snapshot yet: it has no {MANIFEST} "
        f"(its job has not committed its first snapshot, or the file was lost; a job "
        f"resuming from the store rebuilds it from the snapshot files)"
    )


def readers(directory: str, writer: DirectorySnapshotStore) -> dict[str, Callable[[], Any]]:
    """Every reader, by name: each must raise ``SnapshotError``."""
    job = SimpleNamespace(name="job", store=writer)
    out: dict[str, Callable[[], Any]] = {
        "read": lambda: ss.state.read(directory),
        "read of the job's store": lambda: ss.state.read(writer),
        "changes": lambda: ss.state.changes(directory, 1, 1),
        "job.state": lambda: point_query(job, "v"),
        "sources.snapshot": lambda: sources.snapshot(directory),
    }
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        pass
    else:
        out["read_arrow"] = lambda: ss.state.read_arrow(directory)
        try:
            import duckdb  # noqa: F401
        except ImportError:
            pass
        else:
            out["sql"] = lambda: ss.state.sql(directory, "SELECT * FROM state")
    return out


def test_readers_never_see_a_snapshot_whose_commit_is_held(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    directory = str(tmp_path / "store")
    writer = DirectorySnapshotStore(directory)
    writer.bind("job", "exec-1")
    writer.lock()
    seen: dict[str, str] = {}
    listing: list[list[str]] = []
    commit_manifest = writer._write_manifest

    def held(ids: list[int], completed: bool = False) -> None:
        # snapshot 1's files are in place, MANIFEST.json is not: what a reader sees now
        before = sorted(os.listdir(directory))
        assert "snapshot-0000000001.bin" in before and MANIFEST not in before
        for name, call in readers(directory, writer).items():
            with pytest.raises(SnapshotError) as e:
                call()
            seen[name] = str(e.value)
        seen["cli"] = f"exit {main(['state', directory])}: {capsys.readouterr().err}"
        seen["dashboard"] = repr(StateSizes().describe(SimpleNamespace(store=writer), "job"))
        listing.append(before)
        listing.append(sorted(os.listdir(directory)))
        commit_manifest(ids, completed)

    monkeypatch.setattr(writer, "_write_manifest", held)
    with caplog.at_level(logging.WARNING):
        writer.write(snapshot(1, 10))
    expected = {name: not_yet(directory) for name in readers(directory, writer)}
    expected["job.state"] = (
        f"job 'job' has committed no snapshot yet (its store is {directory}): there is no "
        f"state to read"
    )
    expected["cli"] = f"exit 1: error: {not_yet(directory)}\n"
    expected["dashboard"] = repr(
        {"snapshot_id": None, "counted_snapshot_id": None, "vertices": []}
    )
    assert seen == expected
    assert listing[0] == listing[1]  # the readers wrote nothing into the store
    assert caplog.text == ""  # and rebuilt nothing
    # committed: every reader sees it; the writer's lock never stood in their way
    assert ss.state.read(directory) == [("v", 0, "k", None, 10, "keyed")]
    assert point_query(SimpleNamespace(name="job", store=writer), "v")[0] == 1
    writer.unlock()


def test_a_lost_manifest_is_not_rebuilt_by_readers_but_by_the_jobs_restore(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = str(tmp_path / "store")
    writer = DirectorySnapshotStore(directory)
    writer.bind("job", "exec-1")
    writer.write(snapshot(1, 10))
    writer.write(snapshot(2, 20))
    os.remove(os.path.join(directory, MANIFEST))
    files = sorted(os.listdir(directory))
    with caplog.at_level(logging.WARNING):
        with pytest.raises(SnapshotError) as e:
            ss.state.read(directory)
    assert str(e.value) == not_yet(directory)
    assert caplog.text == ""
    assert sorted(os.listdir(directory)) == files
    # the recovery path: the job opening its store to restore from it
    with caplog.at_level(logging.WARNING):
        restored = DirectorySnapshotStore(directory).latest()
    assert restored is not None and restored.snapshot_id == 2
    assert "has no usable MANIFEST.json; rebuilt it from 2 snapshot file(s): [1, 2]" in caplog.text


def test_a_damaged_manifest_is_reported_not_rebuilt_by_readers(tmp_path: Path) -> None:
    directory = str(tmp_path / "store")
    writer = DirectorySnapshotStore(directory)
    writer.bind("job", "exec-1")
    writer.write(snapshot(1, 10))
    path = os.path.join(directory, MANIFEST)
    with open(path, "a") as fh:
        fh.write("!")
    with pytest.raises(SnapshotStoreDamagedError) as e:
        ss.state.read(directory)
    assert str(e.value).startswith(f"snapshot store {directory} is damaged: its {MANIFEST} ")
    assert str(e.value).endswith(
        "; a reader does not rebuild it (a job resuming from the store rebuilds it from "
        "the snapshot files)"
    )
