"""The keyed processors keep their state in KeyedState (issue 22): while the job takes
incremental snapshots a save after a committed one holds only the keys changed since,
and a chain of saves merged as the store merges it restores the same state as one full
save. Without incremental snapshots every save is full (their restores are tested by
the processors' own tests through ``verify_processor``).

The processors are driven by hand here (the harness's contexts take no incremental
snapshots): :class:`Driver` feeds items and watermarks, saves snapshot ``sid`` with
``committed`` as the last committed one, and restores merged entries into a new
processor.
"""

from __future__ import annotations

import operator
import os
import pickle
import random
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis.strategies import booleans as st_booleans
from hypothesis.strategies import integers as st_integers
from hypothesis.strategies import just as st_just
from hypothesis.strategies import lists as st_lists
from hypothesis.strategies import one_of as st_one_of
from hypothesis.strategies import tuples as st_tuples

from slipstream import processors as P
from slipstream.aggregate import AggregateOperation, counting, summing, to_list
from slipstream.core.config import ProcessingGuarantee
from slipstream.core.inbox import Inbox
from slipstream.core.item_errors import ItemErrors
from slipstream.core.items import NO_WATERMARK, Watermark
from slipstream.core.outbox import Outbox
from slipstream.core.processor import Context, Processor
from slipstream.pipeline import keyed as pipeline_keyed
from slipstream.pipeline.keyed import map_stateful, rolling_aggregate
from slipstream.processors.sessions import CURRENT_WATERMARK_KEY
from slipstream.processors.windows import NEXT_WIN_TO_EMIT_KEY
from slipstream.state import keyed as keyed_mod
from slipstream.state import live
from slipstream.state.keyed import DELTA, DROP, FULL, KEYED, StateMap, StateMapSave
from slipstream.state.keys import expand_entries
from slipstream.window import KeyedWindowResult, sliding_window_def, tumbling_window_def

Entries = list[tuple[Any, Any]]

#: the size up to which a layered map is diffed by default (state/keyed.py)
DIFF_MAX = keyed_mod.DIFF_MAX


@pytest.fixture(autouse=True)
def _layered_small_maps(monkeypatch: pytest.MonkeyPatch) -> None:
    """The layered maps' tests here use small maps, which are diffed by default
    (``state.keyed.DIFF_MAX``): here they are layered from the start, as a larger map
    is. The diffed maps' own tests (``diffed``) set the default back."""
    monkeypatch.setattr(keyed_mod, "DIFF_MAX", -1)


@pytest.fixture
def diffed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Small layered maps are diffed, as by default."""
    monkeypatch.setattr(keyed_mod, "DIFF_MAX", DIFF_MAX)


class Driver:
    """One processor with an outbox of one ordinal and a context that takes
    incremental snapshots (``incremental=False``: as the engine does today)."""

    def __init__(
        self,
        supplier: Callable[[], Processor],
        incremental: bool = True,
        skip: bool = False,
        state_dir: str | None = None,
    ) -> None:
        self.supplier = supplier
        self.p = supplier()
        self.outbox = Outbox(1, capacity=64)
        self.ctx = Context(vertex_name="v", processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE)
        self.ctx.incremental_snapshots = incremental
        if skip:
            self.ctx.item_errors = ItemErrors(self.ctx, skip=True)
        if state_dir is not None:  # the disk backend
            self.ctx.state_backend = "sqlite"
            self.ctx.state_dir = state_dir
        self.p.init(self.outbox, self.ctx)
        self.output: list[Any] = []

    def _drain(self) -> None:
        self.output.extend(self.outbox.buckets[0])
        self.outbox.buckets[0].clear()

    def feed(self, items: list[Any]) -> Driver:
        inbox = Inbox(items)
        while inbox:
            self.p.process(0, inbox)
            self._drain()
        return self

    def watermark(self, ts: int) -> Driver:
        while not self.p.try_process_watermark(Watermark(ts)):
            self._drain()
        self._drain()
        return self

    def complete(self) -> Driver:
        while not self.p.complete():
            self._drain()
        self._drain()
        return self

    def save(self, sid: int, committed: int | None = None) -> Entries:
        """Snapshot ``sid``'s entries; ``committed`` defaults to ``sid - 1``."""
        self.ctx.current_snapshot_id = sid
        self.ctx.committed_snapshot_id = sid - 1 if committed is None else committed
        out: Entries = []
        while True:
            done = self.p.save_to_snapshot()
            out.extend(self.outbox.snapshot_bucket)
            self.outbox.snapshot_bucket.clear()
            self._drain()
            if done:
                out = [_produced(e) for e in out]
                # the engine hands the snapshot a copy the processor can no longer change
                return pickle.loads(pickle.dumps(out))  # noqa: S301 - our own bytes

    def restored(self, entries: Entries, incremental: bool = True) -> Driver:
        """A new processor restored from ``entries`` (full maps, e.g. :func:`merged`)."""
        d = Driver(self.supplier, incremental)
        inbox = Inbox(expand_entries(entries))
        while inbox:
            d.p.restore_from_snapshot(inbox)
        while not d.p.finish_snapshot_restore():
            pass
        return d


def _produced(entry: tuple[Any, Any]) -> tuple[Any, Any]:
    """``entry`` with a copy-on-write save (``context.live_saves`` set) produced now, as
    the store thread takes it: a map as of the save."""
    k, v = entry
    if type(k) is not StateMap or type(v.upserts) is not live.LiveSave:
        return entry
    v.upserts.finish()
    content, removed = v.upserts.result()
    if isinstance(content, live.EncodedMap):
        content = content.to_dict()
    elif not isinstance(content, dict):  # column batches
        content = dict(zip(*content.pairs(), strict=True))
    return k, StateMapSave(v.mode, content, removed, v.base_id)


def maps(entries: Entries) -> dict[StateMap, StateMapSave]:
    return {k: v for k, v in entries if type(k) is StateMap}


def merged(chain: list[tuple[int, Entries]], strict: bool = True) -> Entries:
    """A processor's chain of saves ``(sid, entries)`` merged as the store does: a save
    with a DELTA or DROP map is a delta (its maps apply to the previous state, maps it
    does not name stay, its other entries replace the previous ones), any other save
    replaces everything. A delta's base must be the previous save, and with ``strict`` a
    removed key or a dropped map must exist (a key inserted and removed between two
    saves is marked, and saved as removed)."""
    state: dict[StateMap, dict[Any, Any]] = {}
    others: Entries = []
    prev = 0
    for sid, entries in chain:
        saves = maps(entries)
        if not any(s.mode in (DELTA, DROP) for s in saves.values()):
            state = {}
        for k, s in saves.items():
            if s.mode == FULL:
                state[k] = dict(s.upserts)
                continue
            assert s.base_id == prev, f"{k}: base {s.base_id}, the chain ends at {prev}"
            if s.mode == DROP:
                del state[k]
            else:
                m = state[k]
                m.update(s.upserts)
                for r in s.removed:
                    if strict or r in m:
                        del m[r]
        others = [(k, v) for k, v in entries if type(k) is not StateMap]
        prev = sid
    return [(k, StateMapSave(FULL, m)) for k, m in state.items()] + others


def full_state(entries: Entries) -> list[tuple[Any, Any]]:
    """What ``entries`` restore, in a comparable order."""
    return sorted(expand_entries(entries), key=repr)


# -- MapStatefulP: rolling_aggregate and map_stateful ---------------------------------


def _marking_count(
    monkeypatch: pytest.MonkeyPatch, keys: int, *, in_steps: bool = False
) -> tuple[Driver, Any]:
    """A rolling count over ``keys`` keys with small enough limits that an interval marks
    (``LAYER_MIN`` 4, ``_MARKS_WORTH_KEEPING`` 4), after its first save committed;
    ``in_steps``: live saves produced a slice of two keys a step. The driver and its map."""
    monkeypatch.setattr(live, "LIVE_SAVE_MIN_KEYS", 3)
    if in_steps:
        monkeypatch.setattr(live, "LIVE_SAVE_SLICE", 2)
        monkeypatch.setattr(live, "LIVE_SAVE_FULL_SLICE", 2)
        monkeypatch.setattr(live, "LIVE_SAVE_STEP_S", 0.0)  # one slice a step
    monkeypatch.setattr(keyed_mod, "LAYER_MIN", 4)
    monkeypatch.setattr(pipeline_keyed, "_MARKS_WORTH_KEEPING", 4)
    d = Driver(rolling_aggregate(operator.itemgetter(0), counting()))
    d.ctx.live_saves = []
    d.feed([(k, 1) for k in range(keys)])
    d.save(1, 0)
    d.ctx.live_saves.clear()
    return d, d.p.states


def _first(x: Any) -> Any:
    return x[0]


def test_rolling_count_second_save_is_a_delta_of_the_changed_keys() -> None:
    d = Driver(rolling_aggregate(_first, counting()))
    d.feed([("a", 1), ("b", 1), ("c", 1)])
    [(key, save)] = d.save(1, 0)
    assert save.mode == FULL and save.upserts == {"a": 1, "b": 1, "c": 1}
    d.feed([("b", 1), ("d", 1), ("b", 1)])
    [(key2, save2)] = d.save(2, 1)
    assert key2 == key
    assert save2 == StateMapSave(DELTA, {"b": 3, "d": 1}, (), 1)
    # nothing changed: an empty delta (the chain must still reach this snapshot)
    assert d.save(3, 2) == [(key, StateMapSave(DELTA, {}, (), 2))]


def test_rolling_sum_fast_path_marks_the_keys_of_the_chunk() -> None:
    d = Driver(rolling_aggregate(_first, summing(lambda x: x[1])))
    d.feed([(k, 1) for k in "abcdef"])
    d.save(1, 0)
    d.feed([("e", 5), ("a", 2)])
    [(_, save)] = d.save(2, 1)
    assert save == StateMapSave(DELTA, {"a": 3, "e": 6}, (), 1)


def test_rolling_aggregate_general_path_marks_every_item() -> None:
    # an op without an additive form (max) takes the per-item loop
    op = AggregateOperation(
        create=lambda: None, accumulate=lambda a, x: x[1] if a is None else max(a, x[1])
    )
    d = Driver(rolling_aggregate(_first, op))
    d.feed([("a", 1), ("b", 5), ("c", 2)])
    d.save(1, 0)
    d.feed([("b", 3), ("c", 9)])
    [(_, save)] = d.save(2, 1)
    assert save == StateMapSave(DELTA, {"b": 5, "c": 9}, (), 1)


def test_map_stateful_marks_a_state_mutated_in_place() -> None:
    def fn(state: list[int], key: Any, item: Any) -> Any:
        state.append(item[1])
        return (key, len(state))

    d = Driver(map_stateful(_first, list, fn))
    d.feed([("a", 1), ("b", 2), ("c", 3)])
    d.save(1, 0)
    d.feed([("a", 4)])
    [(_, save)] = d.save(2, 1)
    assert save == StateMapSave(DELTA, {"a": [1, 4]}, (), 1)


