"""File sources: ``read_files`` (lines), ``read_csv``, ``read_jsonl`` and ``read_parquet``.

All four share one processor shape (:class:`FileSourceP`): the directory's data files
matching ``glob`` are listed when the job starts, sorted by path, and split across all
processors of all members. ``read_files`` (in UTF-8 or a one-byte charset) and
``read_jsonl`` split them by **byte ranges** (:class:`LineFileSourceP`,
:mod:`slipstream.sources.byte_ranges`): the files laid end to end are cut into ``n``
stretches of equal bytes, one per processor, each reading the lines that start in it, so
one large file keeps every processor busy; a snapshot holds the ranges each processor has
left, and a restore with another parallelism cuts them again. ``read_csv`` (a quoted
field may hold a line break, so a cut cannot find where a row starts), ``read_parquet``
(whole-file format) and ``read_files`` in other encodings (UTF-16: a ``\n`` byte may be
half of another character) split by **file**: global processor ``i`` of ``n`` reads
files ``i, i + n, ...``, its snapshot position ``(file index in its share, records
emitted from that file)``, restored only at the same parallelism. Each ``complete()``
call reads at most as many records as the outbox takes, so a call stays short and memory
stays bounded whatever the file size.

**Which files are data.** Every regular file matching ``glob`` whose name starts with
neither ``"."`` nor ``"_"``. The file sinks keep their temporary and in-progress files
under such names (``.part-...tmp``), so a reader pointed at a sink's directory sees
committed output only, even while the sink is writing.

**Empty matches are not silent.** A glob that matches no file while the directory holds
data files fails the job, naming the directory, the glob and the files that are there
(``data.CSV`` is not ``*.csv``: globs are case-sensitive); a directory with no data file at
all is read as empty input, with a warning. A glob in the directory argument
(``read_files("data/*.txt")``, as Spark and shells take paths) is understood: the path is
split where its first wildcard is (:func:`split_glob`).

Text is UTF-8 (``read_files`` takes another ``encoding``). A malformed record fails the
job with an error naming the file and line (CSV, JSON lines) or the file (Parquet); a CSV
field whose quote is never closed, the line where it opens (``csv`` itself would read the
rest of the file into that field); bytes that do not decode, the file, line, column and
byte offset of the first bad byte (:mod:`slipstream.sources.decoding`).
"""

from __future__ import annotations

import codecs
import csv
import fnmatch
import functools
import json
import os
import re
from collections.abc import Iterator
from itertools import chain, islice
from pathlib import Path
from typing import Any

from slipstream.core.files import is_data_file_name, require_pyarrow
from slipstream.core.processor import Context
from slipstream.core.validation import check_csv_dialect, check_path
from slipstream.sources.batch import _emit_chunk, _emit_room, _PositionedSource
from slipstream.sources.byte_ranges import LineRange, Piece, split_pieces, splittable
from slipstream.sources.decoding import describe_decode_error, locate_decode_error
from slipstream.state.keys import tagged_broadcast_name

__all__ = [
    "FileSourceP",
    "LineFileSourceP",
    "ReadFilesP",
    "ReadCsvP",
    "ReadJsonlP",
    "ReadParquetP",
    "list_data_files",
    "split_glob",
    "read_files",
    "read_csv",
    "read_jsonl",
    "read_parquet",
]


def list_data_files(directory: str, glob: str) -> list[str]:
    """The sorted paths of the data files in ``directory`` matching ``glob`` (see the
    module docstring for which files are data)."""
    return sorted(
        str(p) for p in Path(directory).glob(glob) if p.is_file() and is_data_file_name(p.name)
    )


_WILDCARDS = ("*", "?", "[")
_SHOWN_NAMES = 5


