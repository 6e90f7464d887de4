"""KeyedState: full and delta saves, what is tracked, and how restore expands them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from slipstream.state.keyed import DELTA, DROP, FULL, KEYED, PLAIN, KeyedState, StateMap
from slipstream.state.keys import KeyedStateKey, expand_entries


def _ctx(incremental: bool = True) -> SimpleNamespace:
    return SimpleNamespace(
        incremental_snapshots=incremental, current_snapshot_id=0, committed_snapshot_id=0
    )


def _save(state: KeyedState, ctx: SimpleNamespace, sid: int, committed: int) -> tuple:
    ctx.current_snapshot_id = sid
    ctx.committed_snapshot_id = committed
    return state.snapshot_entry()


def test_without_incremental_snapshots_nothing_is_tracked_and_every_save_is_full() -> None:
    ctx = _ctx(False)
    s = KeyedState(context=ctx)
    assert s.dirty is None
    s["a"] = 1
    key, save = _save(s, ctx, 1, 0)
    assert key == StateMap(PLAIN, None) and save.mode == FULL and save.upserts == {"a": 1}
    s["a"] = 2
    assert _save(s, ctx, 2, 1)[1] == (FULL, {"a": 2}, (), 0)


def test_delta_holds_changed_and_removed_keys_relative_to_the_previous_save() -> None:
    ctx = _ctx()
    s = KeyedState(context=ctx)
    for k in "abcd":
        s[k] = 1
    s.dirty.update("abcd")  # type: ignore[union-attr]
    assert _save(s, ctx, 1, 0)[1].mode == FULL  # the first save of an execution
    s["a"] = 5
    del s["b"]
    s.dirty.update("ab")  # type: ignore[union-attr]
    save = _save(s, ctx, 2, 1)[1]
    assert save.mode == DELTA and save.upserts == {"a": 5} and save.removed == ("b",)
    assert save.base_id == 1
    # the upserts are a copy: later writes do not reach the handed-over save
    s["a"] = 6
    assert save.upserts == {"a": 5}


def test_a_save_after_an_uncommitted_one_is_full() -> None:
    ctx = _ctx()
    s = KeyedState(context=ctx)
    s["a"], s["b"] = 1, 1
    _save(s, ctx, 1, 0)
    s["a"] = 2
    s.changed("a")
    _save(s, ctx, 2, 1)  # snapshot 2 then fails: committed stays 1
    s["b"] = 3
    s.changed("b")
    save = _save(s, ctx, 3, 1)[1]
    assert save.mode == FULL and save.upserts == {"a": 2, "b": 3}


def test_every_key_changed_saves_full() -> None:
    ctx = _ctx()
    s = KeyedState(context=ctx)
    s["a"] = 1
    _save(s, ctx, 1, 0)
    s["a"] = 2
    s.changed("a")
    assert _save(s, ctx, 2, 1)[1].mode == FULL


def test_dropped_entry_only_once_a_snapshot_holds_the_map() -> None:
    ctx = _ctx()
    s = KeyedState(KEYED, 100, ctx)
    assert s.dropped_entry() is None
    s[1] = 1
    _save(s, ctx, 1, 0)
    key, save = s.dropped_entry()  # type: ignore[misc]
    assert key == StateMap(KEYED, 100) and save.mode == DROP and save.base_id == 1


def test_expand_entries_turns_full_maps_into_the_entries_they_stand_for() -> None:
    ctx = _ctx(False)
    plain = KeyedState(context=ctx)
    plain["x"] = 1
    keyed = KeyedState(KEYED, 7, ctx)
    keyed["y"] = 2
    entries = [plain.snapshot_entry(), keyed.snapshot_entry(), ("other", 3)]
    assert expand_entries(entries) == [("x", 1), (KeyedStateKey("y", 7), 2), ("other", 3)]


def test_expand_entries_refuses_an_unmerged_delta() -> None:
    ctx = _ctx()
    s = KeyedState(context=ctx)
    s["a"], s["b"] = 1, 1
    _save(s, ctx, 1, 0)
    s.changed("a")
    with pytest.raises(ValueError, match="delta of keyed state, not merged with the snapshot 1"):
        expand_entries([_save(s, ctx, 2, 1)])


def test_bad_tag() -> None:
    with pytest.raises(ValueError, match="tag must be PLAIN or KEYED"):
        KeyedState("x")


def test_a_full_save_keeps_no_copy_of_the_map_until_the_next_save() -> None:
    """A full save's entry is a copy of the whole map: the state does not hold it between
    saves (a second copy of the state in memory); asked again for the same snapshot, it
    copies the unchanged map again. With a forked writer it hands the map itself over."""
    ctx = _ctx()
    s = KeyedState(context=ctx)
    s["a"], s["b"] = 1, 2
    first = _save(s, ctx, 1, 0)
    again = _save(s, ctx, 1, 0)
    assert first[1] == again[1] == (FULL, {"a": 1, "b": 2}, (), 0)
    assert again[1].upserts is not first[1].upserts
    assert type(first[1].upserts) is dict
    ctx.snapshot_writer = "fork"
    s.changed("a")
    s.changed("b")
    assert _save(s, ctx, 2, 1)[1].upserts is s


def test_asked_again_for_the_same_snapshot_it_returns_the_same_entry() -> None:
    """A processor whose offer_to_snapshot was refused calls snapshot_entry() again for
    the same snapshot: a second call must not turn into an empty delta relative to the
    snapshot being saved (the changes would be lost)."""
    ctx = _ctx()
    s = KeyedState(context=ctx)
    s["a"], s["b"] = 1, 1
    _save(s, ctx, 1, 0)
    s["a"] = 2
    s.changed("a")
    first = _save(s, ctx, 2, 1)
    assert first[1] == (DELTA, {"a": 2}, (), 1)
    assert _save(s, ctx, 2, 1) is first
    s["b"] = 5
    s.changed("b")
    assert _save(s, ctx, 3, 2)[1] == (DELTA, {"b": 5}, (), 2)


def test_mark_all_makes_the_next_save_full_and_lets_the_marks_go() -> None:
    ctx = _ctx()
    s = KeyedState(context=ctx)
    for k in range(10):
        s[k] = 0
    _save(s, ctx, 1, 0)
    s.dirty.update(range(6))  # type: ignore[union-attr]
    s.mark_all()
    assert s.all_dirty and s.dirty == set()
    s[3] = 7
    save = _save(s, ctx, 2, 1)[1]
    assert save.mode == FULL and save.upserts[3] == 7 and not s.all_dirty
    s[4] = 1
    s.changed(4)
    assert _save(s, ctx, 3, 2)[1] == (DELTA, {4: 1}, (), 2)