def test_skipped_items_mark_nothing_they_did_not_change() -> None:
    def key(x: Any) -> Any:
        if x == "bad-key":
            raise ValueError("no key")
        return x[0]

    def boom(state: list[int], k: Any, item: Any) -> Any:
        if item[1] < 0:
            raise ValueError("negative")
        state.append(item[1])
        return None

    # counting (the C-level map of the additive path): a bad key leaves no mark
    d = Driver(rolling_aggregate(key, counting()), skip=True)
    d.feed([("a", 1), ("b", 1), ("c", 1)])
    d.save(1, 0)
    d.feed([("a", 1), "bad-key", ("c", 1)])
    assert d.save(2, 1)[0][1] == StateMapSave(DELTA, {"a": 2, "c": 2}, (), 1)
    # summing (the zip path): the items before the bad one are in, the rest follow
    d = Driver(rolling_aggregate(key, summing(lambda x: x[1])), skip=True)
    d.feed([("a", 1), ("b", 1), ("c", 1)])
    d.save(1, 0)
    d.feed([("a", 1), "bad-key", ("b", 1)])
    assert d.save(2, 1)[0][1] == StateMapSave(DELTA, {"a": 2, "b": 2}, (), 1)
    # map_stateful: a new key whose first item fails gets a state (create ran) and is
    # saved; a failing key_fn marks nothing
    d = Driver(map_stateful(key, list, boom), skip=True)
    d.feed([("a", 1), ("b", 1)])
    d.save(1, 0)
    d.feed(["bad-key", ("z", -1), ("b", 2)])
    assert d.save(2, 1)[0][1] == StateMapSave(DELTA, {"z": [], "b": [1, 2]}, (), 1)


def test_without_incremental_snapshots_every_save_is_full_and_nothing_is_tracked() -> None:
    d = Driver(rolling_aggregate(_first, counting()), incremental=False)
    d.feed([("a", 1), ("b", 1)])
    assert type(d.p.states) is dict  # type: ignore[attr-defined]
    d.save(1, 0)
    d.feed([("a", 1)])
    [(_, save)] = d.save(2, 1)
    assert save == StateMapSave(FULL, {"a": 2, "b": 1}, (), 0)


def test_a_save_after_an_uncommitted_one_is_full() -> None:
    d = Driver(rolling_aggregate(_first, counting()))
    d.feed([("a", 1), ("b", 1)])
    d.save(1, 0)
    d.feed([("a", 1)])
    d.save(2, 1)  # snapshot 2 fails: the last committed stays 1
    d.feed([("b", 1)])
    [(_, save)] = d.save(3, 1)
    assert save == StateMapSave(FULL, {"a": 2, "b": 2}, (), 0)


def _rolling_chain_equals_full(supplier: Callable[[], Processor], seed: int) -> None:
    rnd = random.Random(seed)
    keys = [f"k{i}" for i in range(40)]
    inc, full = Driver(supplier), Driver(supplier, incremental=False)
    chain: list[tuple[int, Entries]] = []
    for sid in range(1, 12):
        items = [
            (rnd.choice(keys[: 5 + sid * 3]), rnd.randint(1, 9)) for _ in range(rnd.randint(0, 30))
        ]
        inc.feed(list(items))
        full.feed(list(items))
        chain.append((sid, inc.save(sid)))
        assert full_state(merged(chain)) == full_state(full.save(sid))
    # and the merged chain restores a processor that goes on as the uninterrupted one
    restored = inc.restored(merged(chain))
    more = [(k, 1) for k in keys]
    assert restored.feed(list(more)).output == full.feed(list(more)).output[-len(more) :]


def test_rolling_and_map_stateful_chains_restore_what_full_saves_restore() -> None:
    def fn(state: list[int], key: Any, item: Any) -> Any:
        state[0] += item[1]
        return (key, state[0])

    for seed in range(5):
        _rolling_chain_equals_full(rolling_aggregate(_first, counting()), seed)
        _rolling_chain_equals_full(rolling_aggregate(_first, summing(lambda x: x[1])), seed)
        _rolling_chain_equals_full(map_stateful(_first, lambda: [0], fn), seed)


# -- GroupByKeyP: aggregate_by_key, accumulate_by_key, combine_by_key ------------------


def _second_save(supplier: Callable[[], Processor], first: list[Any], second: list[Any]) -> Any:
    d = Driver(supplier)
    d.feed(first)
    [(_, save)] = d.save(1, 0)
    assert save.mode == FULL
    d.feed(second)
    [(_, save)] = d.save(2, 1)
    return save


def test_group_by_key_saves_the_changed_keys() -> None:
    words = ["a", "b", "c", "a"]
    # counting by identity, by a key function (C-speed paths), summing (per item)
    assert _second_save(P.aggregate_by_key(lambda w: w, counting()), words, ["b", "d"]) == (
        StateMapSave(DELTA, {"b": 2, "d": 1}, (), 1)
    )
    assert _second_save(P.aggregate_by_key(str.upper, counting()), words, ["b"]) == (
        StateMapSave(DELTA, {"B": 2}, (), 1)
    )
    op = summing(lambda x: x[1])
    assert _second_save(P.aggregate_by_key(_first, op), [("a", 1), ("b", 2)], [("a", 5)]) == (
        StateMapSave(DELTA, {"a": 6}, (), 1)
    )
    # a mutable accumulator changed in place
    assert _second_save(
        P.accumulate_by_key(_first, to_list()), [("a", 1), ("b", 2)], [("b", 3)]
    ) == (StateMapSave(DELTA, {"b": [("b", 2), ("b", 3)]}, (), 1))
    # combining (key, acc) pairs
    assert _second_save(P.combine_by_key(counting()), [("a", 1), ("b", 2)], [("a", 3)]) == (
        StateMapSave(DELTA, {"a": 4}, (), 1)
    )


def test_group_by_key_counting_skips_a_bad_key_and_marks_the_others() -> None:
    def key(w: str) -> str:
        if w == "bad":
            raise ValueError(w)
        return w

    d = Driver(P.aggregate_by_key(key, counting()), skip=True)
    d.feed(["a", "b", "c"])
    d.save(1, 0)
    d.feed(["a", "bad", "c", "c"])
    assert d.save(2, 1)[0][1] == StateMapSave(DELTA, {"a": 2, "c": 3}, (), 1)


def test_group_by_key_emission_removes_the_emitted_keys_at_the_next_save() -> None:
    d = Driver(P.aggregate_by_key(lambda w: w, counting()))
    d.outbox.capacity = 2  # emits two results per complete() call
    keys = [f"k{i}" for i in range(7)]
    d.feed(keys)
    first = d.save(1, 0)
    assert d.p.complete() is False
    assert d.outbox.buckets[0] == [("k0", 1), ("k1", 1)]
    d._drain()
    second = d.save(2, 1)
    [(_, save)] = second
    assert save == StateMapSave(DELTA, {}, save.removed, 1)
    assert sorted(save.removed) == ["k0", "k1"]
    # restored from the chain, the rest is emitted
    rest = d.restored(merged([(1, first), (2, second)]))
    assert sorted(rest.complete().output) == [(k, 1) for k in keys[2:]]
    # two more, then a save: a delta again; at the end every key is gone (a save with
    # more keys changed than the map holds is full: here, empty)
    assert d.p.complete() is False
    d._drain()
    third = d.save(3, 2)
    assert sorted(third[0][1].removed) == ["k2", "k3"]
    d.complete()
    assert d.save(4, 3)[0][1] == StateMapSave(FULL, {}, (), 0)
    assert sorted(d.output) == [(k, 1) for k in keys]


def test_group_by_key_chains_restore_what_full_saves_restore() -> None:
    rnd = random.Random(7)
    for supplier in (
        P.aggregate_by_key(lambda w: w, counting()),
        P.aggregate_by_key(_first, summing(lambda x: x[1])),
        P.accumulate_by_key(_first, to_list()),
    ):
        inc, full = Driver(supplier), Driver(supplier, incremental=False)
        chain: list[tuple[int, Entries]] = []
        for sid in range(1, 9):
            items = [(f"k{rnd.randint(0, 5 + 3 * sid)}", sid) for _ in range(rnd.randint(0, 20))]
            inc.feed(list(items))
            full.feed(list(items))
            chain.append((sid, inc.save(sid)))
            assert full_state(merged(chain)) == full_state(full.save(sid))
        restored = inc.restored(merged(chain))
        assert sorted(restored.complete().output) == sorted(full.complete().output)


def test_rolling_count_marks_new_keys_when_every_old_key_is_marked() -> None:
    # every key marked: the fast path skips marking, but not for a chunk with a new key
    d = Driver(rolling_aggregate(_first, counting()))
    d.feed([(k, 1) for k in "abcdefgh"])
    d.save(1, 0)
    d.feed([(k, 1) for k in "abcdefgh"])  # all marked
    d.feed([("a", 1), ("z", 1)])  # one new key
    d.feed([("b", 1)])
    [(_, save)] = d.save(2, 1)
    assert save.mode == FULL  # every key changed
    assert save.upserts == {**{k: 2 for k in "cdefgh"}, "a": 3, "b": 3, "z": 1}
    d.feed([("c", 1)])
    assert d.save(3, 2)[0][1] == StateMapSave(DELTA, {"c": 3}, (), 2)


# -- window frames: aggregate_to_sliding_window, combine_to_sliding_window -------------


def _window(op: Any, size: int = 10, slide: int | None = None, key: Any = None) -> Any:
    wd = tumbling_window_def(size) if slide is None else sliding_window_def(size, slide)
    return P.aggregate_to_sliding_window(
        key_fn=key or operator.itemgetter(1),
        timestamp_fn=operator.itemgetter(0),
        window_def=wd,
        agg_op=op,
    )


def _frames(entries: Entries) -> dict[Any, StateMapSave]:
    out = {}
    for k, v in entries:
        if type(k) is StateMap:
            assert k.tag == KEYED
            out[k.detail] = v
    return out


def test_window_frames_save_changed_keys_and_drop_evicted_frames() -> None:
    for op in (counting(), summing(operator.itemgetter(2)), to_list()):
        d = Driver(_window(op))
        d.feed([(1, "a", 1), (2, "b", 1), (11, "a", 1)])  # frames 10 and 20
        first = d.save(1, 0)
        assert {f: s.mode for f, s in _frames(first).items()} == {10: FULL, 20: FULL}
        assert (NEXT_WIN_TO_EMIT_KEY, NO_WATERMARK) in first
        d.feed([(12, "b", 5), (13, "b", 1)])
        second = _frames(d.save(2, 1))
        assert second[10] == StateMapSave(DELTA, {}, (), 1)
        assert second[20].mode == DELTA and list(second[20].upserts) == ["b"]
        assert second[20].base_id == 1
        d.watermark(10)  # emits window 10: frame 10 is evicted
        third = d.save(3, 2)
        assert _frames(third) == {
            10: StateMapSave(DROP, {}, (), 2),
            20: StateMapSave(DELTA, {}, (), 2),
        }
        assert (NEXT_WIN_TO_EMIT_KEY, 20) in third
        d.watermark(20)
        assert _frames(d.save(4, 3)) == {20: StateMapSave(DROP, {}, (), 3)}


