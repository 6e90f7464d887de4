"""Copy-on-write saves (state/live.py): a save taken at a barrier and produced in steps
while the map keeps changing holds exactly the map as it was at the barrier."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slipstream.state import live
from slipstream.state.columnar import EncodedBatches
from slipstream.state.keyed import DELTA, FULL, KeyedState
from slipstream.state.live import EncodedMap, LiveSave


@pytest.fixture(autouse=True)
def _small_saves_are_live(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(live, "LIVE_SAVE_MIN_KEYS", 0)


def _ctx() -> SimpleNamespace:
    return SimpleNamespace(
        incremental_snapshots=True,
        current_snapshot_id=0,
        committed_snapshot_id=0,
        live_saves=[],
    )


def _state(ctx: SimpleNamespace, content: dict[Any, Any]) -> KeyedState:
    s = KeyedState(context=ctx)
    s.values_replaced = True
    s.update(content)
    return s


def _content(save: LiveSave) -> tuple[dict[Any, Any], tuple[Any, ...]]:
    """What the store thread takes from a complete save, as a dict."""
    upserts, removed = save.result()
    if type(upserts) in (EncodedMap, EncodedBatches):
        upserts = upserts.to_dict()
    return upserts, removed


def _save(s: KeyedState, ctx: SimpleNamespace, sid: int, committed: int) -> Any:
    ctx.current_snapshot_id = sid
    ctx.committed_snapshot_id = committed
    return s.snapshot_entry()[1]


#: an operation on the map while its save is produced: ("set", key, value),
#: ("del", key), ("pop", key), ("setdefault", key, value), ("step", budget)
_keys = st.integers(0, 40)
_ops = st.lists(
    st.one_of(
        st.tuples(st.just("set"), _keys, st.integers(0, 9)),
        st.tuples(st.just("del"), _keys),
        st.tuples(st.just("pop"), _keys),
        st.tuples(st.just("setdefault"), _keys, st.integers(0, 9)),
        st.tuples(st.just("step"), st.integers(1, 7)),
    ),
    max_size=120,
)


def _apply(s: KeyedState, op: tuple[Any, ...], save: LiveSave, model: dict[Any, Any]) -> None:
    """``op`` on the live map and on a plain dict that models it."""
    kind = op[0]
    if kind == "set":
        s[op[1]] = model[op[1]] = op[2]
    elif kind == "del":
        if op[1] in model:
            del s[op[1]]
            del model[op[1]]
        else:
            with pytest.raises(KeyError):
                del s[op[1]]
    elif kind == "pop":
        assert s.pop(op[1], None) == model.pop(op[1], None)
    elif kind == "setdefault":
        assert s.setdefault(op[1], op[2]) == model.setdefault(op[1], op[2])
    else:
        save.step(op[1])
    assert dict(s) == model  # the processor sees its own writes at once


@settings(max_examples=135, deadline=None)
@given(
    st.dictionaries(_keys, st.integers(0, 9), max_size=30),
    _ops,
    st.booleans(),
)
def test_a_full_save_holds_the_pre_barrier_map_whatever_changes_meanwhile(
    content: dict[int, int], ops: list[tuple[Any, ...]], reinsert_first: bool
) -> None:
    ctx = _ctx()
    s = _state(ctx, content)
    if reinsert_first:  # a map whose order is not its keys' first insertion order
        for k in list(content)[::3]:
            v = s.pop(k)
            s[k] = v
    at_barrier = dict(s)
    save = _save(s, ctx, 1, 0)
    assert save.mode == FULL and type(save.upserts) is LiveSave
    assert ctx.live_saves == [save.upserts]
    model = dict(s)
    for op in ops:
        _apply(s, op, save.upserts, model)
    save.upserts.finish()
    assert type(s) is KeyedState  # the map has its class back
    upserts, removed = _content(save.upserts)
    assert upserts == at_barrier and removed == ()
    assert dict(s) == model


@settings(max_examples=144, deadline=None)
@given(
    st.dictionaries(_keys, st.integers(0, 9), max_size=30),
    st.lists(st.tuples(_keys, st.integers(-1, 9)), max_size=30),
    _ops,
)
def test_a_delta_holds_the_pre_barrier_values_of_the_changed_keys(
    content: dict[int, int],
    changes: list[tuple[int, int]],
    ops: list[tuple[Any, ...]],
) -> None:
    ctx = _ctx()
    s = _state(ctx, content)
    s.dirty.update(content)  # type: ignore[union-attr]
    _save(s, ctx, 1, 0)  # full (the first save), produced at once
    ctx.live_saves.pop().finish()
    base = dict(s)
    for k, v in changes:  # changes since snapshot 1: a negative value removes the key
        if v < 0:
            s.pop(k, None)
        else:
            s[k] = v
        s.dirty.add(k)  # type: ignore[union-attr]
        if v in (2, 7):  # the marks so far go into a set of their own (seal_marks)
            s.seal_marks()
    if s.marked() >= len(s):
        return  # every key changed: the save is full (the test above)
    at_barrier = dict(s)
    save = _save(s, ctx, 2, 1)
    assert save.mode == DELTA and save.base_id == 1 and type(save.upserts) is LiveSave
    model = dict(s)
    for op in ops:
        _apply(s, op, save.upserts, model)
    save.upserts.finish()
    upserts, removed = _content(save.upserts)
    merged = dict(base)
    merged.update(upserts)
    for k in removed:
        assert k not in upserts
        merged.pop(k, None)  # as the store merges a delta
    assert merged == at_barrier
    changed = {k for k, _ in changes}
    assert set(upserts) | set(removed) == changed


def test_a_delta_records_the_pre_barrier_values_of_its_changed_keys_only() -> None:
    """A write after the barrier records a key's pre-barrier value only if the delta
    holds the key: in the uniform pattern the keys written while a delta is produced
    are other keys than the delta's (main recorded every one: a dict entry of ~100 bytes
    a key written, tens of MB at 10M keys)."""
    ctx = _ctx()
    s = _state(ctx, {i: i for i in range(100)})
    _save(s, ctx, 1, 0)
    ctx.live_saves.pop().finish()
    for k in range(10):
        s[k] = k + 100
    s.dirty.update(range(10))  # type: ignore[union-attr]
    s.pop(99)
    s.dirty.add(99)  # type: ignore[union-attr]
    save = _save(s, ctx, 2, 1).upserts
    for k in range(50, 99):  # keys the delta does not hold, one removed
        s[k] = -k
    del s[98]
    s[99] = 1  # removed before the barrier, inserted again
    assert save.old == {99: live.ABSENT}
    save.step(4)
    s[3] = -3
    s[7] = -7
    assert set(save.old) == {3, 7, 99} and save.old[3] == 103 and save.old[7] == 107
    save.finish()
    assert _content(save) == ({k: k + 100 for k in range(10)}, (99,))


def test_marks_past_marks_seal_go_into_a_new_set_and_the_delta_saves_each_key_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The additive rolling loop's marks go into a new set once ``dirty`` holds
    MARKS_SEAL keys (a large set's table doubles, and at 10M keys one set of an
    interval's 1.8M marks had 67 MB of table); the delta of several sets holds each
    changed key once, with its value at the barrier, also when a write or a removal
    after the barrier meets a key of a sealed set (main had one set: no ``sealed``)."""
    from slipstream.pipeline import keyed as pipeline_keyed
    from slipstream.state import keyed as keyed_mod

    monkeypatch.setattr(keyed_mod, "MARKS_SEAL", 8)
    monkeypatch.setattr(pipeline_keyed, "_MARKS_WORTH_KEEPING", 0)
    ctx = _ctx()
    s = _state(ctx, {i: 0 for i in range(200)})
    _save(s, ctx, 1, 0)
    ctx.live_saves.pop().finish()
    bucket: list[tuple[int, int]] = []
    for chunk in (range(10), range(5, 15), range(10, 20), (3, 30)):
        start = len(bucket)
        for k in chunk:
            s[k] += 1
            bucket.append((k, s[k]))
        pipeline_keyed._mark_from(s, s.dirty, bucket, start)  # type: ignore[arg-type]
    assert [sorted(m) for m in s.sealed] == [
        list(range(10)),
        list(range(5, 15)),
        list(range(10, 20)),
    ]
    assert s.dirty == {3, 30} and s.marked() == 32
    del s[19]
    at_barrier = dict(s)
    save = _save(s, ctx, 2, 1)
    assert save.mode == DELTA and type(save.upserts) is LiveSave
    live_save = save.upserts
    assert s.sealed == [] and s.dirty == set() and s.marked() == 0
    s[12] = 99  # of two sealed sets
    s[3] = 77  # of a sealed set and the last one
    s[100] = 5  # not the delta's
    live_save.step(1)
    s.pop(13)
    assert set(live_save.old) == {12, 3, 13}  # type: ignore[arg-type]
    live_save.finish()
    changed = set(range(19)) | {30}
    upserts, removed = _content(live_save)
    assert upserts == {k: at_barrier[k] for k in changed} and removed == (19,)
    assert live_save.count == len(changed)  # each key once


