"""A snapshot store with a few committed snapshots, from a job run for it (the tests of
``ss.state`` reading and querying a store, and of the ``slipstream state`` command), and
what a store's files say (:func:`class_path_text`)."""

from __future__ import annotations

import json
import os
import time
import zlib
from os import PathLike
from typing import Any

import pytest

import slipstream as ss
from slipstream import JobConfig, ProcessingGuarantee
from slipstream.core.errors import JobCancelledError
from slipstream.state.format import CHUNK_MAGIC
from slipstream.state.store import DirectorySnapshotStore


def exactly_once(name: str, store: Any, interval_ms: int = 10_000) -> JobConfig:
    """An exactly-once job ``name`` with snapshots into ``store`` (a path or a store)."""
    return JobConfig(
        name=name,
        processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE,
        snapshot_interval_ms=interval_ms,
        snapshot_store=store,
    )


def run_restored(pipeline: ss.Pipeline, name: str, store: Any, restore_from: Any) -> list[Any]:
    """Run ``pipeline`` (its source finite) to its end as exactly-once job ``name``
    restored from ``restore_from`` (a store; ``None``: from nothing), snapshots into
    ``store``; the items of its list sink ``out``, sorted."""
    engine = ss.local()
    engine.new_job(pipeline, exactly_once(name, store), restore_from=restore_from).join(120)
    return sorted(engine.get_list("out"))


def run_until_snapshots(
    pipeline: ss.Pipeline, name: str, directory: str | PathLike[str], snapshots: int = 4
) -> None:
    """Run ``pipeline`` (its source endless) exactly once as job ``name``, a snapshot every
    20 ms into the store at ``directory`` (keeping 50), until ``snapshots`` committed; then
    cancel it."""
    engine = ss.local()
    try:
        job = engine.new_job(
            pipeline,
            exactly_once(name, DirectorySnapshotStore(str(directory), keep=50), interval_ms=20),
        )
        deadline = time.monotonic() + 120
        while int(job.metrics["__job__"]["snapshots"]) < snapshots:
            assert not job.status.is_terminal, job.status
            assert time.monotonic() < deadline, "timed out waiting for the snapshots"
            time.sleep(0.005)
        job.cancel()
        with pytest.raises(JobCancelledError):
            job.join(60)
    finally:
        engine.shutdown()


def committed_ids(store: str) -> list[int]:
    """The committed snapshot ids a directory store's MANIFEST.json lists (none while it
    is missing or being replaced): what a test killing a job's process watches for."""
    try:
        with open(os.path.join(store, "MANIFEST.json")) as fh:
            return list(json.load(fh)["committed"])
    except (OSError, ValueError):
        return []


def part_lines(d: str) -> list[str]:
    """Every line of the ``part-*`` files a file sink committed into directory ``d``, in
    file-name order (none if ``d`` does not exist yet; the sink's in-progress files,
    ``.part-*.tmp``, are not part files)."""
    lines: list[str] = []
    for name in sorted(os.listdir(d)) if os.path.isdir(d) else []:
        if name.startswith("part-"):
            with open(os.path.join(d, name)) as fh:
                lines.extend(x for x in fh.read().split("\n") if x)
    return lines


def class_path_text(raw: bytes) -> bytes:
    """The bytes of a store file in which a pickled class would name its module: the file
    as it is, and for a chunk whose payload is zlib-compressed (a small pickle,
    state/format.py's ``COMPRESS_MAX``) its framing followed by the decompressed payload.
    A scan of the raw bytes for ``b"slipstream"`` does not see into a compressed payload."""
    if not raw.startswith(CHUNK_MAGIC):
        return raw
    *framing, payload = raw.split(b"\n", 3)  # magic, MAC, header; then the payload
    if payload[:1] != b"\x78":  # a pickle (0x80) or the columns' magic: as it is
        return raw
    return b"\n".join([*framing, zlib.decompress(payload)])