def test_window_frame_dropped_after_an_uncommitted_save_is_left_out() -> None:
    d = Driver(_window(counting()))
    d.feed([(1, "a", 1), (11, "a", 1)])
    d.save(1, 0)
    d.save(2, 1)  # fails: the last committed stays 1
    d.watermark(10)
    third = d.save(3, 1)
    assert _frames(third) == {20: StateMapSave(FULL, {"a": 1}, (), 0)}  # no drop of 10


def test_window_paths_mark_only_what_they_changed() -> None:
    # a sliding window with deduct (summing), the itemgetter-sum path, a skipped item
    def key(e: Any) -> Any:
        if e[1] == "bad":
            raise ValueError("bad key")
        return e[1]

    d = Driver(_window(summing(operator.itemgetter(2)), 20, 10, key), skip=True)
    d.feed([(1, "a", 1), (2, "b", 1), (11, "c", 1)])
    d.save(1, 0)
    d.feed([(3, "a", 1), (4, "bad", 1), (12, "c", 2), (1, "new", 1)])
    frames = _frames(d.save(2, 1))
    assert frames[10].upserts == {"a": 2, "new": 1} and frames[10].removed == ()
    assert frames[20].upserts == {"c": 3} and frames[20].removed == ()
    # late items change nothing
    d.watermark(10).feed([(5, "a", 1)])
    assert _frames(d.save(3, 2))[10] == StateMapSave(DELTA, {}, (), 2)
    # the itemgetter paths of the loops without tracking give the same windows
    items = [(i, f"k{i % 7}", i) for i in range(60)]
    inc = Driver(_window(summing(operator.itemgetter(2)), 20, 10)).feed(list(items))
    full = Driver(_window(summing(operator.itemgetter(2)), 20, 10), incremental=False)
    full.feed(list(items))
    assert inc.watermark(100).output == full.watermark(100).output


def test_window_stage_two_marks_the_combined_keys() -> None:
    wd = tumbling_window_def(10)
    d = Driver(P.combine_to_sliding_window(window_def=wd, agg_op=counting()))
    d.feed([KeyedWindowResult(0, 10, "a", 2), KeyedWindowResult(0, 10, "b", 1)])
    d.save(1, 0)
    d.feed([KeyedWindowResult(0, 10, "b", 3), KeyedWindowResult(10, 20, "c", 1)])
    frames = _frames(d.save(2, 1))
    assert frames[10] == StateMapSave(DELTA, {"b": 4}, (), 1)
    assert frames[20] == StateMapSave(FULL, {"c": 1}, (), 0)  # a new frame


def _random_events(rnd: random.Random, n: int, t0: int) -> list[tuple[int, str, int]]:
    return [(t0 + rnd.randint(0, 25), f"k{rnd.randint(0, 9)}", rnd.randint(1, 5)) for _ in range(n)]


def _chain_equals_full(supplier: Callable[[], Processor], seed: int, lag: int = 5) -> None:
    """Events with watermarks at random; a save after every step. The merged chain of
    incremental saves restores what the full save restores, and a processor restored
    from it emits what the uninterrupted one emits."""
    rnd = random.Random(seed)
    inc, full = Driver(supplier), Driver(supplier, incremental=False)
    chain: list[tuple[int, Entries]] = []
    t = 0
    for sid in range(1, 15):
        events = sorted(_random_events(rnd, rnd.randint(0, 15), t))
        inc.feed(list(events))
        full.feed(list(events))
        if rnd.random() < 0.5:
            t += rnd.randint(0, 15)
            inc.watermark(t - lag)
            full.watermark(t - lag)
        committed = sid - 1 if rnd.random() < 0.8 else max(0, sid - 2)  # some fail
        if committed < sid - 1:
            chain = [c for c in chain if c[0] <= committed]
        chain.append((sid, inc.save(sid, committed)))
        assert full_state(merged(chain)) == full_state(full.save(sid, committed))
    assert inc.output == full.output
    restored = inc.restored(merged(chain))
    more = sorted(_random_events(rnd, 30, t))
    restored.feed(list(more)).watermark(t + 100)
    n = len(full.output)
    expected = full.feed(list(more)).watermark(t + 100).output[n:]
    # the same results (the order of a window's keys follows the merged maps' order)
    assert sorted(map(repr, restored.output)) == sorted(map(repr, expected))


def test_window_chains_restore_what_full_saves_restore() -> None:
    for seed in range(6):
        _chain_equals_full(_window(counting()), seed)
        _chain_equals_full(_window(to_list(), 20, 5), seed)
        _chain_equals_full(_window(summing(operator.itemgetter(2)), 15, 5), seed)


# -- session windows ---------------------------------------------------------------------


def _sessions(op: Any) -> Any:
    return P.aggregate_to_session_window(
        session_timeout=5,
        key_fn=operator.itemgetter(1),
        timestamp_fn=operator.itemgetter(0),
        agg_op=op,
    )


def test_sessions_save_changed_and_emitted_keys() -> None:
    d = Driver(_sessions(summing(operator.itemgetter(2))))
    d.feed([(0, "a", 1), (1, "b", 1), (2, "c", 1), (20, "c", 1), (30, "d", 1), (30, "e", 1)])
    [(key, save), wm] = d.save(1, 0)
    assert key == StateMap(KEYED, None) and save.mode == FULL and len(save.upserts) == 5
    assert wm == (CURRENT_WATERMARK_KEY, NO_WATERMARK)
    d.feed([(3, "a", 2)])
    d.watermark(8)  # [1, 6) and [2, 7) end: b leaves, c keeps [20, 25), a is [0, 8)
    [(_, save), wm] = d.save(2, 1)
    assert save == StateMapSave(DELTA, {"a": [[0, 8, 3]], "c": [[20, 25, 1]]}, ("b",), 1)
    assert wm == (CURRENT_WATERMARK_KEY, 8)
    restored = d.restored(merged([(3, d.save(3, 0)), (4, d.save(4, 3))]))
    n = len(d.output)
    assert sorted(map(repr, restored.complete().output)) == sorted(
        map(repr, d.complete().output[n:])
    )


def test_session_chains_restore_what_full_saves_restore() -> None:
    for seed in range(6):
        _chain_equals_full(_sessions(counting()), seed)
        _chain_equals_full(_sessions(to_list()), seed, lag=0)


def test_window_frames_on_disk_are_closed_when_evicted(tmp_path: Any) -> None:
    d = Driver(_window(counting()), state_dir=str(tmp_path))
    d.feed([(1, "a", 1), (11, "a", 1)])
    frames = dict(d.p._frames)  # type: ignore[attr-defined]
    assert {type(f).__name__ for f in frames.values()} == {"DiskKeyedState"}
    d.save(1, 0)
    d.watermark(10)  # frame 10 evicted: its files go
    assert not os.path.exists(frames[10].directory) and os.path.exists(frames[20].directory)
    assert _frames(d.save(2, 1)) == {
        10: StateMapSave(DROP, {}, (), 1),
        20: StateMapSave(DELTA, {}, (), 1),
    }
    assert d.watermark(20).output[-2:] == [KeyedWindowResult(10, 20, "a", 1), Watermark(20)]


def test_rolling_additive_with_a_finish_marks_a_key_whose_finish_raised() -> None:
    def finish(acc: int) -> int:
        if acc == 3:
            raise ValueError("three")
        return acc * 10

    op = AggregateOperation(create=lambda: 0, accumulate=lambda a, x: a + 1, finish=finish)
    op.additive = 1  # the per-item loop of the additive path (finish is not the identity)
    d = Driver(rolling_aggregate(_first, op), skip=True)
    d.feed([("a", 1), ("a", 1), ("b", 1), ("c", 1)])
    d.save(1, 0)
    d.feed([("a", 1), ("b", 1)])  # a's count becomes 3: finish raises, the item is skipped
    assert d.save(2, 1)[0][1] == StateMapSave(DELTA, {"a": 3, "b": 2}, (), 1)
    assert d.output == [("a", 10), ("a", 20), ("b", 10), ("c", 10), ("b", 20)]


def test_a_large_map_whose_keys_nearly_all_changed_stops_marking_and_saves_full() -> None:
    """The uniform pattern: once more than half of a large map's keys are marked, the
    marks are let go (the set would grow as large as the map) and the next save is full;
    the save after that is a delta again."""
    n = 10_000
    d = Driver(rolling_aggregate(operator.itemgetter(0), counting()))
    d.feed([(k, 1) for k in range(n)])
    d.save(1, 0)
    d.feed([(k, 1) for k in range(0, n, 2)] + [(1, 1)] * 10)  # half, then one more key
    st = d.p.states
    assert st.all_dirty and len(st.dirty) < 100
    save = d.save(2, 1)[0][1]
    assert save.mode == FULL and save.upserts[0] == 2 and save.upserts[1] == 11
    d.feed([(5, 1)])
    assert d.save(3, 2)[0][1] == StateMapSave(DELTA, {5: 2}, (), 2)


