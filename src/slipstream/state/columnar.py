"""The columnar chunk payload (``SLIPSTREAM-COLUMNS 1``): a chunk whose keyed maps hold
keys and values of simple types, as typed column buffers in Arrow's memory layout.

Why: a chunk's default payload is a pickle of its records, and turning a 10M-key map
back into Python objects (``pickle.loads``) was three quarters of an SQL aggregate over
the snapshot. In this encoding a map's keys and values are each one column of
fixed-width values or of offsets + bytes, which :func:`Column.to_arrow` hands to Arrow
as they are (``pyarrow.Array.from_buffers`` over the verified payload: no Python
object per entry), and which decode to Python lists at C speed for a restore
(:func:`Column.to_list`). Nothing in such a payload is unpickled.

Layout of the payload (inside a signed chunk file, see :mod:`~slipstream.state.format`;
the chunk's MAC covers every byte below)::

    SLIPSTREAM-COLUMNS 1\\n
    <meta: JSON on one line>\\n
    <zero padding to a multiple of 8 bytes from the payload's start>
    <buffer area: the columns' buffers, each starting at a multiple of 8 bytes>

``meta`` is ``{"records": [...]}``, one item per record of the chunk in order:

* a keyed-state map record ``("m", tag, detail, mode, {key: value}, [removed], base_id)``
  is ``{"map": [tag, detail, mode, base_id], "batches": [{"keys": <column>, "values":
  <column>}, ...], "removed": <column>, "repeats": false}`` (``tag`` and ``detail`` as
  :func:`~slipstream.state.format.to_json` writes them). The map is its batches' pairs in
  order; a map encoded at once is one batch, a copy-on-write save's one batch per step
  (:mod:`~slipstream.state.live`). With ``"repeats": true`` a later batch may name a key
  again, and its value is the one that counts (a writer that learns a key's final
  value after its batch was encoded; this version's writers set it false, its readers
  honour it); otherwise every key is in one batch, once. Two batches of one map may be of different kinds (ints, then ints with
  ``None``);
* any other record is ``{"record": <its tag>, "fields": <its other fields, to_json>}``.

A *column* is ``{"kind": K, "n": <length>, "data": [start, length], "offsets": [start,
length] | absent, "valid": [start, length] | absent}`` (positions in the buffer area):

=========  ==================  ================================================  ============
kind       Python type         ``data``                                          Arrow type
=========  ==================  ================================================  ============
int64      ``int`` (64-bit)    ``n`` little-endian signed 8-byte ints            ``int64``
float64    ``float``           ``n`` little-endian IEEE 754 doubles              ``double``
utf8       ``str``             the UTF-8 bytes; ``offsets``: ``n + 1``           ``string``
                               little-endian int32 (value ``i`` is
                               ``data[offsets[i]:offsets[i + 1]]``)
binary     ``bytes``           as utf8, the bytes as they are                    ``binary``
bool       ``bool``            ``n`` bytes, 0 or 1                               ``bool``
null       ``None`` only       empty                                             ``null``
=========  ==================  ================================================  ============

``valid`` (present when some values are ``None``): ``n`` bytes, 0 where the value is
``None`` (its slot in ``data`` holds 0, or an empty string). A column holds values of
exactly one of these types (``type(v) is int``: a bool or an int subclass is not an
int), plus ``None``.

When it applies (:func:`encode`): the chunk has at least one map record; every map's
keys, values and removed keys each fit one column (an int beyond 64 bits, a str that is
not valid Unicode, a tuple, an object, two types in one column: no); every other record
is plain JSON data (:func:`~slipstream.state.format.to_json`) and there are at most
:data:`MAX_OTHER_RECORDS` of them. Otherwise the chunk is pickled as before. A
copy-on-write save's pre-encoded content (pickle fragments,
:class:`~slipstream.state.live.EncodedMap`) is pickled as it is; compaction rewrites
its chain as a columnar full chunk.
"""

from __future__ import annotations

import json
import sys
from array import array
from itertools import accumulate, islice
from operator import is_not
from typing import Any

__all__ = [
    "COLUMNS_MAGIC",
    "Column",
    "EncodedBatches",
    "MapColumns",
    "decode",
    "encode",
    "is_columnar",
]