def split_glob(directory: str, glob: str, default: str, factory: str) -> tuple[str, str]:
    """``(directory, glob)``, understanding a glob written into the directory argument
    (``"data/*.txt"`` is ``("data", "*.txt")``, ``"logs/2024-*/*.log"`` is ``("logs",
    "2024-*/*.log")``): the path is cut before its first component with a wildcard. An
    existing directory whose name has wildcard characters is taken as it is. A pattern in
    both arguments is a ``ValueError`` that shows the call to write instead."""
    if not any(w in directory for w in _WILDCARDS) or os.path.isdir(directory):
        return directory, glob
    parts = Path(directory).parts
    i = next(i for i, part in enumerate(parts) if any(w in part for w in _WILDCARDS))
    base = str(Path(*parts[:i])) if i else "."
    pattern = "/".join(parts[i:])
    if glob != default:
        raise ValueError(
            f"{factory}(): the directory argument {directory!r} holds a glob pattern and "
            f"glob={glob!r} is given too; pass the directory and the pattern apart, e.g. "
            f"{factory}({base!r}, {pattern!r})"
        )
    return base, pattern


def _no_match(directory: str, glob: str, where: str) -> str | None:
    """The error for a glob matching no data file in ``directory``: it names the glob and
    the data files that are there, with a hint when one matches ignoring case or sits in
    a subdirectory. ``None`` when the directory holds no data file at all (empty input)."""
    names = sorted(n for n in os.listdir(directory) if is_data_file_name(n))
    if not names:
        return None
    shown = [n + "/" if os.path.isdir(os.path.join(directory, n)) else n for n in names]
    listing = ", ".join(shown[:_SHOWN_NAMES])
    if len(shown) > _SHOWN_NAMES:
        listing += f" and {len(shown) - _SHOWN_NAMES} more"
    hint = ""
    folded = [n for n in names if fnmatch.fnmatchcase(n.lower(), glob.lower())]
    if folded:
        name = folded[0]
        hint = f" (globs are case-sensitive: {name} matches only ignoring case)"
        star = glob.startswith("*") and not any(w in glob[1:] for w in _WILDCARDS)
        if star and len(glob) > 1 and name.lower().endswith(glob[1:].lower()):
            fixed = "*" + name[len(name) - len(glob) + 1 :]
            hint = f" (globs are case-sensitive: glob={fixed!r} matches {name})"
    elif "/" not in glob and any(s.endswith("/") for s in shown):
        hint = f" (files in subdirectories match glob={'**/' + glob!r})"
    return (
        f"{where}: no file in {directory!r} matches glob {glob!r}; the directory holds "
        f"{listing}{hint}"
    )


