"""The columnar chunk payload (state/columnar.py): keyed maps of simple keys and values
are written as typed column buffers (every writer: bootstrap, compaction, the snapshot
writer), decode to exactly the same records, and read as Arrow without a row per key;
everything else falls back to the pickle; a tampered columnar chunk fails its signature
check before anything is decoded; a store of pickled chunks (written before the
encoding existed) still reads and restores."""

from __future__ import annotations

import math
import shutil
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import slipstream as ss
from slipstream import JobConfig, ProcessingGuarantee, sinks, sources
from slipstream.aggregate import counting
from slipstream.core.errors import SnapshotError
from slipstream.state import columnar
from slipstream.state import format as fmt
from slipstream.state.columnar import COLUMNS_MAGIC, MapColumns
from slipstream.state.keyed import DELTA, FULL, KEYED, PLAIN, StateMap, StateMapSave
from slipstream.state.keys import BroadcastKey, KeyedStateKey
from slipstream.state.live import EncodedMap, setitems_fragment
from slipstream.state.store import DirectorySnapshotStore

pa = pytest.importorskip("pyarrow")

#: A store of pickled format-3 chunks, written by slipstream 11205dd (before the columnar
#: encoding): bootstrap of a rolling count (items source, 2 processors), 40 keys
#: ``user000`` .. ``user039`` with the counts of ``user{i % 40}`` for i < 100.
PICKLED_STORE = Path(__file__).parent / "data" / "format3-pickled"
PICKLED_KEY = b"format-3-pickled-chunks-fixture"


def payload_of(entries: list[tuple[Any, Any]], columnar_: bool = True) -> bytes:
    return fmt.encode_payload(fmt.encode_records(entries), columnar_)


def full_map(m: dict[Any, Any], tag: str = PLAIN) -> list[tuple[Any, Any]]:
    return [(StateMap(tag), StateMapSave(FULL, m))]


def same(a: Any, b: Any) -> bool:
    """Equal with the same types (and nan equal to nan)."""
    if type(a) is not type(b):
        return False
    if type(a) is float and math.isnan(a):
        return math.isnan(b)
    if type(a) is dict:
        return len(a) == len(b) and all(
            same(ka, kb) and same(va, vb)
            for (ka, va), (kb, vb) in zip(a.items(), b.items(), strict=True)
        )
    return bool(a == b) and (type(a) is not float or math.copysign(1, a) == math.copysign(1, b))


COLUMNS = {
    "int64": [0, -1, 2**63 - 1, -(2**63), 42],
    "float64": [0.0, -0.0, 1.5, math.inf, -math.inf, math.nan, 1e-300],
    "utf8 ascii": ["", "a", "user00000001", "x" * 300],
    "utf8": ["", "ü", "日本語", "a\nb", "\x00"],
    "binary": [b"", b"\x00\xff", b"abc", bytes(range(256))],
    "bool": [True, False, True],
    "null": [None, None],
    "int64 with None": [None, 1, None, -5],
    "utf8 with None": ["a", None, "ü"],
    "float64 with None": [None, 2.5],
    "binary with None": [b"x", None],
    "bool with None": [None, True, False],
}


@pytest.mark.parametrize("name", sorted(COLUMNS))
def test_each_column_type_round_trips_as_keys_and_as_values(name: str) -> None:
    values = COLUMNS[name]
    # values: keyed by position; keys: hashable ones, distinct
    keys = list(dict.fromkeys(v for v in values if not (type(v) is float and math.isnan(v))))
    for m in ({i: v for i, v in enumerate(values)}, {k: i for i, k in enumerate(keys)}):
        payload = payload_of(full_map(m))
        assert payload.startswith(COLUMNS_MAGIC)
        ((_k, save),) = fmt.decode_records(fmt.decode_payload(payload))
        assert type(save.upserts) is dict and same(save.upserts, m)
        (record,) = fmt.decode_payload(payload, columns=True)
        cols = record[4]
        assert type(cols) is MapColumns and same(cols.to_dict(), m)
        # Arrow over the buffers: what pa.array makes of the values (the row path's)
        ((keys, values),) = cols.batches
        for column, py in ((keys, list(m)), (values, list(m.values()))):
            got, want = column.to_arrow(pa), pa.array(py)
            assert got.type == want.type
            assert got.to_pylist() == want.to_pylist() or name.startswith("float")


