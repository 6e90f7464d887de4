"""File sinks: ``write_files`` (one line per item), ``write_csv``, ``write_jsonl`` and
``write_parquet``. One processor class (:class:`WriteFilesP`) does the file handling for
all four; the formats only say how a batch of items becomes bytes.

Output is UTF-8 and every line ends with ``"\\n"``. Items go to a hidden temporary file
(``.part-...tmp``: the file sources never read names starting with ``"."``) that is
renamed to its final name only when its content is final, so a reader never sees a
half-written or uncommitted part file.
"""

from __future__ import annotations

import csv
import functools
import io
import json
import os
import time
import uuid
from collections.abc import Callable, Sequence
from typing import IO, Any

from slipstream.core.commit import AT_COMPLETION, PreparedCommits
from slipstream.core.errors import SnapshotStoreRolledBackError
from slipstream.core.files import require_pyarrow
from slipstream.core.inbox import Inbox
from slipstream.core.processor import Context
from slipstream.core.records import as_record
from slipstream.core.validation import check_callable, check_csv_dialect, check_path, int_value
from slipstream.sinks.basic import _SinkP
from slipstream.state.keys import BroadcastKey, tagged_broadcast_name

__all__ = [
    "DEFAULT_ROLL_SIZE_BYTES",
    "DEFAULT_ROLL_INTERVAL_MS",
    "WriteFilesP",
    "WriteCsvP",
    "WriteJsonlP",
    "WriteParquetP",
    "write_files",
    "write_csv",
    "write_jsonl",
    "write_parquet",
]

DEFAULT_ROLL_SIZE_BYTES = 128 * 1024 * 1024
"""Under snapshots, a part file is published at the first snapshot after it reached
this size..."""
DEFAULT_ROLL_INTERVAL_MS = 60_000
"""... or this age: a streaming job writes ~60 files per processor per hour, not one per
snapshot."""