class FileSourceP(_PositionedSource):
    """Reads this processor's share of the data files, record by record.

    Subclasses say how a file becomes records in :meth:`_records`; the default
    :meth:`_read` takes up to ``room`` of them. The open file (if any) is kept in
    ``self._fh`` so that :meth:`close` can release it.
    """

    snapshot_tag = "files-offset"
    factory = "read_files"
    _encoding = "utf-8"

    def __init__(self, directory: str, glob: str) -> None:
        self._directory = directory
        self._glob = glob
        self._files: list[str] = []
        self._all_files: list[str] = []
        self._file_index = 0
        self._record = 0
        self._fh: Any = None
        self._it: Iterator[Any] | None = None
        self._sizes: list[int] = []
        # reading past the records a restored position skips: bad records among them
        # were set aside (and reported) before the snapshot
        self._replaying = False

    def init_processor(self, context: Context) -> None:
        directory = Path(self._directory)
        if not directory.is_dir():
            what = "is not a directory" if directory.exists() else "does not exist"
            raise FileNotFoundError(
                f"vertex {context.vertex_name!r}: {self.factory} directory "
                f"{self._directory!r} {what}"
            )
        files = list_data_files(self._directory, self._glob)
        if not files:
            where = f"{self.factory} (vertex {context.vertex_name!r})"
            error = _no_match(self._directory, self._glob, where)
            if error is not None:
                raise FileNotFoundError(error)
            if context.global_processor_index == 0:
                context.logger.warning(
                    "%s: directory %r holds no data file (names starting with '.' or '_' "
                    "are never read): the source emits nothing",
                    where,
                    self._directory,
                )
        self._all_files = files
        self._files = files[context.global_processor_index :: context.total_parallelism]
        self._sizes = [os.path.getsize(f) for f in self._files]

    # -- per format -------------------------------------------------------------------
    def _records(self, path: str) -> Iterator[Any]:
        """The records of the file at ``path``; opens it into ``self._fh``."""
        raise NotImplementedError

    def _start_file(self) -> None:
        it = self._records(self._files[self._file_index])
        skip = self._record
        if skip:
            self._replaying = True
            try:
                for _ in islice(it, skip):
                    pass
            finally:
                self._replaying = False
        self._it = it

    def _set_aside(self, item: Any, error: Exception, line: int) -> bool:
        """A malformed record at ``line`` of the current file: ``True`` when the
        bad-record policy sets it aside (its dead letter says ``<file>:<line>``), so the
        reader goes on with the next record; ``False``: the job fails with ``error``."""
        errors = self.context.item_errors
        if errors.fails:
            return False
        if self._replaying:
            return True
        where = f"{self._current_path()}:{line}"
        return errors.handle(item, error, where, names_item=True)

    def _read(self, room: int) -> list[Any]:
        assert self._it is not None
        return list(islice(self._it, room))

    # -- driving ------------------------------------------------------------------------
    def _close_file(self) -> None:
        self._it = None
        fh = self._fh
        if fh is not None:
            self._fh = None
            fh.close()

    def complete(self) -> bool:
        files = self._files
        outbox = self.outbox
        while self._file_index < len(files):
            room = _emit_room(outbox)
            if room <= 0:
                return False
            try:
                if self._it is None:
                    self._start_file()
                chunk = self._read(room)
            except UnicodeDecodeError as e:
                raise self._decode_error(e) from e
            if chunk:
                _emit_chunk(outbox, chunk)
                self._record += len(chunk)
            if len(chunk) < room:  # end of this file
                self._close_file()
                self._file_index += 1
                self._record = 0
                continue
            return False
        return True

    def _position(self) -> Any:
        return (self._file_index, self._record)

    def _seek(self, position: Any) -> None:
        self._close_file()
        self._file_index, self._record = position

    def progress(self) -> tuple[int, int]:
        """(bytes read, bytes in this processor's files), for progress bars and ETAs.
        The current file's position is its byte stream's, which reads ahead by a buffer."""
        sizes = self._sizes
        i = self._file_index
        done = sum(sizes[:i])
        if i < len(sizes) and self._fh is not None:
            try:
                done += min(sizes[i], int(getattr(self._fh, "buffer", self._fh).tell()))
            except (OSError, ValueError, AttributeError, TypeError):
                pass
        return done, sum(sizes)

    def close(self) -> None:
        self._close_file()

    def _decode_error(self, error: UnicodeDecodeError) -> ValueError:
        """The file, line, column and byte offset where the current file stops being
        text in the reader's encoding (found again by reading it from its start: blocks
        are decoded whole, so ``error`` alone does not know the line)."""
        path = self._current_path()
        encoding = self._encoding
        try:
            place = locate_decode_error(path, encoding)
        except OSError:
            place = None
        if place is None:  # gone or rewritten meanwhile: say what the reader saw
            return ValueError(f"{self._where()}: {describe_decode_error(error, encoding)}")
        text = describe_decode_error(place.error, encoding, place.column, place.offset)
        return ValueError(f"{self._where(place.line)}: {text}")

    def _current_path(self) -> str:
        """The file being read (for error messages)."""
        return self._files[self._file_index]

    def _where(self, line: int | None = None) -> str:
        path = self._current_path()
        at = f"{path}:{line}" if line is not None else path
        return f"{self.factory} (vertex {self.context.vertex_name!r}): {at}"


