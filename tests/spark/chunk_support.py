"""Damaged state chunks and the errors that name them, for the Spark tests of kept and
rescaled state (test_spark_executor_state, test_spark_rescale, test_spark_continued_chains,
test_spark_kept_state)."""

from __future__ import annotations

import os
from typing import Any


def damage_chunk(store: Any, ref: Any) -> str:
    """Overwrite the last 3 bytes of the chunk file ``ref`` names in ``store`` (its
    signature check then fails); returns the file's path, as errors name it."""
    path = os.path.join(store.directory, ref.file)
    with open(path, "r+b") as fh:
        fh.seek(-3, os.SEEK_END)
        fh.write(b"xyz")
    return path


def error_text(error: BaseException) -> str:
    """``error``'s message and those of its causes (``__cause__``), a line each: the
    chunk an epoch failed on may be named by a cause only."""
    text = str(error)
    cause = error.__cause__
    while cause is not None:
        text += "\n" + str(cause)
        cause = cause.__cause__
    return text