def _now_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class WriteFilesP(_SinkP):
    """Writes items to part files in ``directory`` (created if missing).

    * Without snapshots: one file ``part-<global index:05d><suffix>`` per processor,
      renamed from its temporary name when the input is complete (an empty one if the
      processor received nothing, for the line formats).
    * With snapshots (two-phase), files **roll**: a part file collects items across
      snapshots until, at a snapshot, it is at least ``roll_size`` bytes or
      ``roll_interval_ms`` old (0: at every snapshot); it is then fsynced and
      *prepared*, and renamed to ``part-<index:05d>-<sequence:06d><suffix>`` when that
      snapshot commits. At a snapshot that does not roll, the unfinished file is
      fsynced and its length goes into the snapshot. So each published file appears
      atomically at a snapshot commit and holds exactly the items of the snapshots it
      spans.

    Restore: files the snapshot prepared are committed (a crash may have come between
    the commit and the renames); the unfinished file is truncated to the length the
    snapshot recorded and written on (what came after the snapshot is written again by
    the replay); other temporary files of this processor are deleted. A job may restore
    with another parallelism: every processor gets every index's entry (broadcast), so
    what any earlier processor prepared is committed; processor 0 publishes the
    unfinished files of indices that no longer exist, cut to their snapshot length, and
    from then on keeps those indices' next sequence numbers in its snapshots (a processor
    only names files with its own index). So when a later restore brings such an index
    back, its processor continues after the part files its earlier incarnation
    published instead of writing them again. Exactly-once under an exactly-once
    job; under at-least-once, items that passed the barrier before the snapshot are
    written again. Formats whose files cannot be continued after a restart
    (``resumable = False``: Parquet needs its footer) roll at every snapshot.
    """

    snapshot_tag = "write-files"
    factory = "write_files"
    suffix = ""
    resumable = True

    def __init__(
        self,
        directory: str,
        formatter: Callable[[Any], str] = str,
        roll_size: int = DEFAULT_ROLL_SIZE_BYTES,
        roll_interval_ms: int = DEFAULT_ROLL_INTERVAL_MS,
        clock: Callable[[], int] | None = None,
    ) -> None:
        self._directory = directory
        self._formatter = formatter
        self._roll_size = roll_size
        self._roll_interval = roll_interval_ms
        self._clock = clock or _now_ms
        self._fh: IO[bytes] | None = None
        self._temp = ""
        self._size = 0
        self._opened_at = 0
        self._sequence = 0
        self._two_phase = False
        self._done = False
        # (index, sequence, prepared [(temp, final)], unfinished (temp, final, length,
        # state) | None)
        self._restored: list[tuple[int, int, list[Any], Any]] = []
        # processor 0 only: {index >= total parallelism: its next part sequence}, saved
        # with every snapshot so an index that comes back never reuses a published name
        self._retired: dict[int, int] = {}
        # prepared files not renamed yet: every snapshot names all of them (a snapshot
        # whose write failed leaves its files to the next one's commit, and a restore
        # from that one must publish them too)
        self._prepared: PreparedCommits[tuple[str, str]] = PreparedCommits()
        self._commits = False  # the job commits snapshots: publish in snapshot_commit_finish

    def is_cooperative(self) -> bool:
        # file system calls (fsync) can block for an unbounded time
        return False

    def init_processor(self, context: Context) -> None:
        try:
            os.makedirs(self._directory, exist_ok=True)
        except OSError as e:
            raise OSError(
                f"vertex {context.vertex_name!r}: cannot create {self.factory} directory "
                f"{self._directory!r}: {e}"
            ) from e
        self._two_phase = context.snapshotting_enabled
        self._commits = context.commits_snapshots

    # -- per format ---------------------------------------------------------------------
    def _encode(self, items: Sequence[Any]) -> bytes:
        """The bytes of ``items`` in this format (lines: ``formatter(item) + "\\n"``)."""
        fmt = self._formatter
        try:
            text = "\n".join([fmt(item) for item in items])
        except TypeError:
            for item in items:
                if not isinstance(fmt(item), str):
                    raise TypeError(
                        f"{self.factory} (vertex {self.context.vertex_name!r}): the formatter "
                        f"returned {fmt(item)!r} for item {item!r}; it must return a str"
                    ) from None
            raise
        return (text + "\n").encode("utf-8")

    def _write_items(self, fh: IO[bytes], items: Sequence[Any]) -> int:
        """Writes ``items``; returns the number of bytes written."""
        data = self._encode(items)
        fh.write(data)
        return len(data)

    def _new_file(self) -> None:
        """A new part file starts: reset per-file state (e.g. a CSV header)."""

    def _finish_file(self, fh: IO[bytes]) -> None:
        """The part file is complete (e.g. write a footer)."""

    def _file_state(self) -> Any:
        """Per-file state to save with an unfinished file (restored by _resume_state)."""
        return None

    def _resume_state(self, state: Any) -> None:
        pass

    # -- files --------------------------------------------------------------------------
    def _name(self, index: int | None = None) -> str:
        i = self.context.global_processor_index if index is None else index
        if self._two_phase:
            return f"part-{i:05d}-{self._sequence:06d}{self.suffix}"
        return f"part-{i:05d}{self.suffix}"

    def _file(self) -> IO[bytes]:
        fh = self._fh
        if fh is None:
            # unique per attempt: a retried or speculative Spark task never writes into
            # another attempt's file, and the final rename is atomic
            self._temp = os.path.join(
                self._directory, f".{self._name()}.{uuid.uuid4().hex[:12]}.tmp"
            )
            fh = self._fh = open(self._temp, "wb")  # closed in _seal / close()
            self._size = 0
            self._opened_at = self._clock()
            self._new_file()
        return fh

    def process(self, ordinal: int, inbox: Inbox) -> None:
        fh = self._file()  # first: a new file resets the size
        self._size += self._write_items(fh, inbox)
        inbox.clear()

    def _sync(self, fh: IO[bytes]) -> None:
        fh.flush()
        os.fsync(fh.fileno())  # a committed snapshot must not claim bytes a crash loses

    def _seal(self) -> tuple[str, str] | None:
        """Finish and close the current temporary file; returns (temp, final) or None
        if there is none."""
        fh = self._fh
        if fh is None:
            return None
        self._fh = None
        self._finish_file(fh)
        self._sync(fh)
        fh.close()
        pair = (self._temp, os.path.join(self._directory, self._name()))
        self._sequence += 1
        return pair

    def _write_empty_part(self) -> None:
        """No input at all and no snapshots: leave an empty part file."""
        open(os.path.join(self._directory, self._name()), "wb").close()

    def complete(self) -> bool:
        pair = self._seal()
        if self._two_phase:
            if pair is not None:
                if self._commits:
                    self._prepared.add(AT_COMPLETION, pair)
                else:
                    _commit_files([pair])  # no commit phase (e.g. the test harness): final now
            if self._prepared:
                # completion state: a restore from a snapshot recording this processor's
                # completion renames these files (finish_snapshot_restore)
                self.outbox.offer_to_snapshot(
                    BroadcastKey((self.snapshot_tag, self.context.global_processor_index)),
                    (self._sequence, self._prepared_names(), None),
                )
            self._offer_retired()
        elif pair is not None:
            os.replace(*pair)
        else:
            self._write_empty_part()
        self._done = True
        return True

    def _prepared_names(self) -> list[tuple[str, str]]:
        return [(os.path.basename(t), os.path.basename(f)) for t, f in self._prepared.items()]

    def _should_roll(self) -> bool:
        return (
            not self.resumable
            or self._size >= self._roll_size
            or self._clock() - self._opened_at >= self._roll_interval
        )

    def save_to_snapshot(self) -> bool:
        unfinished = None
        fh = self._fh
        if fh is not None:
            if self._should_roll():
                pair = self._seal()
                assert pair is not None
                if self._commits:
                    self._prepared.add(self.context.current_snapshot_id, pair)
                else:
                    _commit_files([pair])  # no commit phase (e.g. the test harness)
            else:
                self._sync(fh)
                unfinished = (
                    os.path.basename(self._temp),
                    self._name(),
                    self._size,
                    self._file_state(),
                )
        self._offer_retired()
        return self.outbox.offer_to_snapshot(
            BroadcastKey((self.snapshot_tag, self.context.global_processor_index)),
            (self._sequence, self._prepared_names(), unfinished),
        )

    def _offer_retired(self) -> None:
        """Processor 0's entries for the indices that no longer exist: their next
        sequence, nothing prepared or unfinished (all published at the restore)."""
        for index, sequence in sorted(self._retired.items()):
            self.outbox.offer_to_snapshot(BroadcastKey((self.snapshot_tag, index)), (sequence, [], None))

    def uncommitted_files(self) -> list[str]:
        """This processor's hidden temporary part files that exist and are not published:
        what a job stopped before its end leaves for a resume to publish (under
        snapshots). The engine names them when it stops a job at interpreter exit."""
        paths = [temp for temp, _final in self._prepared.items()]
        if self._temp and self._temp not in paths:
            paths.append(self._temp)
        return [p for p in paths if os.path.exists(p)]

    def snapshot_commit_finish(self, success: bool) -> bool:
        """Publish the part files whose snapshot committed (renames, idempotent)."""
        if success:
            for pair in self._prepared.due(self.context):
                _commit_files([pair])
                self._prepared.remove(pair)
        return True

    def restore_from_snapshot_entry(self, key: Any, value: Any) -> None:
        name = tagged_broadcast_name(
            key, self.snapshot_tag, 2, self.context.vertex_name, str(self.factory)
        )
        # (sequence, prepared) from stores written before files rolled
        sequence, prepared, *rest = value
        self._restored.append((name[1], sequence, prepared, rest[0] if rest else None))
        if name[1] == self.context.global_processor_index:
            self._sequence = sequence

    def finish_snapshot_restore(self) -> bool:
        # Commit what the snapshot prepared (a crash may have come between the snapshot's
        # commit and the renames), continue the unfinished file from its snapshot length,
        # then drop other temporary files. Processor 0 also takes care of indices that no
        # longer exist at this parallelism.
        ctx = self.context
        me = ctx.global_processor_index
        mine = {me}
        if me == 0:
            mine |= {i for i, *_ in self._restored if i >= ctx.total_parallelism}
        d = self._directory
        rolled_back = ctx.allow_rollback is not None and self._rolled_back()
        keep: set[str] = set()
        for index, sequence, prepared, unfinished in self._restored:
            if index not in mine:
                continue
            if index != me:
                self._retired[index] = sequence
            _commit_files([(os.path.join(d, t), os.path.join(d, f)) for t, f in prepared])
            if unfinished is None:
                continue
            temp, final, length, state = unfinished
            if index != me:
                # published below under its final name: the index continues after it
                self._retired[index] = sequence + 1
            path = os.path.join(d, temp)
            if rolled_back and index == me and not os.path.exists(path):
                continue  # published under its final name by a newer snapshot's commit
            if index == me and self._fh is None:
                self._fh = _reopen_at(path, length, self.factory)
                self._temp = path
                self._size = length
                self._opened_at = self._clock()
                self._resume_state(state)
                keep.add(temp)
            elif os.path.exists(path):
                _reopen_at(path, length, self.factory).close()
                _commit_files([(path, os.path.join(d, final))])
            elif not os.path.exists(os.path.join(d, final)):
                raise FileNotFoundError(_lost(path, self.factory))
        for n in os.listdir(d):
            if n.startswith(".part-") and n.endswith(".tmp") and n not in keep:
                try:
                    index = int(n[len(".part-") :].split("-")[0].split(".")[0])
                except ValueError:
                    continue
                if index in mine:
                    os.remove(os.path.join(d, n))
        self._restored = []
        return True

    def _rolled_back(self) -> bool:
        """Whether this processor already published a part file at or after the sequence
        the restored snapshot continues at: a newer snapshot committed it, so the snapshot
        store was rolled back (restored from a backup) and a replay would write its items
        again. :class:`SnapshotStoreRolledBackError` unless ``JobConfig(allow_rollback=True)``,
        which continues after the newest published part (published files are never
        replaced)."""
        ctx = self.context
        me = ctx.global_processor_index
        known = any(i == me for i, *_ in self._restored)
        prefix, published = f"part-{me:05d}-", -1
        for n in os.listdir(self._directory):
            if n.startswith(prefix) and n.endswith(self.suffix):
                seq = n[len(prefix) : len(n) - len(self.suffix)]
                if seq.isdigit():
                    published = max(published, int(seq))
        if published < self._sequence:
            return False
        # a new index (another parallelism) starts at part 0: processor 0 keeps the next
        # sequence of every index that existed before, so its part files are unknown to
        # the snapshot
        resumes = (
            f"which continues at part {self._sequence:06d}"
            if known
            else f"which has no part files of processor {me}"
        )
        text = (
            f"{self.factory} (vertex {ctx.vertex_name!r}): the snapshot store was rolled back: "
            f"{self._directory} holds the published part file "
            f"{prefix}{published:06d}{self.suffix} of processor {me}, newer than the snapshot "
            f"the job resumes from ({resumes})"
        )
        if not ctx.allow_rollback:
            raise SnapshotStoreRolledBackError(
                f"{text}: resuming would write the items after it again. Put the store's "
                f"newest snapshots back, or pass JobConfig(allow_rollback=True) to accept "
                f"that replay (into new part files: duplicates downstream)."
            )
        ctx.logger.warning(
            "%s; allow_rollback=True: the items after it are written again, into new part "
            "files from %s%06d%s on",
            text,
            prefix,
            published + 1,
            self.suffix,
        )
        self._sequence = published + 1
        return True

    def close(self) -> None:
        fh = self._fh
        if fh is not None:
            self._fh = None
            fh.close()
            if not self._two_phase and not self._done:
                try:
                    os.remove(self._temp)
                except FileNotFoundError:
                    pass