def test_a_map_whose_values_may_change_in_place_is_copied_at_the_barrier() -> None:
    ctx = _ctx()
    s = KeyedState(context=ctx)
    s["a"] = [1]
    save = _save(s, ctx, 1, 0)
    assert type(save.upserts) is dict and ctx.live_saves == []


def test_asked_again_for_the_same_snapshot_it_hands_out_the_same_save() -> None:
    ctx = _ctx()
    s = _state(ctx, {"a": 1, "b": 2})
    first = _save(s, ctx, 1, 0).upserts
    again = s.snapshot_entry()[1].upserts
    assert again is first and ctx.live_saves == [first]


def test_clear_produces_the_save_first() -> None:
    ctx = _ctx()
    s = _state(ctx, {"a": 1, "b": 2, "c": 3})
    save = _save(s, ctx, 1, 0).upserts
    save.step(1)
    s.clear()
    s["d"] = 4
    assert save.done and _content(save) == ({"a": 1, "b": 2, "c": 3}, ())
    assert dict(s) == {"d": 4}


def test_a_save_of_an_earlier_snapshot_still_in_progress_is_cancelled() -> None:
    ctx = _ctx()
    s = _state(ctx, {"a": 1, "b": 2})
    first = _save(s, ctx, 1, 0).upserts
    ctx.live_saves.clear()  # its snapshot failed; nobody produced it
    second = _save(s, ctx, 2, 0).upserts  # snapshot 1 did not commit: full again
    assert first.done and second is not first
    with pytest.raises(RuntimeError, match="cancelled"):
        first.result()
    second.finish()
    assert _content(second) == ({"a": 1, "b": 2}, ())