class LineFileSourceP(FileSourceP):
    """A file source whose records are lines (``read_files``, ``read_jsonl``): split
    over all processors of all members by byte ranges (:mod:`.byte_ranges`) when the
    encoding allows, else by file as :class:`FileSourceP`.

    Each processor reads one stretch of the files laid end to end in sorted path order
    (``total bytes / n`` each, cut anywhere: a range reads the lines that start in it).
    Its snapshot entry is ``("ranges", [(name, byte offset reached, end), ...])``, what
    it has left; a restore with the same total parallelism takes its own entry, one with
    another parallelism (a rescale, another process count) lays every processor's rest
    end to end and cuts it again, so nothing is read twice or lost. Entries of the split
    by file (``(file index, records)``, written before byte ranges) are turned into
    ranges on restore, by reading the file up to that record.
    """

    def __init__(self, directory: str, glob: str) -> None:
        super().__init__(directory, glob)
        self._by_bytes = False
        self._pieces: list[Piece] = []
        self._piece_index = 0
        self._reader: LineRange | None = None
        self._share_bytes = 0
        self._saved: dict[int, tuple[int, Any]] = {}

    def _splittable(self) -> bool:
        return splittable(self._encoding)

    def _records_of(self, lines: list[str], first: int) -> list[Any]:
        """The records of ``lines`` (lines ``first, ...`` of the reader's block)."""
        return lines

    def init_processor(self, context: Context) -> None:
        super().init_processor(context)
        self._by_bytes = self._splittable()
        if self._by_bytes:
            whole = [(self._name(f), 0, os.path.getsize(f)) for f in self._all_files]
            share = split_pieces(whole, context.total_parallelism)
            self._set_pieces(share[context.global_processor_index])

    def _name(self, path: str) -> str:
        return os.path.relpath(path, self._directory)

    def _set_pieces(self, pieces: list[Piece]) -> None:
        self._close_file()
        self._pieces = pieces
        self._piece_index = 0
        self._share_bytes = sum(max(0, e - s) for _, s, e in pieces)

    def _current_path(self) -> str:
        if not self._by_bytes:
            return super()._current_path()
        return os.path.join(self._directory, self._pieces[self._piece_index][0])

    def complete(self) -> bool:
        if not self._by_bytes:
            return super().complete()
        pieces = self._pieces
        outbox = self.outbox
        while self._piece_index < len(pieces):
            room = _emit_room(outbox)
            if room <= 0:
                return False
            try:
                reader = self._reader
                if reader is None:
                    _, start, end = pieces[self._piece_index]
                    reader = self._reader = LineRange(
                        self._current_path(), start, end, self._encoding, READ_BLOCK_BYTES
                    )
                lines = reader.take(room)
            except UnicodeDecodeError as e:
                raise self._decode_error(e) from e
            if not lines:
                self._close_file()
                self._piece_index += 1
                continue
            chunk = self._records_of(lines, reader.pos - len(lines))
            if chunk:
                _emit_chunk(outbox, chunk)
        return True

    def _close_file(self) -> None:
        reader = self._reader
        if reader is not None:
            self._reader = None
            reader.close()
        super()._close_file()

    def _position(self) -> Any:
        if not self._by_bytes:
            return super()._position()
        rest = self._pieces[self._piece_index :]
        reader = self._reader
        if reader is not None and rest:
            name, _, end = rest[0]
            rest = [(name, reader.position(), end), *rest[1:]]
        return ("ranges", rest)

    def restore_from_snapshot_entry(self, key: Any, value: Any) -> None:
        if not self._by_bytes:
            super().restore_from_snapshot_entry(key, value)
            return
        ctx = self.context
        name = tagged_broadcast_name(
            key, self.snapshot_tag, 2, ctx.vertex_name, f"a {type(self).__name__} source"
        )
        self._saved[name[1]] = value

    def finish_snapshot_restore(self) -> bool:
        saved, self._saved = self._saved, {}
        if not self._by_bytes or not saved:
            return True
        ctx = self.context
        n, index = ctx.total_parallelism, ctx.global_processor_index
        if index in saved and all(tp == n for tp, _ in saved.values()):
            self._set_pieces(self._rest_of(index, *saved[index]))
            return True
        order = {self._name(f): i for i, f in enumerate(self._all_files)}
        rest = [p for i, (tp, pos) in saved.items() if i < tp for p in self._rest_of(i, tp, pos)]
        rest.sort(key=lambda p: (order.get(p[0], len(order)), p[0], p[1]))
        self._set_pieces(split_pieces(rest, n)[index])
        return True

    def _rest_of(self, index: int, parallelism: int, position: Any) -> list[Piece]:
        """What processor ``index`` of ``parallelism`` had left at the snapshot."""
        if type(position) is tuple and position and position[0] == "ranges":
            return [(str(n), int(s), int(e)) for n, s, e in position[1]]
        file_index, records = position  # saved by the split by file
        files = self._all_files[index::parallelism]
        rest = [(self._name(f), 0, os.path.getsize(f)) for f in files[file_index:]]
        if rest and records:
            name, _, size = rest[0]
            rest[0] = (name, self._offset_after(os.path.join(self._directory, name), records), size)
        return rest

    def _offset_after(self, path: str, records: int) -> int:
        """The byte offset after the first ``records`` records of the file at ``path``."""
        reader = LineRange(path, 0, os.path.getsize(path), self._encoding, READ_BLOCK_BYTES)
        try:
            while records > 0:
                lines = reader.take(records)
                if not lines:
                    break
                records -= self._records_counted(lines)
            return reader.position()
        finally:
            reader.close()

    def _records_counted(self, lines: list[str]) -> int:
        """How many of ``lines`` the split by file counted as records."""
        return len(lines)

    def progress(self) -> tuple[int, int]:
        """(bytes read, bytes of this processor's ranges): for progress bars; the
        current range's bytes count from the start of the block being read."""
        if not self._by_bytes:
            return super().progress()
        pieces = self._pieces
        done = sum(e - s for _, s, e in pieces[: self._piece_index])
        reader = self._reader
        if reader is not None and self._piece_index < len(pieces):
            _, s, e = pieces[self._piece_index]
            done += max(0, min(e, reader.block_at) - s)
        return done, self._share_bytes