def _lost(path: str, factory: str) -> str:
    return (
        f"{factory}: the unfinished part file {path!r} recorded in the snapshot is gone; "
        "restoring would lose committed output"
    )


def _reopen_at(path: str, length: int, factory: str) -> IO[bytes]:
    """Open an unfinished part file for appending after cutting it to ``length`` (the
    bytes its snapshot covers); a missing or shorter file fails loudly."""
    try:
        fh = open(path, "r+b")  # closed by the caller / WriteFilesP.close
    except FileNotFoundError:
        raise FileNotFoundError(_lost(path, factory)) from None
    size = os.fstat(fh.fileno()).st_size
    if size < length:
        fh.close()
        raise ValueError(
            f"{factory}: the unfinished part file {path!r} has {size} bytes but its "
            f"snapshot recorded {length}; the file was damaged"
        )
    fh.truncate(length)
    fh.seek(length)
    return fh


def _commit_files(pairs: list[tuple[str, str]]) -> None:
    """Rename prepared temporary files to their final names (idempotent)."""
    for temp, final in pairs:
        try:
            os.replace(temp, final)
        except FileNotFoundError:
            if not os.path.exists(final):
                raise


class WriteCsvP(WriteFilesP):
    """Writes items as CSV rows. Dict items, named tuples and dataclass instances
    (records: :mod:`slipstream.core.records`) are written in the order of the file's
    columns: the ``header`` given, else the field names of the first record of the
    file; a record with other fields fails the job naming it. Plain tuples and lists are
    written as they are; any other item as a one-field row. Every part file starts with
    its header row when there is one (``header=None``: only for records; ``False``:
    never)."""

    factory = "write_csv"
    suffix = ".csv"

    def __init__(
        self,
        directory: str,
        header: Sequence[str] | bool | None,
        dialect: Any,
        roll_size: int = DEFAULT_ROLL_SIZE_BYTES,
        roll_interval_ms: int = DEFAULT_ROLL_INTERVAL_MS,
    ) -> None:
        super().__init__(directory, str, roll_size, roll_interval_ms)
        self._header = header
        self._dialect = dialect
        self._fields: list[str] | None = None
        self._header_written = False

    def _new_file(self) -> None:
        self._fields = None
        self._header_written = False

    def _file_state(self) -> Any:
        return (self._fields, self._header_written)

    def _resume_state(self, state: Any) -> None:
        self._fields, self._header_written = state

    def _encode(self, items: Sequence[Any]) -> bytes:
        buf = io.StringIO()
        writer = csv.writer(buf, self._dialect, lineterminator="\n")
        header = self._header
        explicit = header if header is not None and not isinstance(header, bool) else None
        if explicit is not None and not self._header_written:
            writer.writerow(explicit)
            self._fields = list(explicit)
            self._header_written = True
        rows: list[Sequence[Any]] = []
        for item in items:
            record = item if isinstance(item, dict) else as_record(item)
            if record is not None:
                fields = self._fields
                if fields is None:
                    fields = self._fields = list(record)
                    # a header only at the top of the file
                    if header is not False and self._size == 0 and not rows:
                        writer.writerow(fields)
                        self._header_written = True
                if len(record) != len(fields) or any(f not in record for f in fields):
                    raise ValueError(
                        f"write_csv (vertex {self.context.vertex_name!r}): item {item!r} "
                        f"does not have the file's columns {fields}"
                    )
                rows.append([record[f] for f in fields])
            elif isinstance(item, (tuple, list)):
                rows.append(item)
            else:
                rows.append((item,))
        writer.writerows(rows)
        return buf.getvalue().encode("utf-8")