def test_update_and_ior_record_pre_barrier_values() -> None:
    ctx = _ctx()
    s = _state(ctx, {"a": 1, "b": 2})
    save = _save(s, ctx, 1, 0).upserts
    s.update({"a": 10, "c": 3})
    s |= {"b": 20}
    save.finish()
    assert _content(save) == ({"a": 1, "b": 2}, ())
    assert dict(s) == {"a": 10, "b": 20, "c": 3}


@settings(max_examples=50, deadline=None)
@given(
    st.dictionaries(
        st.one_of(
            st.integers(), st.text(max_size=5), st.tuples(st.integers(), st.text(max_size=3))
        ),
        st.one_of(st.integers(), st.floats(allow_nan=False), st.text(max_size=4)),
        max_size=60,
    ),
    st.integers(1, 9),
)
def test_an_encoded_save_decodes_to_the_records_a_copy_gives(
    content: dict[Any, Any], budget: int
) -> None:
    """The chunk payload put together from a save's fragments decodes to exactly the
    records of the same map saved as a dict (next to another map and a plain entry)."""
    from slipstream.state import format as fmt
    from slipstream.state.keyed import StateMap, StateMapSave
    from slipstream.state.keys import BroadcastKey

    ctx = _ctx()
    s = _state(ctx, content)
    save = _save(s, ctx, 1, 0).upserts
    while not save.step(budget):
        pass
    upserts, removed = save.result()
    assert type(upserts) in (EncodedMap, EncodedBatches)
    entries = [
        (StateMap("e", None), StateMapSave(FULL, upserts, removed, 0)),
        (BroadcastKey("cursor"), (1, "x")),
        (StateMap("k", 7), StateMapSave(DELTA, {"a": 1}, ("b",), 3)),
    ]
    copied = [(StateMap("e", None), StateMapSave(FULL, dict(content), (), 0)), *entries[1:]]
    payload = fmt.encode_payload(fmt.encode_records(entries))
    assert fmt.decode_payload(payload) == fmt.decode_payload(
        fmt.encode_payload(fmt.encode_records(copied))
    )


def test_a_slice_the_fast_pickler_cannot_encode_turns_the_save_into_a_dict() -> None:
    ctx = _ctx()
    s = _state(ctx, {1: 1, 2: 2, 3: 3})
    save = _save(s, ctx, 1, 0).upserts
    assert not save.step(1)  # encoded
    bad = lambda: None  # noqa: E731 - only cloudpickle encodes it
    s[(2, bad)] = 9  # after the barrier: not in the save
    s[3] = 30
    save.finish()
    assert _content(save) == ({1: 1, 2: 2, 3: 3}, ())  # still encoded: no such key in it
    ctx2 = _ctx()
    s2 = _state(ctx2, {1: 1, (2, lambda: None): 2})
    save2 = _save(s2, ctx2, 1, 0).upserts
    save2.finish()
    content, _ = save2.result()
    assert type(content) is dict and len(content) == 2 and content[1] == 1


