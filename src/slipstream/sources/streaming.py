"""Streaming sources: a TCP socket, a watched directory, and a synthetic generator.

These sources never run out of data on their own (the socket source ends when the server
closes the connection; the generator can be bounded with ``max_items``). They all stop
promptly when the job is cancelled: cooperative ones simply stop being called, the
non-cooperative socket reader returns from every blocking read within a short timeout so
its thread notices the cancellation.

Sources that can run dry mark themselves *idle* (they offer
:data:`~slipstream.core.items.IDLE_MESSAGE`) after ``idle_timeout_ms`` without data, so
that a quiet source does not hold back the watermark of the processors downstream; the
first new item makes them active again.
"""

from __future__ import annotations

import fnmatch
import functools
import math
import os
import socket
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from slipstream.core.items import IDLE_MESSAGE
from slipstream.core.net import connect_tcp
from slipstream.core.partition import stable_hash
from slipstream.core.processor import AbstractProcessor, Context, Processor
from slipstream.core.suppliers import (
    FactorySupplier,
    ProcessorMetaSupplier,
    SameSupplierMetaSupplier,
)
from slipstream.core.validation import check_encoding, check_fn, check_port
from slipstream.sources.lines import (
    BAD_LINES_METRIC,
    DEFAULT_MAX_LINE_BYTES,
    LineAssembler,
    LineTooLongError,
    SkippedLine,
    check_line_options,
    decode_line,
)
from slipstream.state.keys import BroadcastKey

__all__ = [
    "stream_socket",
    "stream_files",
    "generator",
    "StreamSocketP",
    "StreamFilesP",
    "GeneratorP",
]

#: How long one blocking socket read may wait before the reader returns to the engine
#: (which is how a non-cooperative processor notices cancellation).
SOCKET_READ_TIMEOUT_S = 0.05
#: Upper bound of items the generator emits in one call (keeps a call well under 1 ms).
GENERATOR_MAX_PER_CALL = 1024
#: Bytes ``stream_files`` reads from one file in one call.
FILE_READ_CHUNK = 32 * 1024


def _check_line_encoding(where: str, encoding: str) -> None:
    check_encoding(encoding, where)
    if "\n".encode(encoding) != b"\n":
        raise ValueError(
            f"{where}: encoding {encoding!r} does not write a line break as the byte "
            "0x0A; use an ASCII-compatible encoding such as utf-8"
        )


def _check_idle_timeout(where: str, idle_timeout_ms: float | None) -> None:
    if idle_timeout_ms is not None and not idle_timeout_ms >= 0:
        raise ValueError(
            f"{where}: idle_timeout_ms must be >= 0 or None (never idle), got {idle_timeout_ms!r}"
        )


class _IdleMarkingSource(AbstractProcessor):
    """A source that can run dry: after ``idle_timeout_s`` without data it offers
    :data:`IDLE_MESSAGE` once; new data makes it active again (module docstring)."""

    def __init__(self, idle_timeout_ms: float | None) -> None:
        self.idle_timeout_s = None if idle_timeout_ms is None else idle_timeout_ms / 1000.0
        self._idle = False
        self._last_data = 0.0

    def _mark_active(self) -> None:
        """Data came (or the source started): the idle timeout starts again."""
        self._last_data = time.monotonic()
        self._idle = False

    def _maybe_idle(self) -> None:
        t = self.idle_timeout_s
        if (
            t is not None
            and not self._idle
            and time.monotonic() - self._last_data >= t
            and self.outbox.offer(IDLE_MESSAGE)
        ):
            self._idle = True


# ---------------------------------------------------------------------------------------
# stream_socket
# ---------------------------------------------------------------------------------------


