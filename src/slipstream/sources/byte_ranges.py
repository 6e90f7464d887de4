"""Byte ranges of line-oriented files: how ``read_files`` and ``read_jsonl`` split their
input over processors by bytes, not by file.

With a split by file, two large files and four processors leave two processors idle, and
one file read by one processor is the whole job's speed. A *piece* ``(name, start, end)``
stands for the lines of file ``name`` whose first byte lies in ``[start, end)``: a
reader of a piece starting past 0 begins at the first line start at or after ``start``
and reads on through the line that crosses ``end`` (Hadoop's rule for text splits).
Pieces that tile a file therefore read each of its lines exactly once, wherever the cuts
fall, so a cut never needs to look at the data: :func:`split_pieces` cuts the total
bytes of all pieces into equal shares, one per processor.

Line ends are those of Python's universal newlines (``\\n``, ``\\r\\n`` and a lone
``\\r``), found as bytes. That is right only for encodings where those bytes are never
part of another character: UTF-8 and the single-byte charsets (:func:`splittable`).
UTF-16 and other multi-byte encodings keep the split by file, and so do CSV (a quoted
field may hold a line break, and where a field starts cannot be told from a byte in the
middle of the file) and Parquet (whole-file format).
"""

from __future__ import annotations

import codecs
import functools
import os
import re
from typing import BinaryIO

__all__ = ["LineRange", "Piece", "count_line_ends", "next_line_start", "split_pieces", "splittable"]

#: ``(file name relative to the source's directory, start, end)``
Piece = tuple[str, int, int]

_SCAN = 1 << 16
_TERMINATOR = re.compile(rb"\r\n|\r|\n")


@functools.lru_cache(maxsize=64)
def splittable(encoding: str) -> bool:
    """Whether files in ``encoding`` can be cut at ``\\n`` / ``\\r`` bytes: UTF-8, or a
    stateless charset with one byte per character whose bytes 10 and 13 are those
    characters (latin-1, cp1252, ascii, ...)."""
    name = codecs.lookup(encoding).name
    if name in ("utf-8", "utf-8-sig"):
        return True
    try:
        chars = bytes(range(256)).decode(encoding, errors="replace")
        ends = "\n\r".encode(encoding)
    except (UnicodeError, LookupError, TypeError):
        return False
    return len(chars) == 256 and chars[10] == "\n" and chars[13] == "\r" and ends == b"\n\r"