def test_marks_go_once_more_than_a_quarter_of_a_large_map_changed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The set of marks is let go at a quarter of the keys (it holds ~40 bytes a key at
    its largest: at half the keys it was the largest part of exactly-once's memory in the
    uniform pattern); a fifth of the keys stays a delta. (Smaller limits than the real
    ones, 4,096 marks and a layer of 4,096 keys at least, keep the map small.)"""
    monkeypatch.setattr(pipeline_keyed, "_MARKS_WORTH_KEEPING", 100)
    monkeypatch.setattr(keyed_mod, "LAYER_MIN", 100)
    n = 8_000
    d = Driver(rolling_aggregate(operator.itemgetter(0), counting()))
    d.feed([(k, 1) for k in range(n)])
    d.save(1, 0)
    d.feed([(k, 1) for k in range(0, n, 5)])  # a fifth
    st = d.p.states
    assert not st.all_dirty and len(st.dirty) == n // 5
    assert d.save(2, 1)[0][1].mode == DELTA
    d.feed([(k, 1) for k in range(0, n, 3)])  # a third
    assert st.all_dirty
    assert d.save(3, 2)[0][1].mode == FULL


# -- the write layer: the changed keys' values are written, not marked ----------------


def test_a_rolling_count_writes_few_changes_into_a_layer_that_is_the_next_delta() -> None:
    """The skewed pattern: once a save changed few keys, the next interval writes each
    new value into ``states.layer`` (no mark, the map untouched) and the save hands that
    dict over as the delta; the map then holds the values and a new layer starts."""
    d = Driver(rolling_aggregate(operator.itemgetter(0), counting()))
    d.feed([(k, 1) for k in range(100)])
    assert d.save(1, 0)[0][1].mode == FULL
    st = d.p.states
    assert st.layered and st.layer == {}
    d.feed([(3, 1), (7, 1), (3, 1), (200, 1)])  # 200: a new key, the map's tail
    assert st.layer == {3: 3, 7: 2} and not st.dirty
    assert dict.get(st, 3) == 1 and dict.get(st, 200) == 1  # 3 is written at the save
    assert d.output[-4:] == [(3, 2), (7, 2), (3, 3), (200, 1)]
    assert d.save(2, 1)[0][1] == StateMapSave(DELTA, {200: 1, 3: 3, 7: 2}, (), 1)
    assert st.layer == {} and st[3] == 3 and st[200] == 1 and len(st) == 101
    d.feed([(3, 1)])
    assert d.save(3, 2)[0][1] == StateMapSave(DELTA, {3: 4}, (), 2)
    # a save after an uncommitted one is full, and holds the layer's values
    d.feed([(7, 1)])
    full = d.save(4, 2)[0][1]
    assert full.mode == FULL and full.upserts[7] == 3 and full.upserts[3] == 4


@pytest.mark.usefixtures("diffed")
@pytest.mark.parametrize("op", [counting(), summing(operator.itemgetter(1))])
def test_a_small_rolling_aggregate_marks_nothing_and_its_save_compares(op: Any) -> None:
    """A small map (at most DIFF_MAX keys) is updated as a plain dict, with no layer and
    no mark; its save compares it with the previous save's copy: a delta holds exactly
    the keys whose value changed (and new keys), a save after an uncommitted one or
    with every key changed is full, and the chain restores the map."""
    d = Driver(rolling_aggregate(operator.itemgetter(0), op))
    st = d.p.states
    assert st.diff_base == {} and st.layer is None
    d.feed([(k, 1) for k in range(100)])
    chain = [(1, d.save(1, 0))]
    assert chain[0][1][0][1] == StateMapSave(FULL, {k: 1 for k in range(100)})
    d.feed([(3, 1), (7, 1), (3, 1), (200, 1)])  # 200: new
    assert st.layer is None and not st.dirty and st.diff_base == {k: 1 for k in range(100)}
    assert d.output[-4:] == [(3, 2), (7, 2), (3, 3), (200, 1)]
    chain.append((2, d.save(2, 1)))
    assert chain[-1][1][0][1] == StateMapSave(DELTA, {3: 3, 7: 2, 200: 1}, (), 1)
    chain.append((3, d.save(3, 2)))  # nothing changed: an empty delta
    assert chain[-1][1][0][1] == StateMapSave(DELTA, {}, (), 2)
    d.feed([(7, 1)])
    chain.append((4, d.save(4, 3)))
    assert chain[-1][1][0][1] == StateMapSave(DELTA, {7: 3}, (), 3)
    want = {k: 1 for k in range(100)} | {3: 3, 7: 3, 200: 1}
    assert full_state(merged(chain)) == full_state([(StateMap("e"), StateMapSave(FULL, want))])
    d.feed([(7, 1)])
    full = d.save(5, 3)[0][1]  # after an uncommitted save (4): full
    assert full.mode == FULL and full.upserts == want | {7: 4}
    d.feed([(k, 1) for k in list(range(100)) + [200]])  # every key changed: full
    assert d.save(6, 5)[0][1].mode == FULL


@pytest.mark.usefixtures("diffed")
def test_a_diffed_map_that_grows_past_diff_max_is_layered_with_its_changes_so_far(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Once a diffed map holds more than DIFF_MAX keys (checked once a chunk) it leaves
    the mode: the keys changed since the last save, before it grew too, are the first
    layer, and the next save's delta holds them with the keys inserted since."""
    monkeypatch.setattr(keyed_mod, "DIFF_MAX", 20)
    d = Driver(rolling_aggregate(operator.itemgetter(0), counting()))
    st = d.p.states
    d.feed([(k, 1) for k in range(10)])
    chain = [(1, d.save(1, 0))]
    d.feed([(3, 1)])
    d.feed([(k, 1) for k in range(10, 30)])  # 30 keys (one chunk: the next one checks)
    assert st.diff_base is not None
    d.feed([(5, 1), (31, 1)])
    assert st.diff_base is None and st.layer == {3: 2, **{k: 1 for k in range(10, 30)}, 5: 2}
    chain.append((2, d.save(2, 1)))
    assert chain[-1][1][0][1] == StateMapSave(
        DELTA, {3: 2, 5: 2, 31: 1, **{k: 1 for k in range(10, 30)}}, (), 1
    )
    assert st.layer == {}  # layered from here
    d.feed([(5, 1)])
    chain.append((3, d.save(3, 2)))
    assert chain[-1][1][0][1] == StateMapSave(DELTA, {5: 3}, (), 2)
    want = {k: 1 for k in range(32) if k != 30} | {3: 2, 5: 3}
    assert full_state(merged(chain)) == full_state([(StateMap("e"), StateMapSave(FULL, want))])


@pytest.mark.usefixtures("diffed")
def test_a_diffed_map_saves_a_removed_key_as_removed() -> None:
    """A key removed from a diffed map (the rolling processors remove none; a custom
    processor's layered map might) is in the next delta's removed keys."""
    d = Driver(rolling_aggregate(operator.itemgetter(0), counting()))
    st = d.p.states
    d.feed([(k, 1) for k in range(5)])
    d.save(1, 0)
    dict.__delitem__(st, 2)
    d.feed([(4, 1)])
    assert d.save(2, 1)[0][1] == StateMapSave(DELTA, {4: 2}, (2,), 1)


@pytest.mark.usefixtures("diffed")
def test_a_diffed_map_restored_from_its_own_chain_saves_only_what_changed_since() -> None:
    """Restored from exactly its own chain (keyed.continue_restored_chain), a diffed map
    compares its first save with what it restored: a delta of the keys changed since."""
    d = Driver(rolling_aggregate(operator.itemgetter(0), counting()))
    d.feed([(k, 1) for k in range(50)])
    entries = d.save(1, 0)
    r = d.restored(merged([(1, entries)]))
    r.ctx.restored_snapshot_id = 1
    r.ctx._restored_maps = {("e", None): 50}
    r.ctx._restored_states = [r.p.states]
    assert keyed_mod.continue_restored_chain(r.ctx)
    assert r.p.states.diff_base == {k: 1 for k in range(50)}
    r.feed([(9, 1)])
    assert r.save(2, 1)[0][1] == StateMapSave(DELTA, {9: 2}, (), 1)


def test_a_count_into_an_empty_layer_leaves_the_map_and_layer_the_layered_loop_would() -> None:
    """While its layer is empty a rolling count writes a chunk straight into the map (as
    with no guarantee); when the map grew by fewer keys than the chunk had items, the map
    and the layer become what the layered loop makes of the chunk: the layer holds each
    item but the first of a key the chunk inserted, the map the values before those."""
    d = Driver(rolling_aggregate(operator.itemgetter(0), counting()), skip=True)
    d.feed([(k, 1) for k in range(10)])
    assert d.save(1, 0)[0][1].mode == FULL
    st = d.p.states
    d.feed([(20, 1)])  # new: the map's tail; the layer stays empty
    assert st.layer == {} and dict.get(st, 20) == 1
    # 3: held before the save; 20: the tail; 30: new, met twice; 5 fails; 31: new
    d.feed([(3, 1), (20, 1), (30, 1), (3, 1), 5, (30, 1), (31, 1)])
    assert d.output[-6:] == [(3, 2), (20, 2), (30, 1), (3, 3), (30, 2), (31, 1)]
    assert st.layer == {3: 3, 20: 2, 30: 2} and not st.dirty
    assert [dict.get(st, k) for k in (3, 20, 30, 31)] == [1, 1, 1, 1] and len(st) == 13
    assert d.save(2, 1)[0][1] == StateMapSave(DELTA, {3: 3, 20: 2, 30: 2, 31: 1}, (), 1)


def test_a_large_layer_goes_into_the_map_in_steps_and_reads_see_it_meanwhile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A layer of LIVE_SAVE_MIN_KEYS keys or more is written into the map in slices by the
    tasklet's steps (``context.live_saves``); until then the loop reads it as
    ``states.frozen`` (after the new layer, before the map), and a save writes the rest
    first."""
    monkeypatch.setattr(live, "LIVE_SAVE_MIN_KEYS", 3)
    monkeypatch.setattr(live, "LIVE_SAVE_SLICE", 2)
    monkeypatch.setattr(live, "LIVE_SAVE_STEP_S", 0.0)  # one slice a step
    d = Driver(rolling_aggregate(operator.itemgetter(0), summing(operator.itemgetter(1))))
    d.ctx.live_saves = []
    d.feed([(k, 1) for k in range(50)])
    d.save(1, 0)  # full, copy-on-write: produced by the Driver
    d.ctx.live_saves.clear()
    st = d.p.states
    assert st.layer == {}
    d.feed([(k, 10) for k in range(10)])
    assert d.save(2, 1)[0][1] == StateMapSave(DELTA, {k: 11 for k in range(10)}, (), 1)
    [merge] = d.ctx.live_saves
    assert st.frozen == {k: 11 for k in range(10)} and dict.get(st, 0) == 1
    assert not merge.step(1 << 30)  # one slice: keys 0 and 1
    assert dict.get(st, 1) == 11 and dict.get(st, 2) == 1
    d.feed([(5, 100), (0, 100), (60, 7)])  # 5 is in frozen only, 0 in both, 60 new
    assert st.layer == {5: 111, 0: 111} and dict.get(st, 60) == 7
    while not merge.step(1 << 30):
        pass
    assert st.frozen == {} and dict.get(st, 9) == 11 and dict.get(st, 5) == 11
    d.feed([(9, 1)])
    # another large layer whose merge the next save finishes first
    assert d.save(3, 2)[0][1] == StateMapSave(DELTA, {5: 111, 0: 111, 60: 7, 9: 12}, (), 2)
    d.feed([(5, 1)])
    assert d.save(4, 3)[0][1] == StateMapSave(DELTA, {5: 112}, (), 3)
    assert dict.get(st, 60) == 7 and dict.get(st, 0) == 111 and st.frozen == {}


def test_a_layer_past_its_limit_goes_into_the_map_and_the_interval_marks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The uniform pattern: once the layer holds more than the map's layer_limit() keys,
    it is written into the map and its keys marked; the interval marks from then on (and
    lets the marks go past a quarter of the keys), and the next one writes a layer only
    if this one changed few keys."""
    monkeypatch.setattr(keyed_mod, "LAYER_MIN", 10)
    monkeypatch.setattr(pipeline_keyed, "_MARKS_WORTH_KEEPING", 10)
    n = 1600  # limit: 100 keys
    d = Driver(rolling_aggregate(operator.itemgetter(0), counting()))
    d.feed([(k, 1) for k in range(n)])
    d.save(1, 0)
    st = d.p.states
    assert st.layer == {}  # every key was new (none changed): the next one is layered
    d.feed([(5, 1)])
    assert d.save(2, 1)[0][1] == StateMapSave(DELTA, {5: 2}, (), 1)
    assert st.layer == {} and st.layer_limit() == 100
    d.feed([(k, 1) for k in range(0, 240)])  # 240 keys: past the limit
    assert st.layer is None and len(st.dirty) == 240 and not st.all_dirty
    assert st[0] == 2 and st[5] == 3 and st[239] == 2 and st[240] == 1
    save = d.save(3, 2)[0][1]
    assert save.mode == DELTA and save.upserts == {k: 3 if k == 5 else 2 for k in range(240)}
    assert st.layer is None  # 240 changed: the next interval marks
    d.feed([(k, 1) for k in range(0, n, 4)] + [(1, 1)])  # a quarter and one more
    assert st.all_dirty and st.layer is None
    assert d.save(4, 3)[0][1].mode == FULL
    assert st.layer is None
    d.feed([(7, 1)])
    assert d.save(5, 4)[0][1] == StateMapSave(DELTA, {7: 3}, (), 4)
    assert st.layer == {}  # one key changed: the next interval writes a layer