class StreamSocketP(_IdleMarkingSource):
    """Reads text lines from a TCP server and emits each line (without its line break).

    Why non-cooperative: reading a socket is blocking I/O, and a blocking processor gets a
    thread of its own plus a blocking outbox from the engine, which keeps the cooperative
    workers free. Every read waits at most :data:`SOCKET_READ_TIMEOUT_S`, so ``complete()``
    returns regularly and the thread notices a cancelled job within that time.

    Only the processor with global index 0 connects; all others complete at once (one
    connection per job, whatever the parallelism). The source completes when the server
    closes the connection; a last line without a line break is emitted then. ``"\\r\\n"``
    line ends lose their ``"\\r"`` too.

    Snapshots: the socket cannot be rewound, so there is no state to save; after a restart
    the source reconnects and reads whatever the server sends from then on (at-most-once
    for lines in flight at the failure).
    """

    def __init__(
        self,
        host: str,
        port: int,
        encoding: str = "utf-8",
        idle_timeout_ms: float | None = 1000,
        connect_timeout_s: float = 10.0,
        max_line_length: int | None = DEFAULT_MAX_LINE_BYTES,
        bad_lines: str = "fail",
    ) -> None:
        super().__init__(idle_timeout_ms)
        self.host = host
        self.port = port
        self.encoding = encoding
        self.connect_timeout_s = connect_timeout_s
        self._sock: socket.socket | None = None
        self._reader = False
        self._lines: Iterator[str] | None = None
        self._skip = bad_lines == "skip"
        self._assembler = LineAssembler(max_line_length, self._skip)
        self._line_no = 0
        self._eof = False

    def is_cooperative(self) -> bool:
        return False

    def init_processor(self, context: Context) -> None:
        self._reader = context.global_processor_index == 0
        if not self._reader:
            return
        self._sock = connect_tcp(
            self.host,
            self.port,
            self.connect_timeout_s,
            SOCKET_READ_TIMEOUT_S,
            f"stream_socket (vertex {context.vertex_name!r})",
        )
        self._mark_active()

    def complete(self) -> bool:
        if not self._reader:
            return True
        lines = self._lines
        if lines is not None:
            if not self.emit_from(lines):
                return False
            self._lines = None
        if self._eof:
            return True
        sock = self._sock
        if sock is None:
            raise ConnectionError(f"stream_socket: connection to {self.host}:{self.port} is closed")
        try:
            data = sock.recv(65536)
        except TimeoutError:
            self._maybe_idle()
            return False
        except OSError as e:
            raise ConnectionError(
                f"stream_socket: reading from {self.host}:{self.port} failed: {e}"
            ) from e
        where = f"stream_socket {self.host}:{self.port}"
        try:
            if data:
                raw = self._assembler.feed(data)
            else:
                self._eof = True
                last = self._assembler.finish()
                raw = [] if last is None else [last]
        except LineTooLongError as e:
            raise ValueError(
                f"{where}, line {self._line_no + e.complete_before + 1}: {e} (max_line_length; bad_lines='skip' "
                "skips and counts such lines)"
            ) from e
        self._mark_active()
        parts = []
        skipped = 0
        for r in raw:
            self._line_no += 1
            line = decode_line(r, self.encoding, where, self._line_no, self._skip)
            if line is None:
                skipped += 1
            else:
                parts.append(line)
        if skipped:
            self.context.increment_metric(BAD_LINES_METRIC, skipped)
        if not parts:
            return self._eof
        it = iter(parts)
        if not self.emit_from(it):
            self._lines = it
            return False
        return self._eof

    def close(self) -> None:
        sock = self._sock
        self._sock = None
        if sock is not None:
            sock.close()


