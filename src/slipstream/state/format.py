"""The snapshot file format, version 3: a signed manifest per snapshot naming chunks of
plain records. This module is the format's documentation and its only codec (the store,
:mod:`~slipstream.state.store`, does the files; the coordinator encodes on its store
thread).

Files of a store directory
--------------------------
``snapshot-<id:010d>.bin``
    the snapshot's *manifest*::

        SLIPSTREAM-SNAPSHOT 3\\n
        <HMAC-SHA256 hex of header + "\\n" + body>\\n
        <header: JSON {format: 3, snapshot_id, job, execution, size, created, dag,
                       chunk_bytes}>\\n
        <body: JSON, see below>

    ``size`` is the body's length; ``dag`` the DAG's fingerprint; ``chunk_bytes`` the size
    of the chunk files this snapshot wrote (what it cost besides its manifest).
``chunk-<id:010d>-<index>-<vertex digest>[-c].bin``
    one processor's state as of snapshot ``id`` (``-c``: written by compaction)::

        SLIPSTREAM-CHUNK 3\\n
        <HMAC-SHA256 hex of header + "\\n" + payload>\\n
        <header: JSON {format: 3, snapshot_id, vertex, index, mode, size}>\\n
        <payload: the list of records (below), in one of two encodings>

    The payload's first bytes tell its encoding (both covered by the chunk's MAC, both
    decoded only after it was checked):

    * ``SLIPSTREAM-COLUMNS 1\\n``: the *columnar* encoding, written whenever the chunk's
      keyed maps hold keys and values of simple types (int, float, str, bytes, bool,
      None) and its other records are plain JSON data: each map as typed column buffers
      in Arrow's layout, nothing pickled (:mod:`~slipstream.state.columnar` documents
      it, with when it applies);
    * a pickle (protocol 5, first byte ``0x80``) of the list of records otherwise, and
      in every chunk written before the columnar encoding existed (they read as before);
    * a zlib stream (first byte ``0x78``) of such a pickle: a pickle of at most
      :data:`COMPRESS_MAX` bytes is written compressed when that makes it smaller (a
      small delta: 100 changed counts pickle to ~840 bytes, ~330 compressed, where the
      chunk's framing and the manifest are a fixed ~1.5 KB a snapshot). Chunks written
      before it have no such payload and read as before.

``MANIFEST.json``
    the store's index (signed JSON: the committed ids, owner, completed); see the store.

The manifest body::

    {"snapshot_id": 7, "job": "...", "dag_shape": [[vertex names], [[src, ord, dst, ord]]],
     "extra": <tagged JSON, below>,
     "vertices": {"<name>": {"parallelism": 2, "completed": [1], "final": [1],
                             "chains": {"0": [<chunk ref>, ...]}}}}

with a *chunk ref* ``[5, "full" | "delta", 1234, "<MAC>"]``: the snapshot whose state
the chunk brings its chain to, its mode, its size in bytes and its HMAC-SHA256 in
URL-safe base64 without padding (43 characters), then the file's name only when it is
not ``chunk-<snapshot:010d>-<index>-<vertex digest>.bin`` (a compaction's ``-c``
chunk, a Spark task attempt's). A vertex's ``completed``, ``final`` and ``chains`` are
left out when empty (read as empty). Manifests written before 2026-11-27 spell a ref
as the object ``{"file": "chunk-...bin", "mac": "<hex>", "snapshot": 5, "mode":
"full", "bytes": 1234}`` and every field of a vertex; they read as before (a ref of
~190 bytes where the list is ~60: a manifest names every chunk of every chain, and a
small state's delta is a few hundred bytes). A processor's *chain* is a full chunk
followed by delta chunks, oldest first; a processor without state has no chain. Reading
checks each chunk's MAC against its own header + payload *and* against the MAC the
manifest recorded for it, so a damaged, missing, swapped or reordered chunk fails the
restore naming its file; nothing is unpickled before both checks pass.

Records
-------
A chunk's records hold plain data only: lists, tuples, dicts, str, int, and the user's
own keys and values. No slipstream class is pickled (a file's meaning does not depend on
the Python class paths of the version that wrote it). One record per saved entry:

====================================================  ===================================
record                                                 entry it stands for
====================================================  ===================================
``("e", key, value)``                                  ``(key, value)``: routed by key
``("k", key, detail, value)``                          ``(KeyedStateKey(key, detail), value)``
``("b", name, value)``                                 ``(BroadcastKey(name), value)``
``("kb", detail, {key: value})``                       ``(KeyedStateBatch(detail), mapping)``
``("m", tag, detail, mode, {key: value}, [removed],    a saved keyed-state map:
base_id)``                                             ``(StateMap(tag, detail),
                                                       StateMapSave(mode, upserts, removed,
                                                       base_id))``
====================================================  ===================================

Chains and merging
------------------
A *full* chunk holds all of a processor's entries. A *delta* chunk (written when one of
the processor's maps saved a delta or a drop, see :mod:`~slipstream.state.keyed`):

* its non-map records REPLACE the chain's earlier non-map records wholesale;
* its maps apply by ``(tag, detail)``: mode ``full`` replaces that map, ``delta`` upserts
  ``upserts`` and removes ``removed`` (``base_id`` must be the snapshot of the previous
  chunk of the chain), ``drop`` removes the map;
* maps it does not name keep their content.

:func:`merge_chain` folds a chain into the entries of one full chunk (maps as full
:class:`~slipstream.state.keyed.StateMap` entries: no per-key expansion before restore
routing). Compaction writes such a merged chain as a new full chunk; later manifests
name it instead of the chunks it replaces.

``extra`` (an engine's metadata) and ``dag_shape`` are JSON; ``extra`` may hold tuples and
dicts with non-str keys, tagged as ``{"__tuple__": [...]}`` and ``{"__items__": [[k, v],
...]}`` (see :func:`to_json` / :func:`from_json`).

Format 2 (slipstream before the chunked store): one file ``snapshot-<id>.bin`` with magic
``SLIPSTREAM-SNAPSHOT 2`` whose payload is a pickled ``SnapshotData``. The store still
reads it (signed by the same key); it writes format 3 only.
"""

