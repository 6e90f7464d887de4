"""Bad input for the streaming text sources: huge lines (linear time, bounded calls, a
maximum length), undecodable lines (named by file and line, or skipped and counted), and
log rotation of watched files (rename, copytruncate) without re-read lines or fragments."""

from __future__ import annotations

import os
import re
import shutil
from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_streaming_sources import (
    HOST,
    LineServer,
    drain,
    init_processor,
    sending,
    split_bytes,
    take,
)

from slipstream import sources
from slipstream.sources.lines import LineAssembler, LineTooLongError, SkippedLine
from slipstream.sources.streaming import FILE_READ_CHUNK, StreamFilesP, StreamSocketP


def oracle(data: bytes, limit: int | None) -> list[Any]:
    """Complete lines of ``data``; a line over ``limit`` as SkippedLine(length)."""
    lines = data.split(b"\n")[:-1]
    return [SkippedLine(len(x)) if limit is not None and len(x) > limit else x for x in lines]


def norm(lines: list[Any]) -> list[Any]:
    return [("skipped", x.length) if isinstance(x, SkippedLine) else x for x in lines]


@settings(max_examples=200, deadline=None)
@given(
    data=st.binary(max_size=300).map(lambda b: b.replace(b"\x00", b"\n")),
    cuts=st.lists(st.integers(0, 300), max_size=10),
    limit=st.one_of(st.none(), st.integers(1, 40)),
)
def test_line_assembler_matches_a_plain_split_however_the_bytes_arrive(
    data: bytes, cuts: list[int], limit: int | None
) -> None:
    a = LineAssembler(limit, skip_long=True)
    out: list[Any] = []
    for chunk in split_bytes(data, cuts):
        out += a.feed(chunk)
    assert norm(out) == norm(oracle(data, limit))
    last = a.finish()
    tail = data[data.rfind(b"\n") + 1 :]
    if not tail:
        assert last is None
    else:
        assert norm([last]) == norm(oracle(tail + b"\n", limit))


def test_a_long_line_is_kept_in_pieces_and_refused_once_over_the_limit() -> None:
    a = LineAssembler(10_000)
    for _ in range(9):
        assert a.feed(b"x" * 1000) == []
    assert a.pending == 9000
    with pytest.raises(LineTooLongError, match="longer than 10000 bytes"):
        a.feed(b"x" * 1001)


# -- stream_files -------------------------------------------------------------------------


def files_p(directory: Any, glob: str = "*", **kw: Any) -> tuple[StreamFilesP, Any]:
    p = sources.stream_files(str(directory), glob, poll_interval_ms=0, idle_timeout_ms=None, **kw)()
    return p, init_processor(p)