def test_keys_inserted_during_a_full_save_wait_in_the_overlay_and_join_the_map_after() -> None:
    """An insertion during a full save does not end the save's walk of the map (main
    listed every key still to encode in one step: tens of ms at a few million keys,
    holding the GIL); the processor still reads its new keys at once."""
    ctx = _ctx()
    s = _state(ctx, {i: i for i in range(10)})
    save = _save(s, ctx, 1, 0).upserts
    assert not save.step(3)
    s[100] = 1  # new keys, and a write of one not encoded yet
    s[100] = s[100] + 1
    s[5] = 50
    assert s.get(100) == 2 and s[100] == 2 and 100 in s and len(s) == 11
    assert dict.__len__(s) == 10  # the walk's map keeps its size
    assert not save.step(3)
    assert save._rest is None  # nothing listed
    s[101] = 7
    while not save.done:
        save.step(3)
    assert _content(save) == ({i: i for i in range(10)}, ())
    assert dict(s) == {**{i: i for i in range(10)}, 5: 50, 100: 2, 101: 7}
    while not save.step(1):  # the overlay joins the map, a key at a time
        assert 101 in s and s.get(101) == 7
    assert type(s) is KeyedState and dict.__len__(s) == 12
    assert list(s)[-2:] == [100, 101]


def test_a_full_save_whose_map_changed_size_behind_the_overlay_lists_the_rest() -> None:
    """A key inserted through ``dict`` itself during a full save ends the walk's
    iterators: the keys still to encode are listed once and their values read by key,
    a written key's recorded value among them."""
    ctx = _ctx()
    s = _state(ctx, {i: i for i in range(10)})
    save = _save(s, ctx, 1, 0).upserts
    assert not save.step(3)
    s[5] = 50  # recorded: 5
    dict.__setitem__(s, 100, 1)  # behind the overlay
    assert not save.step(3)
    assert save._rest == [3, 4, 5, 6, 7, 8, 9]
    while not save.done:
        save.step(3)
    assert _content(save) == ({i: i for i in range(10)}, ())


def test_no_step_encodes_more_than_its_budget_when_keys_were_written_since_the_barrier() -> None:
    """The pre-barrier values of written keys go into the slices that encode those keys
    (main encoded them all in the last step: a step that grows with what was written)."""
    ctx = _ctx()
    s = _state(ctx, {i: i for i in range(12)})
    save = _save(s, ctx, 1, 0).upserts
    for i in range(12):
        s[i] = -i
    sizes = []
    assert save.columns is None  # int keys: pickle fragments (cheaper than columns)
    while not save.done:
        before = len(save.parts)
        save.step(4)
        sizes.extend(len(EncodedMap([p], 0).to_dict()) for p in save.parts[before:])
    assert sizes == [4, 4, 4]
    assert _content(save) == ({i: i for i in range(12)}, ())


def _chunk_records(upserts: Any, columns: bool = False) -> list[Any]:
    """The records of a chunk holding a full map whose content is ``upserts``."""
    from slipstream.state import format as fmt
    from slipstream.state.keyed import StateMap, StateMapSave

    entries = [(StateMap("e", None), StateMapSave(FULL, upserts, (), 0))]
    payload = b"".join(fmt.encode_payload_parts(fmt.encode_records(entries)))
    return fmt.decode_payload(payload, columns)


def test_a_save_of_simple_keys_and_values_is_a_column_batch_per_step() -> None:
    """A full save of str -> int is a column batch per step, each with the pre-barrier
    values of its keys: the chunk decodes to the map at the barrier, and read as data
    (MapColumns) its columns are the map's rows as they are, in order."""
    from slipstream.state.columnar import COLUMNS_MAGIC, MapColumns
    from slipstream.state.query import _Columns

    ctx = _ctx()
    content = {f"k{i}": i for i in range(10)}
    s = _state(ctx, content)
    save = _save(s, ctx, 1, 0).upserts
    save.step(4)
    s["k1"] = 100  # encoded already
    s["k9"] = 900  # not yet encoded: its pre-barrier value is encoded
    s["new"] = 1
    save.finish()
    upserts, _removed = save.result()
    assert type(upserts) is EncodedBatches and len(upserts) == 10 and not upserts.repeats
    assert [b[0]["n"] for b in upserts.batches] == [4, 6]
    assert upserts.to_dict() == content
    ((*_, decoded, _r, _b),) = _chunk_records(upserts)
    assert decoded == content
    ((*_, cols, _r, _b),) = _chunk_records(upserts, columns=True)
    assert type(cols) is MapColumns and cols.unique and len(cols) == 10
    table = _Columns()
    table.add_map("v", 0, cols)
    got = table.table().select(["key", "value"]).to_pydict()
    assert list(zip(got["key"], got["value"], strict=True)) == list(content.items())
    from slipstream.state import format as fmt
    from slipstream.state.keyed import StateMap, StateMapSave

    entries = [(StateMap("e", None), StateMapSave(FULL, upserts, (), 0))]
    payload = b"".join(fmt.encode_payload_parts(fmt.encode_records(entries)))
    assert payload.startswith(COLUMNS_MAGIC)