COLUMNS_MAGIC = b"SLIPSTREAM-COLUMNS 1\n"
#: a chunk with more records besides its maps is pickled (each would be a JSON value)
MAX_OTHER_RECORDS = 1000

INT64, FLOAT64, UTF8, BINARY, BOOL, NULL = "int64", "float64", "utf8", "binary", "bool", "null"
_KIND_OF = {int: INT64, float: FLOAT64, str: UTF8, bytes: BINARY, bool: BOOL}
_FILL: dict[str, Any] = {INT64: 0, FLOAT64: 0.0, UTF8: "", BINARY: b"", BOOL: False}
_BIG = sys.byteorder == "big"
_INT32_MAX = 2**31 - 1


class _Unfit(Exception):
    """Values that no column kind holds (the chunk is pickled instead)."""


#: key types whose maps encode faster as columns than pickled (measured, 1M entries, on
#: a 2-core machine at load 5-7: str -> int 270 ms against pickle.dumps 325 ms; int ->
#: int 110 ms against 31 ms, int -> float 139 against 27: the C pickler's number
#: opcodes cost less than the type scan and the array a column takes)
CHEAPER_KEYS = (str, bytes)


def cheaper_than_pickle(records: list[tuple[Any, ...]]) -> bool:
    """Whether encoding ``records`` as columns should cost less than pickling them: every
    map's first key is a str or bytes (the job's own saves encode as columns only then,
    :data:`CHEAPER_KEYS`; the other writers whenever the encoding applies)."""
    for r in records:
        if r[0] == "m":
            upserts = r[4]
            if type(upserts) is dict and upserts:
                if type(next(iter(upserts))) not in CHEAPER_KEYS:
                    return False
    return True


def is_columnar(payload: bytes | memoryview) -> bool:
    """Whether a chunk payload is in this encoding (its first bytes)."""
    return bytes(payload[: len(COLUMNS_MAGIC)]) == COLUMNS_MAGIC


# -- encoding ----------------------------------------------------------------------------------
class _Buffers:
    """The buffer area as it is written: pieces, each padded to 8 bytes."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.size = 0

    def add(self, buf: bytes) -> list[int]:
        at = self.size
        n = len(buf)
        if n:
            self.parts.append(buf)
            pad = -n % 8
            if pad:
                self.parts.append(b"\0" * pad)
            self.size += n + pad
        return [at, n]


def _le(a: array) -> bytes:  # type: ignore[type-arg]
    if _BIG:
        a.byteswap()
    return a.tobytes()


def _offsets(lengths: Any) -> bytes:
    offs = array("i")
    try:
        offs.extend(accumulate(lengths, initial=0))
    except OverflowError:
        raise _Unfit("more than 2 GiB of strings in one column") from None
    return _le(offs)


def _column(values: list[Any], out: _Buffers) -> dict[str, Any]:
    """``values`` as a column in ``out``; :class:`_Unfit` if they fit no kind."""
    n = len(values)
    types = set(map(type, values))
    nulls = type(None) in types
    if nulls:
        types.discard(type(None))
    if not types:
        return {"kind": NULL, "n": n, "data": out.add(b"")}
    if len(types) > 1:
        raise _Unfit("values of several types")
    kind = _KIND_OF.get(types.pop())
    if kind is None:
        raise _Unfit("values of a type no column holds")
    spec: dict[str, Any] = {"kind": kind, "n": n}
    if nulls:
        spec["valid"] = out.add(bytes(map(is_not, values, [None] * n)))
        fill = _FILL[kind]
        values = [fill if v is None else v for v in values]
    if kind == INT64:
        try:
            spec["data"] = out.add(_le(array("q", values)))
        except OverflowError:
            raise _Unfit("an int beyond 64 bits") from None
    elif kind == FLOAT64:
        spec["data"] = out.add(_le(array("d", values)))
    elif kind == BOOL:
        spec["data"] = out.add(bytes(values))
    elif kind == UTF8:
        joined = "".join(values)
        if joined.isascii():
            spec["offsets"] = out.add(_offsets(map(len, values)))
            spec["data"] = out.add(joined.encode("ascii"))
        else:
            try:
                encoded = [v.encode("utf-8") for v in values]
            except UnicodeEncodeError:
                raise _Unfit("a str that is not valid Unicode (a lone surrogate)") from None
            spec["offsets"] = out.add(_offsets(map(len, encoded)))
            spec["data"] = out.add(b"".join(encoded))
    else:  # BINARY
        spec["offsets"] = out.add(_offsets(map(len, values)))
        spec["data"] = out.add(b"".join(values))
    return spec


class EncodedBatches:
    """A map's content encoded as column batches ahead of its chunk (a copy-on-write
    save encodes a batch per step on the processor's thread, :mod:`~slipstream.state.live`):
    each batch's key and value column specs with positions in its own buffers, and
    ``repeats`` when a later batch may name a key again (its value counts)."""

    __slots__ = ("batches", "count", "repeats")

    def __init__(self) -> None:
        self.batches: list[tuple[dict[str, Any], dict[str, Any], list[bytes], int]] = []
        self.count = 0
        self.repeats = False

    def __len__(self) -> int:
        return self.count

    def add(self, keys: list[Any], values: list[Any]) -> bool:
        """Encode one batch of pairs; ``False`` (nothing added) when they fit no column."""
        out = _Buffers()
        try:
            k, v = _column(keys, out), _column(values, out)
        except _Unfit:
            return False
        self.batches.append((k, v, out.parts, out.size))
        self.count += len(keys)
        return True

    def pairs(self) -> tuple[list[Any], list[Any]]:
        """Every batch's keys and values, decoded (a key repeated: each time)."""
        keys: list[Any] = []
        values: list[Any] = []
        for k, v, parts, _size in self.batches:
            area = memoryview(b"".join(parts))
            keys.extend(_decoded_column(area, k).to_list())
            values.extend(_decoded_column(area, v).to_list())
        return keys, values

    def to_dict(self) -> dict[Any, Any]:
        keys, values = self.pairs()
        return dict(zip(keys, values, strict=True))


