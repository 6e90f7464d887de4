"""Bad text in the batch file sources: bytes that do not decode are named by file, line,
column and byte offset (found again after the block decoder failed), and a CSV field
whose quote never closes fails naming the line where it opens instead of swallowing the
rest of the file. Each through the engine (the message users see) and under the
processor harness (restores after every record)."""

from __future__ import annotations

import codecs
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import slipstream as ss
from slipstream import DAG, Edge, sinks, sources
from slipstream.testing import verify_processor


def job_error(src: Any) -> str:
    """The first line of the error of a job reading ``src`` (vertex 'src')."""
    dag = DAG()
    s = dag.new_vertex("src", src)
    k = dag.new_vertex("sink", sinks.list_sink("out"))
    dag.edge(Edge.between(s, k))
    with pytest.raises(ss.JobFailedError) as info:
        ss.local().new_job(dag).join(60)
    return str(info.value).split("\n")[0].split(" failed: ", 1)[1]


def rows(src: Any) -> list[Any]:
    dag = DAG()
    s = dag.new_vertex("src", src)
    k = dag.new_vertex("sink", sinks.list_sink("out"))
    dag.edge(Edge.between(s, k))
    engine = ss.local()
    engine.new_job(dag).join(60)
    return list(engine.get_list("out"))


# -- undecodable bytes ---------------------------------------------------------------------


def test_read_files_names_file_line_column_and_offset(tmp_path: Path) -> None:
    (tmp_path / "x.txt").write_bytes(b"ok\nfine\r\nt\xc3\xa9 \xffcd\nmore\n")
    path = tmp_path / "x.txt"
    assert job_error(sources.read_files(tmp_path)) == (
        f"vertex 'src', processor 0: ValueError: read_files (vertex 'src'): {path}:3: invalid "
        "UTF-8 (byte 0xff at column 4, offset 13 in the file: invalid start byte)"
    )
    with pytest.raises(ValueError, match=r"x\.txt:3: invalid UTF-8 \(byte 0xff at column 4,"):
        verify_processor(sources.read_files(tmp_path)).disable_snapshots().expect_output([])


def test_read_files_error_far_into_a_file(tmp_path: Path) -> None:
    # past several 64 Ki-character blocks, with multi-byte characters and \r\n endings
    line = "ab€d\r\n"  # 6 characters, 8 bytes
    n = 40_000
    (tmp_path / "big.txt").write_bytes((line * n + "é ").encode() + b"\xe2\x82\n")
    assert job_error(sources.read_files(tmp_path)).endswith(
        f"big.txt:{n + 1}: invalid UTF-8 (bytes 0xe2 0x82 at column 3, offset {8 * n + 3} in "
        "the file: invalid continuation byte)"
    )


def test_read_files_other_encodings_name_theirs(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_bytes(b"plain\n\x80\n")
    assert job_error(sources.read_files(tmp_path, encoding="ascii")).endswith(
        "a.txt:2: invalid ascii (byte 0x80 at column 1, offset 6 in the file: ordinal not in "
        "range(128))"
    )


def test_read_csv_and_read_jsonl_name_the_bad_byte(tmp_path: Path) -> None:
    (tmp_path / "y.csv").write_bytes(b"a,b\n1,2\n3,\xe2\x82\n")
    assert job_error(sources.read_csv(tmp_path)) == (
        f"vertex 'src', processor 0: ValueError: read_csv (vertex 'src'): {tmp_path / 'y.csv'}:3: "
        "invalid UTF-8 (bytes 0xe2 0x82 at column 3, offset 10 in the file: invalid continuation "
        "byte)"
    )
    (tmp_path / "z.jsonl").write_bytes(b'{"a": 1}\n\n"\xc3"\n')
    assert job_error(sources.read_jsonl(tmp_path)) == (
        f"vertex 'src', processor 0: ValueError: read_jsonl (vertex 'src'): {tmp_path / 'z.jsonl'}:3: "
        "invalid UTF-8 (byte 0xc3 at column 2, offset 11 in the file: invalid continuation byte)"
    )


PIECES = ["a", "é", "€", "𝄞", "\n", "\r", "\r\n"]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.sampled_from(PIECES), max_size=30),
    st.sampled_from([b"\xff", b"\xc3", b"\xe2\x82", b"\xed\xa0\x80"]),
    st.lists(st.sampled_from(PIECES), max_size=5),
    st.integers(1, 9),
)
def test_locating_matches_a_whole_file_decode(
    tmp_path_factory: Any, before: list[str], bad: bytes, after: list[str], chunk: int
) -> None:
    """Wherever the chunks of the search cut the bytes (multi-byte characters, \\r\\n),
    the place is the one a decode of the whole prefix gives."""
    from slipstream.sources import decoding

    prefix = "".join(before)
    data = prefix.encode() + bad + "".join(after).encode()
    path = tmp_path_factory.mktemp("t") / "f.txt"
    path.write_bytes(data)
    lines = prefix.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    old = decoding._LOCATE_CHUNK
    decoding._LOCATE_CHUNK = chunk
    try:
        place = decoding.locate_decode_error(str(path), "utf-8")
    finally:
        decoding._LOCATE_CHUNK = old
    assert place is not None
    assert (place.line, place.column, place.offset) == (
        len(lines),
        len(lines[-1]) + 1,
        len(prefix.encode()),
    )
    with pytest.raises(UnicodeDecodeError):
        codecs.decode(data, "utf-8")