class ReadFilesP(LineFileSourceP):
    """Emits the lines of the files, one item per line without its line ending; files
    in sorted path order, lines in file order. ``"\\r\\n"`` and ``"\\r"`` endings read as
    ``"\\n"``.

    The file is read in blocks of :data:`READ_BLOCK_CHARS` characters, each split into
    lines at once (one ``str.split`` per block instead of a line iterator plus a strip
    per line: about half the cost per line); the lines of a block not emitted yet wait
    in ``_lines``, a line cut by the block's end in ``_tail``.
    """

    def __init__(self, directory: str, glob: str, encoding: str) -> None:
        super().__init__(directory, glob)
        self._encoding = encoding
        self._lines: list[str] = []
        self._pos = 0
        self._tail: list[str] = []
        self._eof = False

    def _start_file(self) -> None:
        # newline=None: universal newlines, without str.splitlines' exotic separators
        fh = self._fh = open(  # closed in _close_file() / close()
            self._files[self._file_index], encoding=self._encoding, newline=None
        )
        if self._record:
            for _ in islice(fh, self._record):
                pass
        self._it = fh
        self._lines = []
        self._pos = 0
        self._tail = []
        self._eof = False

    def _read(self, room: int) -> list[Any]:
        """Up to ``room`` lines; fewer only at the end of the file."""
        lines, pos = self._lines, self._pos
        if len(lines) - pos >= room:
            self._pos = pos + room
            return lines[pos : pos + room]
        chunk = lines[pos:] if pos else lines
        self._lines, self._pos = [], 0
        read = self._fh.read
        tail = self._tail
        while len(chunk) < room and not self._eof:
            text = read(READ_BLOCK_CHARS)
            if not text:
                self._eof = True
                if tail:  # the last line has no line ending
                    chunk.append("".join(tail))
                    tail.clear()
                break
            pieces = text.split("\n")
            if len(pieces) == 1:  # no line ends in this block (a long line)
                tail.append(text)
                continue
            if tail:
                tail.append(pieces[0])
                pieces[0] = "".join(tail)
                tail.clear()
            last = pieces.pop()  # the start of a line the next block goes on with
            if last:
                tail.append(last)
            need = room - len(chunk)
            if len(pieces) <= need:
                if chunk:
                    chunk += pieces
                else:
                    chunk = pieces
            else:
                chunk += pieces[:need]
                self._lines, self._pos = pieces, need
        return chunk