def _moved(spec: dict[str, Any], by: int) -> dict[str, Any]:
    """A column spec with its buffer positions moved ``by`` bytes on."""
    return {
        name: ([at[0] + by, at[1]] if name in ("data", "offsets", "valid") else at)
        for name, at in spec.items()
    }


def encode(records: list[tuple[Any, ...]]) -> list[bytes] | None:
    """The columnar payload of ``records`` (as pieces, in order), or ``None`` when the
    encoding does not apply to them (module doc: the caller pickles them). A map's
    content is a dict or :class:`EncodedBatches` (their buffers written as they are)."""
    from slipstream.state.format import to_json

    if not any(r[0] == "m" for r in records):
        return None
    if len(records) - sum(1 for r in records if r[0] == "m") > MAX_OTHER_RECORDS:
        return None
    out = _Buffers()
    meta: list[dict[str, Any]] = []
    try:
        for r in records:
            if r[0] != "m":
                meta.append({"record": r[0], "fields": to_json(list(r[1:]))})
                continue
            upserts = r[4]
            item: dict[str, Any] = {"map": [to_json(r[1]), to_json(r[2]), r[3], r[6]]}
            if type(upserts) is dict:
                batch = {
                    "keys": _column(list(upserts), out),
                    "values": _column(list(upserts.values()), out),
                }
                item["batches"] = [batch] if upserts else []
                item["repeats"] = False
            elif type(upserts) is EncodedBatches:
                item["batches"] = []
                for k, v, parts, size in upserts.batches:
                    at = out.size
                    out.parts.extend(parts)  # each piece padded to 8 bytes already
                    out.size += size
                    item["batches"].append({"keys": _moved(k, at), "values": _moved(v, at)})
                item["repeats"] = upserts.repeats
            else:  # pre-encoded pickle fragments: the chunk is pickled
                return None
            item["removed"] = _column(list(r[5]), out)
            meta.append(item)
    except (_Unfit, TypeError):
        return None
    head = COLUMNS_MAGIC + json.dumps({"records": meta}, separators=(",", ":")).encode() + b"\n"
    return [head + b"\0" * (-len(head) % 8), *out.parts]


