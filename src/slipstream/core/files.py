"""File helpers: atomic replacement of a file, which names hold data, the optional
pyarrow dependency of the Parquet source and sink, and private per-user directories."""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Sequence
from pathlib import Path
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


def atomic_write(
    path: str, data: bytes | Sequence[bytes | memoryview], durable: bool = True
) -> None:
    """Replace ``path`` with ``data`` (bytes, or chunks written in order) so that readers
    see the old or the new content, never a mix; ``durable`` also fsyncs the file and its
    directory. The temporary file is ``.tmp-*`` in the same directory."""
    d = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=d)
    try:
        with os.fdopen(fd, "wb") as fh:
            if isinstance(data, bytes):
                fh.write(data)
            else:
                for chunk in data:
                    fh.write(chunk)
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


class UnsafeDirectoryError(PermissionError):
    """A directory slipstream would keep private state in is not private: not a real
    directory, owned by another user, or open to group or others."""


def private_dir(path: str | os.PathLike[str]) -> Path:
    """Create directory ``path`` with mode 0700, or check that the existing one is
    private: a real directory (not a symlink), owned by this user, with no access for
    group or others. Raises :class:`UnsafeDirectoryError` otherwise (it never takes
    over or deletes someone else's directory). The parent must exist."""
    p = Path(path)
    try:
        os.mkdir(p, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(p)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeDirectoryError(f"{p} is not a directory (a symlink or a file)")
    if st.st_uid != os.geteuid():
        raise UnsafeDirectoryError(
            f"{p} belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()})"
        )
    if st.st_mode & 0o077:
        raise UnsafeDirectoryError(
            f"{p} is open to other users (mode {stat.S_IMODE(st.st_mode):o}, expected 700)"
        )
    return p


def user_temp_dir(*names: str) -> Path:
    """``<system temp dir>/slipstream-<uid>/<names...>``, every level created by
    :func:`private_dir` (so checked to be this user's alone). Raises
    :class:`UnsafeDirectoryError` if another user planted one of them; callers then fall
    back to :func:`tempfile.mkdtemp`."""
    path = private_dir(Path(tempfile.gettempdir()) / f"slipstream-{os.geteuid()}")
    for name in names:
        path = private_dir(path / name)
    return path
