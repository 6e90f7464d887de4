"""read_files / read_jsonl split by byte ranges: every line read exactly once whatever
the cuts (random line lengths, empty lines, CRLF and lone CR, no final newline,
multi-byte UTF-8 across the cuts), also after a restore with another parallelism and
from a snapshot entry of the split by file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from test_batch_sources import run_source

from slipstream import sources
from slipstream.core.inbox import Inbox
from slipstream.core.outbox import Outbox
from slipstream.core.processor import Context, Processor
from slipstream.sources import files as files_module
from slipstream.state.keys import BroadcastKey


def python_lines(path: Path, encoding: str = "utf-8") -> list[str]:
    with open(path, encoding=encoding, newline=None) as fh:
        return [line[:-1] if line.endswith("\n") else line for line in fh]


def started(supplier: Any, index: int, total: int, capacity: int) -> tuple[Processor, Outbox]:
    proc = supplier()
    outbox = Outbox(1, capacity)
    proc.init(outbox, Context("src", global_processor_index=index, total_parallelism=total))
    return proc, outbox


def drain(proc: Processor, outbox: Outbox, calls: int | None = None) -> list[Any]:
    """Call complete() ``calls`` times (None: until True), returning what it emitted."""
    out: list[Any] = []
    n = 0
    while calls is None or n < calls:
        done = proc.complete()
        out += outbox.buckets[0]
        outbox.buckets[0].clear()
        n += 1
        if done:
            break
    return out


def saved_entries(procs: list[tuple[Processor, Outbox]]) -> list[tuple[Any, Any]]:
    entries = []
    for proc, outbox in procs:
        while not proc.save_to_snapshot():
            pass
        entries += outbox.snapshot_bucket
        outbox.snapshot_bucket.clear()
    return entries


def restored(supplier: Any, n: int, entries: list[Any], capacity: int) -> list[Any]:
    """Every line read by ``n`` fresh processors restored from ``entries``."""
    out: list[Any] = []
    for i in range(n):
        proc, outbox = started(supplier, i, n, capacity)
        proc.restore_from_snapshot(Inbox(list(entries)))
        assert proc.finish_snapshot_restore()
        out += drain(proc, outbox)
        proc.close()
    return out


texts = st.text(alphabet="ab\r\n\u00e9\u20ac", max_size=50)


@settings(max_examples=60, deadline=None)
@given(
    contents=st.lists(texts, min_size=1, max_size=3),
    total=st.integers(1, 5),
    block=st.integers(1, 7),
    capacity=st.integers(1, 4),
    restore_every=st.integers(0, 2),
)
# a restore mid-block right after an empty line, and CR LF cut by a block and a range
@example(contents=["\n\nb\n"], total=1, block=7, capacity=1, restore_every=1)
@example(contents=["ab\r\ncd\r\n\u20ac\r"], total=3, block=3, capacity=2, restore_every=1)
def test_byte_ranges_read_every_line_once_in_order(
    tmp_path_factory: Any,
    contents: list[str],
    total: int,
    block: int,
    capacity: int,
    restore_every: int,
) -> None:
    """Processors 0..n-1 together emit the lines of Python's universal-newline reader,
    in file and line order, each once; with blocks of 1-7 bytes and restores between
    calls."""
    d = tmp_path_factory.mktemp("ranges")
    expected: list[str] = []
    for i, text in enumerate(contents):
        (d / f"f{i}.txt").write_bytes(text.encode("utf-8"))
        expected += python_lines(d / f"f{i}.txt")
    got: list[str] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(files_module, "READ_BLOCK_BYTES", block, raising=False)
        for i in range(total):
            (share,) = run_source(
                sources.read_files(d, "*.txt"),
                index=i,
                total=total,
                capacity=capacity,
                restore_every=restore_every,
            )
            got += share
    assert got == expected


def test_one_file_is_shared_by_every_processor(tmp_path: Path) -> None:
    """The split by file left all but one processor idle on a single file."""
    (tmp_path / "one.txt").write_text("".join(f"line {i:03d}\n" for i in range(100)))
    shares = [run_source(sources.read_files(tmp_path), index=i, total=4)[0] for i in range(4)]
    assert [len(s) for s in shares] == [25, 25, 25, 25]
    assert sum(shares, []) == [f"line {i:03d}" for i in range(100)]


@settings(max_examples=30, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 12), min_size=1, max_size=40),
    files=st.integers(1, 3),
    before=st.integers(1, 4),
    after=st.integers(1, 4),
    calls=st.integers(0, 6),
    capacity=st.integers(1, 3),
)
def test_restore_with_another_parallelism_reads_the_rest_once(
    tmp_path_factory: Any,
    lengths: list[int],
    files: int,
    before: int,
    after: int,
    calls: int,
    capacity: int,
) -> None:
    """``before`` processors run ``calls`` calls each and snapshot mid-range; ``after``
    processors restored from all their entries emit exactly the lines not emitted yet."""
    d = tmp_path_factory.mktemp("rescale")
    lines = [f"{i}:" + "\u00e9" * n for i, n in enumerate(lengths)]
    per = -(-len(lines) // files)
    for f in range(files):
        part = lines[f * per : (f + 1) * per]
        (d / f"p{f}.txt").write_text("".join(line + "\r\n" for line in part), encoding="utf-8")
    supplier = sources.read_files(d, "*.txt")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(files_module, "READ_BLOCK_BYTES", 5, raising=False)
        procs = [started(supplier, i, before, capacity) for i in range(before)]
        first = [line for proc, outbox in procs for line in drain(proc, outbox, calls)]
        entries = saved_entries(procs)
        rest = restored(supplier, after, entries, capacity)
    assert sorted(first + rest) == sorted(lines)
    assert len(first + rest) == len(lines)


@pytest.mark.parametrize("after", [1, 2, 3])
def test_snapshot_of_the_split_by_file_restores(tmp_path: Path, after: int) -> None:
    """Entries written before byte ranges, ``(total, (file index, records))`` per
    processor of the split by file, restore into byte ranges with any parallelism."""
    names = ["a.txt", "b.txt", "c.txt"]
    lines = {n: [f"{n}{i}" for i in range(5)] for n in names}
    for n in names:
        (tmp_path / n).write_text("\n".join(lines[n]) + "\n")
    # two processors: 0 had a.txt, c.txt and was at c.txt's third line; 1 had b.txt, done
    entries = [
        (BroadcastKey(("files-offset", 0)), (2, (1, 2))),
        (BroadcastKey(("files-offset", 1)), (2, (1, 0))),
    ]
    rest = restored(sources.read_files(tmp_path, "*.txt"), after, entries, 3)
    assert rest == lines["c.txt"][2:]


def test_jsonl_by_ranges_names_the_line_and_restores_old_entries(tmp_path: Path) -> None:
    rows = [json.dumps({"i": i}) for i in range(50)]
    rows[37] = "{bad json"
    rows[10] = ""
    (tmp_path / "x.jsonl").write_text("\n".join(rows) + "\n")
    proc, outbox = started(sources.read_jsonl(tmp_path), 1, 2, 100)
    with pytest.raises(ValueError, match=r"x\.jsonl:38: malformed JSON line: .*'\{bad json'"):
        drain(proc, outbox)
    proc.close()
    (tmp_path / "x.jsonl").write_text("\n".join(r for r in rows if r != "{bad json") + "\n")
    # the split by file had emitted 20 records (the blank line is none)
    entry = (BroadcastKey(("jsonl-offset", 0)), (1, (0, 20)))
    got = restored(sources.read_jsonl(tmp_path), 2, [entry], 4)
    assert got == [{"i": i} for i in range(21, 50) if i != 37]


def test_encodings_without_byte_line_ends_keep_the_split_by_file(tmp_path: Path) -> None:
    for n in ("a", "b"):
        (tmp_path / f"{n}.txt").write_bytes(f"{n}1\n{n}2\n".encode("utf-16"))
    supplier = sources.read_files(tmp_path, encoding="utf-16")
    shares = [run_source(supplier, index=i, total=2, restore_every=1)[0] for i in range(2)]
    assert shares == [["a1", "a2"], ["b1", "b2"]]