def stream_socket(
    host: str,
    port: int,
    encoding: str = "utf-8",
    *,
    idle_timeout_ms: float | None = 1000,
    connect_timeout_s: float = 10.0,
    max_line_length: int | None = DEFAULT_MAX_LINE_BYTES,
    bad_lines: str = "fail",
) -> ProcessorMetaSupplier:
    """A source that connects to the TCP server at ``host:port`` and emits every line it
    receives, decoded with ``encoding``, as a ``str`` without the line break.

    The source completes when the server closes the connection. One processor (global
    index 0) does the reading, so the vertex defaults to local parallelism 1; any other
    processors finish at once. After ``idle_timeout_ms`` without data the source marks
    itself idle (``None``: never). A refused connection fails the job with a
    ``ConnectionError`` naming ``host:port``. Lines are split in linear time; a line
    longer than ``max_line_length`` bytes (``None``: no limit) or not decodable fails
    the job with an error naming ``host:port`` and the line number, or with
    ``bad_lines="skip"`` is skipped and counted in the ``bad_lines_skipped`` metric. The
    encoding must write a line break as the byte ``0x0A`` (UTF-8, Latin-1, ASCII...).
    See :class:`StreamSocketP`.
    """
    check_port(port, "stream_socket")
    _check_line_encoding("stream_socket", encoding)
    _check_idle_timeout("stream_socket", idle_timeout_ms)
    check_line_options("stream_socket", max_line_length, bad_lines)
    factory = functools.partial(
        StreamSocketP,
        host,
        port,
        encoding,
        idle_timeout_ms,
        connect_timeout_s,
        max_line_length,
        bad_lines,
    )
    return SameSupplierMetaSupplier(FactorySupplier(factory), preferred_local_parallelism=1)


# ---------------------------------------------------------------------------------------
# stream_files
# ---------------------------------------------------------------------------------------

_FILES_KEY = "stream_files"
#: Bytes kept of a file's start and of the bytes before its committed offset: they tell a
#: file rewritten in place (copytruncate, then new lines) and a copy of a file read before.
_FINGERPRINT = 256


class _TrackedFile:
    """What ``stream_files`` knows of one file, found again by its identity
    ``(st_dev, st_ino)`` whatever its name."""

    __slots__ = ("identity", "name", "offset", "line", "read_pos", "assembler", "head", "tail")

    def __init__(self, identity: tuple[int, int], name: str, assembler: LineAssembler) -> None:
        self.identity = identity
        self.name = name
        self.offset = 0  # committed: the byte after the last emitted line
        self.line = 0  # lines up to ``offset`` (the number of the last emitted line)
        self.read_pos = 0  # bytes handed to the assembler (>= offset)
        self.assembler = assembler
        self.head = b""  # the file's first bytes
        self.tail = b""  # the bytes just before ``offset`` (empty: unknown)

    def restart(self) -> None:
        self.offset = self.line = self.read_pos = 0
        self.assembler = LineAssembler(self.assembler.max_line_bytes, self.assembler.skip_long)
        self.head = self.tail = b""

    def continue_from(self, other: _TrackedFile) -> None:
        self.offset = self.read_pos = other.offset
        self.line = other.line
        self.head = other.head
        self.tail = other.tail

    def state(self) -> tuple[str, int, int, bytes, bytes]:
        return (self.name, self.offset, self.line, self.head, self.tail)


