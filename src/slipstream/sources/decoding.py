"""Saying where text could not be decoded: file, line, column and byte offset.

The batch file readers decode whole blocks (64 Ki characters at a time for
``read_files``), which is what makes them fast, and a ``UnicodeDecodeError`` raised there
knows only its position in the block. Nothing is counted on the hot path; when decoding
fails, :func:`locate_decode_error` reads the file again from its start, decoding as the
reader did, and counts lines up to the first byte that does not decode (an error path:
linear in the bytes before it). The streaming sources decode line by line and know the
line already; they only need :func:`describe_decode_error`.
"""

from __future__ import annotations

import codecs
import io
from typing import NamedTuple

__all__ = ["DecodeErrorPlace", "describe_decode_error", "locate_decode_error"]

_LOCATE_CHUNK = 1 << 20


class DecodeErrorPlace(NamedTuple):
    """Where a file first fails to decode: 1-based ``line`` and ``column`` (in
    characters), the ``offset`` of the first bad byte in the file, and the error."""

    line: int
    column: int
    offset: int
    error: UnicodeDecodeError


def describe_decode_error(
    error: UnicodeDecodeError, encoding: str, column: int | None = None, offset: int | None = None
) -> str:
    """``invalid UTF-8 (byte 0xff at column 4, offset 1234 in the file: invalid start
    byte)``; ``column`` and ``offset`` are left out when not given."""
    bad = error.object[error.start : error.end]
    shown = " ".join(f"0x{b:02x}" for b in bad[:8]) + (" ..." if len(bad) > 8 else "")
    place = [f"{'byte' if len(bad) == 1 else 'bytes'} {shown}"]
    if column is not None:
        place[0] += f" at column {column}"
    if offset is not None:
        place.append(f"offset {offset} in the file")
    return f"invalid {_encoding_name(encoding)} ({', '.join(place)}: {error.reason})"


def _encoding_name(encoding: str) -> str:
    try:
        name = codecs.lookup(encoding).name
    except LookupError:
        return encoding
    return "UTF-8" if name == "utf-8" else name


def locate_decode_error(path: str, encoding: str) -> DecodeErrorPlace | None:
    """The first place where ``path`` does not decode as ``encoding`` (lines end with
    ``"\\n"``, ``"\\r\\n"`` or ``"\\r"``), or ``None`` if it decodes (it changed since)."""
    decoder = codecs.getincrementaldecoder(encoding)("strict")
    newlines = io.IncrementalNewlineDecoder(None, translate=True)
    line = 1
    column = 1
    offset = 0  # bytes read before the current chunk

    def count(text: str, final: bool = False) -> None:
        nonlocal line, column
        text = newlines.decode(text, final)
        breaks = text.count("\n")
        if breaks:
            line += breaks
            column = len(text) - text.rindex("\n")
        else:
            column += len(text)

    with open(path, "rb") as fh:
        while True:
            data = fh.read(_LOCATE_CHUNK)
            held = len(decoder.getstate()[0])  # bytes of the previous chunk not decoded
            try:
                count(decoder.decode(data, final=not data))
            except UnicodeDecodeError as e:
                # the decoder keeps its state when it raises: decode what precedes the
                # bad bytes (in this chunk; it may start in the bytes held back)
                if e.start > held:
                    count(decoder.decode(data[: e.start - held]))
                count("", final=True)
                return DecodeErrorPlace(line, column, offset - held + e.start, e)
            if not data:
                return None
            offset += len(data)
