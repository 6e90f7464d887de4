"""Chunks written and read without a store object (state.store.write_chunk_file /
read_chain_files): what a Spark executor does with its processors' state; the store
commits a manifest from the refs alone."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from slipstream.core.errors import SnapshotError
from slipstream.state import format as fmt
from slipstream.state.keys import BroadcastKey
from slipstream.state.store import (
    ChunkRef,
    DirectorySnapshotStore,
    Manifest,
    VertexManifest,
    chunk_file_id,
    chunk_file_name,
    encode_chunk,
    read_chain_files,
    write_chunk_file,
)


def _write(store: DirectorySnapshotStore, sid: int, index: int, entries: list[Any], attempt: str) -> ChunkRef:
    name = chunk_file_name(sid, "count", index, attempt=attempt)
    payload = encode_chunk(entries, sid, "count", index)
    return write_chunk_file(store.directory, store.key, name, sid, "count", index, fmt.CHUNK_FULL, payload)


def test_chunks_written_elsewhere_commit_and_read_back(tmp_path: Path) -> None:
    store = DirectorySnapshotStore(tmp_path / "s", key=b"k" * 32)
    store.ensure_directory()
    entries: dict[int, list[Any]] = {0: [("a", 1), (BroadcastKey("wm"), 5)], 1: [("b", 2)]}
    refs = {i: _write(store, 1, i, es, f"{i}x") for i, es in entries.items()}
    manifest = Manifest(1, "job")
    manifest.vertices["count"] = VertexManifest(2, chains={i: [r] for i, r in refs.items()})
    store.commit(manifest, chunk_bytes=sum(r.size for r in refs.values()))
    assert store.committed_ids() == [1]
    assert store.read_header(1)["chunk_bytes"] == sum(r.size for r in refs.values())
    assert store.read(1).vertices["count"].entries == entries
    got = read_chain_files(store.directory, store.key, [refs[0]], "count", 0, 1)
    assert got == entries[0]
    # the attempt makes the name unique and keeps the snapshot id readable (for GC)
    assert refs[0].file != chunk_file_name(1, "count", 0)
    assert chunk_file_id(refs[0].file) == 1


def test_a_damaged_chunk_fails_naming_its_file(tmp_path: Path) -> None:
    store = DirectorySnapshotStore(tmp_path / "s", key=b"k" * 32)
    store.ensure_directory()
    ref = _write(store, 1, 0, [("a", 1)], "a")
    path = os.path.join(store.directory, ref.file)
    with open(path, "r+b") as fh:
        fh.seek(-1, os.SEEK_END)
        fh.write(b"\0")
    with pytest.raises(SnapshotError) as info:
        read_chain_files(store.directory, store.key, [ref], "count", 0, 1)
    assert str(info.value) == (
        f"snapshot 1: chunk {path} (vertex 'count', processor 0) fails its signature check "
        "(corrupt, truncated, tampered with, or signed with another key)"
    )
    with pytest.raises(SnapshotError, match="signed with another key"):
        read_chain_files(store.directory, b"x" * 32, [ref], "count", 0, 1)