from __future__ import annotations

import json
import pickle
import zlib
from collections.abc import Iterable, Sequence
from typing import Any

from slipstream.state.columnar import (
    EncodedBatches,
    MapColumns,
    cheaper_than_pickle,
    is_columnar,
)
from slipstream.state.columnar import decode as decode_columnar
from slipstream.state.columnar import encode as encode_columnar
from slipstream.state.keyed import DELTA, DROP, FULL, StateMap, StateMapSave
from slipstream.state.keys import BroadcastKey, KeyedStateBatch, KeyedStateKey

__all__ = [
    "CHUNK_DELTA",
    "CHUNK_FULL",
    "CHUNK_MAGIC",
    "COMPRESS_MAX",
    "FORMAT",
    "MAGIC",
    "chunk_mode",
    "decode_payload",
    "decode_records",
    "encode_payload",
    "encode_records",
    "from_json",
    "merge_chain",
    "to_json",
]

FORMAT = 3
MAGIC = b"SLIPSTREAM-SNAPSHOT 3\n"
CHUNK_MAGIC = b"SLIPSTREAM-CHUNK 3\n"
#: a pickled chunk payload of at most this many bytes is written zlib-compressed (level
#: 1) when that makes it smaller; a larger one is not: compressing costs ~10 ns a byte,
#: its fixed framing is no longer most of what it writes, and a large save's bytes are
#: written by steps whose cost is bounded per step (state/live.py)
COMPRESS_MAX = 64 * 1024
#: the first byte of a zlib stream (deflate, 32 KiB window): a compressed payload's
_ZLIB_FIRST = b"\x78"
#: chunk modes
CHUNK_FULL = "full"
CHUNK_DELTA = "delta"

_new = tuple.__new__


def encode_records(entries: Iterable[tuple[Any, Any]]) -> list[tuple[Any, ...]]:
    """A processor's saved entries as plain records (see the module doc)."""
    out: list[tuple[Any, ...]] = []
    append = out.append
    for entry in entries:
        k, v = entry
        t = type(k)
        if t is StateMap:
            upserts = v.upserts
            if type(upserts) is MapColumns:  # read as data, written back (a transform)
                upserts = upserts.to_dict()
            append(("m", k.tag, k.detail, v.mode, upserts, list(v.removed), v.base_id))
        elif t is KeyedStateKey:
            append(("k", k.key, k.detail, v))
        elif t is BroadcastKey:
            append(("b", k.name, v))
        elif t is KeyedStateBatch:
            append(("kb", k.detail, v if type(v) is dict else dict(v)))
        else:
            append(("e", k, v))
    return out


def decode_records(records: Iterable[Sequence[Any]]) -> list[tuple[Any, Any]]:
    """The entries ``records`` stand for (the inverse of :func:`encode_records`)."""
    out: list[tuple[Any, Any]] = []
    append = out.append
    for r in records:
        tag = r[0]
        if tag == "e":
            append((r[1], r[2]))
        elif tag == "k":
            append((_new(KeyedStateKey, (r[1], r[2])), r[3]))
        elif tag == "b":
            append((_new(BroadcastKey, (r[1],)), r[2]))
        elif tag == "m":
            append(
                (
                    _new(StateMap, (r[1], r[2])),
                    _new(StateMapSave, (r[3], r[4], tuple(r[5]), r[6])),
                )
            )
        elif tag == "kb":
            append((_new(KeyedStateBatch, (r[1],)), r[2]))
        else:
            raise ValueError(f"unknown snapshot record tag {tag!r}")
    return out