# -- decoding ----------------------------------------------------------------------------------
class Column:
    """One column of a verified payload (views of its buffers; nothing copied)."""

    __slots__ = ("kind", "length", "data", "offsets", "valid")

    def __init__(
        self,
        kind: str,
        length: int,
        data: memoryview,
        offsets: memoryview | None,
        valid: memoryview | None,
    ) -> None:
        self.kind = kind
        self.length = length
        self.data = data
        self.offsets = offsets
        self.valid = valid

    def __len__(self) -> int:
        return self.length

    def _offset_list(self) -> list[int]:
        assert self.offsets is not None
        offs = array("i")
        offs.frombytes(self.offsets)
        if _BIG:
            offs.byteswap()
        return offs.tolist()

    def to_list(self) -> list[Any]:
        """The values as Python objects (no per-value work in Python for numbers;
        a slice per value for strings and bytes)."""
        kind, n = self.kind, self.length
        if kind == NULL:
            return [None] * n
        if kind in (INT64, FLOAT64):
            a = array("q" if kind == INT64 else "d")
            a.frombytes(self.data)
            if _BIG:
                a.byteswap()
            values: list[Any] = a.tolist()
        elif kind == BOOL:
            values = list(map(bool, self.data))
        else:
            offs = self._offset_list()
            ends = zip(offs, islice(offs, 1, None), strict=False)
            raw = bytes(self.data)
            if kind == BINARY:
                values = [raw[a:b] for a, b in ends]
            elif raw.isascii():  # one decode, then a slice of the text per value
                text = raw.decode("ascii")
                values = [text[a:b] for a, b in ends]
            else:
                values = [raw[a:b].decode("utf-8") for a, b in ends]
        if self.valid is not None:
            values = [v if ok else None for v, ok in zip(values, self.valid, strict=True)]
        return values

    def value_at(self, i: int) -> Any:
        """Value ``i`` as a Python object (nothing else decoded)."""
        if self.valid is not None and not self.valid[i]:
            return None
        kind = self.kind
        if kind == NULL:
            return None
        if kind in (INT64, FLOAT64):
            a = array("q" if kind == INT64 else "d")
            a.frombytes(self.data[8 * i : 8 * i + 8])
            if _BIG:
                a.byteswap()
            return a[0]
        if kind == BOOL:
            return bool(self.data[i])
        assert self.offsets is not None
        ends = array("i")
        ends.frombytes(self.offsets[4 * i : 4 * i + 8])
        if _BIG:
            ends.byteswap()
        raw = bytes(self.data[ends[0] : ends[1]])
        return raw if kind == BINARY else raw.decode("utf-8")

    def index_of(self, key: Any) -> int | None:
        """The position of ``key`` among the values (the first; ``None``: absent), found
        without a Python object per value, for a key that can only equal values of
        this column's type: a str in a utf8 column, bytes in a binary one, an int in an
        int64 one, and any key in a column it cannot equal (a str among ints: absent).
        :class:`LookupError` for the rest (an int among floats: ``1 == 1.0``), which a
        dict answers instead."""
        t, kind = type(key), self.kind
        if (t is str and kind == UTF8) or (t is bytes and kind == BINARY):
            return self._index_of_text(key)
        if t is int and kind == INT64:
            a = array("q")
            a.frombytes(self.data)
            if _BIG:
                a.byteswap()
            return _first_valid(a, key, self.valid)
        if t in (str, bytes) or (t is int and kind in (UTF8, BINARY, NULL)):
            return None  # no value of this column equals it
        raise LookupError(f"a {t.__name__} key among {kind} values")

    def _index_of_text(self, key: str | bytes) -> int | None:
        try:
            import pyarrow as pa
            import pyarrow.compute as pc
        except ImportError:
            return _first_valid(self.to_list(), key, None)
        if _BIG:
            return _first_valid(self.to_list(), key, None)
        arr = self.to_arrow(pa)
        found = pc.index(arr, pa.scalar(key, arr.type)).as_py()
        return None if found < 0 else int(found)

    def to_arrow(self, pa: Any) -> Any:
        """The column as a ``pyarrow.Array`` over the payload's own buffers (on a
        little-endian machine; a big-endian one converts its values)."""
        n = self.length
        if self.kind == NULL:
            return pa.nulls(n)
        if _BIG:
            return pa.array(self.to_list())
        validity = None
        if self.valid is not None:
            validity = _bitmap(pa, n, self.valid)
        data = pa.py_buffer(self.data)
        kind = self.kind
        if kind == INT64:
            arr = pa.Array.from_buffers(pa.int64(), n, [validity, data])
        elif kind == FLOAT64:
            arr = pa.Array.from_buffers(pa.float64(), n, [validity, data])
        elif kind == BOOL:
            arr = pa.Array.from_buffers(pa.bool_(), n, [validity, _bitmap(pa, n, self.data)])
        else:
            assert self.offsets is not None
            type_ = pa.string() if kind == UTF8 else pa.binary()
            arr = pa.Array.from_buffers(type_, n, [validity, pa.py_buffer(self.offsets), data])
        arr.validate()
        return arr


