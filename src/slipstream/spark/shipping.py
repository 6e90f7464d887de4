"""Shipping slipstream itself to Spark executors.

A Spark task runs :class:`~slipstream.spark.task.VertexTask`, which PySpark pickles by
reference (``slipstream.spark.task.VertexTask``): an executor's Python must be able to
import slipstream. On a cluster it usually cannot (slipstream is installed on the
driver's machine only), and even in ``local[N]`` the executors run ``python3`` from
``PATH`` unless ``PYSPARK_PYTHON`` says otherwise. So the engine ships slipstream the
way PySpark users ship their own code: :func:`ship_slipstream` builds a zip of the
installed ``slipstream`` package (once per content: the file name carries a hash of
the sources, so a changed install gets a new zip) in a private per-user cache
directory, and adds it to the SparkContext with ``addPyFile``. Spark copies the zip to
every executor and puts it at the front of its Python workers' ``sys.path``, so the
executors run exactly the driver's slipstream, whether or not one is installed there.

slipstream's own dependency, cloudpickle, is not needed on executors: code that runs
in tasks takes it from :mod:`slipstream.core.pickling`, which falls back to the copy
PySpark bundles (Spark puts ``pyspark.zip`` on its workers' path).
"""

from __future__ import annotations

import hashlib
import io
import logging
import tempfile
import threading
import weakref
import zipfile
from pathlib import Path
from typing import Any

import slipstream
from slipstream.core.files import UnsafeDirectoryError, atomic_write, user_temp_dir

__all__ = ["package_zip", "ship_slipstream"]

log = logging.getLogger("slipstream.spark")

_CACHE_NAME = "spark-pyfiles"
#: A fixed timestamp for every zip entry, so the same sources give the same zip bytes.
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)

_lock = threading.Lock()
_zip: Path | None = None
_shipped: weakref.WeakSet[Any] = weakref.WeakSet()


def _package_root() -> Path | None:
    """The directory of the imported slipstream package, or ``None`` if it does not
    live in one (e.g. it was itself imported from a zip)."""
    origin = getattr(slipstream, "__file__", None)
    if not origin:
        return None
    root = Path(origin).resolve().parent
    return root if root.is_dir() and (root / "__init__.py").is_file() else None


def _package_files(root: Path) -> list[tuple[str, bytes]]:
    """``(name in the zip, content)`` of every source file of the package, sorted."""
    files = []
    for path in sorted(root.rglob("*")):
        if "__pycache__" in path.parts or not path.is_file():
            continue
        if path.suffix != ".py" and path.name != "py.typed":
            continue
        files.append((f"slipstream/{path.relative_to(root).as_posix()}", path.read_bytes()))
    return files


def _cache_dir() -> Path:
    try:
        return user_temp_dir(_CACHE_NAME)
    except (UnsafeDirectoryError, OSError) as exc:
        log.warning("not using the shared zip cache: %s; using a private temp dir", exc)
        return Path(tempfile.mkdtemp(prefix=f"slipstream-{_CACHE_NAME}-"))


def _write_zip(path: Path, files: list[tuple[str, bytes]]) -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in files:
            info = zipfile.ZipInfo(name, _ZIP_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, data)
    # a cache entry: readers see the whole zip or none; no fsync needed
    atomic_write(str(path), buf.getvalue(), durable=False)


def package_zip() -> Path | None:
    """The zip of the installed slipstream package (built on first use, then reused
    from the per-user cache while the sources are unchanged), or ``None`` if slipstream
    is not imported from a directory."""
    global _zip
    with _lock:
        if _zip is not None and _zip.is_file():
            return _zip
        root = _package_root()
        if root is None:
            return None
        files = _package_files(root)
        digest = hashlib.sha256()
        for name, data in files:
            digest.update(name.encode("utf-8") + b"\0" + len(data).to_bytes(8, "big") + data)
        path = _cache_dir() / f"slipstream-{digest.hexdigest()[:20]}.zip"
        if not path.is_file():
            _write_zip(path, files)
        _zip = path
        return path


def ship_slipstream(spark_context: Any) -> Path | None:
    """Make ``spark_context``'s executors import this slipstream (``addPyFile`` of
    :func:`package_zip`), once per context. Returns the zip shipped, or ``None`` when
    there is nothing to ship (slipstream not imported from a directory, or a context
    without ``addPyFile``, such as a test double): the executors must then have
    slipstream installed."""
    add = getattr(spark_context, "addPyFile", None)
    if add is None:
        return None
    with _lock:
        if spark_context in _shipped:
            return _zip
    path = package_zip()
    if path is None:
        log.warning(
            "slipstream is not imported from a directory, so it is not shipped to the "
            "executors; they must have it installed"
        )
        return None
    with _lock:
        if spark_context not in _shipped:
            add(str(path))
            _shipped.add(spark_context)
    return path