def chunk_mode(entries: Iterable[tuple[Any, Any]]) -> str:
    """``delta`` iff one of ``entries`` is a map saved as a delta or a drop."""
    for k, v in entries:
        if type(k) is StateMap and v.mode != FULL:
            return CHUNK_DELTA
    return CHUNK_FULL


def delta_bases(entries: Iterable[tuple[Any, Any]]) -> set[int]:
    """The ``base_id`` of every map of ``entries`` saved as a delta or drop."""
    return {v.base_id for k, v in entries if type(k) is StateMap and v.mode != FULL}


def encode_payload(records: list[tuple[Any, ...]], columnar: bool = True) -> bytes:
    """A chunk's payload: the columnar encoding when the records are keyed maps of
    simple keys and values (:mod:`~slipstream.state.columnar`; not with ``columnar``
    false), else the C pickler, or cloudpickle for what only it encodes (lambdas,
    classes defined in ``__main__``) among the user's values.

    A map record whose content was encoded already, in steps by a copy-on-write save
    (an :class:`~slipstream.state.live.EncodedMap` of pickle fragments), is put together
    from its fragments: the same pickle opcodes a dict's items get, after an empty dict,
    so the payload decodes to the same records (the other records are pickled without
    a memo around it; if one cannot be, the map is decoded and pickled as a dict)."""
    parts = encode_payload_parts(records, columnar)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def encode_payload_parts(
    records: list[tuple[Any, ...]], columnar: bool | None = True
) -> list[bytes]:
    """:func:`encode_payload` as the pieces the payload is made of, in order (no joined
    copy of an encoded map's fragments: the store writes and signs the pieces). The
    columnar encoding (:mod:`~slipstream.state.columnar`) where it applies, unless
    ``columnar`` is false (``None``: only where it also costs less than the pickle,
    :func:`~slipstream.state.columnar.cheaper_than_pickle`: a job's own saves); the
    pickle otherwise."""
    from slipstream.state.live import EncodedMap

    if columnar or (columnar is None and cheaper_than_pickle(records)):
        parts = encode_columnar(records)
        if parts is not None:
            return parts
    if any(r[0] == "m" and type(r[4]) is EncodedBatches for r in records):
        # column batches of a copy-on-write save in a chunk that is pickled
        records = [
            (*r[:4], r[4].to_dict(), *r[5:]) if r[0] == "m" and type(r[4]) is EncodedBatches else r
            for r in records
        ]
    if any(r[0] == "m" and type(r[4]) is EncodedMap for r in records):
        try:
            return _small_compressed(_assembled(records, EncodedMap))
        except Exception:  # noqa: BLE001 - a record the fast pickler cannot encode
            records = [
                (*r[:4], r[4].to_dict(), *r[5:]) if r[0] == "m" and type(r[4]) is EncodedMap else r
                for r in records
            ]
    return _small_compressed([_pickled(records)])


def _small_compressed(parts: list[bytes]) -> list[bytes]:
    """A pickled payload (as its pieces) of at most :data:`COMPRESS_MAX` bytes as one
    zlib stream when that is shorter; ``parts`` otherwise."""
    size = sum(map(len, parts))
    if size > COMPRESS_MAX:
        return parts
    z = zlib.compress(parts[0] if len(parts) == 1 else b"".join(parts), 1)
    return [z] if len(z) < size else parts