@pytest.mark.parametrize("name", sorted(COLUMNS))
def test_one_key_is_found_in_the_columns_as_a_dict_finds_it(name: str) -> None:
    """A point query's lookup (MapColumns.find) answers what the map's dict does, for
    each column kind as keys and as values, keys present and absent, of the column's
    type and of others (1.0 or True among ints: the dict's answer), and makes no dict
    where the columns can answer."""
    values = COLUMNS[name]
    keys = list(dict.fromkeys(v for v in values if not (type(v) is float and math.isnan(v))))
    others: list[Any] = ["a", "zz", b"abc", b"zz", 0, 1, 42, -5, 7, 1.0, 0.0, True, None, "ü"]
    for m in ({i: v for i, v in enumerate(values)}, {k: i for i, k in enumerate(keys)}):
        (record,) = fmt.decode_payload(payload_of(full_map(m)), columns=True)
        cols = record[4]
        for key in [*m, *others]:
            want = (True, m[key]) if key in m else (False, None)
            fresh = fmt.decode_payload(payload_of(full_map(m)), columns=True)[0][4]
            got = fresh.find(key)
            assert got[0] == want[0] and same(got[1], want[1]), (key, got, want)
            if type(key) in (str, bytes) or (type(key) is int and "float" not in name):
                if "bool" not in name:
                    assert fresh._dict is None, key  # answered from the columns
        assert cols._dict is None


@pytest.mark.parametrize(
    ("what", "m"),
    [
        ("keys of two types", {1: 1, "a": 2}),
        ("an int and a bool", {1: True, 2: 3}),
        ("ints and floats", {1: 1, 2: 2.5}),
        ("tuple keys", {(1, 2): 1}),
        ("list values", {"a": [1]}),
        ("an int beyond 64 bits", {"a": 2**64}),
        ("a lone surrogate", {"\ud800": 1}),
        ("a str subclass", {type("S", (str,), {})("a"): 1}),
    ],
)
def test_maps_the_columns_do_not_hold_are_pickled(what: str, m: dict[Any, Any]) -> None:
    payload = payload_of(full_map(m))
    assert is_pickle(payload), what
    ((_k, save),) = fmt.decode_records(fmt.decode_payload(payload))
    assert save.upserts == m and [type(k) for k in save.upserts] == [type(k) for k in m]


def test_a_chunk_is_columnar_only_when_every_record_fits() -> None:
    plain = [
        (StateMap(PLAIN), StateMapSave(FULL, {"a": 1, "b": 2})),
        (StateMap(KEYED, 1000), StateMapSave(DELTA, {"x": 3.5}, ("y", "z"), 4)),
        (BroadcastKey(("generator", 0)), (5, 2)),
        (KeyedStateKey("k", {"frame": 1}), [1, (2, 3), None, {"n": 1.5}]),
        ("plain", True),
    ]
    payload = payload_of(plain)
    assert payload.startswith(COLUMNS_MAGIC)
    back = fmt.decode_records(fmt.decode_payload(payload))
    assert back == plain
    assert [type(k) for k, _ in back] == [type(k) for k, _ in plain]
    assert type(back[3][1][1]) is tuple and back[1][1].removed == ("y", "z")
    # no map: pickled; a record that is not plain JSON data (bytes): pickled
    assert is_pickle(payload_of(plain[2:]))
    assert is_pickle(payload_of([*plain, ("bytes", b"x")]))
    # the pickle is still there when asked for
    assert is_pickle(payload_of(plain, columnar_=False))
    # a copy-on-write save's pickle fragments are written as they are
    encoded = EncodedMap([setitems_fragment(["a", "b"], [1, 2])], 2)
    live = [(StateMap(PLAIN), StateMapSave(FULL, encoded))]  # type: ignore[arg-type]
    payload = b"".join(fmt.encode_payload_parts(fmt.encode_records(live)))
    assert is_pickle(payload)
    assert fmt.decode_records(fmt.decode_payload(payload))[0][1].upserts == {"a": 1, "b": 2}


def test_the_jobs_own_saves_use_columns_only_where_they_cost_less_than_the_pickle() -> None:
    """columnar=None (the store thread of a job): maps of str or bytes keys as columns,
    maps of numbers pickled (the C pickler's number opcodes cost less); the other
    writers (columnar=True) write both as columns."""

    def encoded(m: dict[Any, Any], columnar_: bool | None) -> bytes:
        return b"".join(fmt.encode_payload_parts(fmt.encode_records(full_map(m)), columnar_))

    assert encoded({"a": 1, "b": 2}, None).startswith(COLUMNS_MAGIC)
    assert encoded({b"a": 1.5}, None).startswith(COLUMNS_MAGIC)
    assert is_pickle(encoded({1: 1, 2: 2}, None))
    assert is_pickle(encoded({1.5: "x"}, None))
    assert encoded({1: 1, 2: 2}, True).startswith(COLUMNS_MAGIC)


