"""File helpers: atomic replacement of a file, which names hold data, and the optional
pyarrow dependency of the Parquet source and sink."""

from __future__ import annotations

import os
import tempfile
from typing import Any


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: str, data: bytes, durable: bool = True) -> None:
    """Replace ``path`` with ``data`` so that readers see the old or the new content,
    never a mix; ``durable`` also fsyncs the file and its directory."""
    d = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=d)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if durable:
        _fsync_dir(d)


def is_data_file_name(name: str) -> bool:
    """Whether a file sink's output (or a user's data file) may have this name: file
    readers skip names starting with ``"."`` or ``"_"``, which is where the file sinks
    keep temporary and in-progress files (and where tools keep ``_SUCCESS`` markers)."""
    return not name.startswith((".", "_"))


def require_pyarrow(factory: str) -> Any:
    """The ``pyarrow`` module with ``pyarrow.parquet`` loaded, or an ``ImportError``
    saying how to install it (it is an optional dependency: the ``[parquet]`` extra)."""
    try:
        import pyarrow
        import pyarrow.parquet  # noqa: F401 - makes pyarrow.parquet an attribute
    except ImportError as e:
        raise ImportError(
            f"{factory}() needs pyarrow, an optional dependency of slipstream; install it "
            "with `pip install -e '.[parquet]'` in a checkout (or `pip install pyarrow`)"
        ) from e
    return pyarrow