# characters per read of ReadFilesP: measured 38 ns per line at 64 Ki vs 89 ns for the
# line iterator (short lines); larger blocks were no faster
READ_BLOCK_CHARS = 1 << 16
# bytes per read of a byte range (LineFileSourceP): one decode and one split per block
READ_BLOCK_BYTES = 1 << 16


class ReadCsvP(FileSourceP):
    """Emits the rows of CSV files as dicts (``as_dicts``, keyed by the header) or
    tuples of strings. With ``header``, each file's first row names the columns and is
    not emitted, and a row with another number of fields fails the job naming the file
    and line, or under ``JobConfig(on_item_error=...)`` is set aside (its dead letter's
    ``item`` the row's fields, or ``None`` where ``csv`` could not read it; its
    ``source`` the file and line). Blank lines are skipped."""

    handles_item_errors = True

    snapshot_tag = "csv-offset"
    factory = "read_csv"

    def __init__(
        self, directory: str, glob: str, header: bool, as_dicts: bool, dialect: Any
    ) -> None:
        super().__init__(directory, glob)
        self._header = header
        self._as_dicts = as_dicts
        self._dialect = dialect

    def _records(self, path: str) -> Iterator[Any]:
        fh = self._fh = open(path, encoding="utf-8", newline="")  # closed in _close_file
        # set when the reader asks for a line after the last one: a row it returns then
        # was cut by the end of the file (an unclosed quote), which csv does not report
        # (chain + iter(callable, sentinel): no Python code per line)
        at_end: list[bool] = []
        lines = chain(fh, iter(functools.partial(at_end.append, True), None))
        reader = csv.reader(lines, self._dialect)
        names: list[str] | None = None
        as_dicts = self._as_dicts
        while True:
            try:
                for row in reader:
                    if at_end:
                        bad, start = self._unclosed(row, reader)
                        if self._set_aside(row, bad, start):
                            return  # the rest of the file was that field
                        raise bad
                    if not row:
                        continue
                    if self._header and names is None:
                        names = row
                        continue
                    if names is not None and len(row) != len(names):
                        bad = ValueError(
                            f"{self._where(reader.line_num)}: malformed CSV row: {len(row)} "
                            f"fields where the header has {len(names)} ({row!r})"
                        )
                        if self._set_aside(row, bad, reader.line_num):
                            continue
                        raise bad
                    if as_dicts:
                        yield dict(zip(names, row, strict=True))  # type: ignore[arg-type]
                    else:
                        yield tuple(row)
                return
            except csv.Error as e:
                bad = ValueError(f"{self._where(reader.line_num)}: malformed CSV row: {e}")
                if not self._set_aside(None, bad, reader.line_num):
                    raise bad from e

    def _unclosed(self, row: list[str], reader: Any) -> tuple[ValueError, int]:
        """The error for a row the end of the file cut, and the line it starts on: its
        last field is the one left open, so that line is the file's last line less the
        line breaks in that field (each line's own break included)."""
        last = reader.line_num
        field = row[-1] if row else ""
        breaks = len(_LINE_BREAK.findall(field))
        start = last - breaks + (1 if _LINE_BREAK.search(field[-1:] or "x") else 0)
        if reader.dialect.quoting == csv.QUOTE_NONE:
            what = "a field continued by an escaped line break"
        else:
            what = "unclosed quote: the quoted field that starts on this line"
        return (
            ValueError(f"{self._where(start)}: {what} runs to the end of the file (line {last})"),
            start,
        )