def test_a_chain_of_a_columnar_base_and_deltas_merges() -> None:
    base = ("full", 4, fmt.decode_payload(payload_of(full_map({"a": 1, "b": 2})), columns=True))
    delta_entries = [(StateMap(PLAIN), StateMapSave(DELTA, {"c": 3, "a": 5}, ("b",), 4))]
    delta = ("delta", 5, fmt.decode_payload(payload_of(delta_entries), columns=True))
    ((_k, save),) = fmt.merge_chain([base, delta])
    assert save.upserts == {"a": 5, "c": 3} and type(save.upserts) is dict
    # the base alone stays its columns (state read as data)
    ((_k, save),) = fmt.merge_chain([base])
    assert type(save.upserts) is MapColumns and dict(save.upserts.items()) == {"a": 1, "b": 2}


def test_a_payload_that_does_not_hold_together_is_refused() -> None:
    payload = payload_of(full_map({"a": 1}))
    head, _, rest = payload.partition(b"\n{")
    meta = (b"{" + rest).split(b"\n", 1)[0].replace(b'"n":1', b'"n":2', 1)
    bad = head + b"\n" + meta + b"\n" + (b"{" + rest).split(b"\n", 1)[1]
    with pytest.raises(ValueError, match="a utf8 column of 2 values without its 3 offsets"):
        fmt.decode_payload(bad)


simple = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=8),
    st.binary(max_size=8),
    st.booleans(),
)
columns_of_one_type = st.sampled_from(
    [
        st.integers(-(2**63), 2**63 - 1),
        st.floats(allow_nan=False),
        st.text(max_size=8),
        st.binary(max_size=8),
        st.booleans(),
    ]
)


@st.composite
def maps(draw: Any) -> dict[Any, Any]:
    """A map whose keys are of one type or of several, and values likewise, some None."""
    if draw(st.booleans()):
        keys = draw(st.lists(draw(columns_of_one_type), max_size=30, unique=True))
    else:
        keys = draw(st.lists(simple, max_size=30, unique_by=lambda k: (type(k), k)))
        keys = list({k: None for k in keys})  # 1 and True are one key of a dict
    values_of = draw(columns_of_one_type) if draw(st.booleans()) else simple
    values = [
        draw(st.one_of(st.none(), values_of) if draw(st.booleans()) else values_of) for _ in keys
    ]
    return dict(zip(keys, values, strict=True))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(maps(), min_size=1, max_size=3))
def test_read_arrow_tables_equal_the_row_path(ms: list[dict[Any, Any]]) -> None:
    """Differential: each map restores to itself either way, and the Arrow table made
    from the columns equals the one made from the decoded dicts (the old path)."""
    from slipstream.state.query import _Columns

    by_columns, by_dicts = _Columns(), _Columns()
    for i, m in enumerate(ms):
        entries = full_map(m)
        payload = payload_of(entries)
        ((_k, save),) = fmt.decode_records(fmt.decode_payload(payload))
        assert same(save.upserts, m)
        (record,) = fmt.decode_payload(payload, columns=True)
        by_columns.add_map("v", i, record[4])
        by_dicts.add_map("v", i, m)
    a, b = by_columns.table(), by_dicts.table()
    assert a.schema == b.schema
    assert a.to_pylist() == b.to_pylist()


# -- stores ------------------------------------------------------------------------------------
def rolling(items: list[Any], parallelism: int = 2) -> ss.Pipeline:
    p = ss.Pipeline()
    p.read_from(sources.items(items)).group_by(lambda x: x).rolling_aggregate(
        counting()
    ).set_local_parallelism(parallelism).write_to(sinks.list_sink("out"))
    return p


def is_pickle(payload: bytes) -> bool:
    """A pickled payload, as it is (first byte 0x80) or zlib-compressed (first byte
    0x78: a small one, format.COMPRESS_MAX)."""
    if payload.startswith(b"\x78"):
        payload = zlib.decompress(payload)
    return payload.startswith(b"\x80")


def chunk_payloads(directory: Path) -> list[bytes]:
    out = []
    for f in sorted(directory.glob("chunk-*.bin")):
        raw = f.read_bytes()
        out.append(raw.split(b"\n", 3)[3])
    return out


def seeded(directory: Path, rows: Any, key: bytes | None = None) -> DirectorySnapshotStore:
    store = DirectorySnapshotStore(directory, key=key)
    ss.state.bootstrap(rolling([]), "rolling_aggregate", rows, store, parallelism=2)
    return store