class StreamFilesP(_IdleMarkingSource):
    """Watches a directory and emits the lines of its files as they are written.

    Files present at the start are read from the beginning, new files as they appear,
    and bytes appended to a file are emitted as lines once their line break arrived: a
    partial last line is held back. Files are tracked by **identity** (``st_dev``,
    ``st_ino``), not by name, and each processor owns the files whose identity satisfies
    ``stable_hash(identity) % total_parallelism == global_processor_index``, so every
    line is read by exactly one processor.

    Log rotation: a file *renamed* away (and a new file created under its name) is the
    same file under another name: it is read on from where it was, to its end (its new
    name need not match ``glob``; it is followed while it stays in the directory), and
    the new file is read from its start. A file *truncated* (copytruncate) or rewritten
    in place is noticed by its size or by the bytes before the read position no longer
    being those read, and read again from its start: no fragment of a line is emitted.
    A *copy* of a file already read (the copy of copytruncate, when its name matches
    ``glob``) is recognised by its first bytes and the bytes before the position reached
    in the original, and read on from that position, not again from its start: lines are
    not emitted twice (with parallelism > 1 only when the copy and the original belong to
    the same processor).

    Cooperative: the directory is listed at most every ``poll_interval_ms`` from
    ``complete()``, and one call reads at most :data:`FILE_READ_CHUNK` bytes of one file
    and emits at most what the outbox takes. Lines are assembled in linear time (a line
    longer than a chunk is kept in pieces across calls), so a huge line never blocks the
    engine; a line longer than ``max_line_length`` bytes or not decodable fails the job
    with an error naming the file and the line number, or (``bad_lines="skip"``) is
    skipped and counted in the ``bad_lines_skipped`` metric. Local file reads are treated
    as non-blocking. Files are opened only for the duration of one read.

    The files must be text in an encoding in which ``"\\n"`` is the byte ``0x0A`` (UTF-8,
    Latin-1, ASCII...). A deleted file is forgotten.

    Snapshots: each owned file's state (name, committed offset, line number and the
    fingerprint bytes) is saved under ``BroadcastKey(("stream_files", identity))``.
    Broadcast keys reach every processor on restore, and each keeps the files it owns
    under the *new* parallelism. Lines emitted after the last snapshot are read again
    after a restore: exactly-once under an exactly-once job, at-least-once otherwise.
    """

    def __init__(
        self,
        directory: str,
        glob: str = "*",
        encoding: str = "utf-8",
        poll_interval_ms: float = 100,
        idle_timeout_ms: float | None = 1000,
        max_line_length: int | None = DEFAULT_MAX_LINE_BYTES,
        bad_lines: str = "fail",
    ) -> None:
        super().__init__(idle_timeout_ms)
        self.directory = directory
        self.glob = glob
        self.encoding = encoding
        self.poll_interval_s = poll_interval_ms / 1000.0
        self.max_line_length = max_line_length
        self._skip = bad_lines == "skip"
        self._files: dict[tuple[int, int], _TrackedFile] = {}
        # files read before that were truncated or restored but not seen yet: what a copy
        # of them would start with (copytruncate)
        self._gone: list[_TrackedFile] = []
        # restored from a snapshot of the name-keyed format: name -> offset
        self._legacy: dict[str, int] = {}
        self._work: deque[tuple[int, int]] = deque()
        self._batch: list[Any] = []
        self._batch_i = 0
        self._batch_file: _TrackedFile | None = None
        self._next_poll = 0.0
        self._snapshot_it: Iterator[tuple[Any, Any]] | None = None

    def init_processor(self, context: Context) -> None:
        if not os.path.isdir(self.directory):
            raise FileNotFoundError(
                f"stream_files (vertex {context.vertex_name!r}): {self.directory!r} is not "
                "a directory"
            )
        self._index = context.global_processor_index
        self._parallelism = context.total_parallelism
        self._mark_active()

    def _owns(self, identity: tuple[int, int]) -> bool:
        return stable_hash(identity) % self._parallelism == self._index

    def _new_file(self, identity: tuple[int, int], name: str) -> _TrackedFile:
        return _TrackedFile(identity, name, LineAssembler(self.max_line_length, self._skip))

    # -- emitting ----------------------------------------------------------------------
    def complete(self) -> bool:
        if self._batch and not self._emit_batch():
            return False
        if not self._work:
            now = time.monotonic()
            if now >= self._next_poll:
                self._poll()
                self._next_poll = now + self.poll_interval_s
        if self._work:
            identity = self._work.popleft()
            if self._read(identity):
                self._work.append(identity)  # more to read: round robin over the files
            if self._batch:
                self._mark_active()
                self._emit_batch()
            return False
        self._maybe_idle()
        return False

    def _emit_batch(self) -> bool:
        """Emit the lines read last; ``True`` when all are out."""
        batch = self._batch
        f = self._batch_file
        assert f is not None
        i = self._batch_i
        n = len(batch)
        offset = f.offset
        line_no = f.line
        offer = self.outbox.offer
        encoding = self.encoding
        skipped = 0
        first = i
        where = self._where(f)
        try:
            while i < n:
                raw = batch[i]
                line = decode_line(raw, encoding, where, line_no + 1, self._skip, offset)
                if line is not None and not offer(line):
                    break
                if line is None:
                    skipped += 1
                offset += (raw.length if type(raw) is SkippedLine else len(raw)) + 1
                line_no += 1
                i += 1
        finally:
            if i > first:
                f.tail = _tail_after(f.tail, batch[first:i])
            f.offset = offset
            f.line = line_no
            if skipped:
                self.context.increment_metric(BAD_LINES_METRIC, skipped)
        if i < n:
            self._batch_i = i
            return False
        self._batch = []
        self._batch_i = 0
        self._batch_file = None
        return True

    def _path(self, f: _TrackedFile) -> str:
        return os.path.join(self.directory, f.name)

    def _where(self, f: _TrackedFile) -> str:
        """How errors name file ``f`` (followed by ``:<line>``)."""
        return f"stream_files (vertex {self.context.vertex_name!r}): {self._path(f)}"

    def _read(self, identity: tuple[int, int]) -> bool:
        """Read the next chunk of ``identity`` and queue its complete lines. ``True`` if
        the file has more bytes after this chunk."""
        f = self._files.get(identity)
        if f is None:
            return False
        path = self._path(f)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return False  # renamed or deleted: the next poll finds out which
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != identity:
                return False  # the name is another file's now: the next poll sorts it out
            size = st.st_size
            if size < f.read_pos or not _still_there(fd, f):
                self.context.logger.warning(
                    "stream_files: %s was truncated or rewritten (%d bytes, %d read); reading "
                    "it again from the start",
                    path,
                    size,
                    f.read_pos,
                )
                self._gone.append(_copy_of(f))
                f.restart()
            if size == f.read_pos:
                return False
            data = os.pread(fd, min(FILE_READ_CHUNK, size - f.read_pos), f.read_pos)
        finally:
            os.close(fd)
        if not data:
            return False
        if f.read_pos == 0:
            f.head = data[:_FINGERPRINT]
        f.read_pos += len(data)
        try:
            lines = f.assembler.feed(data)
        except LineTooLongError as e:
            raise ValueError(
                f"{self._where(f)}:{f.line + e.complete_before + 1}: {e} (max_line_length; "
                "bad_lines='skip' skips and counts such lines)"
            ) from e
        if lines:
            self._batch = lines
            self._batch_i = 0
            self._batch_file = f
        return f.read_pos < size

    def _poll(self) -> None:
        """List the directory: follow renamed files, take on new ones (read from their
        start, or on from where a file they are a copy of was read), forget deleted ones,
        and queue the owned files that grew."""
        files = self._files
        seen: set[tuple[int, int]] = set()
        grown: list[tuple[str, tuple[int, int]]] = []
        glob = self.glob
        with os.scandir(self.directory) as entries:
            for entry in entries:
                try:
                    if not entry.is_file():
                        continue
                    st = entry.stat()
                except FileNotFoundError:
                    continue
                identity = (st.st_dev, st.st_ino)
                name = entry.name
                f = files.get(identity)
                if f is None:
                    # a file we do not follow yet: it must match the glob and be ours
                    if not fnmatch.fnmatch(name, glob) or not self._owns(identity):
                        continue
                    f = files[identity] = self._take_on(identity, name, st.st_size)
                elif f.name != name:
                    f.name = name  # renamed (rotation): read on where it was
                seen.add(identity)
                if st.st_size != f.read_pos:
                    grown.append((name, identity))
        # deleted (or moved out of the directory): forgotten, but for one more poll a new
        # file may still turn out to be a copy of one of them
        self._gone = [files.pop(i) for i in [i for i in files if i not in seen]]
        self._legacy = {}
        grown.sort()
        self._work.extend(identity for _, identity in grown)

    def _take_on(self, identity: tuple[int, int], name: str, size: int) -> _TrackedFile:
        f = self._new_file(identity, name)
        legacy = self._legacy.pop(name, None)
        if legacy is not None and legacy <= size:
            f.offset = f.read_pos = legacy
            return f
        for old in [*self._gone, *self._files.values()]:
            if old.offset and old.head and size >= old.offset and _is_copy(self.directory, name, old):
                f.continue_from(old)
                self.context.logger.info(
                    "stream_files: %s is a copy of %s as read before; reading it on from byte %d",
                    os.path.join(self.directory, name),
                    old.name,
                    old.offset,
                )
                break
        return f

    # -- snapshots ---------------------------------------------------------------------
    def save_to_snapshot(self) -> bool:
        it = self._snapshot_it
        if it is None:
            it = self._snapshot_it = iter(
                [(BroadcastKey((_FILES_KEY, i)), f.state()) for i, f in self._files.items()]
            )
        if not self.emit_to_snapshot_from(it):
            return False
        self._snapshot_it = None
        return True

    def restore_from_snapshot_entry(self, key: Any, value: Any) -> None:
        if type(key) is not BroadcastKey or not (
            isinstance(key.name, tuple) and len(key.name) == 2 and key.name[0] == _FILES_KEY
        ):
            raise ValueError(f"stream_files: unexpected snapshot entry {key!r}: {value!r}")
        ident = key.name[1]
        if isinstance(ident, str):  # the name-keyed format of earlier versions
            if stable_hash(ident) % self._parallelism == self._index:
                self._legacy[ident] = int(value)
            return
        identity = (int(ident[0]), int(ident[1]))
        if not self._owns(identity):
            return
        name, offset, line, head, tail = value
        f = self._new_file(identity, name)
        f.offset = f.read_pos = offset
        f.line = line
        f.head = head
        f.tail = tail
        self._files[identity] = f

    def finish_snapshot_restore(self) -> bool:
        self._work.clear()
        self._next_poll = 0.0
        return True


