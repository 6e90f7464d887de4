"""Carrying a processor's exception from a Spark executor back to the driver, safely.

Spark does not return the Python exception object of a failed task: the driver only
gets text (the worker's traceback, embedded in a ``Py4JJavaError`` or a
``PythonException``). That text also holds whatever the processor's own exception said,
and exception messages often quote input records (``int('...')`` does), so anything in
it may have been written by the data. Hence:

* the executor raises :class:`ProcessorFailure`, whose message carries a marker
  ``[slipstream-processor-failure:<payload>:<mac>]``; the payload is plain data (JSON:
  vertex, processor index, the exception's type, message and traceback) and the mac is
  an HMAC-SHA256 of it under a random key made for the job on the driver
  (:func:`new_failure_key`) and shipped inside the task closure, which the data never
  sees;
* the driver (:func:`find_failure`) accepts only a marker whose mac verifies under the
  job's key, so a record cannot forge one, and decodes it as JSON: nothing found in
  error text is ever unpickled. The processor's exception comes back as an instance of
  its built-in type (``ValueError``, ``KeyError``, ...) when it is one, otherwise as
  :class:`RemoteProcessorError` carrying the type's name and the message.

No pyspark import here: the module is used on both sides.
"""

from __future__ import annotations

import base64
import builtins
import hashlib
import hmac
import json
import re
import secrets
import traceback
import zlib
from dataclasses import dataclass
from typing import Any

from slipstream.core.errors import JobFailedError, trim_driver_frames
from slipstream.core.item_errors import on_item

__all__ = [
    "FailureInfo",
    "ProcessorFailure",
    "RemoteProcessorError",
    "encode_failure",
    "find_failure",
    "new_failure_key",
    "environment_problem",
    "summarize_spark_error",
    "thread_died_error",
]

_MARKER = "slipstream-processor-failure"
_MARKER_RE = re.compile(r"\[" + _MARKER + r":([A-Za-z0-9_\-=]+):([0-9a-f]{64})\]")

#: Bounds on what a marker carries (the text travels inside Spark's error messages).
_MAX_MESSAGE = 4000
_MAX_TRACEBACK = 32000
#: A verified payload is still decompressed with a bound (defence in depth).
_MAX_PAYLOAD = 256 * 1024


class RemoteProcessorError(Exception):
    """Stands in for a processor's exception whose type is not a built-in one: the
    message is ``"<type>: <message>"``; ``error_type`` is the type's qualified name."""

    def __init__(self, message: str, error_type: str = "") -> None:
        super().__init__(message)
        self.error_type = error_type

    def __reduce__(self) -> tuple[Any, ...]:
        return (RemoteProcessorError, (str(self), self.error_type))


@dataclass
class FailureInfo:
    """What the driver learns about a processor that raised on an executor."""

    vertex: str
    processor_index: int
    error_type: str
    message: str
    traceback: str
    error: BaseException
    #: ``", on item 'x'"`` when the processor named the item it failed on
    on_item: str = ""

    def describe(self) -> str:
        return (
            f"vertex {self.vertex!r}, processor {self.processor_index}{self.on_item}: "
            f"{self.error_type}: {self.message}"
        )


class ProcessorFailure(Exception):
    """Raised inside a Spark task when a processor (or its supplier) fails.

    The message starts with a one-line signed marker that :func:`find_failure` decodes
    on the driver; the rest is human-readable for Spark's own logs.
    """

    def __init__(self, text: str) -> None:
        super().__init__(text)

    def __reduce__(self) -> tuple[Any, ...]:
        return (ProcessorFailure, (str(self),))


def new_failure_key() -> bytes:
    """A fresh random key for one job's failure markers."""
    return secrets.token_bytes(32)


def _mac(key: bytes, blob: str) -> str:
    return hmac.new(key, blob.encode("ascii"), hashlib.sha256).hexdigest()


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 15] + "... (truncated)"


def encode_failure(
    vertex: str, processor_index: int, error: BaseException, key: bytes
) -> ProcessorFailure:
    """Wrap ``error`` raised by processor ``processor_index`` of ``vertex`` in a
    :class:`ProcessorFailure` whose marker is signed with the job's ``key``."""
    try:
        message = str(error)
    except Exception:  # noqa: BLE001 - a broken __str__ must not hide the failure
        message = f"<unprintable {type(error).__qualname__}>"
    payload = {
        "vertex": vertex,
        "index": processor_index,
        "type": type(error).__qualname__,
        "module": type(error).__module__,
        "message": _clip(message, _MAX_MESSAGE),
        "traceback": _clip(
            "".join(traceback.format_exception(trim_driver_frames(error))), _MAX_TRACEBACK
        ),
        "on_item": _clip(on_item(error), _MAX_MESSAGE),
    }
    raw = json.dumps(payload, ensure_ascii=True).encode("ascii")
    blob = base64.urlsafe_b64encode(zlib.compress(raw)).decode("ascii")
    first = message.splitlines()[0] if message else ""
    text = (
        f"[{_MARKER}:{blob}:{_mac(key, blob)}]\n"
        f"vertex {vertex!r}, processor {processor_index} failed: "
        f"{type(error).__qualname__}: {_clip(first, 500)}"
    )
    return ProcessorFailure(text)