def test_a_file_that_decodes_after_all_is_not_located(tmp_path: Path) -> None:
    from slipstream.sources.decoding import locate_decode_error

    (tmp_path / "ok.txt").write_text("fine\n", encoding="utf-8")
    assert locate_decode_error(str(tmp_path / "ok.txt"), "utf-8") is None


# -- CSV quotes ----------------------------------------------------------------------------


def unclosed(path: Path, start: int, end: int) -> str:
    return (
        f"vertex 'src', processor 0: ValueError: read_csv (vertex 'src'): {path}:{start}: "
        f"unclosed quote: the quoted field that starts on this line runs to the end of the "
        f"file (line {end})"
    )


@pytest.mark.parametrize("eol", ["\n", "\r\n"])
@pytest.mark.parametrize("last_eol", [True, False])
def test_read_csv_unclosed_quote_names_the_line_it_opens(
    tmp_path: Path, eol: str, last_eol: bool
) -> None:
    text = eol.join(["a,b", '1,"x', "2,y", "3,z"]) + (eol if last_eol else "")
    (tmp_path / "f.csv").write_bytes(text.encode())
    assert job_error(sources.read_csv(tmp_path)) == unclosed(tmp_path / "f.csv", 2, 4)
    assert job_error(sources.read_csv(tmp_path, header=False, as_dicts=False)) == unclosed(
        tmp_path / "f.csv", 2, 4
    )


def test_read_csv_unclosed_quote_after_a_multi_line_field(tmp_path: Path) -> None:
    # the record starts on line 2, its second field spans lines 2-3, the third opens on 3
    (tmp_path / "f.csv").write_text('a,b,c\n1,"two\nlines","open\n\nend\n', encoding="utf-8")
    assert job_error(sources.read_csv(tmp_path)) == unclosed(tmp_path / "f.csv", 3, 5)
    with pytest.raises(ValueError, match=r"f\.csv:3: unclosed quote"):
        verify_processor(sources.read_csv(tmp_path)).disable_snapshots().expect_output([])


def test_read_csv_unclosed_quote_in_the_header(tmp_path: Path) -> None:
    (tmp_path / "f.csv").write_text('"a,b\n1,2\n', encoding="utf-8")
    assert job_error(sources.read_csv(tmp_path)) == unclosed(tmp_path / "f.csv", 1, 2)


def test_read_csv_quoted_line_breaks_still_read(tmp_path: Path) -> None:
    (tmp_path / "f.csv").write_bytes(b'a,b\r\n1,"multi\r\nline"\r\n"2","x\n""y"""\n3,z')
    expected = [
        {"a": "1", "b": "multi\r\nline"},
        {"a": "2", "b": 'x\n"y"'},
        {"a": "3", "b": "z"},
    ]
    assert rows(sources.read_csv(tmp_path)) == expected
    verify_processor(sources.read_csv(tmp_path)).expect_output(expected)