def _tail_after(tail: bytes, lines: list[Any]) -> bytes:
    """The last :data:`_FINGERPRINT` bytes after ``tail`` was followed by ``lines`` (each
    with its line break); empty when a skipped line leaves them unknown."""
    parts: list[bytes] = []
    n = 0
    for raw in reversed(lines):
        if type(raw) is SkippedLine:
            return b"".join(reversed(parts))[-_FINGERPRINT:] if n >= _FINGERPRINT else b""
        parts.append(raw + b"\n")
        n += len(raw) + 1
        if n >= _FINGERPRINT:
            break
    else:
        parts.append(tail)
    return b"".join(reversed(parts))[-_FINGERPRINT:]


def _still_there(fd: int, f: _TrackedFile) -> bool:
    """Whether the bytes before the committed offset are still those read (a file
    truncated and written again past that point is not)."""
    tail = f.tail
    if not tail or f.offset < len(tail):
        return True
    return os.pread(fd, len(tail), f.offset - len(tail)) == tail


def _copy_of(f: _TrackedFile) -> _TrackedFile:
    c = _TrackedFile(f.identity, f.name, f.assembler)
    c.continue_from(f)
    return c


def _is_copy(directory: str, name: str, old: _TrackedFile) -> bool:
    """Whether file ``name`` starts as ``old`` did and holds ``old``'s bytes before the
    offset reached in ``old``."""
    try:
        fd = os.open(os.path.join(directory, name), os.O_RDONLY)
    except OSError:
        return False
    try:
        if os.pread(fd, len(old.head), 0) != old.head:
            return False
        tail = old.tail
        return not tail or os.pread(fd, len(tail), old.offset - len(tail)) == tail
    finally:
        os.close(fd)


