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


def test_a_manifest_names_chunks_compactly_and_reads_them_back(tmp_path: Path) -> None:
    """A manifest spells a ref as [snapshot, mode, bytes, MAC in base64], with the
    file's name only where chunk_file_name does not give it (a compaction's, a task
    attempt's), and a vertex's empty fields not at all: what it reads back is the
    manifest committed. The object spelling of older stores reads too
    (test_columnar's stored format-3 store restores)."""
    store = DirectorySnapshotStore(tmp_path / "s", key=b"k" * 32)
    store.ensure_directory()
    plain = store.write_chunk(3, "count", 0, fmt.CHUNK_DELTA, encode_chunk([("a", 1)], 3, "count", 0))
    compacted = store.write_chunk(
        2, "count", 0, fmt.CHUNK_FULL, encode_chunk([("a", 0)], 2, "count", 0), compacted=True
    )
    attempt = _write(store, 3, 1, [("b", 2)], "7")
    manifest = Manifest(3, "job")
    manifest.vertices["count"] = VertexManifest(
        2, {1}, {1}, chains={0: [compacted, plain], 1: [attempt]}
    )
    manifest.vertices["sink"] = VertexManifest(1)
    body = manifest.body()
    assert body["vertices"]["sink"] == {"parallelism": 1}
    chain0 = body["vertices"]["count"]["chains"]["0"]
    assert chain0[1] == [3, "delta", plain.size, chain0[1][3]] and len(chain0[1][3]) == 43
    assert chain0[0][4] == compacted.file
    assert body["vertices"]["count"]["chains"]["1"][0][4] == attempt.file
    store.commit(manifest)
    back = store.read_manifest(3)
    assert back.vertices == manifest.vertices
    assert store.read(3).vertices["count"].entries == {0: [("a", 1)], 1: [("b", 2)]}
    old = Manifest.from_body(
        {**body, "vertices": {"count": {"parallelism": 2, "completed": [], "final": [],
                                        "chains": {"0": [plain.as_json()]}}}}
    )
    assert old.vertices["count"].chains == {0: [plain]}


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


def test_a_chunk_of_many_parts_is_signed_and_written_whole_also_when_writes_are_partial(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chunk given as many pieces (a copy-on-write save's fragments) is signed in
    groups of pieces and written with writev, a batch of pieces per call: the file is
    the pieces in order, its MAC that of their concatenation, also when a call writes
    only part of its batch (here: at most 7 bytes) and with empty pieces among them."""
    import hashlib
    import hmac

    from slipstream.state import signing
    from slipstream.state import store as store_mod

    monkeypatch.setattr(signing, "SIGN_GROUP_BYTES", 50)
    monkeypatch.setattr(store_mod, "_IOV_MAX", 3)
    calls: list[int] = []
    writev = os.writev

    def short_writev(fd: int, buffers: list[Any]) -> int:
        calls.append(len(buffers))
        data = b"".join(buffers)[:7]
        return writev(fd, [data])

    monkeypatch.setattr(os, "writev", short_writev)
    entries: list[Any] = [(i, i * i) for i in range(300)]
    payload = encode_chunk(entries, 1, "v", 0)
    cuts = [0, 0, 1, 9, 9, 40, 41, 100, 180, 181, len(payload) - 4, len(payload)]
    parts: list[Any] = [payload[a:b] for a, b in zip(cuts, cuts[1:], strict=False)]
    parts[-1] = memoryview(parts[-1])
    key = b"k" * 32
    assert signing.sign(key, b"h", *parts) == hmac.new(key, b"h" + payload, hashlib.sha256).hexdigest()
    ref = write_chunk_file(str(tmp_path), key, "c", 1, "v", 0, fmt.CHUNK_FULL, parts)
    raw = (tmp_path / "c").read_bytes()
    assert raw.endswith(b"\n" + payload) and ref.size == len(raw)
    assert len(calls) > 3 and max(calls) == 3
    assert read_chain_files(str(tmp_path), key, [ref], "v", 0, 1) == entries


def test_write_all_counts_bytes_of_buffers_of_wider_items(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A part that is a buffer of 8-byte items (an ``array('q')`` or a view of one) is
    written whole when a call writes only part of it: the count writev returns is bytes,
    not items."""
    from array import array

    from slipstream.state import store as store_mod

    writev = os.writev
    monkeypatch.setattr(os, "writev", lambda fd, bufs: writev(fd, [b"".join(bufs)[:5]]))
    parts: list[Any] = [b"ab", array("q", [1, 2, 3]), memoryview(array("q", [-1])), b"z"]
    path = tmp_path / "f"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        store_mod.write_all(fd, parts)
    finally:
        os.close(fd)
    assert path.read_bytes() == b"ab" + array("q", [1, 2, 3]).tobytes() + array("q", [-1]).tobytes() + b"z"