_LINE_BREAK = re.compile(r"\r\n|\r|\n")


class ReadJsonlP(LineFileSourceP):
    """Emits one item per line of JSON-lines files (``json.loads`` of the line).
    Blank lines are skipped; a malformed line fails the job naming the file and line, or
    under ``JobConfig(on_item_error=...)`` is set aside (the line, and its file and line
    number as the dead letter's ``source``)."""

    handles_item_errors = True

    snapshot_tag = "jsonl-offset"
    factory = "read_jsonl"

    def _records_of(self, lines: list[str], first: int) -> list[Any]:
        loads = json.loads
        try:
            return [loads(line) for line in lines]
        except json.JSONDecodeError:
            pass  # a blank or malformed line among them: line by line
        out = []
        reader = self._reader
        assert reader is not None
        for i, line in enumerate(lines):
            try:
                out.append(loads(line))
            except json.JSONDecodeError as e:
                if not line.strip():
                    continue
                lineno = reader.line_number(first + i)
                bad = ValueError(
                    f"{self._where(lineno)}: malformed JSON line: {e.msg} "
                    f"(column {e.colno}): {line.rstrip()[:200]!r}"
                )
                if self._set_aside(line, bad, lineno):
                    continue
                raise bad from None
        return out

    def _records_counted(self, lines: list[str]) -> int:
        count = 0
        for line in lines:
            try:
                json.loads(line)
            except json.JSONDecodeError:
                continue
            count += 1
        return count

    def _records(self, path: str) -> Iterator[Any]:
        fh = self._fh = open(path, encoding="utf-8", newline=None)  # closed in _close_file
        loads = json.loads
        for lineno, line in enumerate(fh, 1):
            try:
                item = loads(line)
            except json.JSONDecodeError as e:
                if not line.strip():
                    continue
                bad = ValueError(
                    f"{self._where(lineno)}: malformed JSON line: {e.msg} "
                    f"(column {e.colno}): {line.rstrip()[:200]!r}"
                )
                if self._set_aside(line.rstrip("\r\n"), bad, lineno):
                    continue
                raise bad from None
            yield item


class ReadParquetP(FileSourceP):
    """Emits the rows of Parquet files as dicts (column name -> value), read one row
    group batch at a time."""

    snapshot_tag = "parquet-offset"
    factory = "read_parquet"
    batch_rows = 1024

    def _records(self, path: str) -> Iterator[Any]:
        pq = require_pyarrow(self.factory).parquet
        fh = self._fh = open(path, "rb")  # closed in _close_file
        try:
            pf = pq.ParquetFile(fh)
        except Exception as e:  # noqa: BLE001 - pyarrow raises several kinds
            raise ValueError(f"{self._where()}: not a readable Parquet file: {e}") from e
        for batch in pf.iter_batches(batch_size=self.batch_rows):
            yield from batch.to_pylist()


# -- factories -----------------------------------------------------------------------


def _check_glob(glob: Any, factory: str) -> None:
    if not isinstance(glob, str) or not glob:
        raise TypeError(f"{factory}(): argument 'glob' must be a non-empty str, got {glob!r}")