class WriteJsonlP(WriteFilesP):
    """Writes every item as one line of JSON (UTF-8, not ASCII-escaped); a named tuple
    or dataclass instance as an object of its fields (as a dict). An item JSON cannot
    represent fails the job naming it."""

    factory = "write_jsonl"
    suffix = ".jsonl"

    def __init__(
        self,
        directory: str,
        roll_size: int = DEFAULT_ROLL_SIZE_BYTES,
        roll_interval_ms: int = DEFAULT_ROLL_INTERVAL_MS,
    ) -> None:
        super().__init__(directory, str, roll_size, roll_interval_ms)

    def _encode(self, items: Sequence[Any]) -> bytes:
        dumps = functools.partial(json.dumps, ensure_ascii=False, separators=(",", ":"))
        records = [_as_mapping(item) for item in items]
        try:
            text = "\n".join([dumps(record) for record in records])
        except (TypeError, ValueError):
            for item, record in zip(items, records, strict=True):
                try:
                    dumps(record)
                except (TypeError, ValueError) as e:
                    raise TypeError(
                        f"write_jsonl (vertex {self.context.vertex_name!r}): item {item!r} "
                        f"cannot be written as JSON: {e}"
                    ) from e
            raise
        return (text + "\n").encode("utf-8")


class WriteParquetP(WriteFilesP):
    """Writes items as the rows of Parquet files: dicts (column name -> value), named
    tuples and dataclass instances (their fields are the columns: a
    ``KeyedWindowResult`` gives ``start, end, key, value``), or plain tuples and lists
    whose elements become columns ``f0, f1, ...``. The schema of a file is inferred
    from its first batch of items; a later item that does not fit it fails the job
    naming the item. Parquet files cannot be continued after a restart, so under
    snapshots a file is published at every snapshot that has new items."""

    factory = "write_parquet"
    suffix = ".parquet"
    resumable = False

    def __init__(self, directory: str) -> None:
        super().__init__(directory, str)
        self._writer: Any = None

    def _new_file(self) -> None:
        self._writer = None

    def _write_items(self, fh: IO[bytes], items: Sequence[Any]) -> int:
        pa = require_pyarrow(self.factory)
        rows = [_parquet_row(item) for item in items]
        if not rows:
            return 0
        writer = self._writer
        try:
            if writer is None:
                table = pa.Table.from_pylist(rows)
                writer = self._writer = pa.parquet.ParquetWriter(fh, table.schema)
            else:
                table = pa.Table.from_pylist(rows, schema=writer.schema)
        except (pa.ArrowException, TypeError, ValueError) as e:
            raise ValueError(
                f"write_parquet (vertex {self.context.vertex_name!r}): items starting with "
                f"{items[0]!r} do not fit the file's schema: {e}"
            ) from e
        before = fh.tell()
        writer.write_table(table)
        return int(fh.tell() - before)

    def _finish_file(self, fh: IO[bytes]) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()

    def _write_empty_part(self) -> None:
        pass  # an empty file is not Parquet, and a Parquet file needs a schema

    def close(self) -> None:
        self._writer = None
        super().close()