def split_pieces(pieces: list[Piece], n: int) -> list[list[Piece]]:
    """``pieces`` (in reading order) cut into ``n`` shares of equal bytes: share ``i``
    holds bytes ``[i * T / n, (i + 1) * T / n)`` of the pieces laid end to end. Empty
    pieces are dropped; a share may be empty."""
    pieces = [p for p in pieces if p[2] > p[1]]  # a range read past its end has nothing left
    total = sum(e - s for _, s, e in pieces)
    shares: list[list[Piece]] = [[] for _ in range(n)]
    done = 0  # bytes of the concatenation before the current piece
    for name, start, end in pieces:
        size = end - start
        first = done * n // total
        for i in range(first, n):
            lo = max(i * total // n, done)
            hi = min((i + 1) * total // n, done + size)
            if lo >= hi:
                if (i + 1) * total // n >= done + size:
                    break
                continue
            shares[i].append((name, start + lo - done, start + hi - done))
            if hi >= done + size:
                break
        done += size
    return shares


def next_line_start(fh: BinaryIO, pos: int, size: int) -> int:
    """The first offset ``>= pos`` where a line starts (``0`` is one; so is ``size``):
    the byte before it ends a line, and it is not the ``\\n`` of a ``\\r\\n``."""
    if pos <= 0:
        return 0
    if pos >= size:
        return size
    at = pos - 1
    fh.seek(at)
    while True:
        data = fh.read(_SCAN + 1)
        if not data:
            return size
        nl = data.find(b"\n", 0, _SCAN)
        cr = data.find(b"\r", 0, _SCAN)
        if nl < 0 and cr < 0:
            if len(data) <= _SCAN:
                return size
            at += _SCAN
            fh.seek(at)
            continue
        if cr < 0 or 0 <= nl < cr:
            return at + nl + 1
        # cr < _SCAN and _SCAN + 1 bytes were read: the next byte is here if the file has it
        return at + cr + (2 if data[cr + 1 : cr + 2] == b"\n" else 1)


def count_line_ends(fh: BinaryIO, start: int, end: int) -> int:
    """The number of line ends in bytes ``[start, end)`` (``start`` and ``end`` line
    starts): for line numbers in error messages, counted only when one is needed."""
    fh.seek(start)
    count = 0
    left = end - start
    last = b""
    while left > 0:
        data = fh.read(min(left, 1 << 20))
        if not data:
            break
        left -= len(data)
        count += data.count(b"\n") + data.count(b"\r") - data.count(b"\r\n")
        if last == b"\r" and data[:1] == b"\n":
            count -= 1
        last = data[-1:]
    return count


class LineRange:
    """Reads the lines of one piece in blocks of bytes, each cut after its last line end
    and decoded at once (one decode and one ``str.split`` per block). Lines come without
    their endings, ``\\r\\n`` and ``\\r`` read as ``\\n`` ends.

    ``position()`` is the byte offset of the first line not handed out yet (always a
    line start, so a piece ``(name, position(), end)`` is exactly what is left)."""

    def __init__(self, path: str, start: int, end: int, encoding: str, block: int) -> None:
        fh = self._fh = open(path, "rb", buffering=0)  # noqa: SIM115 - closed in close()
        try:
            size = os.fstat(fh.fileno()).st_size
            self.path = path
            self.start = next_line_start(fh, start, size)
            self.stop = next_line_start(fh, end, size) if end < size else size
            fh.seek(self.start)
        except BaseException:
            fh.close()
            raise
        self._encoding = encoding
        # a BOM is only at the start of the file: later blocks decode without it
        self._later_encoding = "utf-8" if codecs.lookup(encoding).name == "utf-8-sig" else encoding
        self._block = max(1, block)
        self._read_to = self.start  # bytes read from the file so far
        self._pending = b""  # the start of a line the next block goes on with
        self.block_at = self.start  # offset of the current block's first line
        self._raw = b""  # the current block's bytes (whole lines)
        self.lines: list[str] = []  # the current block's lines
        self.pos = 0  # lines of the block handed out
        self._line_base: tuple[int, int] | None = None  # (offset, line number there)

    @property
    def done(self) -> bool:
        return self.pos >= len(self.lines) and self._read_to >= self.stop and not self._pending

    def take(self, room: int) -> list[str]:
        """Up to ``room`` lines of the current block (the next block when it is used
        up); ``[]`` only at the end of the piece."""
        lines, pos = self.lines, self.pos
        if pos >= len(lines):
            if not self._next_block():
                return []
            lines, pos = self.lines, 0
        if pos == 0 and len(lines) <= room:
            self.pos = len(lines)
            return lines
        end = pos + room
        self.pos = min(end, len(lines))
        return lines[pos:end]

    def _next_block(self) -> bool:
        fh = self._fh
        buf = self._pending
        while True:
            at_end = self._read_to >= self.stop
            if not at_end:
                data = fh.read(min(self._block, self.stop - self._read_to))
                if not data:  # the file shrank meanwhile: what is there is the end
                    self._read_to = self.stop
                    at_end = True
                else:
                    self._read_to += len(data)
                    buf += data
                    at_end = self._read_to >= self.stop
            if at_end:
                cut = len(buf)
            else:
                cut = max(buf.rfind(b"\n"), buf.rfind(b"\r", 0, len(buf) - 1)) + 1
                if cut == 0:  # no line ends in this block (a long line)
                    continue
            if cut == 0:
                self._pending = b""
                return False
            raw, self._pending = buf[:cut], buf[cut:]
            self.block_at += len(self._raw)
            self._raw = raw
            encoding = self._encoding if self.block_at == 0 else self._later_encoding
            text = raw.decode(encoding)
            if "\r" in text:
                text = text.replace("\r\n", "\n").replace("\r", "\n")
            lines = text.split("\n")
            if text.endswith("\n"):
                lines.pop()
            self.lines, self.pos = lines, 0
            return True

    def position(self) -> int:
        """The byte offset of the first line not handed out yet."""
        pos = self.pos
        if pos == 0:
            return self.block_at
        if pos >= len(self.lines):
            return self.block_at + len(self._raw)
        end = 0
        for i, m in enumerate(_TERMINATOR.finditer(self._raw), 1):
            if i == pos:
                end = m.end()
                break
        return self.block_at + end

    def line_number(self, index: int) -> int:
        """The 1-based line number in the file of line ``index`` of the current block
        (counting line ends from the start of the file once, then on from there)."""
        base = self._line_base
        if base is None or base[0] > self.block_at:
            base = (0, 1)
        offset, line = base
        if offset < self.block_at:
            line += count_line_ends(self._fh, offset, self.block_at)
            self._fh.seek(self._read_to)
        self._line_base = (self.block_at, line)
        return line + index

    def close(self) -> None:
        self._fh.close()