def read_files(
    directory: str | os.PathLike[str], glob: str = "*", encoding: str = "utf-8"
) -> functools.partial[ReadFilesP]:
    """A source emitting the lines (without line endings) of the data files in
    ``directory`` whose names match ``glob`` (``pathlib`` glob syntax, relative to
    ``directory``; names starting with ``.`` or ``_`` are never read). A glob in
    ``directory`` itself (``read_files("data/*.txt")``) is understood (:func:`split_glob`).

    The files, sorted by path and laid end to end, are split across all processors of
    all members by bytes: processor ``i`` of ``n`` reads the lines that start in the
    ``i``-th ``1/n`` of the bytes, in file and line order (an encoding where a ``\n``
    byte can be part of another character, such as UTF-16, splits by file instead:
    processor ``i`` reads files ``i, i + n, ...``). The directory is checked when
    the job starts: a missing one fails the job with an error naming it, and so does a
    glob that matches none of the data files it holds (a directory without any data
    file is empty input, with a warning).
    """
    check_path(directory, "read_files")
    _check_glob(glob, "read_files")
    directory, glob = split_glob(os.fspath(directory), glob, "*", "read_files")
    try:
        codecs.lookup(encoding)
    except (LookupError, TypeError):
        raise ValueError(f"read_files(): unknown encoding {encoding!r}") from None
    return functools.partial(ReadFilesP, os.fspath(directory), glob, encoding)


def read_csv(
    directory: str | os.PathLike[str],
    glob: str = "*.csv",
    *,
    header: bool = True,
    as_dicts: bool = True,
    dialect: str | type[csv.Dialect] = "excel",
) -> functools.partial[ReadCsvP]:
    """A source emitting the rows of the CSV files in ``directory`` matching ``glob``
    (UTF-8; split across processors by file: processor ``i`` of ``n`` reads files ``i,
    i + n, ...``, since a quoted field may hold a line break and a cut in the middle of
    a file cannot tell where a row starts).

    ``header``: each file's first row holds the column names (not emitted).
    ``as_dicts``: rows as ``{column: value}`` dicts (needs ``header``), else tuples.
    ``dialect``: a name from ``csv.list_dialects()`` or a ``csv.Dialect`` subclass.
    Values are strings, as in the file; convert them in a following ``P.map``.
    """
    check_path(directory, "read_csv")
    _check_glob(glob, "read_csv")
    directory, glob = split_glob(os.fspath(directory), glob, "*.csv", "read_csv")
    if as_dicts and not header:
        raise ValueError("read_csv(): as_dicts=True needs header=True (dict keys come from it)")
    check_csv_dialect(dialect, "read_csv")
    return functools.partial(
        ReadCsvP, os.fspath(directory), glob, bool(header), bool(as_dicts), dialect
    )


def read_jsonl(
    directory: str | os.PathLike[str], glob: str = "*.jsonl"
) -> functools.partial[ReadJsonlP]:
    """A source emitting one decoded JSON value per line of the JSON-lines files in
    ``directory`` matching ``glob`` (UTF-8; blank lines skipped; split across
    processors by bytes as :func:`read_files` does)."""
    check_path(directory, "read_jsonl")
    _check_glob(glob, "read_jsonl")
    directory, glob = split_glob(os.fspath(directory), glob, "*.jsonl", "read_jsonl")
    return functools.partial(ReadJsonlP, os.fspath(directory), glob)


def read_parquet(
    directory: str | os.PathLike[str], glob: str = "*.parquet"
) -> functools.partial[ReadParquetP]:
    """A source emitting the rows of the Parquet files in ``directory`` matching
    ``glob`` as dicts. Needs pyarrow (``pip install -e '.[parquet]'``)."""
    check_path(directory, "read_parquet")
    _check_glob(glob, "read_parquet")
    directory, glob = split_glob(os.fspath(directory), glob, "*.parquet", "read_parquet")
    require_pyarrow("read_parquet")
    return functools.partial(ReadParquetP, os.fspath(directory), glob)