def stream_files(
    directory: str,
    glob: str = "*",
    encoding: str = "utf-8",
    poll_interval_ms: float = 100,
    *,
    idle_timeout_ms: float | None = 1000,
    max_line_length: int | None = DEFAULT_MAX_LINE_BYTES,
    bad_lines: str = "fail",
) -> Callable[[], Processor]:
    """A source that watches ``directory`` and emits, as ``str`` lines without line
    breaks, the lines of the files matching ``glob`` (or a glob in ``directory``, as
    :func:`~slipstream.sources.files.split_glob` reads it): those already there, new ones, and
    lines appended later (a line is emitted once its line break was written). Never
    completes. Files are tracked by identity (device and inode), so log rotation by
    rename or copytruncate neither re-reads lines nor emits fragments, and spread over
    the processors by a stable hash of it. A line longer than ``max_line_length`` bytes
    (``None``: no limit) or not decodable fails the job naming the file and the line, or
    with ``bad_lines="skip"`` is skipped and counted (``bad_lines_skipped``). See
    :class:`StreamFilesP` for the rotation, snapshot and encoding rules.
    """
    from slipstream.sources.files import split_glob

    directory, glob = split_glob(os.fspath(directory), glob, "*", "stream_files")
    _check_line_encoding("stream_files", encoding)
    if not poll_interval_ms >= 0:
        raise ValueError(f"stream_files: poll_interval_ms must be >= 0, got {poll_interval_ms!r}")
    _check_idle_timeout("stream_files", idle_timeout_ms)
    check_line_options("stream_files", max_line_length, bad_lines)
    return functools.partial(
        StreamFilesP,
        os.fspath(directory),
        glob,
        encoding,
        poll_interval_ms,
        idle_timeout_ms,
        max_line_length,
        bad_lines,
    )


