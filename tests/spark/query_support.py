"""Feeding a Structured Streaming query file by file, for the tests that stop a query
and start it again on its checkpoint (test_spark_streaming, test_spark_executor_state,
test_spark_rescale)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

import slipstream as ss


def write_json_file(
    directory: Path, i: int, events: Sequence[Sequence[Any]], fields: Sequence[str]
) -> None:
    """Write ``events`` as the JSON lines file ``part-<i>.json`` of ``directory`` (each
    event's values named by ``fields``), atomically: the query sees whole files only."""
    tmp = directory.parent / f".tmp-{directory.name}-{i}"
    tmp.write_text("\n".join(json.dumps(dict(zip(fields, e, strict=True))) for e in events))
    os.rename(tmp, directory / f"part-{i:04d}.json")


def feed_and_cancel(
    job: Any,
    directory: Path,
    files: Sequence[tuple[int, Sequence[Sequence[Any]]]],
    fields: Sequence[str],
) -> None:
    """Add ``files`` (``(i, events)``) to the query's ``directory`` one at a time, waiting
    for the job to process each, then cancel the job (its checkpoint stays for a
    restart)."""
    try:
        for i, events in files:
            write_json_file(directory, i, events, fields)
            job.process_all_available(120)
    finally:
        job.cancel()
        with pytest.raises(ss.JobCancelledError):
            job.join(60)