def _as_mapping(item: Any) -> Any:
    """A named tuple or dataclass instance as the dict of its fields; else ``item``."""
    record = as_record(item)
    return item if record is None else record


def _parquet_row(item: Any) -> dict[Any, Any]:
    """The column -> value dict of a Parquet row: a dict as it is, a record's fields, a
    plain tuple's or list's elements as ``f0, f1, ...``, anything else as ``f0``."""
    if isinstance(item, dict):
        return item
    record = as_record(item)
    if record is not None:
        return record
    if isinstance(item, (tuple, list)):
        return {f"f{i}": v for i, v in enumerate(item)}
    return {"f0": item}


# -- factories -----------------------------------------------------------------------


def _roll_args(roll_size: Any, roll_interval_ms: Any, factory: str) -> tuple[int, int]:
    size = int_value(roll_size)
    interval = int_value(roll_interval_ms)
    if size is None or size < 0:
        raise ValueError(f"{factory}(): roll_size must be an int >= 0, got {roll_size!r}")
    if interval is None or interval < 0:
        raise ValueError(
            f"{factory}(): roll_interval_ms must be an int >= 0, got {roll_interval_ms!r}"
        )
    return size, interval


def write_files(
    directory: str | os.PathLike[str],
    formatter: Callable[[Any], str] = str,
    *,
    roll_size: int = DEFAULT_ROLL_SIZE_BYTES,
    roll_interval_ms: int = DEFAULT_ROLL_INTERVAL_MS,
) -> functools.partial[WriteFilesP]:
    """Writes ``formatter(item)`` per line (UTF-8, ``"\\n"``) into ``directory`` (created
    if missing): one file ``part-<global processor index:05d>`` per processor, or, under
    snapshots, files rolled by size and age and committed per snapshot (see
    :class:`WriteFilesP`)."""
    check_path(directory, "write_files")
    check_callable(formatter, "formatter", "write_files")
    size, interval = _roll_args(roll_size, roll_interval_ms, "write_files")
    return functools.partial(WriteFilesP, os.fspath(directory), formatter, size, interval)