# ---------------------------------------------------------------------------------------
# generator
# ---------------------------------------------------------------------------------------

_GENERATOR_KEY = "generator"
_NOTHING: Any = object()


class GeneratorP(AbstractProcessor):
    """Emits ``fn(seq)`` for its share of the sequence numbers at a limited rate.

    Processor ``i`` of ``n`` produces ``seq = i, i + n, i + 2n, ...`` at
    ``items_per_second / n`` items per second, measured on ``clock`` from the first
    ``complete()`` call: each call emits the items that are due (catching up after a
    stall), at most :data:`GENERATOR_MAX_PER_CALL` and what the outbox takes. With
    ``max_items`` the vertex emits exactly the sequence numbers ``0 .. max_items - 1``
    and then completes. The generator always has data, so it never marks itself idle.

    Snapshots: each processor saves ``(next_seq, total_parallelism)`` under
    ``BroadcastKey(("generator", global_index))``. Restored with the same parallelism, a
    processor resumes at its own ``next_seq`` (a processor without an entry had
    finished). Restored with another parallelism, every processor resumes from the
    smallest saved ``next_seq``, so some numbers are emitted twice (at-least-once).
    The rate is measured afresh after a restore.
    """

    def __init__(
        self,
        fn: Callable[[int], Any],
        items_per_second: float | None,
        max_items: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.fn = fn
        self.items_per_second = items_per_second
        self.max_items = max_items
        self.clock = clock
        self._pending: Any = _NOTHING
        self._restored: dict[int, tuple[int, int]] = {}

    def init_processor(self, context: Context) -> None:
        self._index = context.global_processor_index
        self._stride = context.total_parallelism
        self._next = self._index
        ips = self.items_per_second
        self._rate = None if ips is None or math.isinf(ips) else ips / self._stride
        self._start: float | None = None
        self._emitted = 0

    def complete(self) -> bool:
        outbox = self.outbox
        stride = self._stride
        if self._pending is not _NOTHING:
            if not outbox.offer(self._pending):
                return False
            self._pending = _NOTHING
            self._next += stride
            self._emitted += 1
        max_items = self.max_items
        if max_items is not None and self._next >= max_items:
            return True
        budget = GENERATOR_MAX_PER_CALL
        rate = self._rate
        if rate is not None:
            now = self.clock()
            if self._start is None:
                self._start = now
            due = int((now - self._start) * rate) + 1 - self._emitted
            if due <= 0:
                return False
            if due < budget:
                budget = due
        seq = self._next
        if max_items is not None:
            remaining = (max_items - seq + stride - 1) // stride
            if remaining < budget:
                budget = remaining
        nb = outbox.bucket_count
        if nb:
            room = min([outbox.room(o) for o in range(nb)])
            if room < budget:
                budget = room
        if budget > 0:
            fn = self.fn
            stop = seq + budget * stride
            if nb == 1:
                # budget <= room, so the bucket takes all of them; map calls fn at C
                # speed (a list comprehension's loop cost ~20-45 ns an item more)
                if outbox.offer_many(list(map(fn, range(seq, stop, stride))), 0) is not None:
                    raise RuntimeError("generator: the outbox refused items it had room for")
            else:
                offer = outbox.offer
                for s in range(seq, stop, stride):
                    item = fn(s)
                    if not offer(item):
                        self._pending = item
                        stop = s
                        break
            done = (stop - seq) // stride
            self._next = stop
            self._emitted += done
        return max_items is not None and self._next >= max_items

    def save_to_snapshot(self) -> bool:
        # one entry: a refused offer is simply made again on the next call (the state
        # cannot change before save_to_snapshot() returned True)
        return self.outbox.offer_to_snapshot(
            BroadcastKey((_GENERATOR_KEY, self._index)), (self._next, self._stride)
        )

    def restore_from_snapshot_entry(self, key: Any, value: Any) -> None:
        if type(key) is not BroadcastKey or not (
            isinstance(key.name, tuple) and len(key.name) == 2 and key.name[0] == _GENERATOR_KEY
        ):
            raise ValueError(f"generator: unexpected snapshot entry {key!r}: {value!r}")
        next_seq, parallelism = value
        self._restored[int(key.name[1])] = (int(next_seq), int(parallelism))

    def finish_snapshot_restore(self) -> bool:
        restored = self._restored
        if not restored:
            return True
        n = self._stride
        i = self._index
        same = all(p == n for _, p in restored.values())
        mine = restored.get(i)
        if same and mine is not None:
            self._next = mine[0]
        elif same and self.max_items is not None:
            # every live processor saves an entry; a missing one had finished
            self._next = max(self.max_items, i)
        else:
            low = min(s for s, _ in restored.values())
            self._next = low + (i - low) % n
        self._restored = {}
        self._pending = _NOTHING
        self._start = None
        self._emitted = 0
        return True


def generator(
    fn: Callable[[int], Any],
    items_per_second: float | None,
    *,
    max_items: int | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Callable[[], Processor]:
    """A synthetic stream for demos and benchmarks: emits ``fn(seq)`` for
    ``seq = 0, 1, 2, ...`` (spread over the processors), about ``items_per_second``
    items per second for the whole vertex (``None`` or ``math.inf``: as fast as
    possible). With ``max_items`` it emits exactly ``seq = 0 .. max_items - 1`` and
    completes; without, it never completes. See :class:`GeneratorP`.
    """
    check_fn(fn, "fn", "generator")
    if items_per_second is not None and not items_per_second > 0:
        raise ValueError(
            f"generator: items_per_second must be > 0 (or None / math.inf for unlimited), "
            f"got {items_per_second!r}"
        )
    if max_items is not None and (
        not isinstance(max_items, int) or isinstance(max_items, bool) or max_items < 0
    ):
        raise ValueError(f"generator: max_items must be an int >= 0 or None, got {max_items!r}")
    return functools.partial(GeneratorP, fn, items_per_second, max_items, clock)
