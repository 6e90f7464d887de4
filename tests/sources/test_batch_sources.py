"""Batch sources: items, list_source, map_source, read_files. Hand-driven with outbox
capacity 1 (resumption, snapshot/restore of positions) and through the engine with
several processors and members (every element exactly once)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import slipstream as ss
from slipstream import DAG, Edge, sinks, sources
from slipstream.core.inbox import Inbox
from slipstream.core.outbox import Outbox
from slipstream.core.processor import Context, Processor
from slipstream.state.keys import BroadcastKey

# -- hand driver -------------------------------------------------------------------------


def run_source(
    supplier: Callable[[], Processor],
    *,
    index: int = 0,
    total: int = 1,
    capacity: int = 1,
    ordinal_count: int = 1,
    restore_every: int = 0,
    context: Context | None = None,
) -> list[list[Any]]:
    """Call complete() until True, draining the outbox between calls. With
    ``restore_every`` = k, every k-th call is followed by save + restore into a fresh
    processor (snapshots of all ``total`` processors would be broadcast: we feed this
    processor's entry plus a foreign one, which it must ignore)."""

    def new() -> tuple[Processor, Outbox]:
        proc = supplier()
        outbox = Outbox(ordinal_count, capacity)
        ctx = context or Context(global_processor_index=index, total_parallelism=total)
        proc.init(outbox, ctx)
        return proc, outbox

    proc, outbox = new()
    out: list[list[Any]] = [[] for _ in range(ordinal_count)]
    for call in range(1, 1_000_000):
        done = proc.complete()
        for i, b in enumerate(outbox.buckets):
            out[i].extend(b)
            b.clear()
        if done:
            proc.close()
            return out
        if restore_every and call % restore_every == 0:
            while not proc.save_to_snapshot():
                pass
            entries = list(outbox.snapshot_bucket)
            assert len(entries) == 1
            ((key, value),) = entries
            assert isinstance(key, BroadcastKey)
            foreign = (BroadcastKey((key.name[0], index + 1000)), value)
            proc.close()
            proc, outbox = new()
            proc.restore_from_snapshot(Inbox([foreign, entries[0]]))
            assert proc.finish_snapshot_restore()
    raise AssertionError("complete() never returned True")


def run_engine(dag: DAG, members: int, engine: ss.LocalEngine | None = None) -> list[Any]:
    engine = engine or ss.local(members=members)
    engine.new_job(dag).join(timeout=60)
    return list(engine.get_list("out"))


def source_to_sink(supplier: Any, lp: int) -> DAG:
    dag = DAG()
    src = dag.new_vertex("source", supplier).local_parallelism(lp)
    sink = dag.new_vertex("sink", sinks.list_sink("out")).local_parallelism(1)
    dag.edge(Edge.between(src, sink).distributed())
    return dag


# -- items -----------------------------------------------------------------------------


@given(
    data=st.lists(st.integers(), max_size=30),
    total=st.integers(1, 4),
    capacity=st.integers(1, 4),
    restore_every=st.integers(0, 3),
)
def test_items_split_by_position_and_resume(
    data: list[int], total: int, capacity: int, restore_every: int
) -> None:
    supplier = sources.items(data)
    for i in range(total):
        (got,) = run_source(
            supplier, index=i, total=total, capacity=capacity, restore_every=restore_every
        )
        assert got == data[i::total]


def test_items_materialises_at_factory_time() -> None:
    data = [1, 2, 3]
    supplier = sources.items(iter(data))  # a one-shot iterator
    assert run_source(supplier) == [[1, 2, 3]]
    assert run_source(supplier) == [[1, 2, 3]]  # a second processor still gets it


def test_items_emit_to_every_ordinal() -> None:
    assert (
        run_source(sources.items("abcde".split("c")), capacity=1, ordinal_count=3)
        == [["ab", "de"]] * 3
    )


def test_source_restore_with_other_parallelism_fails_clearly() -> None:
    proc = sources.items(range(10))()
    proc.init(Outbox(1, 1), Context(vertex_name="src", total_parallelism=2))
    entry = (BroadcastKey(("items-offset", 0)), (3, 4))
    with pytest.raises(ValueError, match="src.*parallelism 3"):
        proc.restore_from_snapshot(Inbox([entry]))


@pytest.mark.parametrize("members", [1, 2])
def test_engine_items_each_exactly_once(members: int) -> None:
    data = list(range(2500)) + ["dup"] * 3
    assert Counter(run_engine(source_to_sink(sources.items(data), 3), members)) == Counter(data)


# -- list_source / map_source ----------------------------------------------------------


@pytest.mark.parametrize("members", [1, 2])
def test_engine_list_source(members: int) -> None:
    engine = ss.local(members=members)
    data = [("x", i) for i in range(1001)]
    engine.get_list("input").extend(data)
    got = run_engine(source_to_sink(sources.list_source("input"), 3), members, engine)
    assert Counter(got) == Counter(data)


@pytest.mark.parametrize("members", [1, 2])
def test_engine_map_source_emits_key_value_tuples(members: int) -> None:
    engine = ss.local(members=members)
    m = engine.get_map("input")
    m.update({f"k{i}": i * i for i in range(777)})
    got = run_engine(source_to_sink(sources.map_source("input"), 2), members, engine)
    assert all(type(e) is tuple and len(e) == 2 for e in got)
    assert sorted(got) == sorted(m.items())


def test_list_source_hand_driven_with_restore() -> None:
    ctx_services = Context().services
    ctx_services.get_list("l").extend(range(17))

    def ctx(i: int) -> Context:
        return Context(global_processor_index=i, total_parallelism=2, services=ctx_services)

    for i in range(2):
        (got,) = run_source(
            sources.list_source("l"), index=i, total=2, restore_every=2, context=ctx(i)
        )
        assert got == list(range(17))[i::2]


def test_empty_list_source_completes() -> None:
    assert run_source(sources.list_source("nothing-here")) == [[]]


# -- read_files ------------------------------------------------------------------------


def write_corpus(directory: Path, big: int = 5000) -> dict[str, list[str]]:
    """Files with awkward content: empty lines, no final newline, CRLF, unicode,
    an empty file, and a file the glob must skip."""
    contents = {
        "a.txt": "alpha beta\n\ngamma\n",
        "b.txt": "no final newline",
        "c.txt": "crlf one\r\ncrlf two\r\n",
        "d.txt": "",
        "e.txt": "ünïcödé ✓\n" * 3,
        "f.txt": "".join(f"line {i}\n" for i in range(big)),
        "skip.csv": "not,me\n",
    }
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in contents.items():
        (directory / name).write_bytes(text.encode("utf-8"))
    (directory / "sub").mkdir(exist_ok=True)  # a directory matching nothing
    expected = {
        name: text.replace("\r\n", "\n").split("\n")[: -1 if text.endswith("\n") else None]
        for name, text in contents.items()
        if name.endswith(".txt")
    }
    expected["d.txt"] = []
    return expected


def test_read_files_hand_driven_splits_files_and_resumes(tmp_path: Path) -> None:
    expected = write_corpus(tmp_path)
    names = sorted(expected)
    supplier = sources.read_files(tmp_path, "*.txt")
    for total in (1, 3):
        shares = []
        for i in range(total):
            for restore_every in (0, 7):
                (got,) = run_source(
                    supplier, index=i, total=total, capacity=3, restore_every=restore_every
                )
                assert not restore_every or got == shares[-1]
                if not restore_every:
                    shares.append(got)
        # byte ranges: processor i reads the i-th stretch of the files laid end to end
        assert sum(shares, []) == [line for n in names for line in expected[n]]
        assert all(shares)


def test_read_files_capacity_one_with_restore_every_call(tmp_path: Path) -> None:
    (tmp_path / "x.txt").write_text("1\n2\n3\n\n5")
    assert run_source(sources.read_files(tmp_path, "x.txt"), restore_every=1) == [
        ["1", "2", "3", "", "5"]
    ]


@settings(max_examples=50, deadline=None)  # tests/sources/test_byte_ranges.py: more
@given(
    text=st.text(alphabet="ab\r\n\u00e9", max_size=60),
    block=st.integers(1, 9),
    capacity=st.integers(1, 5),
    restore_every=st.integers(0, 3),
)
def test_read_files_blocks_match_pythons_line_reader(
    tmp_path_factory: Any, text: str, block: int, capacity: int, restore_every: int
) -> None:
    """Reading in blocks (here of 1-9 characters, cutting lines and CRLF pairs anywhere)
    gives exactly the lines of Python's own universal-newline line reader, also with
    outbox capacity 1 and a restore between calls."""
    from slipstream.sources import files as files_module

    d = tmp_path_factory.mktemp("blocks")
    (d / "x.txt").write_bytes(text.encode("utf-8"))
    with open(d / "x.txt", encoding="utf-8", newline=None) as fh:
        expected = [line[:-1] if line.endswith("\n") else line for line in fh]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(files_module, "READ_BLOCK_CHARS", block)  # the split by file
        mp.setattr(files_module, "READ_BLOCK_BYTES", block)  # byte ranges
        got = run_source(
            sources.read_files(d, "x.txt"), capacity=capacity, restore_every=restore_every
        )
    assert got == [expected]


@pytest.mark.parametrize("members", [1, 2])
def test_engine_read_files_each_line_exactly_once(tmp_path: Path, members: int) -> None:
    expected = write_corpus(tmp_path)
    all_lines = [line for lines in expected.values() for line in lines]
    got = run_engine(source_to_sink(sources.read_files(tmp_path, "*.txt"), 3), members)
    assert Counter(got) == Counter(all_lines)


def test_engine_read_files_missing_directory_fails_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    engine = ss.local()
    with pytest.raises(ss.JobFailedError, match="nope") as info:
        engine.new_job(source_to_sink(sources.read_files(missing), 1)).join(timeout=30)
    assert isinstance(info.value.cause, FileNotFoundError)


def test_read_files_other_encoding(tmp_path: Path) -> None:
    (tmp_path / "l1.txt").write_bytes("café\nnaïve\n".encode("latin-1"))
    assert run_source(sources.read_files(tmp_path, encoding="latin-1")) == [["café", "naïve"]]


# -- factories ---------------------------------------------------------------------------


def test_factories_validate_arguments(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="iterable"):
        sources.items(42)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="name"):
        sources.list_source(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="name"):
        sources.map_source("")
    with pytest.raises(TypeError, match="directory"):
        sources.read_files(None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="klingon"):
        sources.read_files(tmp_path, encoding="klingon")


