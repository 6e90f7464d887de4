"""Splitting a byte stream into lines in linear time, with a bound on line length.

The streaming text sources (``stream_files``, ``stream_socket``) receive bytes in chunks
of any size. Joining the unfinished tail of the previous chunk to each new chunk and
splitting again costs time quadratic in the length of a long line (a 200 MB line without
a line break froze the engine). :class:`LineAssembler` looks for line breaks only in the
new bytes and keeps an unfinished line as a list of pieces, joined once when its break
arrives: linear time. A line longer than ``max_line_bytes`` is not kept: the assembler
raises :class:`LineTooLongError` (the caller names the file/connection and the line), or
with ``skip_long`` forgets its bytes up to the next line break and returns a
:class:`SkippedLine` in its place.
"""

from __future__ import annotations

from typing import Any

from slipstream.sources.decoding import describe_decode_error

__all__ = [
    "BAD_LINES",
    "DEFAULT_MAX_LINE_BYTES",
    "LineAssembler",
    "LineTooLongError",
    "SkippedLine",
    "check_line_options",
    "decode_line",
]

DEFAULT_MAX_LINE_BYTES = 8 * 1024 * 1024
"""The default longest line the streaming text sources accept (8 MiB)."""

BAD_LINES = ("fail", "skip")
"""What a streaming text source does with a line that is too long or cannot be decoded:
fail the job with an error naming the file (or connection) and the line, or skip it and
count it in the ``bad_lines_skipped`` metric."""


class LineTooLongError(ValueError):
    """A line grew beyond the maximum line length before its line break arrived."""

    def __init__(self, length: int, limit: int, complete_before: int = 0) -> None:
        super().__init__(f"line longer than {limit} bytes (at least {length})")
        self.length = length
        self.limit = limit
        # complete lines the same feed() found before this one (they are not returned)
        self.complete_before = complete_before


class SkippedLine:
    """Stands for a line that was too long (``skip_long``); ``length`` is its length in
    bytes without the line break."""

    __slots__ = ("length",)

    def __init__(self, length: int) -> None:
        self.length = length

    def __repr__(self) -> str:
        return f"SkippedLine({self.length})"


class LineAssembler:
    """Feed bytes with :meth:`feed`; get the complete lines (``bytes`` without ``\\n``,
    or a :class:`SkippedLine`). Memory holds at most ``max_line_bytes`` of an unfinished
    line."""

    __slots__ = ("max_line_bytes", "skip_long", "_parts", "_pending", "_skipping")

    def __init__(self, max_line_bytes: int | None = DEFAULT_MAX_LINE_BYTES, skip_long: bool = False) -> None:
        self.max_line_bytes = max_line_bytes
        self.skip_long = skip_long
        self._parts: list[bytes] = []
        self._pending = 0  # bytes of the unfinished line (also while skipping it)
        self._skipping = False

    @property
    def pending(self) -> int:
        """Bytes of the unfinished line received so far."""
        return self._pending

    def feed(self, data: bytes) -> list[Any]:
        out: list[Any] = []
        limit = self.max_line_bytes
        start = 0
        find = data.find
        while True:
            i = find(b"\n", start)
            if i < 0:
                break
            n = self._pending + i - start
            if self._skipping:
                out.append(SkippedLine(n))
                self._skipping = False
            elif limit is not None and n > limit:
                self._too_long(n, len(out))
                self._parts = []
                out.append(SkippedLine(n))
            elif self._parts:
                self._parts.append(data[start:i])
                out.append(b"".join(self._parts))
                self._parts = []
            else:
                out.append(data[start:i])
            self._pending = 0
            start = i + 1
        rest = len(data) - start
        if rest:
            self._pending += rest
            if not self._skipping:
                if limit is not None and self._pending > limit:
                    self._too_long(self._pending, len(out))
                    self._parts = []
                    self._skipping = True
                else:
                    self._parts.append(data[start:] if start else data)
        return out

    def _too_long(self, n: int, complete_before: int) -> None:
        assert self.max_line_bytes is not None
        if not self.skip_long:
            raise LineTooLongError(n, self.max_line_bytes, complete_before)

    def finish(self) -> Any:
        """The end of the stream: the unfinished last line (``bytes`` or a
        :class:`SkippedLine`), or ``None`` if there is none."""
        if not self._pending:
            return None
        n = self._pending
        line: Any = SkippedLine(n) if self._skipping else b"".join(self._parts)
        self._parts = []
        self._pending = 0
        self._skipping = False
        return line


BAD_LINES_METRIC = "bad_lines_skipped"


def decode_line(
    raw: Any, encoding: str, where: str, line_no: int, skip: bool, offset: int | None = None
) -> str | None:
    """``raw`` (bytes or :class:`SkippedLine`) as text without a trailing ``\r``; ``None``
    for a line to skip (too long, or not decodable when ``skip``). ``where`` names the
    connection in the error (``<where>, line <n>``), or, given the byte ``offset`` where
    the line starts, the file (``<where>:<n>``, the offset of the bad byte too)."""
    if type(raw) is SkippedLine:
        return None
    try:
        line: str = raw.decode(encoding)
    except UnicodeDecodeError as e:
        if skip:
            return None
        column = len(raw[: e.start].decode(encoding, "replace")) + 1
        at = f"{where}, line {line_no}" if offset is None else f"{where}:{line_no}"
        bad_at = None if offset is None else offset + e.start
        raise ValueError(
            f"{at}: {describe_decode_error(e, encoding, column, bad_at)} "
            "(bad_lines='skip' skips and counts such lines)"
        ) from e
    if line and line[-1] == "\r":
        line = line[:-1]
    return line


def check_line_options(where: str, max_line_length: Any, bad_lines: Any) -> None:
    """``max_line_length``: a positive int or ``None`` (no limit); ``bad_lines``: one of
    :data:`BAD_LINES`."""
    if max_line_length is not None and (
        not isinstance(max_line_length, int) or isinstance(max_line_length, bool) or max_line_length < 1
    ):
        raise ValueError(f"{where}: max_line_length must be an int >= 1 or None, got {max_line_length!r}")
    if bad_lines not in BAD_LINES:
        raise ValueError(f"{where}: bad_lines must be 'fail' or 'skip', got {bad_lines!r}")