def write_csv(
    directory: str | os.PathLike[str],
    *,
    header: Sequence[str] | bool | None = None,
    dialect: str | type[csv.Dialect] = "excel",
    roll_size: int = DEFAULT_ROLL_SIZE_BYTES,
    roll_interval_ms: int = DEFAULT_ROLL_INTERVAL_MS,
) -> functools.partial[WriteCsvP]:
    """Writes items as CSV rows into ``part-*.csv`` files in ``directory`` (UTF-8, lines
    end with ``"\\n"``). ``header``: ``None`` writes the keys of dict items as the header
    (in their order), a sequence of names is the header of every file (and the column
    order of dict items), ``False`` writes none. See :class:`WriteCsvP`."""
    check_path(directory, "write_csv")
    if header is not None and not isinstance(header, bool):
        if isinstance(header, str) or not all(isinstance(h, str) for h in header):
            raise TypeError(
                f"write_csv(): argument 'header' must be None, a bool or a sequence of "
                f"column names, got {header!r}"
            )
        header = tuple(header)
    check_csv_dialect(dialect, "write_csv")
    size, interval = _roll_args(roll_size, roll_interval_ms, "write_csv")
    return functools.partial(WriteCsvP, os.fspath(directory), header, dialect, size, interval)


def write_jsonl(
    directory: str | os.PathLike[str],
    *,
    roll_size: int = DEFAULT_ROLL_SIZE_BYTES,
    roll_interval_ms: int = DEFAULT_ROLL_INTERVAL_MS,
) -> functools.partial[WriteJsonlP]:
    """Writes every item as a line of JSON into ``part-*.jsonl`` files in ``directory``."""
    check_path(directory, "write_jsonl")
    size, interval = _roll_args(roll_size, roll_interval_ms, "write_jsonl")
    return functools.partial(WriteJsonlP, os.fspath(directory), size, interval)


def write_parquet(directory: str | os.PathLike[str]) -> functools.partial[WriteParquetP]:
    """Writes items as rows of ``part-*.parquet`` files in ``directory``. Needs pyarrow
    (``pip install -e '.[parquet]'``). See :class:`WriteParquetP`."""
    check_path(directory, "write_parquet")
    require_pyarrow("write_parquet")
    return functools.partial(WriteParquetP, os.fspath(directory))
