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

import codecs
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
from slipstream.core.snapshot_keys import BroadcastKey
from slipstream.core.suppliers import (
    FactorySupplier,
    ProcessorMetaSupplier,
    SameSupplierMetaSupplier,
)
from slipstream.core.validation import check_encoding, check_fn, check_port

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
    ) -> None:
        super().__init__(idle_timeout_ms)
        self.host = host
        self.port = port
        self.encoding = encoding
        self.connect_timeout_s = connect_timeout_s
        self._sock: socket.socket | None = None
        self._reader = False
        self._lines: Iterator[str] | None = None
        self._partial = ""
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
        self._decoder = codecs.getincrementaldecoder(self.encoding)()
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
        if data:
            parts = (self._partial + self._decoder.decode(data)).split("\n")
            self._partial = parts.pop()
        else:
            self._eof = True
            tail = self._partial + self._decoder.decode(b"", True)
            self._partial = ""
            parts = [tail] if tail else []
        self._mark_active()
        if not parts:
            return self._eof
        for i, line in enumerate(parts):
            if line.endswith("\r"):
                parts[i] = line[:-1]
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
) -> ProcessorMetaSupplier:
    """A source that connects to the TCP server at ``host:port`` and emits every line it
    receives, decoded with ``encoding``, as a ``str`` without the line break.

    The source completes when the server closes the connection. One processor (global
    index 0) does the reading, so the vertex defaults to local parallelism 1; any other
    processors finish at once. After ``idle_timeout_ms`` without data the source marks
    itself idle (``None``: never). A refused connection fails the job with a
    ``ConnectionError`` naming ``host:port``. See :class:`StreamSocketP`.
    """
    check_port(port, "stream_socket")
    check_encoding(encoding, "stream_socket")
    _check_idle_timeout("stream_socket", idle_timeout_ms)
    factory = functools.partial(
        StreamSocketP, host, port, encoding, idle_timeout_ms, connect_timeout_s
    )
    return SameSupplierMetaSupplier(FactorySupplier(factory), preferred_local_parallelism=1)


# ---------------------------------------------------------------------------------------
# stream_files
# ---------------------------------------------------------------------------------------

_FILES_KEY = "stream_files"