def test_a_save_whose_later_slice_fits_no_column_turns_into_pickle_fragments() -> None:
    ctx = _ctx()
    content: dict[Any, Any] = {f"k{i}": i for i in range(6)}
    content["mixed"] = (1, 2)  # a tuple value in the last slice
    s = _state(ctx, content)
    save = _save(s, ctx, 1, 0).upserts
    assert not save.step(3) and save.columns is not None  # str keys: column batches
    while not save.step(3):
        pass
    upserts, _removed = save.result()
    assert type(upserts) is EncodedMap and len(upserts) == 7
    assert upserts.to_dict() == content
    ((*_, decoded, _r, _b),) = _chunk_records(upserts)
    assert decoded == content


def test_a_step_stops_after_its_time_at_the_end_of_a_slice(monkeypatch: pytest.MonkeyPatch) -> None:
    """A step works in slices and stops once it took LIVE_SAVE_STEP_S (main made the
    whole budget at once: 32,768 changed keys of a 10M-key map took 55-240 ms, each a
    lookup with its cache misses, and a tasklet on the same thread counted it in its
    pause)."""
    monkeypatch.setattr(live, "LIVE_SAVE_SLICE", 2)
    monkeypatch.setattr(live, "LIVE_SAVE_STEP_S", 0.0)  # every slice is past the time
    ctx = _ctx()
    s = _state(ctx, {i: i for i in range(10)})
    s.dirty.update(s)  # type: ignore[union-attr]
    _save(s, ctx, 1, 0)  # the first save: full
    ctx.live_saves.pop().finish()
    for i in range(6):
        s[i] = -i
        s.dirty.add(i)  # type: ignore[union-attr]
    save = _save(s, ctx, 2, 1)
    assert save.mode == DELTA and type(save.upserts) is LiveSave
    assert not save.upserts.step(100) and save.upserts.count == 2  # one slice
    monkeypatch.setattr(live, "LIVE_SAVE_STEP_S", 60.0)
    assert save.upserts.step(100)  # the rest, slice after slice, within its time
    assert _content(save.upserts) == ({i: -i for i in range(6)}, ())


@settings(max_examples=40, deadline=None)
@given(
    st.dictionaries(_keys, st.integers(0, 9), min_size=1, max_size=30),
    st.sets(_keys),
    st.lists(st.tuples(_keys, st.integers(0, 9)), max_size=10),
    st.booleans(),
)
def test_a_save_checks_whether_a_key_it_saves_is_another_processors(
    content: dict[int, int],
    foreign: set[int],
    later: list[tuple[int, int]],
    delta: bool,
) -> None:
    """With ``context.spilled_keys`` (member processes), a copy-on-write save, full or
    delta, records whether one key it saves goes to another processor (``foreign``), as
    its slices are produced: keys written after the barrier do not count."""
    ctx = _ctx()
    checked: list[int] = []

    def spilled(keys: list[Any]) -> bool:
        checked.extend(keys)
        return bool(foreign & set(keys))

    ctx.spilled_keys = spilled
    s = _state(ctx, content)
    saved = set(content)
    if delta:
        _save(s, ctx, 1, 0).upserts.finish()  # the full save the delta continues
        changed = list(content)[: max(1, len(content) // 2)]
        for k in changed:
            s[k] = s[k] + 1
        s.dirty = set(changed)
        saved = set(changed)
        checked.clear()
    save = _save(s, ctx, 2 if delta else 1, 1 if delta else 0)
    assert save.mode == (DELTA if delta and len(changed) < len(content) else FULL)
    for k, v in later:
        s[k] = v
    save.upserts.finish()
    if save.mode == FULL:
        saved = set(content)
    assert save.upserts.spill is bool(foreign & saved)
    assert set(checked) <= saved and (save.upserts.spill or set(checked) == saved)


def test_a_save_without_spilled_keys_leaves_its_keys_unchecked() -> None:
    ctx = _ctx()
    s = _state(ctx, {1: 1, 2: 2})
    save = _save(s, ctx, 1, 0)
    save.upserts.finish()
    assert save.upserts.spill is None