def test_suppliers_pickle(tmp_path: Path) -> None:
    for supplier in (
        sources.items([1, 2]),
        sources.list_source("l"),
        sources.map_source("m"),
        sources.read_files(tmp_path),
    ):
        assert isinstance(cloudpickle.loads(cloudpickle.dumps(supplier))(), Processor)


# -- the processor test harness (slipstream.testing) ------------------------------------


def test_verify_processor_harness(tmp_path: Path) -> None:
    from slipstream.core.services import InMemoryServices
    from slipstream.testing import verify_processor

    data = list(range(11))
    verify_processor(sources.items(data)).expect_output(data)
    verify_processor(sources.items(data)).expect_outputs([data, data])
    for i in range(3):
        verify_processor(sources.items(data)).global_processor_index(i).local_parallelism(
            1
        ).total_parallelism(3).expect_output(data[i::3])

    services = InMemoryServices()
    services.get_list("l").extend("abcdefg")
    services.get_map("m").update({"x": 1, "y": 2})
    verify_processor(sources.list_source("l"), services=services).expect_output(list("abcdefg"))
    verify_processor(sources.map_source("m"), services=services).expect_output([("x", 1), ("y", 2)])

    expected = write_corpus(tmp_path, big=40)  # restore after every line re-reads the file
    names = sorted(expected)
    verify_processor(sources.read_files(tmp_path, "*.txt")).expect_output(
        [line for n in names for line in expected[n]]
    )
    second = run_source(sources.read_files(tmp_path, "*.txt"), index=1, total=2)[0]
    first = run_source(sources.read_files(tmp_path, "*.txt"), index=0, total=2)[0]
    assert first + second == [line for n in names for line in expected[n]]
    verify_processor(sources.read_files(tmp_path, "*.txt")).global_processor_index(
        1
    ).total_parallelism(2).expect_output(second)
