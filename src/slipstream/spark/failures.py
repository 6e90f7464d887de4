"""Carrying a processor's exception from a Spark executor back to the driver.

Spark does not return the Python exception object of a failed task: the driver only
gets text (the worker's traceback, embedded in a ``Py4JJavaError`` or a
``PythonException``). So the executor raises :class:`ProcessorFailure`, whose message
carries a marker with an encoded payload: the vertex name, the processor's global index,
the exception's type, message and traceback, and the exception itself pickled with
cloudpickle when that is possible. The driver finds the marker in the Spark error text
(:func:`find_failure`) and turns it into :class:`slipstream.JobFailedError` naming the
vertex and processor index, with the original exception chained.

No pyspark import here: the module is used on both sides.
"""

from __future__ import annotations

import base64
import re
import traceback
import zlib
from dataclasses import dataclass
from typing import Any

import cloudpickle

__all__ = [
    "FailureInfo",
    "ProcessorFailure",
    "RemoteProcessorError",
    "encode_failure",
    "find_failure",
]

_MARKER = "slipstream-processor-failure"
_MARKER_RE = re.compile(r"\[" + _MARKER + r":([A-Za-z0-9_\-=]+)\]")

#: Bound on the pickled exception we ship back; a huge exception object is not worth it.
_MAX_PICKLED_EXCEPTION = 256 * 1024


class RemoteProcessorError(Exception):
    """Stands in for a processor's exception that could not be pickled back to the
    driver; the message has the original type name and message."""


@dataclass
class FailureInfo:
    """What the driver learns about a processor that raised on an executor."""

    vertex: str
    processor_index: int
    error_type: str
    message: str
    traceback: str
    error: BaseException

    def describe(self) -> str:
        return (
            f"vertex {self.vertex!r}, processor {self.processor_index}: "
            f"{self.error_type}: {self.message}"
        )


class ProcessorFailure(Exception):
    """Raised inside a Spark task when a processor (or its supplier) fails.

    The message starts with a one-line marker that :func:`find_failure` decodes on the
    driver; the rest is human-readable for Spark's own logs.
    """

    def __init__(self, text: str) -> None:
        super().__init__(text)

    def __reduce__(self) -> tuple[Any, ...]:
        return (ProcessorFailure, (str(self),))


def encode_failure(vertex: str, processor_index: int, error: BaseException) -> ProcessorFailure:
    """Wrap ``error`` raised by processor ``processor_index`` of ``vertex``."""
    tb = "".join(traceback.format_exception(error))
    pickled: bytes | None
    try:
        pickled = cloudpickle.dumps(error)
        if len(pickled) > _MAX_PICKLED_EXCEPTION:
            pickled = None
    except Exception:  # noqa: BLE001 - an unpicklable exception is shipped as text
        pickled = None
    payload = {
        "vertex": vertex,
        "index": processor_index,
        "type": type(error).__qualname__,
        "message": str(error),
        "traceback": tb,
        "pickled": pickled,
    }
    blob = base64.urlsafe_b64encode(zlib.compress(cloudpickle.dumps(payload))).decode("ascii")
    text = (
        f"[{_MARKER}:{blob}]\n"
        f"vertex {vertex!r}, processor {processor_index} failed: "
        f"{type(error).__qualname__}: {error}"
    )
    return ProcessorFailure(text)


def find_failure(text: str) -> FailureInfo | None:
    """Decode the first processor failure marker in ``text`` (a Spark error message)."""
    match = _MARKER_RE.search(text)
    if match is None:
        return None
    try:
        payload = cloudpickle.loads(zlib.decompress(base64.urlsafe_b64decode(match.group(1))))
    except Exception:  # noqa: BLE001 - a garbled marker is treated as "not found"
        return None
    error: BaseException | None = None
    if payload.get("pickled") is not None:
        try:
            loaded = cloudpickle.loads(payload["pickled"])
            if isinstance(loaded, BaseException):
                error = loaded
        except Exception:  # noqa: BLE001 - e.g. the exception's class is not importable here
            error = None
    if error is None:
        error = RemoteProcessorError(f"{payload['type']}: {payload['message']}")
    return FailureInfo(
        vertex=payload["vertex"],
        processor_index=int(payload["index"]),
        error_type=payload["type"],
        message=payload["message"],
        traceback=payload["traceback"],
        error=error,
    )