def _pickled(records: list[tuple[Any, ...]]) -> bytes:
    try:
        return pickle.dumps(records, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # noqa: BLE001 - PicklingError, TypeError, AttributeError
        from slipstream.core.pickling import cloudpickle

        return cloudpickle.dumps(records, protocol=pickle.HIGHEST_PROTOCOL)  # type: ignore[no-any-return]


def _assembled(records: list[tuple[Any, ...]], encoded: type) -> list[bytes]:
    """The payload of ``records`` with each encoded map's fragments in place of its
    dict: ``PROTO 5, EMPTY_LIST, MARK, <records>, APPENDS, STOP``."""
    from slipstream.state.live import pushed

    out = [b"\x80\x05]("]
    for r in records:
        if r[0] == "m" and type(r[4]) is encoded:
            out.append(b"(")  # the record: a tuple
            out.append(pushed(r[:4]))
            out.append(b"}")  # its dict, filled by the fragments
            out.extend(r[4].parts)  # type: ignore[attr-defined]
            out.append(pushed(r[5:]))
            out.append(b"t")
        else:
            out.append(pushed((r,)))
    out.append(b"e.")
    return out


def decode_payload(payload: bytes | memoryview, columns: bool = False) -> list[Any]:
    """The records of a *verified* chunk payload, columnar, pickled or compressed. ``columns``: a
    columnar map's content as :class:`~slipstream.state.columnar.MapColumns` (its
    column buffers, for Arrow) instead of a dict."""
    if is_columnar(payload):
        return decode_columnar(payload, columns)
    if payload[:1] == _ZLIB_FIRST:
        payload = zlib.decompress(payload)
    records = pickle.loads(payload)
    if not isinstance(records, list):
        raise ValueError(f"a chunk payload is a list of records, not {type(records).__name__}")
    return records


def merge_chain(
    chunks: Sequence[tuple[str, int, list[Any]]], where: str = ""
) -> list[tuple[Any, Any]]:
    """Fold a chain of decoded chunks ``(mode, snapshot_id, records)`` (oldest first, a
    full chunk first) into the entries of one full chunk: the chain's last non-map
    entries, then every map as a full :class:`StateMap` entry. ``where`` names the chain
    in errors (a ``ValueError``: a delta that does not continue the chain)."""
    if not chunks:
        return []
    if chunks[0][0] != CHUNK_FULL:
        raise ValueError(f"{where}the chain starts with a delta chunk (of snapshot {chunks[0][1]})")
    if len(chunks) == 1:
        return decode_records(chunks[0][2])
    other: list[tuple[Any, Any]] = []
    maps: dict[tuple[str, Any], Any] = {}  # a dict, or columns (MapColumns) until updated
    previous = 0
    for mode, sid, records in chunks:
        if mode == CHUNK_FULL:
            maps = {}
        other = []
        for r in records:
            if r[0] != "m":
                other.extend(decode_records((r,)))
                continue
            name = (r[1], r[2])
            m_mode = r[3]
            if m_mode == FULL:
                maps[name] = r[4]
            elif m_mode == DELTA:
                if r[6] != previous:
                    raise ValueError(
                        f"{where}the delta of map {name!r} in snapshot {sid} is relative to "
                        f"snapshot {r[6]}, but the chain's previous chunk is of snapshot "
                        f"{previous}"
                    )
                m = maps.get(name)
                if m is not None and type(m) is not dict:  # columns: a dict to update
                    m = maps[name] = m.to_dict()
                if m is None:
                    raise ValueError(
                        f"{where}snapshot {sid} holds a delta of map {name!r} that no earlier "
                        f"chunk of its chain holds"
                    )
                m.update(r[4])
                for gone in r[5]:
                    m.pop(gone, None)
            elif m_mode == DROP:
                maps.pop(name, None)
            else:
                raise ValueError(f"{where}unknown map mode {m_mode!r} in snapshot {sid}")
        previous = sid
    out = other
    for (tag, detail), m in maps.items():
        out.append((_new(StateMap, (tag, detail)), _new(StateMapSave, (FULL, m, (), 0))))
    return out


# -- JSON with tuples and non-str keys (the manifest's ``extra``) ------------------------------
def to_json(value: Any, where: str = "extra") -> Any:
    """``value`` as JSON data: tuples tagged ``{"__tuple__": [...]}``, dicts with a non-str
    key as ``{"__items__": [[k, v], ...]}``. Only plain data (dict, list, tuple, str, int,
    float, bool, None); anything else raises ``TypeError`` naming ``where``."""
    t = type(value)
    if value is None or t in (str, int, float, bool):
        return value
    if t is list:
        return [to_json(v, where) for v in value]
    if t is tuple:
        return {"__tuple__": [to_json(v, where) for v in value]}
    if t is dict:
        if all(type(k) is str for k in value) and not ({"__tuple__", "__items__"} & value.keys()):
            return {k: to_json(v, f"{where}[{k!r}]") for k, v in value.items()}
        return {"__items__": [[to_json(k, where), to_json(v, where)] for k, v in value.items()]}
    raise TypeError(
        f"{where} holds a {t.__module__}.{t.__qualname__}; a snapshot's extra holds plain "
        f"data only (dict, list, tuple, str, int, float, bool, None)"
    )


def from_json(value: Any) -> Any:
    """The inverse of :func:`to_json`."""
    if type(value) is list:
        return [from_json(v) for v in value]
    if type(value) is dict:
        if len(value) == 1 and "__tuple__" in value:
            return tuple(from_json(v) for v in value["__tuple__"])
        if len(value) == 1 and "__items__" in value:
            return {_hashable(from_json(k)): from_json(v) for k, v in value["__items__"]}
        return {k: from_json(v) for k, v in value.items()}
    return value


def _hashable(v: Any) -> Any:
    return tuple(_hashable(x) for x in v) if type(v) is list else v


def dumps(body: dict[str, Any]) -> bytes:
    """A manifest body as bytes (sorted keys: the same body, the same bytes)."""
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode("utf-8")