class StreamFilesP(_IdleMarkingSource):
    """Watches a directory and emits the lines of its files as they are written.

    Files present at the start are read from the beginning, new files as they appear,
    and bytes appended to a file are emitted as lines once their line break arrived: a
    partial last line is held back (it is simply not consumed yet). Each processor owns
    the files whose name satisfies ``stable_hash(name) % total_parallelism ==
    global_processor_index``, so every line is read by exactly one processor.

    Cooperative: the directory is listed at most every ``poll_interval_ms`` from
    ``complete()``, and one call reads at most :data:`FILE_READ_CHUNK` bytes of one file
    and emits at most what the outbox takes. Local file reads are treated as
    non-blocking. Files are opened only for the duration of one read.

    The files must be append-only text in an encoding in which ``"\\n"`` is the byte
    ``0x0A`` (UTF-8, Latin-1, ASCII...). A file that shrinks is taken as replaced and read
    again from its start; a deleted file is forgotten.

    Snapshots: each owned file's offset (the byte just past the last emitted line) is
    saved under ``BroadcastKey(("stream_files", file_name))``. Broadcast keys reach every
    processor on restore, and each keeps only the files it owns under the *new*
    parallelism, which is why the file-to-processor rule (hash of the name) need not match
    the engine's key partitioning. Lines emitted after the last snapshot are read again
    after a restore: exactly-once under an exactly-once job, at-least-once otherwise.
    """

    def __init__(
        self,
        directory: str,
        glob: str = "*",
        encoding: str = "utf-8",
        poll_interval_ms: float = 100,
        idle_timeout_ms: float | None = 1000,
    ) -> None:
        super().__init__(idle_timeout_ms)
        self.directory = directory
        self.glob = glob
        self.encoding = encoding
        self.poll_interval_s = poll_interval_ms / 1000.0
        # committed offset per owned file name: the byte after the last emitted line
        self._offsets: dict[str, int] = {}
        # the file size at which the file had no further complete line (skip re-reading)
        self._checked: dict[str, int] = {}
        self._work: deque[str] = deque()
        self._batch: list[bytes] = []
        self._batch_i = 0
        self._batch_name = ""
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

    def _owns(self, name: str) -> bool:
        return stable_hash(name) % self._parallelism == self._index

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
            name = self._work.popleft()
            if self._read(name):
                self._work.append(name)  # more to read: round robin over the files
            if self._batch:
                self._mark_active()
                self._emit_batch()
            return False
        self._maybe_idle()
        return False

    def _emit_batch(self) -> bool:
        """Emit the lines read last; ``True`` when all are out."""
        batch = self._batch
        i = self._batch_i
        n = len(batch)
        name = self._batch_name
        offset = self._offsets.get(name, 0)
        offer = self.outbox.offer
        encoding = self.encoding
        try:
            while i < n:
                raw = batch[i]
                line = raw.decode(encoding)
                if line and line[-1] == "\r":
                    line = line[:-1]
                if not offer(line):
                    break
                offset += len(raw) + 1
                i += 1
        except UnicodeDecodeError as e:
            raise ValueError(
                f"stream_files: cannot decode the line at byte {offset} of "
                f"{os.path.join(self.directory, name)!r} as {encoding}: {e}"
            ) from e
        finally:
            if name in self._offsets:  # a file forgotten meanwhile stays forgotten
                self._offsets[name] = offset
        if i < n:
            self._batch_i = i
            return False
        self._batch = []
        self._batch_i = 0
        return True

    def _read(self, name: str) -> bool:
        """Read the next chunk of complete lines of ``name`` into the batch. ``True`` if
        the file may have more complete lines after this chunk."""
        offset = self._offsets.get(name)
        if offset is None:
            return False
        path = os.path.join(self.directory, name)
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size < offset:
                    self.context.logger.warning(
                        "stream_files: %s shrank from %d to %d bytes; reading it again "
                        "from the start",
                        path,
                        offset,
                        size,
                    )
                    offset = self._offsets[name] = 0
                if size == offset or self._checked.get(name) == size:
                    return False
                f.seek(offset)
                data = f.read(FILE_READ_CHUNK)
                end = data.rfind(b"\n")
                while end < 0 and len(data) < size - offset:
                    # a line longer than a chunk: read on to its end (or to EOF)
                    more = f.read(FILE_READ_CHUNK)
                    if not more:
                        break
                    found = more.find(b"\n")
                    if found >= 0:
                        end = len(data) + found
                    data += more
        except FileNotFoundError:
            self._forget(name)
            return False
        if end < 0:
            self._checked[name] = size  # only a partial line: wait for the file to grow
            return False
        self._checked.pop(name, None)
        self._batch = data[:end].split(b"\n")
        self._batch_i = 0
        self._batch_name = name
        return offset + end + 1 < size

    def _forget(self, name: str) -> None:
        self._offsets.pop(name, None)
        self._checked.pop(name, None)

    def _poll(self) -> None:
        """List the directory and queue the owned files that grew."""
        offsets = self._offsets
        checked = self._checked
        seen = set()
        grown = []
        glob = self.glob
        with os.scandir(self.directory) as entries:
            for entry in entries:
                name = entry.name
                if not fnmatch.fnmatch(name, glob) or not self._owns(name):
                    continue
                try:
                    if not entry.is_file():
                        continue
                    size = entry.stat().st_size
                except FileNotFoundError:
                    continue
                seen.add(name)
                offset = offsets.setdefault(name, 0)
                if size != offset and checked.get(name) != size:
                    grown.append(name)
        for name in [n for n in offsets if n not in seen]:
            self._forget(name)
        grown.sort()
        self._work.extend(grown)

    # -- snapshots ---------------------------------------------------------------------
    def save_to_snapshot(self) -> bool:
        it = self._snapshot_it
        if it is None:
            it = self._snapshot_it = iter(
                [(BroadcastKey((_FILES_KEY, n)), off) for n, off in self._offsets.items()]
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
        name = key.name[1]
        if self._owns(name):
            self._offsets[name] = int(value)

    def finish_snapshot_restore(self) -> bool:
        self._checked.clear()
        self._work.clear()
        self._next_poll = 0.0
        return True


def stream_files(
    directory: str,
    glob: str = "*",
    encoding: str = "utf-8",
    poll_interval_ms: float = 100,
    *,
    idle_timeout_ms: float | None = 1000,
) -> Callable[[], Processor]:
    """A source that watches ``directory`` and emits, as ``str`` lines without line
    breaks, the lines of the files matching ``glob``: those already there, new ones, and
    lines appended later (a line is emitted once its line break was written). Never
    completes. Files are spread over the processors by a stable hash of their name. See
    :class:`StreamFilesP` for the snapshot and encoding rules.
    """
    check_encoding(encoding, "stream_files")
    if "\n".encode(encoding) != b"\n":
        raise ValueError(
            f"stream_files: encoding {encoding!r} does not write a line break as the byte "
            "0x0A; use an ASCII-compatible encoding such as utf-8"
        )
    if not poll_interval_ms >= 0:
        raise ValueError(f"stream_files: poll_interval_ms must be >= 0, got {poll_interval_ms!r}")
    _check_idle_timeout("stream_files", idle_timeout_ms)
    return functools.partial(
        StreamFilesP, os.fspath(directory), glob, encoding, poll_interval_ms, idle_timeout_ms
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
                # budget <= room, so the bucket takes all of them
                if outbox.offer_many([fn(s) for s in range(seq, stop, stride)], 0) is not None:
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
