"""The snapshot format 3 codec (state/format.py): records are plain data and decode to
the same entries; a chain of a full chunk and deltas merges into the full entries."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from slipstream.state import format as fmt
from slipstream.state.keyed import DELTA, DROP, FULL, KEYED, PLAIN, StateMap, StateMapSave
from slipstream.state.keys import BroadcastKey, KeyedStateBatch, KeyedStateKey


def entries() -> list[tuple[Any, Any]]:
    return [
        ("plain", 1),
        (KeyedStateKey("k", (1, 2)), [3]),
        (BroadcastKey(("src", 0)), {"offset": 5}),
        (KeyedStateBatch("frame"), {"a": 1, "b": 2}),
        (StateMap(PLAIN), StateMapSave(FULL, {"x": 1, "y": 2})),
        (StateMap(KEYED, 1000), StateMapSave(DELTA, {"x": 3}, ("y",), 4)),
    ]


def test_records_are_plain_and_decode_to_the_same_entries() -> None:
    records = fmt.encode_records(entries())
    payload = fmt.encode_payload(records)
    assert b"slipstream" not in payload
    back = fmt.decode_records(fmt.decode_payload(payload))
    assert back == entries()
    assert [type(k) for k, _v in back] == [type(k) for k, _v in entries()]
    assert type(back[5][1]) is StateMapSave


def test_unknown_record_tag_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown snapshot record tag 'z'"):
        fmt.decode_records([("z", 1)])
    with pytest.raises(ValueError, match="a list of records, not dict"):
        fmt.decode_payload(pickle.dumps({}))


def test_chunk_mode_is_delta_iff_a_map_saved_a_delta_or_a_drop() -> None:
    assert fmt.chunk_mode(entries()[:5]) == fmt.CHUNK_FULL
    assert fmt.chunk_mode(entries()) == fmt.CHUNK_DELTA
    drop = [(StateMap(KEYED, 1), StateMapSave(DROP, {}, (), 3))]
    assert fmt.chunk_mode(drop) == fmt.CHUNK_DELTA and fmt.delta_bases(drop) == {3}


def chunk(mode: str, sid: int, es: list[tuple[Any, Any]]) -> tuple[str, int, list[Any]]:
    return mode, sid, fmt.decode_payload(fmt.encode_payload(fmt.encode_records(es)))


def test_a_chain_merges_into_full_maps() -> None:
    a, b, c = StateMap(PLAIN), StateMap(KEYED, 1000), StateMap(KEYED, 2000)
    chain = [
        chunk("full", 4, [("other", 1), (a, StateMapSave(FULL, {"x": 1, "y": 2})), (b, StateMapSave(FULL, {"k": 1}))]),
        # other entries replaced; a: upsert + remove; b not named: kept; c new (full)
        chunk("delta", 5, [("other", 2), (a, StateMapSave(DELTA, {"x": 5, "z": 0}, ("y",), 4)), (c, StateMapSave(FULL, {"q": 9}))]),
        # b dropped (a closed frame); a unchanged (an empty delta)
        chunk("delta", 6, [(a, StateMapSave(DELTA, {}, (), 5)), (b, StateMapSave(DROP, {}, (), 5))]),
    ]
    merged = fmt.merge_chain(chain)
    assert merged == [
        (a, StateMapSave(FULL, {"x": 5, "z": 0})),
        (c, StateMapSave(FULL, {"q": 9})),
    ]
    # a full chunk later in the chain starts over
    again = chain + [chunk("full", 7, [("other", 3)])]
    assert fmt.merge_chain(again) == [("other", 3)]


def test_a_delta_that_does_not_continue_its_chain_is_refused() -> None:
    a = StateMap(PLAIN)
    full = chunk("full", 4, [(a, StateMapSave(FULL, {"x": 1}))])
    skips = chunk("delta", 6, [(a, StateMapSave(DELTA, {"x": 2}, (), 5))])
    with pytest.raises(ValueError, match="v#0: the delta of map .* in snapshot 6 is relative to snapshot 5, but the chain's previous chunk is of snapshot 4"):
        fmt.merge_chain([full, skips], "v#0: ")
    unknown = chunk("delta", 5, [(StateMap(KEYED, 1), StateMapSave(DELTA, {"x": 2}, (), 4))])
    with pytest.raises(ValueError, match="holds a delta of map .* that no earlier chunk"):
        fmt.merge_chain([full, unknown])
    with pytest.raises(ValueError, match="starts with a delta chunk"):
        fmt.merge_chain([unknown])


def test_extra_round_trips_through_json() -> None:
    import json

    extra = {"epoch_id": 3, "wm": [("v", 0, {1: (2, None)})], "t": (1, "a"), "f": 0.5}
    assert fmt.from_json(json.loads(json.dumps(fmt.to_json(extra)))) == extra
    with pytest.raises(TypeError, match=r"extra\['x'\] holds a builtins.set"):
        fmt.to_json({"x": {1}})


def test_a_small_pickled_payload_is_written_compressed_and_a_large_one_as_it_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A pickled payload of at most COMPRESS_MAX bytes is a zlib stream when that is
    shorter (a small delta: its framing and manifest are most of what a snapshot
    writes), and decodes to the same records; a larger one, or one that compression
    does not shorten, is the pickle itself."""
    delta = [(StateMap(PLAIN), StateMapSave(DELTA, {k * 100: 1000 + k for k in range(100)}, (), 4))]
    records = fmt.encode_records(delta)
    pickled = pickle.dumps(records, protocol=pickle.HIGHEST_PROTOCOL)
    payload = fmt.encode_payload(records, columnar=False)
    assert payload[:1] == b"\x78" and len(payload) < len(pickled)
    assert fmt.decode_records(fmt.decode_payload(payload)) == delta
    assert fmt.decode_payload(memoryview(payload)) == fmt.decode_payload(pickled)
    tiny = fmt.encode_records([(BroadcastKey(("src", 0)), 5)])
    assert fmt.encode_payload(tiny) == pickle.dumps(tiny, protocol=pickle.HIGHEST_PROTOCOL)
    monkeypatch.setattr(fmt, "COMPRESS_MAX", len(pickled) - 1)
    assert fmt.encode_payload(records, columnar=False) == pickled