def find_failure(text: str, key: bytes) -> FailureInfo | None:
    """The first processor failure marker in ``text`` (a Spark error message) that was
    signed with ``key``; markers that do not verify (forged by data, or another job's)
    are ignored."""
    if not key:
        return None
    for match in _MARKER_RE.finditer(text):
        blob, mac = match.group(1), match.group(2)
        if not hmac.compare_digest(_mac(key, blob), mac):
            continue
        info = _decode(blob)
        if info is not None:
            return info
    return None


def _decode(blob: str) -> FailureInfo | None:
    try:
        inflater = zlib.decompressobj()
        raw = inflater.decompress(base64.urlsafe_b64decode(blob), _MAX_PAYLOAD)
        payload = json.loads(raw.decode("ascii"))
        vertex = payload["vertex"]
        index = payload["index"]
        error_type = payload["type"]
        module = payload["module"]
        message = payload["message"]
        tb = payload["traceback"]
        item = payload.get("on_item", "")
    except (ValueError, KeyError, TypeError, AttributeError, zlib.error):
        return None
    if not (
        isinstance(vertex, str)
        and type(index) is int
        and all(isinstance(s, str) for s in (error_type, module, message, tb, item))
    ):
        return None
    return FailureInfo(
        vertex=vertex,
        processor_index=index,
        error_type=error_type,
        message=message,
        traceback=tb,
        error=_rebuild(module, error_type, message),
        on_item=item,
    )


def _rebuild(module: str, error_type: str, message: str) -> BaseException:
    """The processor's exception as plain data allows: an instance of a built-in
    exception type (constructed from its message only), else a stand-in."""
    if module == "builtins":
        cls = getattr(builtins, error_type, None)
        if isinstance(cls, type) and issubclass(cls, Exception):
            try:
                return cls(message)
            except Exception:  # noqa: BLE001 - e.g. UnicodeDecodeError needs 5 arguments
                pass
    name = error_type if module == "builtins" else f"{module}.{error_type}"
    return RemoteProcessorError(f"{name}: {message}", name)


# -- failures that are not a processor's: one short line naming the cause and the fix ----

_VERSION_MISMATCH_RE = re.compile(
    r"Python in worker has different version:? *(\d+\.\d+) than that in driver:? *(\d+\.\d+)"
)
_NO_PROGRAM_RE = re.compile(r'Cannot run program "([^"]+)"(?:[^:\n]*: *([^\n]*))?')
_NO_MODULE_RE = re.compile(r"ModuleNotFoundError: No module named '([^']+)'")
_PY_TRACEBACK = "Traceback (most recent call last):"
_SPARK_LINE_RE = re.compile(r"^[\s:]*((?:org\.apache\.|java\.|scala\.)[\w.$]+(?:Exception|Error)):(.*)$")


def environment_problem(text: str) -> str | None:
    """The cause and fix of a failure that says the executors cannot run slipstream's
    Python at all (wrong Python version, no interpreter, a module the executors lack),
    or ``None``."""
    m = _VERSION_MISMATCH_RE.search(text)
    if m is not None:
        worker, driver = m.group(1), m.group(2)
        return (
            f"the executors run Python {worker} but the driver runs Python {driver}, and "
            "PySpark needs the same minor version on both. Fix: set PYSPARK_PYTHON (before "
            f"the SparkContext starts) to a Python {driver} interpreter that exists on every "
            f"executor, or run the driver with Python {worker}"
        )
    m = _NO_PROGRAM_RE.search(text)
    if m is not None:
        reason = (m.group(2) or "").strip().rstrip(")")
        return (
            f"the executors cannot start the Python interpreter {m.group(1)!r}"
            + (f" ({reason})" if reason else "")
            + ". Fix: set PYSPARK_PYTHON (before the SparkContext starts) to a Python "
            "interpreter that exists on every executor"
        )
    m = _NO_MODULE_RE.search(text)
    if m is not None:
        return (
            f"the executors cannot import module {m.group(1)!r}, which the job's code "
            "needs (the driver can). Fix: install it where the executors' Python finds it, "
            "ship it with spark_context.addPyFile(<zip of the package>), or, for your own "
            "module, pyspark.cloudpickle.register_pickle_by_value(<module>)"
        )
    return None


def summarize_spark_error(text: str, limit: int = 500) -> str:
    """One line saying why a Spark action failed: the final exception of the last
    Python traceback in ``text`` if there is one (the worker's real error), else the
    first Spark/Java exception line. Never ends at PySpark's "An exception was thrown
    from the Python worker:" preamble."""
    line = ""
    at = text.rfind(_PY_TRACEBACK)
    if at >= 0:
        for candidate in text[at + len(_PY_TRACEBACK) :].splitlines():
            if candidate and not candidate[0].isspace():
                line = candidate.strip()
                break
    if not line:
        for candidate in text.splitlines():
            m = _SPARK_LINE_RE.match(candidate)
            if m is not None and m.group(2).strip():
                line = f"{m.group(1)}:{m.group(2)}".strip()
                break
    if not line:
        lines = [s.strip() for s in text.splitlines() if s.strip()]
        line = lines[0] if lines else "unknown error"
    return _clip(line, limit)


def thread_died_error(job_name: str, thread: str, exc: BaseException) -> JobFailedError:
    """The error of a job whose driver-side ``thread`` died of ``exc`` (a bug, or an
    exception no handler expected): the job fails instead of never ending."""
    err = JobFailedError(
        f"job {job_name!r} failed: its driver thread {thread!r} died of "
        f"{type(exc).__name__}: {exc}",
        cause=exc,
    )
    err.__cause__ = exc
    return err