def _first_valid(values: Any, key: Any, valid: memoryview | None) -> int | None:
    """The first position of ``key`` in ``values`` (a list or an array) whose value is
    not ``None`` (``valid``: 0 where it is, its slot holds a filler)."""
    start = 0
    while True:
        try:
            i = values.index(key, start)
        except ValueError:
            return None
        if valid is None or valid[i]:
            return int(i)
        start = i + 1


def _bitmap(pa: Any, n: int, flags: memoryview) -> Any:
    """Arrow's bitmap of ``n`` bytes that are 0 or 1 (a cast in Arrow, no Python loop)."""
    return (
        pa.Array.from_buffers(pa.uint8(), n, [None, pa.py_buffer(flags)])
        .cast(pa.bool_())
        .buffers()[1]
    )


class MapColumns:
    """A saved map's content as its batches of key and value columns, as the readers of
    state as data take it (``Store.read(..., columns=True)``): Arrow arrays straight
    from the columns (:attr:`unique`: when no key repeats), and the mapping interface
    (``len``, ``in``, ``[]``, ``keys``, ``values``, ``items``) over a dict made on first
    use."""

    __slots__ = ("batches", "unique", "_dict")

    def __init__(self, batches: list[tuple[Column, Column]], unique: bool = True) -> None:
        self.batches = batches
        #: every key is in one batch, once: the columns are the map's rows as they are
        self.unique = unique
        self._dict: dict[Any, Any] | None = None

    def __len__(self) -> int:
        if self.unique:
            return sum(k.length for k, _v in self.batches)
        return len(self._map())

    @property
    def keys_columns(self) -> list[Column]:
        return [k for k, _v in self.batches]

    @property
    def values_columns(self) -> list[Column]:
        return [v for _k, v in self.batches]

    def to_dict(self) -> dict[Any, Any]:
        """A new dict of the content."""
        if len(self.batches) == 1:
            k, v = self.batches[0]
            return dict(zip(k.to_list(), v.to_list(), strict=True))
        out: dict[Any, Any] = {}
        for k, v in self.batches:
            out.update(zip(k.to_list(), v.to_list(), strict=True))
        return out

    def _map(self) -> dict[Any, Any]:
        if self._dict is None:
            self._dict = self.to_dict()
        return self._dict

    def __contains__(self, key: Any) -> bool:
        return key in self._map()

    def __getitem__(self, key: Any) -> Any:
        return self._map()[key]

    def __iter__(self) -> Any:
        return iter(self._map())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, MapColumns):
            other = other._map()
        return self._map() == other

    __hash__ = None  # type: ignore[assignment]

    def get(self, key: Any, default: Any = None) -> Any:
        return self._map().get(key, default)

    def find(self, key: Any) -> tuple[bool, Any]:
        """``(key in self, self[key] or None)``, searched in the columns when no dict
        was made yet (a point query of one key: no dict of a processor's whole map);
        a dict answers where the columns cannot (:meth:`Column.index_of`), and where a
        key may repeat."""
        if self._dict is None and self.unique:
            try:
                for k, v in self.batches:
                    i = k.index_of(key)
                    if i is not None:
                        return True, v.value_at(i)
                return False, None
            except LookupError:
                pass
        m = self._map()
        return (True, m[key]) if key in m else (False, None)

    def _column_list(self, which: int) -> list[Any]:
        out: list[Any] = []
        for batch in self.batches:
            out.extend(batch[which].to_list())
        return out

    def keys(self) -> Any:
        """The keys in the map's order (a list straight from the columns while no dict
        was needed: no hashing)."""
        if self._dict is None and self.unique:
            return self._column_list(0)
        return self._map().keys()

    def values(self) -> Any:
        if self._dict is None and self.unique:
            return self._column_list(1)
        return self._map().values()

    def items(self) -> Any:
        """The pairs in the map's order; while no dict was needed, an iterator over the
        columns' values (one pass, as the row readers take it: no dict is made)."""
        if self._dict is None and self.unique:
            return zip(self._column_list(0), self._column_list(1), strict=True)
        return self._map().items()