def test_bootstrap_writes_columnar_chunks_that_sql_reads_as_the_pickled_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("duckdb")
    rows = [(f"k{i}", i * 3) for i in range(500)] + [(f"ü{i}", -i) for i in range(50)]
    new = seeded(tmp_path / "columnar", rows)
    assert all(p.startswith(COLUMNS_MAGIC) for p in chunk_payloads(tmp_path / "columnar"))
    with monkeypatch.context() as m:
        m.setattr(fmt, "encode_columnar", lambda records: None)
        old = seeded(tmp_path / "pickled", rows)
    assert all(is_pickle(p) for p in chunk_payloads(tmp_path / "pickled"))
    assert ss.state.read(new) == ss.state.read(old)
    assert ss.state.read_arrow(new).equals(ss.state.read_arrow(old))
    q = "select kind, count(*), sum(value), min(key), max(key) from state group by kind"
    assert ss.state.sql(new, q).to_pylist() == ss.state.sql(old, q).to_pylist()
    assert ss.state.sql(new, q).to_pylist() == [
        {"kind": "keyed", "count_star()": 550, "sum(\"value\")": 3 * sum(range(500)) - sum(range(50)),
         "min(\"key\")": "k0", "max(\"key\")": "ü9"}
    ]  # fmt: skip
    # a point query and the change feed read the columns too
    assert [r.value for r in ss.state.read(new, key="k7")] == [21]
    assert ss.state.changes(new, 1, 1) == []


def test_a_tampered_columnar_chunk_fails_before_it_is_decoded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = seeded(tmp_path / "s", [(f"k{i}", i) for i in range(100)])
    chunk = sorted((tmp_path / "s").glob("chunk-*.bin"))[0]
    raw = bytearray(chunk.read_bytes())
    raw[-3] ^= 0x01  # a byte of a column buffer
    chunk.write_bytes(bytes(raw))
    decoded: list[Any] = []
    monkeypatch.setattr(fmt, "decode_columnar", lambda *a: decoded.append(a))
    with pytest.raises(
        SnapshotError, match=r"fails its signature check \(corrupt, truncated, tampered with"
    ):
        store.read(1)
    with pytest.raises(SnapshotError, match="fails its signature check"):
        ss.state.read_arrow(store)
    assert decoded == []


def test_a_store_of_pickled_chunks_still_reads_and_restores(tmp_path: Path) -> None:
    directory = tmp_path / "old"
    shutil.copytree(PICKLED_STORE, directory)
    assert all(p.startswith(b"\x80") for p in chunk_payloads(directory))
    store = DirectorySnapshotStore(directory, key=PICKLED_KEY)
    history = Counter(f"user{i % 40:03d}" for i in range(100))
    rows = ss.state.read(store, "rolling_aggregate")
    assert sorted((r.key, r.value) for r in rows) == sorted(history.items())
    assert ss.state.read_arrow(store).num_rows == 40
    live = ["user000", "user039", "new", "user000"]
    engine = ss.local()
    config = JobConfig(
        name="counts",
        processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE,
        snapshot_store=str(tmp_path / "live"),
        snapshot_key=PICKLED_KEY,
    )
    engine.new_job(rolling(live), config, restore_from=store).join(120)
    assert sorted(engine.get_list("out")) == sorted(
        [("user000", 4), ("user039", 3), ("new", 1), ("user000", 5)]
    )


def test_compaction_rewrites_a_pickled_chain_as_a_columnar_full_chunk(tmp_path: Path) -> None:
    from slipstream.state.compact import compact_chain

    directory = tmp_path / "old"
    shutil.copytree(PICKLED_STORE, directory)
    store = DirectorySnapshotStore(directory, key=PICKLED_KEY)
    (sid,) = store.committed_ids()
    vertex = "rolling_aggregate"
    for index, chain in store.read_manifest(sid).vertices[vertex].chains.items():
        before = store.read_chain(chain, vertex, index, sid)
        ref = compact_chain(store, vertex, index, chain)
        assert ref.file.endswith("-c.bin")
        assert (directory / ref.file).read_bytes().split(b"\n", 3)[3].startswith(COLUMNS_MAGIC)
        assert store.read_chain([ref], vertex, index, sid) == before


def test_is_columnar_reads_only_the_magic() -> None:
    assert columnar.is_columnar(memoryview(payload_of(full_map({1: 2}))))
    assert not columnar.is_columnar(payload_of(full_map({1: 2}), columnar_=False))