def test_each_call_reads_a_bounded_part_of_a_huge_line(tmp_path: Any) -> None:
    # 4 MB without a line break: no call reads (or joins) more than one chunk, so the
    # engine keeps running (and cancel() is noticed) while the line grows
    (tmp_path / "big.log").write_bytes(b"y" * (4 * 1024 * 1024))
    p, outbox = files_p(tmp_path, max_line_length=None)
    for _ in range(5):
        p.complete()
    (f,) = p._files.values()
    assert f.read_pos <= 5 * FILE_READ_CHUNK
    assert take(outbox) == []
    with open(tmp_path / "big.log", "ab") as fh:
        fh.write(b"\nnext\n")
    out = drain(p, outbox, quiet_calls=4 * 1024 * 1024 // FILE_READ_CHUNK + 10)
    assert [len(x) for x in out] == [4 * 1024 * 1024, 4]


def test_a_line_over_the_maximum_fails_naming_file_and_line(tmp_path: Any) -> None:
    (tmp_path / "app.log").write_bytes(b"one\ntwo\n" + b"z" * 5000 + b"\nfour\n")
    p, outbox = files_p(tmp_path, max_line_length=1000)
    with pytest.raises(ValueError) as info:
        drain(p, outbox)
    assert str(info.value) == (
        f"stream_files (vertex 'v'): {tmp_path / 'app.log'}:3: line longer than 1000 bytes "
        "(at least 5000) (max_line_length; bad_lines='skip' skips and counts such lines)"
    )


def test_bad_lines_skip_counts_long_and_undecodable_lines(tmp_path: Any) -> None:
    (tmp_path / "app.log").write_bytes(b"one\n" + b"z" * 5000 + b"\n\xff\xfe\nfour\n")
    p, outbox = files_p(tmp_path, max_line_length=1000, bad_lines="skip")
    assert drain(p, outbox) == ["one", "four"]
    assert p.context.metrics["bad_lines_skipped"] == 2


def test_an_undecodable_line_is_named_by_file_and_line(tmp_path: Any) -> None:
    (tmp_path / "bad.txt").write_bytes(b"ok\nfine\nt\xc3\xa9 \xff\xfe\n")
    p, outbox = files_p(tmp_path)
    with pytest.raises(ValueError) as info:
        drain(p, outbox)
    # column in characters (the \xc3\xa9 is one), offset in bytes
    assert str(info.value) == (
        f"stream_files (vertex 'v'): {tmp_path / 'bad.txt'}:3: invalid UTF-8 (byte 0xff "
        "at column 4, offset 12 in the file: invalid start byte) (bad_lines='skip' skips and "
        "counts such lines)"
    )


def write(path: Any, lines: list[str], mode: str = "a") -> None:
    with open(path, mode, encoding="utf-8") as fh:
        fh.write("".join(x + "\n" for x in lines))


def test_rotation_by_rename_reads_every_line_once(tmp_path: Any) -> None:
    log = tmp_path / "app.log"
    write(log, [f"a{i}" for i in range(50)])
    p, outbox = files_p(tmp_path, "app.log")
    out = drain(p, outbox)
    write(log, [f"b{i}" for i in range(50)])  # written just before the rotation, not read yet
    os.rename(log, tmp_path / "app.log.1")  # not matching the glob: followed anyway
    write(log, [f"c{i}" for i in range(80)])  # the new file, longer than the old offset
    out += drain(p, outbox)
    write(tmp_path / "app.log.1", ["late"])  # a writer still holding the old file
    write(log, ["c-last"])
    out += drain(p, outbox)
    expected = [f"{x}{i}" for x in "ab" for i in range(50)] + [f"c{i}" for i in range(80)]
    assert Counter(out) == Counter(expected + ["late", "c-last"])


@pytest.mark.parametrize("copy_matches_glob", [True, False])
def test_copytruncate_reads_no_line_twice_and_emits_no_fragment(
    tmp_path: Any, copy_matches_glob: bool
) -> None:
    log = tmp_path / "app.log"
    write(log, [f"a{i:03d}" for i in range(100)])
    p, outbox = files_p(tmp_path, "app.log*" if copy_matches_glob else "app.log")
    out = drain(p, outbox)
    write(log, [f"b{i:03d}" for i in range(20)])  # not read before the rotation
    shutil.copyfile(log, tmp_path / "app.log.1")
    with open(log, "r+b") as fh:
        fh.truncate(0)
    # the writer goes on: the file grows past the old read position before the next poll
    write(log, [f"new-line-{i:04d}" for i in range(100)])
    out += drain(p, outbox)
    assert len(out) == len(set(out))  # nothing twice
    expected = {f"a{i:03d}" for i in range(100)} | {f"new-line-{i:04d}" for i in range(100)}
    if copy_matches_glob:  # the rest of the old file is read from its copy
        expected |= {f"b{i:03d}" for i in range(20)}
    assert set(out) == expected  # and no fragment of a line


def test_a_file_rewritten_past_the_read_position_is_read_from_its_start(tmp_path: Any) -> None:
    log = tmp_path / "app.log"
    write(log, ["first", "second"])
    p, outbox = files_p(tmp_path)
    assert drain(p, outbox) == ["first", "second"]
    write(log, ["a completely different and longer content", "x"], mode="w")
    assert drain(p, outbox) == ["a completely different and longer content", "x"]


def test_rotation_state_survives_a_snapshot(tmp_path: Any) -> None:
    log = tmp_path / "app.log"
    write(log, [f"a{i}" for i in range(30)])
    p, outbox = files_p(tmp_path, "app.log*")
    out = drain(p, outbox)
    entries: list[Any] = []
    while not p.save_to_snapshot():
        entries += outbox.snapshot_bucket
        outbox.snapshot_bucket.clear()
    entries += outbox.snapshot_bucket
    p.close()
    # while the job is down: copytruncate
    write(log, ["b0", "b1"])
    shutil.copyfile(log, tmp_path / "app.log.1")
    with open(log, "r+b") as fh:
        fh.truncate(0)
    write(log, ["c0"])
    q, qout = files_p(tmp_path, "app.log*")
    from slipstream.core.inbox import Inbox

    q.restore_from_snapshot(Inbox(entries))
    assert q.finish_snapshot_restore()
    out += drain(q, qout)
    assert Counter(out) == Counter([f"a{i}" for i in range(30)] + ["b0", "b1", "c0"])


def test_stream_files_argument_checks(tmp_path: Any) -> None:
    with pytest.raises(ValueError, match="max_line_length"):
        sources.stream_files(str(tmp_path), max_line_length=0)
    with pytest.raises(ValueError, match="bad_lines must be 'fail' or 'skip'"):
        sources.stream_files(str(tmp_path), bad_lines="ignore")


# -- stream_socket ------------------------------------------------------------------------


def socket_lines(data: bytes, **kw: Any) -> tuple[list[Any], StreamSocketP]:
    with LineServer(sending(split_bytes(data, list(range(0, len(data), 4096))))) as server:
        p = StreamSocketP(HOST, server.port, idle_timeout_ms=None, **kw)
        outbox = init_processor(p)
        out: list[Any] = []
        try:
            for _ in range(100_000):
                done = p.complete()
                out += take(outbox)
                if done:
                    return out, p
        finally:
            p.close()
    raise AssertionError("stream_socket did not complete")


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 3))
def test_stream_socket_long_line_over_the_maximum_fails_naming_the_line(n: int) -> None:
    data = b"a\n" * n + b"x" * 20_000 + b"\nb\n"
    with pytest.raises(ValueError, match=rf"stream_socket 127.0.0.1:\d+, line {n + 1}: line longer"):
        socket_lines(data, max_line_length=10_000)


def test_stream_socket_skips_and_counts_bad_lines() -> None:
    data = b"a\n" + b"x" * 20_000 + b"\n\xff\nb\n" + b"y" * 30_000  # the last one at EOF
    out, p = socket_lines(data, max_line_length=10_000, bad_lines="skip")
    assert out == ["a", "b"]
    assert p.context.metrics["bad_lines_skipped"] == 3


def test_stream_socket_undecodable_line_is_named() -> None:
    with pytest.raises(ValueError) as info:
        socket_lines(b"a\n\xff\n")
    assert re.fullmatch(
        r"stream_socket 127\.0\.0\.1:\d+, line 2: invalid UTF-8 \(byte 0xff at column 1: "
        r"invalid start byte\) \(bad_lines='skip' skips and counts such lines\)",
        str(info.value),
    )


def test_stream_socket_megabytes_in_one_line_arrive_whole() -> None:
    big = b"q" * (3 * 1024 * 1024)
    out, _ = socket_lines(b"start\n" + big + b"\nend\n")
    assert [len(x) for x in out] == [5, len(big), 3]