@pytest.mark.parametrize("forks", [False, True])
def test_a_layered_maps_marks_carry_their_values_and_its_delta_holds_the_barriers_values(
    monkeypatch: pytest.MonkeyPatch, forks: bool
) -> None:
    """A layered map in an interval that marks (the uniform pattern) marks each changed
    key with its new value, encoded at once (``mark_parts``: pickle fragments, no set,
    where a set's table took 28-56 bytes a key and its key ~32) and, where its full
    save would not be forked (``live.fork_expected``), goes on marking past a quarter
    of its keys up to half of them. The delta is those fragments: complete at the
    barrier, it reads nothing of the map, so the next interval marks straight into the
    map (no layer beside it; on the main before it, sealed lists of keys were looked up
    in the map in steps after the barrier, the map held still by an interim layer). It
    holds every marked key with its value at the barrier; a key marked twice is saved
    twice, its later value last. Where a full save would be forked, the marks go at a
    quarter, as before."""
    monkeypatch.setattr(live, "LIVE_SAVE_MIN_KEYS", 3)
    monkeypatch.setattr(live, "LIVE_SAVE_SLICE", 4)
    monkeypatch.setattr(live, "LIVE_SAVE_STEP_S", 0.0)  # one slice a step
    monkeypatch.setattr(live, "fork_expected", lambda keys: forks)
    monkeypatch.setattr(keyed_mod, "LAYER_MIN", 10)
    monkeypatch.setattr(keyed_mod, "MARKS_SEAL", 50)
    monkeypatch.setattr(pipeline_keyed, "_MARKS_WORTH_KEEPING", 10)
    n = 1600  # layer limit: 100 keys; a quarter 400, half 800
    d = Driver(rolling_aggregate(operator.itemgetter(0), counting()))
    d.ctx.live_saves = []
    d.feed([(k, 1) for k in range(n)])
    d.save(1, 0)  # full, produced by the Driver
    d.ctx.live_saves.clear()
    st = d.p.states
    d.feed([(k, 1) for k in range(240)])  # past the layer's limit: the interval marks
    d.save(2, 1)
    d.ctx.live_saves.clear()
    # 500 marks (keys 0..399 twice for 300..399): past a quarter, under half
    d.feed([(k, 1) for k in range(400)] + [(k, 1) for k in range(300, 400)])
    if forks:
        assert st.all_dirty
        assert d.save(3, 2)[0][1].mode == FULL
        return
    assert st.layer is None and not st.all_dirty
    assert not st.sealed and not st.dirty and st.marked() == 500 and st.mark_count == 500
    marks = live.EncodedMap(st.mark_parts, st.mark_count)
    assert marks.to_dict() == {k: st[k] for k in range(400)}
    at_barrier = dict(st)
    d.ctx.current_snapshot_id, d.ctx.committed_snapshot_id = 3, 2
    _key, save = st.snapshot_entry()
    assert save.mode == DELTA and type(save.upserts) is live.LiveSave
    assert save.upserts.done and d.ctx.live_saves == []  # nothing to produce in steps
    fed = [(k, 1) for k in range(0, n, 7)] + [(n + 1, 1)]  # the next interval
    d.feed(fed)
    assert st.layer is None and st._merge is None  # marked into the map meanwhile
    assert live.EncodedMap(st.mark_parts, st.mark_count).to_dict() == {
        k: at_barrier.get(k, 0) + 1 for k, _ in fed
    }
    assert d.output[-len(fed) :] == [(k, at_barrier.get(k, 0) + 1) for k, _ in fed]
    content, removed = save.upserts.result()
    assert removed == () and content.to_dict() == {k: at_barrier[k] for k in range(400)}
    assert len(content) == 500  # keys 300..399 twice, the later value last
    d.feed([(8, 1)])
    assert d.save(4, 3)[0][1].upserts[8] == at_barrier[8] + 1