def decode(payload: bytes | memoryview, columns: bool = False) -> list[Any]:
    """The records of a *verified* columnar payload: maps as dicts, or with ``columns``
    as :class:`MapColumns` (their removed keys as lists). ``ValueError`` for a payload
    that does not hold together (a buffer outside the payload, lengths that differ)."""
    from slipstream.state.format import from_json

    view = memoryview(payload)
    start = len(COLUMNS_MAGIC)
    if bytes(view[:start]) != COLUMNS_MAGIC:
        raise ValueError("not a columnar chunk payload")
    end = _line_end(view, start)
    meta = json.loads(bytes(view[start:end]))
    head = end + 1
    area = view[head + (-head % 8) :]
    records: list[Any] = []
    for item in meta["records"]:
        if "map" in item:
            tag, detail, mode, base_id = item["map"]
            batches = []
            for b in item["batches"]:
                keys = _decoded_column(area, b["keys"])
                values = _decoded_column(area, b["values"])
                if keys.length != values.length:
                    raise ValueError(f"a map of {keys.length} keys and {values.length} values")
                batches.append((keys, values))
            m = MapColumns(batches, not item["repeats"])
            upserts: Any = m if columns else m.to_dict()
            removed = _decoded_column(area, item["removed"]).to_list()
            records.append(
                ("m", from_json(tag), from_json(detail), mode, upserts, removed, base_id)
            )
        else:
            records.append((item["record"], *from_json(item["fields"])))
    return records


def _line_end(view: memoryview, start: int) -> int:
    """The position of the first newline at or after ``start`` (searched a MiB at a time:
    the payload is not copied whole)."""
    step = 1 << 20
    pos = start
    while pos < len(view):
        i = bytes(view[pos : pos + step]).find(b"\n")
        if i >= 0:
            return pos + i
        pos += step
    raise ValueError("a columnar payload without its meta line")


def _slice(area: memoryview, at: list[int], what: str) -> memoryview:
    start, length = at
    if start < 0 or length < 0 or start + length > len(area):
        raise ValueError(f"a column's {what} lies outside the payload")
    return area[start : start + length]


def _decoded_column(area: memoryview, spec: dict[str, Any]) -> Column:
    kind, n = spec["kind"], int(spec["n"])
    data = _slice(area, spec["data"], "data")
    offsets = _slice(area, spec["offsets"], "offsets") if "offsets" in spec else None
    valid = _slice(area, spec["valid"], "validity") if "valid" in spec else None
    width = {INT64: 8, FLOAT64: 8, BOOL: 1}.get(kind)
    if kind not in _FILL and kind != NULL:
        raise ValueError(f"unknown column kind {kind!r}")
    if width is not None and len(data) != width * n:
        raise ValueError(f"a {kind} column of {n} values has {len(data)} bytes")
    if kind in (UTF8, BINARY):
        if offsets is None or len(offsets) != 4 * (n + 1):
            raise ValueError(f"a {kind} column of {n} values without its {n + 1} offsets")
        ends = array("i")
        ends.frombytes(bytes(offsets[:4]) + bytes(offsets[-4:]))
        if _BIG:
            ends.byteswap()
        if ends[0] != 0 or ends[1] != len(data):
            raise ValueError(f"a {kind} column's offsets do not span its {len(data)} bytes")
    if valid is not None and len(valid) != n:
        raise ValueError(f"a column of {n} values with {len(valid)} validity bytes")
    return Column(kind, n, data, offsets, valid)