def test_rolling_sums_through_the_layer_restore_what_full_saves_restore(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Random bursts over few or many keys, saves that commit or not, the layer's merge
    stepped or not, copy-on-write full saves or copies: every output is the running
    sum, and the chain merged as the store merges it restores exactly the oracle's
    sums at every committed save."""
    op = summing(operator.itemgetter(1))
    seen: set[str] = set()
    for seed in range(8):
        rng = random.Random(seed)
        small = seed % 4 < 2
        monkeypatch.setattr(live, "LIVE_SAVE_MIN_KEYS", 3 if small else 20_000)
        monkeypatch.setattr(live, "LIVE_SAVE_SLICE", 2 if small else 1024)
        monkeypatch.setattr(keyed_mod, "LAYER_MIN", 20 if seed % 2 else 4096)
        monkeypatch.setattr(pipeline_keyed, "_MARKS_WORTH_KEEPING", 10)
        monkeypatch.setattr(keyed_mod, "LAYER_KEEP_MIN", 3 if seed % 3 == 0 else 20_000)
        d = Driver(rolling_aggregate(operator.itemgetter(0), op))
        d.ctx.live_saves = [] if seed % 4 != 3 else None
        st = d.p.states
        oracle: dict[int, int] = {}
        chain: list[tuple[int, Entries]] = []
        committed = 0
        for sid in range(1, 25):
            keys = rng.choice([5, 50, 400])
            items = [(rng.randrange(keys), rng.randrange(-3, 9)) for _ in range(rng.randrange(300))]
            for _ in range(rng.randrange(3)):
                d.feed(items[: len(items) // 2])
                saves = d.ctx.live_saves
                if saves and saves[0].step(rng.choice([1, 3, 1 << 30])):
                    saves.pop(0)
                d.feed(items[len(items) // 2 :])
                for k, v in items:
                    oracle[k] = oracle.get(k, 0) + v
                assert d.output[len(d.output) - len(items) :] == _running(oracle, items)
            seen.add("layer" if st.layer is not None else "marks")
            seen.add("frozen" if st.frozen else "")
            seen.add("retained" if st.frozen and st._merge is None else "")
            entries = d.save(sid, committed)
            seen.add(entries[0][1].mode)
            if rng.random() < 0.8:  # it commits before the next save
                if entries[0][1].mode == FULL:
                    chain = []
                chain.append((sid, entries))
                committed = sid
                assert dict(full_state(merged(chain))) == oracle, (seed, sid)
            # else it never commits: the next save is full (merged() checks the bases)
    assert seen >= {"layer", "marks", "frozen", "retained", FULL, DELTA}


def _running(oracle: dict[int, int], items: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The outputs of ``items``, given the sums ``oracle`` after them."""
    after = dict(oracle)
    out = []
    for k, v in reversed(items):
        out.append((k, after[k]))
        after[k] -= v
    return out[::-1]


# -- the map's tail: keys inserted since the last save are the next delta's -----------


def test_a_creation_pass_inserts_its_keys_into_the_map_and_the_delta_takes_the_tail(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The skewed pattern's creation pass: from the start a rolling count writes the
    changes of existing keys into the layer and inserts new keys into the map, unmarked
    (they are its tail in insertion order); however many keys it creates the layer does
    not overflow, and the next save's delta is exactly the new keys and the layer's."""
    monkeypatch.setattr(keyed_mod, "LAYER_MIN", 10)
    d = Driver(rolling_aggregate(operator.itemgetter(0), counting()))
    st = d.p.states
    assert st.layer == {}  # before the first save already
    d.feed([(k, 1) for k in range(100)] + [(5, 1)])
    assert st.layer == {5: 2} and not st.dirty and dict.__len__(st) == 100
    assert d.save(1, 0)[0][1] == StateMapSave(FULL, {k: 2 if k == 5 else 1 for k in range(100)})
    # 500 new keys (the layer's limit is 10), two old keys, one new key changed again
    d.feed([(k, 1) for k in range(100, 600)] + [(7, 1), (9, 1), (300, 1)])
    assert st.layer == {7: 2, 9: 2, 300: 2} and not st.dirty and not st.all_dirty
    delta = d.save(2, 1)[0][1]
    expected = {k: 1 for k in range(100, 600)} | {7: 2, 9: 2, 300: 2}
    assert delta == StateMapSave(DELTA, expected, (), 1)
    assert st.layer == {}  # the next interval writes a layer again
    d.feed([(600, 1), (5, 1)])
    assert d.save(3, 2)[0][1] == StateMapSave(DELTA, {600: 1, 5: 3}, (), 2)


def _tail_save_begun(monkeypatch: pytest.MonkeyPatch) -> tuple[Driver, Any, Any]:
    """A rolling sum of keys 0..19 saved full, then 10 new keys (20..29) and two writes
    (3 and 25) since, and the next snapshot's delta begun: a tail save (LiveSave mode
    TAIL) walked in steps of 4 keys. Returns the driver, the map and the save."""
    monkeypatch.setattr(live, "LIVE_SAVE_MIN_KEYS", 3)
    monkeypatch.setattr(live, "LIVE_SAVE_FULL_SLICE", 4)
    monkeypatch.setattr(live, "LIVE_SAVE_STEP_S", 0.0)  # one slice a step
    d = Driver(rolling_aggregate(operator.itemgetter(0), summing(operator.itemgetter(1))))
    d.ctx.live_saves = []
    d.feed([(k, 1) for k in range(20)])
    d.save(1, 0)  # full, produced by the Driver
    d.ctx.live_saves.clear()
    st = d.p.states
    d.feed([(k, 1) for k in range(20, 30)] + [(3, 5), (25, 5)])
    d.ctx.current_snapshot_id, d.ctx.committed_snapshot_id = 2, 1
    _key, save = st.snapshot_entry()
    assert save.mode == DELTA and type(save.upserts) is live.LiveSave
    [tail] = d.ctx.live_saves
    return d, st, tail


def test_a_large_tail_is_saved_in_steps_while_the_next_interval_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A delta of many new keys is a copy-on-write save (LiveSave mode TAIL): it walks the
    map's tail from the end in steps; meanwhile writes of its keys go to the new layer and
    new keys too (the walk's iterator would end at an insertion), reads see the saved
    layer as ``frozen`` until the save wrote it into the map. The delta is the state as
    of the barrier."""
    d, st, tail = _tail_save_begun(monkeypatch)
    assert st.frozen == {3: 6, 25: 6} and not st.inserts_to_map()
    assert not tail.step(1 << 30)  # keys 29..26
    d.feed([(27, 100), (25, 100), (3, 100), (40, 1)])  # tail, tail + layer, old, new
    assert st.layer == {27: 101, 25: 106, 3: 106} and tail.fresh == {40: 1}
    assert dict.get(st, 27) == 1 and 40 not in dict.keys(st)
    while not tail.step(1 << 30):
        pass
    assert st.frozen == {} and dict.get(st, 25) == 6 and dict.get(st, 3) == 6
    assert st.inserts_to_map()
    content, removed = tail.result()
    assert removed == () and content.to_dict() == {k: 1 for k in range(20, 30)} | {3: 6, 25: 6}
    assert len(content) == 11
    d.feed([(41, 1)])
    assert d.save(3, 2)[0][1] == StateMapSave(
        DELTA, {27: 101, 25: 106, 3: 106, 40: 1, 41: 1}, (), 2
    )


def _gone(pid: int) -> bool:
    """Whether child ``pid`` was reaped (no zombie left)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


@pytest.mark.skipif(not live._CAN_FORK, reason="forked encoders: Linux only")
def test_a_large_tail_encoded_by_a_forked_child_holds_the_barriers_state(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A tail save of ``LIVE_SAVE_FORK_MIN`` keys or more is encoded by a child forked at
    its first step: for the processor the save is produced at once (its new keys go into
    the map, the layer's merge follows), and the content the store thread reads is the
    map as of the barrier whatever was written since; the child is reaped."""
    monkeypatch.setattr(live, "LIVE_SAVE_FORK_MIN", 5)
    monkeypatch.setattr(live, "LIVE_SAVE_FORK_MAX_S", 60.0)  # whatever the test process's size
    d, st, tail = _tail_save_begun(monkeypatch)
    assert not tail.step(1 << 30)  # forked; then the layer {3, 25} goes into the map
    assert tail._child is not None and tail.produced()
    pid = tail._child[0]
    d.feed([(27, 100), (25, 100), (3, 100), (40, 1)])  # tail, tail + layer, old, new
    assert dict.get(st, 40) == 1 and tail.fresh == {}  # new: into the map at once
    while not tail.step(1 << 30):
        pass
    content, removed = tail.result()
    assert removed == () and type(content) is live.EncodedMap
    assert content.to_dict() == {k: 1 for k in range(20, 30)} | {3: 6, 25: 6}
    assert len(content) == 11 and _gone(pid)
    d.ctx.live_saves.clear()
    d.feed([(41, 1)])
    assert d.save(3, 2)[0][1] == StateMapSave(
        DELTA, {27: 101, 25: 106, 3: 106, 40: 1, 41: 1}, (), 2
    )


def test_a_large_tail_is_encoded_in_steps_when_its_fork_would_take_too_long(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The fork copies the process's page tables (~2.5 ms per 100 MB here): past
    ``LIVE_SAVE_FORK_MAX_S`` predicted, the tail is encoded in steps as before."""
    monkeypatch.setattr(live, "LIVE_SAVE_FORK_MIN", 5)
    monkeypatch.setattr(live, "LIVE_SAVE_FORK_MAX_S", 0.0)
    _d, _st, tail = _tail_save_begun(monkeypatch)
    while not tail.step(1 << 30):
        assert tail._child is None
    content, _removed = tail.result()
    assert content.to_dict() == {k: 1 for k in range(20, 30)} | {3: 6, 25: 6}


@pytest.mark.skipif(not live._CAN_FORK, reason="forked encoders: Linux only")
def test_a_forked_encoder_nobody_reads_is_killed_when_its_save_is_cancelled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(live, "LIVE_SAVE_FORK_MIN", 5)
    monkeypatch.setattr(live, "LIVE_SAVE_FORK_MAX_S", 60.0)  # whatever the test process's size
    _d, _st, tail = _tail_save_begun(monkeypatch)
    tail.step(1 << 30)
    assert tail._child is not None
    pid = tail._child[0]
    tail.cancel()  # its snapshot failed
    assert _gone(pid)


@pytest.mark.skipif(not live._CAN_FORK, reason="forked encoders: Linux only")
def test_a_forked_encoder_that_cannot_encode_fails_its_save_and_later_saves_use_steps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A key the fast pickler cannot encode (a local class's instance): the child says so,
    that snapshot fails (the map has changed since its barrier: nothing else can produce
    it), and the tail saves after it are produced in steps, which hand such content to the
    store thread as a dict (encoded with cloudpickle)."""
    monkeypatch.setattr(live, "LIVE_SAVE_FORK_MIN", 5)
    monkeypatch.setattr(live, "LIVE_SAVE_FORK_MAX_S", 60.0)  # whatever the test process's size
    monkeypatch.setattr(live, "_fork_unencodable", False)

    class Local:
        pass

    d, st, tail = _tail_save_begun(monkeypatch)
    dict.__setitem__(st, Local(), 1)  # (behind the save's back: the child sees it)
    tail._tail += 1
    tail.size += 1
    tail.step(1 << 30)
    with pytest.raises(RuntimeError, match="unencodable"):
        tail.result()
    assert live._fork_unencodable and tail._child is None
    again = live.LiveSave(st, 9, live.TAIL)
    again.tail(12, {})
    while not again.step(1 << 30):
        pass
    assert again._child is None and again._fork_tried is False
    content, _removed = again.result()
    assert type(content) is dict and len(content) == 12


@pytest.mark.parametrize("summing_op", [False, True])
def test_a_chunk_of_new_keys_that_changes_one_of_the_map_reads_the_layer_from_then_on(
    summing_op: bool,
) -> None:
    """While the layer is empty, the layered loop looks a key up in the map first (a
    creation pass's chunk); from the first key of the map it changes on it reads the
    layer first: a key changed twice in one chunk counts both changes."""
    op = summing(operator.itemgetter(1)) if summing_op else counting()
    d = Driver(rolling_aggregate(operator.itemgetter(0), op))
    d.feed([(k, 1) for k in range(5)])
    assert d.save(1, 0)[0][1].mode == FULL
    d.output.clear()
    d.feed([(7, 1), (2, 1), (8, 1), (2, 1), (7, 1), (9, 1)])
    assert d.output == [(7, 1), (2, 2), (8, 1), (2, 3), (7, 2), (9, 1)]
    assert d.p.states.layer == {2: 3, 7: 2}
    assert d.save(2, 1)[0][1] == StateMapSave(DELTA, {7: 2, 8: 1, 9: 1, 2: 3}, (), 1)


@pytest.mark.parametrize("keep", [False, True])
def test_a_key_created_while_a_tail_is_walked_is_saved_once(
    monkeypatch: pytest.MonkeyPatch, keep: bool
) -> None:
    """A key new to the map met while a tail save walks the map goes into the layer and
    into the map once the walk is done, where it is the next delta's tail: it is saved in
    that delta and never again (before, it joined the map's tail a second time when its
    layer was written into the map, or the retained layers were: the skewed bench's 10M
    run wrote 127,000 creation keys twice, 2.2-2.4x the changed entries). ``keep``: the
    saved layers are retained out of the map."""
    if keep:  # every saved layer retained; into the map past twice the newest one
        monkeypatch.setattr(keyed_mod, "LAYER_KEEP_MIN", 0)
    d, st, tail = _tail_save_begun(monkeypatch)
    assert not tail.step(1 << 30)  # keys 29..26
    d.feed([(40, 1), (3, 100), (40, 1)])  # a new key (twice), an old one
    assert 40 not in dict.keys(st) and not st.inserts_to_map()
    while not tail.step(1 << 30):
        pass
    assert dict.get(st, 40) == 2 and st.inserts_to_map()  # the map's tail now
    d.ctx.live_saves.clear()
    d.feed([(41, 1)])
    assert d.save(3, 2)[0][1] == StateMapSave(DELTA, {41: 1, 40: 2, 3: 106}, (), 2)
    d.feed([(3, 1)])
    assert d.save(4, 3)[0][1] == StateMapSave(DELTA, {3: 107}, (), 3)
    d.feed([(5, 1)])
    assert d.save(5, 4)[0][1] == StateMapSave(DELTA, {5: 2}, (), 4)
    st.settle()  # the map alone holds the state
    assert d.output[-1] == (5, 2) and dict.get(st, 40) == 2 and dict.get(st, 3) == 107


def test_keys_met_while_a_tail_save_ends_go_into_the_map_a_slice_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """New keys keep coming while a tail save puts the keys met during its walk into the
    map (a creation pass): those go in one step's slice at a time, and the keys met
    after the walk join the map at once, so the save ends (before, they joined the
    save's overlay and went into the map with one write at the end: a 108 ms step in a
    10M-key creation pass); the next delta holds each new key once with its value."""
    d, st, tail = _tail_save_begun(monkeypatch)
    monkeypatch.setattr(live, "LIVE_SAVE_SLICE", 2)
    writes: list[int] = []
    write = keyed_mod.KeyedState._write

    def counted(self: Any, pairs: Any) -> None:
        pairs = list(pairs)
        writes.append(len(pairs))
        write(self, pairs)

    monkeypatch.setattr(keyed_mod.KeyedState, "_write", counted)
    d.feed([(40, 1), (41, 1), (42, 1), (3, 1)])  # met during the walk
    steps = 0
    while not tail._done.is_set():
        assert not tail.step(1 << 30)
    new_key = 50
    while not tail.step(1 << 30):  # each step: two more new keys, one met in the walk
        d.feed([(new_key, 1), (new_key + 1, 1), (40, 1)])
        new_key += 2
        steps += 1
        assert steps < 100, "the save does not end"
    assert steps >= 1 and writes and max(writes) <= 2
    made = range(50, new_key)
    assert all(dict.get(st, k) == 1 for k in made) and st.inserts_to_map()
    assert tail.fresh == {} and tail.fresh_order == []
    assert d.save(3, 2)[0][1] == StateMapSave(
        DELTA, {3: 7, 40: 1 + steps, 41: 1, 42: 1} | {k: 1 for k in made}, (), 2
    )


def test_a_large_saved_layer_is_retained_out_of_the_map_and_deltas_stay_exact(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A saved layer of LAYER_KEEP_MIN keys or more is not written into the map: its
    values go into ``states.frozen`` (read after the new layer, before the map), so the
    skewed pattern's hot keys, changed again, are found in a small dict, and the map gets
    no random writes a save. Later layers join it (small ones too); the next delta is
    exactly the new layer; past ``layer_limit()`` keys the retained layers go into the
    map in steps, and a full save writes them first."""
    monkeypatch.setattr(keyed_mod, "LAYER_KEEP_MIN", 3)
    monkeypatch.setattr(keyed_mod, "LAYER_MIN", 5)  # layer_limit(): 6 at ~100 keys
    d = Driver(rolling_aggregate(operator.itemgetter(0), counting()))
    d.ctx.live_saves = []
    d.feed([(k, 1) for k in range(100)])
    assert d.save(1, 0)[0][1].mode == FULL
    st = d.p.states
    d.feed([(1, 1), (2, 1), (3, 1)])
    assert d.save(2, 1)[0][1] == StateMapSave(DELTA, {1: 2, 2: 2, 3: 2}, (), 1)
    assert st.frozen == {1: 2, 2: 2, 3: 2} and st.layer == {} and not d.ctx.live_saves
    assert dict.get(st, 1) == 1  # the map does not get them
    d.feed([(1, 1), (2, 1), (150, 1)])  # 150: a new key, the map's tail
    assert st.layer == {1: 3, 2: 3} and dict.get(st, 150) == 1 and st.inserts_to_map()
    assert d.output[-3:] == [(1, 3), (2, 3), (150, 1)]
    assert d.save(3, 2)[0][1] == StateMapSave(DELTA, {150: 1, 1: 3, 2: 3}, (), 2)
    d.feed([(3, 1)])  # a small layer joins the retained ones
    assert d.save(4, 3)[0][1] == StateMapSave(DELTA, {3: 3}, (), 3)
    assert st.frozen == {1: 3, 2: 3, 3: 3} and dict.get(st, 3) == 1
    d.feed([(k, 1) for k in (4, 5, 6, 7)])  # 7 retained keys: past the limit of 6
    assert d.save(5, 4)[0][1] == StateMapSave(DELTA, {4: 2, 5: 2, 6: 2, 7: 2}, (), 4)
    [merge] = d.ctx.live_saves
    assert len(st.frozen) == 7 and dict.get(st, 7) == 1
    while not merge.step(1 << 30):
        pass
    d.ctx.live_saves.clear()
    assert st.frozen == {} and dict.get(st, 1) == 3 and dict.get(st, 7) == 2
    # retained again, then a full save (the one before did not commit) writes them first
    d.feed([(1, 1), (2, 1), (3, 1)])
    d.save(6, 5)
    assert st.frozen == {1: 4, 2: 4, 3: 4}
    d.feed([(1, 1), (8, 1)])
    written: list[list[Any]] = []
    write = keyed_mod.KeyedState._write

    def spy(self: Any, pairs: Any) -> None:
        written.append([k for k, _v in (pairs.items() if isinstance(pairs, dict) else pairs)])
        write(self, pairs)

    monkeypatch.setattr(keyed_mod.KeyedState, "_write", spy)
    full = d.save(7, 5)[0][1]
    assert full.mode == FULL and st.frozen == {} and dict.get(st, 1) == 5
    assert written[:2] == [[2, 3], [1, 8]]  # the retained keys the layer lacks, the layer
    assert full.upserts == dict(st.items()) and full.upserts[8] == 2 and len(full.upserts) == 101


def test_a_retained_layer_with_a_large_tail_is_saved_in_steps_out_of_the_map(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A tail save (LiveSave mode TAIL) whose layer is retained: it walks the tail in
    steps and gives the layer's values for keys of both; reads see the layer in
    ``frozen`` from the barrier on and the map never gets it (no merge step after the
    walk); the next delta is exactly the next interval's layer and tail."""
    monkeypatch.setattr(keyed_mod, "LAYER_KEEP_MIN", 2)
    d, st, tail = _tail_save_begun(monkeypatch)
    assert st.frozen == {3: 6, 25: 6} and st.layer == {} and not st.inserts_to_map()
    assert not tail.step(1 << 30)  # keys 29..26
    d.feed([(27, 100), (25, 100), (3, 100), (40, 1)])  # tail, tail + layer, old, new
    assert st.layer == {27: 101, 25: 106, 3: 106} and tail.fresh == {40: 1}
    while not tail.step(1 << 30):
        pass
    assert st.inserts_to_map() and st.frozen == {3: 6, 25: 6}
    assert dict.get(st, 3) == 1 and dict.get(st, 25) == 1
    assert dict.get(st, 40) == 1  # new during the walk: in the map after it, as the tail
    content, _removed = tail.result()
    assert content.to_dict() == {k: 1 for k in range(20, 30)} | {3: 6, 25: 6}
    d.ctx.live_saves.clear()
    d.feed([(41, 1), (40, 1)])
    assert d.output[-2:] == [(41, 1), (40, 2)]
    assert d.save(3, 2)[0][1] == StateMapSave(
        DELTA, {41: 1, 27: 101, 25: 106, 3: 106, 40: 2}, (), 2
    )
    assert st.frozen == {3: 106, 25: 106, 27: 101, 40: 2} and dict.get(st, 40) == 1


_FEED = st_tuples(st_just("feed"), st_lists(st_integers(0, 60), min_size=1, max_size=12))
_OPS = st_lists(
    st_one_of(
        _FEED,
        _FEED,
        st_tuples(st_just("step"), st_integers(1, 6)),
        st_tuples(st_just("save"), st_just(True)),
        st_tuples(st_just("save"), st_booleans()),
        st_tuples(st_just("remove"), st_integers(0, 60)),
    ),
    min_size=10,
    max_size=40,
)


def _raw_save(d: Driver, sid: int, committed: int) -> Entries:
    """:meth:`Driver.save` without producing the copy-on-write saves: they go on in the
    next steps, while the processor runs."""
    d.ctx.current_snapshot_id, d.ctx.committed_snapshot_id = sid, committed
    out: Entries = []
    while True:
        done = d.p.save_to_snapshot()
        out.extend(d.outbox.snapshot_bucket)
        d.outbox.snapshot_bucket.clear()
        d._drain()
        if done:
            return out


@settings(max_examples=46, deadline=None)
@given(ops=_OPS, steps=st_booleans(), keep=st_booleans(), fork=st_booleans())
def test_deltas_hold_exactly_what_changed_across_inserts_removals_and_reinserts(
    ops: list[tuple[str, Any]], steps: bool, keep: bool, fork: bool
) -> None:
    """Random sequences of chunks (new keys, existing ones, re-inserted ones), steps of
    the copy-on-write saves (produced while the next chunks run, or at once), saves that
    commit or not, and removals by a custom processor (``settle()``, ``del``, mark: the
    interval marks from there): every delta holds the keys written or removed since the
    save before it (at least those whose value changed), with their values as of its
    barrier, and no other key (a key inserted while the previous delta's tail was walked
    is saved once: it was saved twice before), and the chain merged as the store merges
    it is the oracle's counts. ``keep``: every saved layer is retained out of the map (``states.frozen``).
    ``fork``: every tail save (a full save's walk included) is encoded by a forked child."""
    old = live.LIVE_SAVE_MIN_KEYS, live.LIVE_SAVE_FULL_SLICE, live.LIVE_SAVE_SLICE
    old_keep, old_fork = keyed_mod.LAYER_KEEP_MIN, live.LIVE_SAVE_FORK_MIN
    old_fork_s = live.LIVE_SAVE_FORK_MAX_S
    try:
        live.LIVE_SAVE_MIN_KEYS, live.LIVE_SAVE_FULL_SLICE, live.LIVE_SAVE_SLICE = 1, 3, 2
        keyed_mod.LAYER_KEEP_MIN = 1 if keep else old_keep
        live.LIVE_SAVE_FORK_MIN = 10 if fork else None
        live.LIVE_SAVE_FORK_MAX_S = 60.0  # whatever the test process's size
        d = Driver(rolling_aggregate(operator.itemgetter(0), counting()))
        d.ctx.live_saves = [] if steps else None
        st = d.p.states
        oracle: dict[int, int] = {}
        at_save: dict[int, int] = {}  # the oracle at the last save
        touched: set[int] = set()  # the keys fed or removed since
        chain: list[tuple[int, Entries]] = []
        committed = 0
        pending: list[Any] = []

        def check() -> None:  # the pending saves, produced now
            nonlocal chain
            for sid, raw, commits, before, after, written in pending:
                entries = pickle.loads(pickle.dumps([_produced(e) for e in raw]))  # noqa: S301
                save = entries[0][1]
                if save.mode == DELTA:
                    changed = {k for k, v in after.items() if before.get(k) != v}
                    assert changed <= save.upserts.keys() <= written, (sid, save)
                    assert all(after[k] == v for k, v in save.upserts.items())
                    gone = before.keys() - after.keys()
                    assert gone <= set(save.removed) <= written - after.keys()
                else:
                    assert save.upserts == after
                if commits:
                    chain = [] if save.mode == FULL else chain
                    chain.append((sid, entries))
                    assert dict(full_state(merged(chain, strict=False))) == after
            pending.clear()

        sid = 0
        for op, arg in ops:
            if op == "feed":
                d.feed([(k, 1) for k in arg])
                touched.update(arg)
                for k in arg:
                    oracle[k] = oracle.get(k, 0) + 1
            elif op == "step":
                saves = d.ctx.live_saves
                if saves and saves[0].step(arg):
                    saves.pop(0)
            elif op == "remove" and arg in oracle:
                st.settle()
                del st[arg]
                if st.dirty is not None:
                    st.dirty.add(arg)
                del oracle[arg]
                touched.add(arg)
            elif op == "save":
                sid += 1
                check()  # the store took the previous save (and committed it, or not)
                raw = _raw_save(d, sid, committed)
                pending.append((sid, raw, arg, at_save, dict(oracle), touched))
                if arg:  # it commits before the next save
                    committed = sid
                at_save = dict(oracle)
                touched = set()
        check()
    finally:
        live.LIVE_SAVE_MIN_KEYS, live.LIVE_SAVE_FULL_SLICE, live.LIVE_SAVE_SLICE = old
        keyed_mod.LAYER_KEEP_MIN = old_keep
        live.LIVE_SAVE_FORK_MIN, live.LIVE_SAVE_FORK_MAX_S = old_fork, old_fork_s


def test_a_full_save_of_a_layered_map_walks_it_while_the_loop_writes_a_layer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A full copy-on-write save of a rolling count (the uniform pattern's saves, and
    the first one, in a creation pass) walks the map in its order while the loop writes
    its changes into a new layer and the keys it creates into the save's overlay
    (``fresh``): the map is not written meanwhile, so the walk reads it at C speed and
    records no pre-barrier value. A layer past its limit during the walk waits for the
    walk's end (settling would produce the rest of the save at once, in the middle of
    ``process()``: a second or more at 10M keys); the next save holds what changed."""
    monkeypatch.setattr(live, "LIVE_SAVE_MIN_KEYS", 3)
    monkeypatch.setattr(live, "LIVE_SAVE_FULL_SLICE", 30)
    monkeypatch.setattr(live, "LIVE_SAVE_STEP_S", 0.0)  # one slice a step
    monkeypatch.setattr(keyed_mod, "LAYER_MIN", 4)
    monkeypatch.setattr(pipeline_keyed, "_MARKS_WORTH_KEEPING", 4)
    d = Driver(rolling_aggregate(operator.itemgetter(0), counting()))
    d.ctx.live_saves = []
    d.feed([(k, 1) for k in range(100)])
    st = d.p.states
    d.ctx.current_snapshot_id, d.ctx.committed_snapshot_id = 1, 0
    _, first = st.snapshot_entry()
    save = first.upserts
    assert first.mode == FULL and type(save) is live.LiveSave and not save.done
    assert type(st) is keyed_mod.KeyedState  # no mutator of its own: writes are plain
    assert st.snapshot_entry()[1].upserts is save  # asked again: the same save
    assert not save.step(1 << 30)  # keys 0..29
    d.feed([(k, 1) for k in range(100, 103)])  # new keys: the save's overlay
    assert save.fresh == {100: 1, 101: 1, 102: 1} and dict.__len__(st) == 100
    d.feed([(k, 1) for k in range(10)] + [(50, 1)])  # 11 changed keys: past the limit (6)
    assert st.layer == {k: 2 for k in (*range(10), 50)} and dict.get(st, 50) == 1
    assert not save.done and not st.dirty
    while not save.step(1 << 30):
        pass
    assert save.result()[0].to_dict() == {k: 1 for k in range(100)}
    assert list(dict.keys(st)) == [*range(103)] and dict.get(st, 50) == 1
    d.ctx.live_saves.clear()
    d.feed([(7, 1)])  # the walk is over: the layer goes into the map, the keys are marked
    assert st.layer is None and dict.get(st, 50) == 2 and dict.get(st, 7) == 3
    assert d.save(2, 1)[0][1] == StateMapSave(
        DELTA, {k: 2 for k in (*range(10), 50)} | {7: 3, 100: 1, 101: 1, 102: 1}, (), 1
    )


def test_a_delta_of_marks_with_values_reads_nothing_of_the_map(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The uniform pattern at 10M keys: an interval marks (its layer overflowed), each
    changed key with its new value, encoded as it is marked, and its delta is those
    fragments, complete at the barrier: no step after it, no lookup in the map, and the
    next interval marks straight into the map (no layer beside the delta, no ``fresh``
    overlay, nothing to settle after it; on the main before it the loop wrote a layer
    until the delta was produced in steps that looked each key up in the map); the next
    save holds what changed meanwhile."""
    d, st = _marking_count(monkeypatch, 100, in_steps=True)
    d.feed([(k, 1) for k in range(10)])  # past the layer's limit (6): marked
    assert st.layer is None and st.dirty == set() and st.mark_count == 10
    d.ctx.current_snapshot_id, d.ctx.committed_snapshot_id = 2, 1
    _, delta = st.snapshot_entry()
    save = delta.upserts
    assert delta.mode == DELTA and type(save) is live.LiveSave and not save.beside_layer
    assert save.done and d.ctx.live_saves == []
    assert type(st) is keyed_mod.KeyedState and st.layer is None and st._merge is None
    d.feed([(k, 1) for k in range(8)] + [(200, 1), (50, 1)])  # marked, new, unmarked
    assert dict.get(st, 3) == 3 and dict.get(st, 200) == 1 and st.layer is None
    assert st.mark_count == 10
    content, removed = save.result()
    assert content.to_dict() == {k: 2 for k in range(10)} and removed == ()
    d.ctx.live_saves.clear()
    d.feed([(60, 1)])
    assert d.save(3, 2)[0][1] == StateMapSave(
        DELTA, {200: 1, 60: 2} | {k: 3 for k in range(8)} | {50: 2}, (), 2
    )


def test_a_delta_of_marks_with_and_without_values_is_produced_beside_a_layer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A layered map with keys marked with their values and keys marked alone (a custom
    processor's removal: ``settle()``, ``del``, ``dirty.add``): the delta is produced in
    steps while the loop writes the next changes into a new layer and its new keys into
    the save's ``fresh``: the map keeps its class and the delta reads the marked keys'
    values of the barrier from it, then the pairs but those keys (one changed again, or
    removed, after it was marked with a value: the map's value, or the removal,
    counts); once it is produced the layer goes into the map and the interval marks."""
    d, st = _marking_count(monkeypatch, 100, in_steps=True)
    d.feed([(k, 1) for k in range(10)])  # past the layer's limit (6): marked
    st.settle()
    del st[9]  # marked with a value, then removed
    st.dirty.add(9)
    assert st.mark_count == 10 and st.dirty == {9}
    d.ctx.current_snapshot_id, d.ctx.committed_snapshot_id = 2, 1
    _, delta = st.snapshot_entry()
    save = delta.upserts
    assert delta.mode == DELTA and type(save) is live.LiveSave and st._merge is save
    assert type(st) is keyed_mod.KeyedState and st.layer == {}
    assert not save.step(1)  # the removed key
    d.feed([(k, 1) for k in range(8)] + [(200, 1), (50, 1)])  # marked, new, unmarked
    assert st.layer == {k: 3 for k in range(8)} | {50: 2} and save.fresh == {200: 1}
    assert dict.get(st, 3) == 2 and 200 not in dict.keys(st)
    while not save.step(1 << 30):
        pass
    content, removed = save.result()
    # (a removal among pairs encoded at marking: the store thread decodes them to leave
    # the removed key out of the upserts)
    assert content == {k: 2 for k in range(9)} and removed == (9,)
    assert dict.get(st, 200) == 1 and st._merge is None  # the next delta's tail
    d.ctx.live_saves.clear()
    # the interval marks (as the one before): its layer goes into the map at once
    d.feed([(60, 1)])
    assert st.layer is None and dict.get(st, 3) == 3
    assert d.save(3, 2)[0][1] == StateMapSave(
        DELTA, {200: 1, 60: 2} | {k: 3 for k in range(8)} | {50: 2}, (), 2
    )


@pytest.mark.parametrize("foreign", [set(), {7}, {150}])
def test_a_delta_of_marks_with_values_records_whether_a_key_is_another_processors(
    monkeypatch: pytest.MonkeyPatch, foreign: set[int]
) -> None:
    """With ``context.spilled_keys`` (member processes), the keys marked with their values
    are checked as they are marked (until one goes to another processor), and the delta
    made of them carries that flag (``LiveSave.spill``: the chain's spill flag); keys
    changed after the barrier (150) do not count."""
    d, st = _marking_count(monkeypatch, 200)
    checked: list[int] = []

    def spilled(keys: list[Any]) -> bool:
        checked.extend(keys)
        return bool(foreign & set(keys))

    d.ctx.spilled_keys = spilled
    d.feed([(k, 1) for k in range(20)])  # past the layer's limit (12): marked
    d.ctx.current_snapshot_id, d.ctx.committed_snapshot_id = 2, 1
    _key, save = st.snapshot_entry()
    assert save.mode == DELTA and type(save.upserts) is live.LiveSave and save.upserts.done
    at_barrier = set(checked)
    d.feed([(150, 1)])  # the next interval's (checked for the next delta)
    assert save.upserts.spill is bool(foreign & set(range(20)))
    assert at_barrier <= set(range(20)) and (save.upserts.spill or len(at_barrier) == 20)
    content, _removed = save.upserts.result()
    assert content.to_dict() == dict.fromkeys(range(20), 2)


def test_marks_with_values_the_fast_pickler_cannot_encode_are_marked_as_keys(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Keys the fast pickler cannot encode (a local class: ``cloudpickle`` can): the
    interval that marks falls back to marking keys in ``dirty`` from the first such
    pair on (nothing raises in the processor's loop), and the delta holds every changed
    key with its value at the barrier."""
    monkeypatch.setattr(live, "LIVE_SAVE_MIN_KEYS", 3)
    monkeypatch.setattr(keyed_mod, "LAYER_MIN", 4)
    monkeypatch.setattr(pipeline_keyed, "_MARKS_WORTH_KEEPING", 4)

    class Key:  # pickle cannot name a local class
        def __init__(self, v: int) -> None:
            self.v = v

        def __hash__(self) -> int:
            return hash(self.v)

        def __eq__(self, other: object) -> bool:
            return isinstance(other, Key) and other.v == self.v

    keys = [Key(i) for i in range(100)]
    d = Driver(rolling_aggregate(operator.itemgetter(0), counting()))
    d.ctx.live_saves = []
    d.feed([(k, 1) for k in keys])
    st = d.p.states
    d.ctx.current_snapshot_id, d.ctx.committed_snapshot_id = 1, 0
    assert _produced(st.snapshot_entry())[1].upserts == dict.fromkeys(keys, 1)
    d.ctx.live_saves.clear()
    d.feed([(k, 1) for k in keys[:10]])  # past the layer's limit (6): marked
    d.feed([(k, 1) for k in keys[5:15]])
    assert st._pairs_off and st.mark_parts is None and st.dirty == set(keys[:15])
    d.ctx.current_snapshot_id, d.ctx.committed_snapshot_id = 2, 1
    _key, save = _produced(st.snapshot_entry())
    assert save.mode == DELTA and save.removed == ()
    assert save.upserts == {k: st[k] for k in keys[:15]}
    assert [st[k] for k in keys[:16]] == [2] * 5 + [3] * 5 + [2] * 5 + [1]


class _CountingDict(dict):  # type: ignore[type-arg]
    """A dict that counts its get() calls."""

    gets = 0

    def get(self, key: Any, default: Any = None) -> Any:
        type(self).gets += 1
        return dict.get(self, key, default)


def test_the_layered_loop_reads_no_empty_frozen_dict() -> None:
    """With no retained or saved layer (``states.frozen`` empty: the creation pass,
    mostly) the layered loop looks a key up in the layer, then the map, not in the empty
    ``frozen`` as well (a call per new key); with one it reads it, before the map."""
    d = Driver(rolling_aggregate(operator.itemgetter(0), counting()))
    st = d.p.states
    st.frozen = _CountingDict()
    d.feed([(k, 1) for k in range(50)] + [(3, 1)])
    assert _CountingDict.gets == 0 and d.output[-1] == (3, 2)
    st.frozen = _CountingDict({7: 10})
    d.feed([(7, 1), (60, 1)])
    assert _CountingDict.gets == 2 and d.output[-2:] == [(7, 11), (60, 1)]
    assert st.layer == {3: 2, 7: 11}
