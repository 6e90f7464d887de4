"""Keyed state that knows what changed: the engine-provided map behind incremental snapshots.

A keyed processor (rolling aggregates, ``map_stateful``, aggregations, window frames,
sessions, or a custom processor) keeps its per-key state in a :class:`KeyedState`: a
``dict`` (reads and writes at C speed, nothing overridden) plus a set of the keys changed
since the last snapshot, which the processor adds to where it writes::

    def init(self, context):
        self.counts = keyed_state(context)            # tag PLAIN: entries (key, value)

    def process(self, ordinal, inbox):
        counts, dirty = self.counts, self.counts.dirty
        for key in keys:
            counts[key] = counts.get(key, 0) + 1
        if dirty is not None:                         # None: nothing to track
            dirty.update(keys)

    def save_to_snapshot(self):
        return self.outbox.offer_to_snapshot(*self.counts.snapshot_entry())

    def restore_from_snapshot_entry(self, key, value):
        self.counts[key] = value                      # as with any saved entry

A removed key is recorded the same way (``del counts[k]`` and ``dirty.add(k)``): a key
that is in ``dirty`` but no longer in the map is saved as removed.

:meth:`KeyedState.snapshot_entry` hands the snapshot one entry that stands for the whole
map: a :class:`StateMap` key and a :class:`StateMapSave` value. It is *full* (a C-speed
copy of the map) the first time in an execution, when the previous save did not commit,
when the engine does not take incremental snapshots (``dirty`` is ``None`` then, so a
job without them pays nothing per item), or when every key changed; otherwise it is a
*delta*: only the changed keys' values and the removed keys, relative to the snapshot
the previous save went into (``base_id``). The barrier's pause is then proportional to
what changed, not to the size of the state. The snapshot store merges a processor's
chain of a full save and its deltas back into the full map before restore routing
(:func:`expand_entries` refuses an unmerged delta), so a processor restores exactly the
entries it would have restored from full snapshots: ``(key, value)`` for a
:data:`PLAIN` map, ``(KeyedStateKey(key, detail), value)`` for a :data:`KEYED` one.

Values must not change after they were handed over unless they are immutable (ints,
strings, tuples of such): the engine checks at C speed and copies mutable values of the
changed keys (see ``detached`` in :mod:`slipstream.engine.snapshot`).

A map whose values are never changed in place (:attr:`KeyedState.values_replaced`, set
by the additive rolling aggregates) is not copied at all where the engine drives
copy-on-write saves (``context.live_saves``): the save is a
:class:`~slipstream.state.live.LiveSave`, O(1) at the barrier and encoded in slices
after it (see :mod:`slipstream.state.live`).

A map whose processor sets :attr:`KeyedState.layered` (the additive rolling aggregates)
may record its changes by *writing* them instead of marking them: while few keys change
between two snapshots (the skewed pattern: active users), the processor writes each new
value into :attr:`KeyedState.layer`, a small exact ``dict`` of the keys changed since the
last save, and reads a key there before the map (and before :attr:`KeyedState.frozen`, the
previous interval's layer while it is written into the map). The layer *is* the next
delta: at the save it is handed over as the delta's content (nobody writes it any more)
and written into the map, at once when it is small, else in slices between two
``process()`` calls (``context.live_saves``); no set of marks, no lookup of the changed
keys at the barrier, and a small dict's writes cost less than the large map's. When more
keys change than :data:`LAYER_SHARE` of the map (the uniform pattern), the layer is
written into the map, its keys marked, and the interval goes on marking
(:meth:`KeyedState.settle`); the next interval writes a layer again only if the last one
changed that few keys. Such a map marks each changed key *with its new value*, encoded
at once into pickle fragments (:meth:`KeyedState.mark_pairs`, where its delta is produced
in steps): at the barrier the delta is those fragments, complete, with nothing to look up
in the map and no layer to hold the map still while it is produced; a key changed twice
is saved twice, its later value last (the decoded delta holds it). A saved layer of :data:`LAYER_KEEP_MIN` keys or more is not
written into the map: it is *retained* in :attr:`KeyedState.frozen` (a copy, joined by
the later layers), so keys that change again in the next interval (the skewed pattern's
hot keys) are found in a small dict rather than in the large map, which gets no random
writes a save; the retained layers go into the map in steps once they hold more than
the layer's limit (:meth:`KeyedState._retain`). Anything that reads or writes the map
other than through the layer calls :meth:`KeyedState.settle` first (it writes the
retained layers, then the layer).

A layered map writes a layer from the start (:meth:`KeyedState.start_layer`), and the
processor inserts a key the map does not hold into the map itself, not into the layer
(:meth:`KeyedState.inserts_to_map`): a ``dict`` iterates in insertion order, so the keys
inserted since the last save are the map's last ``len - _tail_from`` keys (its *tail*;
the layered processors never remove a key). The next delta is the tail and the layer
(:meth:`KeyedState._tail_save`: a copy-on-write save that walks the tail from the map's
end), so a creation pass (every key new) neither marks its keys nor fills the layer, and
whether the next interval writes a layer counts only the keys that *changed*. Leaving
the layer (:meth:`KeyedState.settle`) marks the tail's keys; a removal behind the
layer's back (the map shorter than its tail's start) makes the next save full.

A *small* layered map (at most :data:`DIFF_MAX` keys) writes no layer and marks nothing:
it is *diffed*. The processor updates it as it would a plain ``dict`` (no guarantee's
loop), and the save finds what changed by comparing the map with
:attr:`KeyedState.diff_base`, the copy taken at the previous save (the values are
replaced, never changed in place, so a value that is not the same object changed): at
10,000 keys a comparison of ~0.4 ms and a copy of ~0.03 ms a save, where the layer's
lookup cost ~10 ns an item (~4 % of a rolling count's CPU at 10,000 keys). Once the map
grows past :data:`DIFF_MAX` (the processor checks once a chunk) it leaves the mode
(:meth:`KeyedState.undiff`): the keys changed since the last save go into a new layer
and the map is layered from there, as a larger map is from its start.
"""

from __future__ import annotations

from collections.abc import ItemsView, Iterator, KeysView, ValuesView
from itertools import chain, compress, islice, repeat
from operator import is_not
from typing import Any, NamedTuple, cast

from slipstream.state.live import ABSENT as _LIVE_ABSENT

__all__ = [
    "DELTA",
    "DIFF_MAX",
    "DROP",
    "FULL",
    "KEYED",
    "LAYER_SHARE",
    "MARKS_SEAL",
    "PLAIN",
    "KeyedState",
    "StateMap",
    "StateMapSave",
    "dropped_entry",
    "fast_keyed_state",
    "continue_restored_chain",
    "keyed_state",
    "saved_entry",
]

#: a map whose entries restore as ``(key, value)``: the key is the grouping key itself
PLAIN = "e"
#: a map whose entries restore as ``(KeyedStateKey(key, detail), value)``
KEYED = "k"

#: :attr:`StateMapSave.mode` values
FULL = "full"
DELTA = "delta"
DROP = "drop"

#: a layered map writes a layer while the keys changed since the last save are at most
#: this share of the map (at least :data:`LAYER_MIN` keys); past it, the interval marks
LAYER_SHARE = 1 / 16
#: the layer's size limit for small maps
LAYER_MIN = 4096
#: a saved layer of at least this many keys is retained as :attr:`KeyedState.frozen`
#: instead of written into the map (see :meth:`KeyedState._retain`)
LAYER_KEEP_MIN = 20_000
#: a layered map of at most this many keys is *diffed* (see the module doc): below
#: ``LIVE_SAVE_MIN_KEYS`` (a save's copy of it, as of any small map, costs less than
#: steps) by more than a chunk, since the processor checks the size once a chunk
DIFF_MAX = 16_384
#: :meth:`KeyedState.seal_marks` once ``dirty`` holds this many keys: just under the 60 %
#: of 2^20 slots at which a set's table doubles to 2^21 (33.5 MB), less a chunk's keys
MARKS_SEAL = 600_000


class StateMap(NamedTuple):
    """Snapshot entry key of a saved :class:`KeyedState` (in memory only: the snapshot
    format stores it as plain data). ``(tag, detail)`` names the map among a processor's
    maps: one processor must not save two maps under the same name."""

    tag: str
    detail: Any = None


class StateMapSave(NamedTuple):
    """Snapshot entry value of a saved :class:`KeyedState`.

    ``mode`` is :data:`FULL` (``upserts`` is the whole map), :data:`DELTA` (``upserts``
    holds the changed keys' new values and ``removed`` the keys removed since snapshot
    ``base_id``, which holds this map's previous save) or :data:`DROP` (the map is gone
    since ``base_id``: a closed window frame)."""

    mode: str
    upserts: dict[Any, Any]
    removed: tuple[Any, ...] = ()
    base_id: int = 0


class KeyedState(dict):  # type: ignore[type-arg]
    """A processor's keyed state: a ``dict`` that records changed keys in :attr:`dirty`
    while the job takes incremental snapshots (see the module doc)."""

    __slots__ = (
        "tag",
        "detail",
        "dirty",
        "sealed",
        "sealed_count",
        "mark_parts",
        "mark_count",
        "mark_spill",
        "_pairs_off",
        "all_dirty",
        "values_replaced",
        "layered",
        "layer",
        "interim_layer",
        "frozen",
        "diff_base",
        "_merge",
        "_tail_from",
        "_context",
        "_saved_id",
        "_entry",
        "_live",
        "_forks",
    )

    def __init__(self, tag: str = PLAIN, detail: Any = None, context: Any = None) -> None:
        super().__init__()
        if tag not in (PLAIN, KEYED):
            raise ValueError(f"KeyedState tag must be PLAIN or KEYED, got {tag!r}")
        self.tag = tag
        self.detail = detail
        #: the keys changed or removed since the last save; ``None`` when nothing is
        #: tracked (the job takes no incremental snapshots)
        self.dirty: set[Any] | None = None
        #: sets of marks of this interval sealed by :meth:`seal_marks`, oldest first
        #: (a key may be in several, and in ``dirty``); they count as marked as ``dirty``.
        #: A layered map's are lists (:meth:`seal_marks`)
        self.sealed: list[Any] = []
        #: how many marks the sealed sets hold (a key in two counted twice)
        self.sealed_count = 0
        #: a layered map's marks with their values (:meth:`mark_pairs`), encoded: pickle
        #: fragments of the keys changed since the last save with each one's value then,
        #: in the order they changed (a key changed twice is in two of them, its later
        #: value last); ``None``: none
        self.mark_parts: list[bytes] | None = None
        #: how many pairs :attr:`mark_parts` holds (a key marked twice counted twice)
        self.mark_count = 0
        #: whether one of their keys goes to another processor at a restore
        #: (``context.spilled_keys``, checked until one does; ``None``: not checked)
        self.mark_spill: bool | None = None
        #: a pair could not be encoded by the fast pickler: this map marks keys only
        self._pairs_off = False
        #: ``True`` after :meth:`mark_all`: the next save is full, marking may stop
        self.all_dirty = False
        #: ``True`` when the processor never changes a value in place (it replaces it:
        #: ``d[k] = new``), e.g. numbers: the engine may then save the map copy-on-write
        #: (:mod:`slipstream.state.live`), with no copy at the barrier
        self.values_replaced = False
        #: ``True`` when the processor writes its changes into :attr:`layer` while it is
        #: not ``None`` (see the module doc); its values are immutable (replaced)
        self.layered = False
        #: the keys changed since the last save with their new values, which the map
        #: does not hold yet; ``None``: changes are marked in ``dirty`` (or not tracked)
        self.layer: dict[Any, Any] | None = None
        #: the layer stands in only while a save is produced beside it (a full save's
        #: walk, a marked delta) in an interval that marks (the last one changed more
        #: keys than a layer holds): once the save is produced the loop settles it, so
        #: the interval marks from there and no layer of ``layer_limit()`` keys is
        #: written into the map at once later
        self.interim_layer = False
        #: the previous interval's layer while it is written into the map in slices,
        #: or the retained layers (:meth:`_retain`): read after :attr:`layer`, before
        #: the map; empty otherwise
        self.frozen: dict[Any, Any] = {}
        #: while the map is diffed (a small layered map, see the module doc): its content
        #: at its last save (empty before the first), which the next save compares it
        #: with; ``None`` otherwise
        self.diff_base: dict[Any, Any] | None = None
        #: the layer's merge into the map in steps, or a tail save (``LiveSave`` of mode
        #: ``"tail"``: it walks the map's tail, then merges the layer)
        self._merge: Any = None
        #: while a layer is written (``layer`` is not ``None``): how many keys of the
        #: map (its first ones in insertion order) it held at the last save; the keys
        #: after them were inserted since and are the next delta's with the layer's
        #: (:meth:`inserts_to_map`). -1: not tracked (new keys are marked or layered)
        self._tail_from = -1
        self._context: Any = None
        self._live: Any = None  # the copy-on-write save in progress (state.live.LiveSave)
        self._saved_id = 0  # the snapshot the previous save went into (0: none yet)
        #: this interval: whether a full save would be encoded by a forked child
        #: (:meth:`full_save_due`); ``None``: not asked yet
        self._forks: bool | None = None
        self._entry: tuple[StateMap, StateMapSave] | None = None  # that save's entry
        if context is not None:
            self.attach(context)

    def attach(self, context: Any) -> None:
        """Track changes if ``context`` (the processor's) takes incremental snapshots."""
        self._context = context
        self.dirty = set() if getattr(context, "incremental_snapshots", False) else None
        restoring(self, context)

    @property
    def saved_id(self) -> int:
        """The snapshot that holds this map's previous save (or the one it was restored
        from as it is, see :func:`continue_restored_chain`); 0: none, the next save is
        full."""
        return self._saved_id

    def changed(self, key: Any) -> None:
        """Record that ``key`` was set or removed (the slower spelling of
        ``dirty.add(key)`` for code that does not hold ``dirty``)."""
        if self.dirty is not None:
            self.dirty.add(key)

    def mark_all(self) -> None:
        """Record that (about) every key changed: the next save is full, so a processor
        may stop marking keys until then (it reads :attr:`all_dirty`), and the set of
        marks, as large as the map by then, is let go at once (the uniform access
        pattern: every key changes between two snapshots)."""
        if self.dirty is not None:
            self._tail_from = -1  # nothing to mark: the next save is full
            self.all_dirty = True  # (before settle(): it marks the layer's keys otherwise)
            self.settle()
            self._new_marks()

    def seal_marks(self) -> None:
        """Keep the marks so far in a set of their own and mark into a new one (the
        additive rolling loop calls it once ``dirty`` holds :data:`MARKS_SEAL` keys).
        A set's table doubles when it is 60 % full, and while it is copied the old and
        the new table are both alive: the marks of 1.8M keys (the 10M-key uniform
        pattern's interval) had a table of 2^22 slots (67 MB) and, at 1.26M marks, a
        moment with that one and the 33.5 MB one before it; in sets of at most
        :data:`MARKS_SEAL` keys their tables are 16.7 MB each, and a resize copies one
        of those at most. The delta saves a key of several sets once
        (:class:`~slipstream.state.live.LiveSave`). Only where the delta is produced in
        steps (``context.live_saves``, values replaced): elsewhere it does nothing.

        A layered map's sealed marks are kept as a *list* (8 bytes a key; a set's table
        takes 28-56): nothing asks whether a key is in them (its delta is produced
        beside a layer, no write records a pre-barrier value), and the delta walks them
        unchecked, so a key of two of them is saved twice, with the same value (the
        map holds the barrier's values until the delta is produced): the decoded delta
        is the same map. At 10M keys in the uniform pattern (intervals of 1.5-3M marks,
        disjoint sets: every check found nothing) the sealed marks took 50-84 MB as
        sets, 12-24 MB as lists; the list costs ~16 ns a key once, in the loop."""
        dirty = self.dirty
        if dirty and self._seals():
            self.sealed.append(list(dirty) if self.layered else dirty)
            self.sealed_count += len(dirty)
            self.dirty = set()

    def _seals(self) -> bool:
        """Whether :meth:`seal_marks` seals (the delta is produced in steps)."""
        return (
            self.values_replaced
            and getattr(self._context, "live_saves", None) is not None
            and getattr(self._context, "snapshot_writer", "thread") != "fork"
        )

    def _seals_lists(self) -> bool:
        """Whether the map's sealed marks are lists (:meth:`seal_marks`)."""
        return self.layered and self._seals()

    def marks_pairs(self) -> bool:
        """Whether the map's changes are marked with their values (:meth:`mark_pairs`)
        rather than as keys in ``dirty``: a layered map whose delta is produced in steps
        (its processor writes each changed key's new value where it marks it)."""
        return self.layered and self.dirty is not None and not self._pairs_off and self._seals()

    def mark_pairs(self, keys: list[Any], values: list[Any]) -> None:
        """Record that ``keys`` changed to ``values`` (lists in step, in the order the
        changes were made; a key may come again, its later value counts): encoded at
        once as a pickle fragment (``live.setitems_fragment``, ~7 bytes a pair of small
        ints) appended to :attr:`mark_parts`, which the next delta starts with as it
        is: no key is looked up in the map again and nothing is encoded after the
        barrier. In the uniform pattern at 10M keys, set marks cost ~28 ns an item to
        mark, ~16 ns a key to seal as a list and ~80 ns a key for the delta to look up
        and encode in steps, with ~40 bytes a marked key held until then. A key marked
        twice is saved twice (the later value last: the decoded delta holds it) and
        counts twice towards :meth:`full_save_due`. Pairs the fast pickler cannot
        encode (``cloudpickle`` needed) are marked in ``dirty`` instead, and so is
        every later change. Only for a map that :meth:`marks_pairs`."""
        if not keys:
            return
        from slipstream.state import live as live_mod

        try:
            part = live_mod.setitems_fragment(keys, values)
        except Exception:  # noqa: BLE001 - the store thread's pickler (cloudpickle)
            self._pairs_off = True
            self.dirty.update(keys)  # type: ignore[union-attr]
            return
        parts = self.mark_parts
        if parts is None:
            parts = self.mark_parts = []
            spilled = getattr(self._context, "spilled_keys", None)
            self.mark_spill = None if spilled is None else False
        parts.append(part)
        self.mark_count += len(keys)
        if self.mark_spill is False:  # checked until one key is another processor's
            try:
                self.mark_spill = bool(self._context.spilled_keys(keys))
            except Exception:  # noqa: BLE001 - a partitioner's error: taken as spilling
                self.mark_spill = True

    def full_save_due(self, marked: int) -> bool:
        """Whether, with ``marked`` keys of the map marked (or about to be), its next
        save should be full (:meth:`mark_all`): past a quarter of its keys, where a
        full save costs about what the delta would and the marks stop growing; for a
        map whose sealed marks are lists (:meth:`seal_marks`) whose full save would not
        be encoded by a forked child (``live.fork_expected``: at 10M keys a fork takes
        longer than a step may), past half of them: its full save is a walk of the
        whole map on the processor's thread (~47 ns a key, 0.47 s at 10M keys; its
        encoded content, ~70 MB, held until written) where a delta costs ~80 ns a
        changed key, and the marks are lists of 8 bytes a key."""
        size = dict.__len__(self)
        if marked * 4 <= size:
            return False
        if marked * 2 > size or not self._seals_lists():
            return True
        forks = self._forks
        if forks is None:  # once an interval (it reads the process's resident size)
            from slipstream.state import live as live_mod

            forks = self._forks = live_mod.fork_expected(size)
        return forks

    def _new_marks(self) -> None:
        """Mark into a new, empty set, with no sealed sets (what was marked is saved,
        or the next save is full)."""
        self.dirty = set()
        self.sealed = []
        self.sealed_count = 0
        self.mark_parts = None
        self.mark_count = 0
        self.mark_spill = None
        self._forks = None

    def marked(self) -> int:
        """How many keys are marked (``dirty`` and the sealed sets; a key in two sets
        counts twice)."""
        dirty = self.dirty
        return (len(dirty) if dirty is not None else 0) + self.sealed_count + self.mark_count

    def start_layer(self) -> None:
        """Write a layer from now on (a layered map before its first save: the creation
        pass inserts its keys into the map, where they are the tail, and writes the
        changes of keys that exist into the layer); a map of at most :data:`DIFF_MAX`
        keys is diffed instead (see the module doc) until it grows past them."""
        if (
            self.layered
            and self.layer is None
            and self.diff_base is None
            and self.dirty is not None
            and getattr(self._context, "snapshot_writer", "thread") != "fork"
        ):
            if dict.__len__(self) <= DIFF_MAX:
                self.diff_base = {}  # (the first save is full)
                return
            self.layer = {}
            self._tail_from = dict.__len__(self)

    def undiff(self) -> None:
        """Leave the diffed mode (the map grew past :data:`DIFF_MAX`, or it is settled):
        the keys changed since the last save (found by comparing the map with
        :attr:`diff_base`; none before the first save, which is full) become a new
        layer, removed ones are marked, and the map is layered from here (its tail
        starts now). A comparison of at most :data:`DIFF_MAX` keys and a chunk's: ~1 ms."""
        base = self.diff_base
        if base is None:
            return
        self.diff_base = None
        layer: dict[Any, Any] = {}
        if self._saved_id:
            layer, removed = _changes(self, base)
            if removed and self.dirty is not None:
                self.dirty.update(removed)
        self.layer = layer
        self._tail_from = dict.__len__(self)

    def inserts_to_map(self) -> bool:
        """Whether a layered writer inserts a *new* key into the map itself (``states[k]
        = v``: it joins the map's tail, the next delta takes it from there, nothing is
        marked) rather than into the layer: while the tail is tracked and no tail save
        walks the map (an insertion would end its dict iterator). Call it once per chunk
        (a save's steps run between two ``process()`` calls)."""
        return self._tail_from >= 0 and (self._merge is None or type(self._merge) is _LayerMerge)

    def walking(self) -> bool:
        """Whether a save produced beside the layer (a tail save, a full save's walk,
        :meth:`_full_walk`, a marked delta) is still produced: :meth:`settle` would
        produce the rest of it at once (a walk of 3M keys: ~0.1 s in one ``process()``
        call), so a layer past its limit waits for it."""
        merge = self._merge
        return type(merge) is not _LayerMerge and merge is not None and not merge.produced()

    def _tail_count(self) -> int:
        """How many keys were inserted into the map since the last save (its tail);
        -1 when not tracked. At a save (the previous one committed, so its content is
        produced): the overlay of a full copy-on-write save still being merged joins the
        map first (a C-speed copy of what is left of it)."""
        t = self._tail_from
        if t < 0:
            return -1
        live = self._live
        if live is not None and live.new:
            live.finish()
        n = dict.__len__(self) - t
        return n if n >= 0 else -1  # fewer keys: some were removed (not by a layered writer)

    def _untail(self) -> None:
        """Stop tracking the tail: its keys are marked in ``dirty`` (or, past
        :meth:`full_save_due`, every key is: the next save is full, :meth:`mark_all`). A full
        copy-on-write save in progress is not finished for it (that would produce the
        rest of the save at once, in the middle of a ``process()`` call: a second or more
        at 10M keys): the keys inserted since its barrier are its overlay's unmerged ones
        and the map's own tail."""
        t = self._tail_from
        if t < 0:
            return
        self._tail_from = -1
        dirty = self.dirty
        if dirty is None:
            return
        live = self._live
        extra = list(live.unmerged()) if live is not None and live.new else []
        n = dict.__len__(self) - t
        total = n + len(extra)
        if total == 0:
            return
        # n < 0: keys were removed behind the layer's back, which of the tail is unknown
        if n < 0 or (total > LAYER_MIN and self.full_save_due(self.marked() + total)):
            self.all_dirty = True
            self._new_marks()
            return
        if n > LAYER_MIN and self._seals_lists():
            # distinct keys, none of them marked yet: a sealed list of its own, not a set
            # (at the end of a 10M-key creation pass, a tail of ~3M keys made a set of a
            # 67 MB table, 100 MB while it doubled: the run's peak RSS), read from the
            # map by the delta (encoding them here, ~30 ns a pair, would make one
            # ``process()`` call, or a barrier's settle, of ~0.1 s)
            self.sealed.append(list(islice(reversed(dict.keys(self)), n)))
            self.sealed_count += n
        else:
            dirty.update(islice(reversed(dict.keys(self)), n))
        dirty.update(extra)

    def layer_limit(self) -> int:
        """The most keys a layer holds before the interval goes on marking."""
        n = int(dict.__len__(self) * LAYER_SHARE)
        return n if n > LAYER_MIN else LAYER_MIN

    def settle(self) -> None:
        """Write :attr:`frozen` and :attr:`layer` into the map and mark the layer's keys
        in ``dirty``: the map alone holds the state again, and changes until the next
        save are marked (call it before reading or writing the map other than through
        the layer)."""
        if self.diff_base is not None:
            self.undiff()  # its changes since the last save: a layer, written below
        if self._merge is not None:
            self._merge.finish()
        frozen = self.frozen
        if frozen:  # retained layers (:meth:`_retain`), older than the layer
            self.frozen = {}
            layer = self.layer
            # a key of both takes the layer's value below: only the others are written
            # (the hot keys are in both: the writes, at random places in a large map,
            # are what a settle at a full save would spend its pause on)
            self._write([p for p in frozen.items() if p[0] not in layer] if layer else frozen)
        layer = self.layer
        self.interim_layer = False
        if layer is None:
            return
        self.layer = None
        self._untail()  # the keys inserted since the last save are marked
        if layer:
            self._write(layer)
            if self.dirty is not None and not self.all_dirty:
                if self.marks_pairs():
                    self.mark_pairs(list(layer), list(layer.values()))
                else:
                    self.dirty.update(layer)

    def _write(self, pairs: Any) -> None:
        """``dict.update`` of the map with ``pairs`` (a dict or a list of pairs), through
        the mutators while a copy-on-write save is in progress (they record the values
        it still needs)."""
        if type(self) is KeyedState:
            dict.update(self, pairs)
        else:
            self.update(pairs)

    def _freeze(self, layer: dict[Any, Any]) -> None:
        """Write a saved layer into the map: now if it is small or nothing drives steps,
        else in slices between two ``process()`` calls (reads look in :attr:`frozen`
        until then); a large one, or any while layers are retained, is retained
        (:meth:`_retain`)."""
        from slipstream.state import live as live_mod

        saves = getattr(self._context, "live_saves", None)
        if self._retains(layer, saves):
            merged = self._retain(layer)
            if merged is not None:
                if saves is None:
                    self.frozen = {}
                    self._write(merged)
                else:
                    self._merge = _LayerMerge(self, merged)
                    saves.append(self._merge)
            return
        if saves is None or len(layer) < live_mod.LIVE_SAVE_MIN_KEYS:
            self._write(layer)
            return
        self.frozen = layer
        self._merge = _LayerMerge(self, layer)
        saves.append(self._merge)

    def _retains(self, layer: dict[Any, Any], saves: Any) -> bool:
        """Whether a saved layer goes into :attr:`frozen` (:meth:`_retain`) rather than
        into the map: layers are retained already, or this one is large and steps drive
        the map's writes."""
        return bool(self.frozen) or (saves is not None and len(layer) >= LAYER_KEEP_MIN)

    def _retain(self, layer: dict[Any, Any]) -> dict[Any, Any] | None:
        """Keep a saved layer out of the map: its values go into :attr:`frozen`, a dict
        of the layers saved since the map last got them (a C-speed copy or update at the
        save, ~25 ns a key), read after the new layer and before the map. Written into
        the map, a saved layer's keys changed again in the next interval (the skewed
        pattern's hot keys) each miss the new layer, are looked up in the large map and
        were written into it at random places first: at 10M keys with 100,000 hot keys,
        a loop model measured 210-236 ns an item that way against 165-191 retained (a
        plain dict 205), and in the bench's job the hot items cost 308-375 ns against
        224 with no guarantee. The next delta stays exactly the new layer. Returns
        :attr:`frozen` once it holds more than :meth:`layer_limit` keys or more than
        twice the layer's (keys that stopped changing: :meth:`settle` would write them
        into the map at once; they go in steps, the caller starts them), else ``None``."""
        frozen = self.frozen
        if frozen:
            frozen.update(layer)
        else:
            self.frozen = frozen = dict(layer)  # a copy: ``layer`` is the save's content
        limit = min(self.layer_limit(), 2 * len(layer) + LAYER_KEEP_MIN)
        return frozen if len(frozen) > limit else None

    def snapshot_entry(self) -> tuple[StateMap, StateMapSave]:
        """The entry to offer to the snapshot being saved (``context.current_snapshot_id``):
        full or delta (see the module doc). Starts the next interval of change tracking;
        called again for the same snapshot (the outbox refused the entry), it returns the
        same entry."""
        ctx = self._context
        sid = int(getattr(ctx, "current_snapshot_id", 0) or 0)
        if sid and sid == self._saved_id and self._entry is not None:
            # asked again for the same snapshot (the outbox refused the entry): the same
            # entry, not a delta relative to the snapshot being saved
            if self._entry is _FULL_AGAIN:  # the map has not changed since: copy it again
                return StateMap(self.tag, self.detail), StateMapSave(FULL, self._full(sid))
            return self._entry
        entry = self._new_entry(sid)
        # a full entry is not kept until the next save: it is a copy of the whole map
        self._entry = _FULL_AGAIN if entry[1].mode == FULL else entry
        return entry

    def _full(self, sid: int) -> dict[Any, Any]:
        """A full save's map: a copy, the map itself for a forked writer
        (JobConfig.snapshot_writer="fork"), whose child encodes its copy-on-write view,
        or a copy-on-write save produced in steps after the barrier (:meth:`_live_save`)."""
        ctx = self._context
        if getattr(ctx, "snapshot_writer", "thread") == "fork":
            return self
        walk = self._full_walk(sid)
        if walk is not None:
            return walk  # type: ignore[no-any-return]
        live = self._live_save(sid, FULL, None)
        if live is not None:
            return live  # type: ignore[no-any-return]
        return dict(self)

    def _full_walk(self, sid: int) -> Any:
        """A full save of a layered map as a walk of the whole map (a tail save whose
        tail is every key, :meth:`_tail_save`), or ``None`` where it does not apply (not
        layered, nothing drives the steps, a small map). The map is not written while
        it is walked: the layered loop writes its changes into a new layer and the keys
        it creates into the save's overlay (``LiveSave.fresh``), so the walk reads the
        map's keys and values with two dict iterators at C speed and records no
        pre-barrier value. A full copy-on-write save with the map's class swapped
        (``_OverlayKeyedState``) made every write a Python call and every slice look its
        keys up in those values: in the uniform pattern, where every save of a 3M-key
        map is full, its steps cost ~135 ns an entry, the walk ~40. Asked again for the
        same snapshot (the outbox refused the entry), the same save."""
        from slipstream.state import live as live_mod

        merge = self._merge
        if type(merge) is live_mod.LiveSave and merge.snapshot_id == sid and merge.whole:
            return merge
        if (
            not self.layered
            or not self.values_replaced
            or type(self) is not KeyedState
            or getattr(self._context, "live_saves", None) is None
            or dict.__len__(self) < live_mod.LIVE_SAVE_MIN_KEYS
        ):
            return None
        interim = self.layer is None  # (a save sets the layer of an interval that writes one)
        self.settle()  # the map alone holds the state (it does after a save's settle)
        if self._live is not None:  # a save of an earlier snapshot, never taken
            self._live.cancel()
        self.layer = {}
        self.interim_layer = interim
        n = self._tail_from = dict.__len__(self)
        return self._tail_save(sid, {}, n)

    def _live_save(
        self,
        sid: int,
        mode: str,
        keys: Any,
        sealed: list[Any] | None = None,
        pairs: tuple[list[bytes], int, bool | None] | None = None,
    ) -> Any:
        """A :class:`~slipstream.state.live.LiveSave` of this map as of now, handed to the
        tasklet that produces it (``context.live_saves``), or ``None`` where it does not
        apply: values may change in place, nothing drives the steps, or the save is small
        (a copy costs less). A save of the same snapshot still in progress (the outbox
        refused the entry) is handed out again; one of an earlier snapshot is finished
        first (its snapshot failed: nobody waits for it). A delta of ``pairs`` alone (keys
        marked with their values, encoded already: :meth:`mark_pairs`) is complete at
        once: nothing of the map is read, no step, no layer beside it."""
        from slipstream.state import live as live_mod

        pending = self._live
        if pending is not None:
            if pending.snapshot_id == sid and pending.mode == mode:
                return pending
            pending.cancel()
        saves = getattr(self._context, "live_saves", None)
        if saves is None or not self.values_replaced or type(self) is not KeyedState:
            return None
        size = len(self) if keys is None else len(keys) + sum(map(len, sealed or ()))
        if pairs:
            size += pairs[1]
        if size < live_mod.LIVE_SAVE_MIN_KEYS:
            return None
        save = live_mod.LiveSave(
            self, sid, mode, keys, getattr(self._context, "spilled_keys", None), sealed, pairs
        )
        if mode == DELTA and pairs and not keys and not sealed:
            save._complete()  # its content is the pairs' fragments: produced
            return save
        if mode == DELTA and self.layered:
            # produced beside a layer: the loop writes its changes into a new layer (and
            # the keys it creates into the save's ``fresh``, the map's tail once the
            # delta is produced), so the delta reads the map as it was at the barrier.
            # Swapping the class instead made each write a Python call that looked the
            # key up in the delta's sets of marks: at 10M keys in the uniform pattern
            # (deltas of ~1.7M keys) ~13 % of the processor's CPU
            save.beside_layer = True
            self._merge = save
            if self.layer is None:  # an interval that marks: once the delta is produced
                self.layer = {}
                self.interim_layer = True
            self._tail_from = dict.__len__(self)  # what the loop inserts is the next tail
        else:
            self._live = save
            self.__class__ = _OverlayKeyedState if mode == FULL else _SavingKeyedState
        saves.append(save)
        return save

    def _new_entry(self, sid: int) -> tuple[StateMap, StateMapSave]:
        ctx = self._context
        key = StateMap(self.tag, self.detail)
        dirty = self.dirty
        base = self._saved_id
        if self.diff_base is not None:
            from slipstream.state import live as live_mod

            if dict.__len__(self) < live_mod.LIVE_SAVE_MIN_KEYS:
                self._saved_id = sid
                return self._diffed_entry(key, base)
            self.undiff()  # (grown by a restore the chain does not continue: no save yet)
        self._saved_id = sid
        if dirty is None:
            return key, StateMapSave(FULL, self._full(sid))
        committed = int(getattr(ctx, "committed_snapshot_id", 0) or 0)
        all_dirty = self.all_dirty
        layer = self.layer
        if self._merge is not None:  # the previous layer goes into the map first
            self._merge.finish()
        full = all_dirty or base == 0 or committed < base
        tail = self._tail_count() if layer is not None and not full else -1
        if layer is not None and tail < 0 and self._tail_from >= 0:
            full = True  # keys were removed behind the layer's back: start again
        if (
            tail >= 0
            and not dirty
            and not self.sealed
            and len(layer) + tail < dict.__len__(self)  # type: ignore[arg-type]
        ):
            # the layer and the keys inserted since the last save (the map's tail) are
            # the delta: the layer handed over as it is (nobody writes it any more), then
            # written into the map; the next interval writes a new one
            assert layer is not None
            self.layer = {}
            self._tail_from = dict.__len__(self)
            if not tail:
                self._freeze(layer)
                return key, StateMapSave(DELTA, layer, (), base)
            return key, StateMapSave(DELTA, self._tail_save(sid, layer, tail), (), base)
        # the keys that changed since the last save: of a layered interval, the layer's
        # (the keys it inserted were new, not changed); else the marks
        changed = len(layer) if layer is not None else self.marked()
        if full:
            self._tail_from = -1  # the tail need not be marked: the save is full
        self.settle()  # a layer's keys (and the tail's) are marked in dirty now
        full = full or self.all_dirty  # (a tail of most of the map is not marked)
        dirty = self.dirty
        sealed = self.sealed
        parts = self.mark_parts
        pairs = (parts, self.mark_count, self.mark_spill) if parts else None
        self._new_marks()
        self.all_dirty = False
        # the next interval writes a layer if this one changed few enough keys (not for a
        # forked writer: its deltas cost the barrier nothing however many keys changed,
        # and nothing would write a large layer into the map in steps)
        layered = (
            self.layered
            and not all_dirty
            and changed <= self.layer_limit()
            and getattr(ctx, "snapshot_writer", "thread") != "fork"
        )
        if layered:
            self.layer = {}
        entry = self._marked_entry(sid, key, dirty, full, base, sealed, pairs)
        if layered:  # after the entry: a save cancelled by it merged its overlay
            self._tail_from = dict.__len__(self)
        return entry

    def _diffed_entry(self, key: StateMap, base: int) -> tuple[StateMap, StateMapSave]:
        """The save of a diffed map (see the module doc): a copy of the map, which is the
        next save's :attr:`diff_base`, and either that copy (full: the first save, after
        a failed snapshot, or every key changed) or the keys whose value is not the same
        object as in the previous save's copy and the keys that copy had and the map
        lacks (a delta relative to snapshot ``base``)."""
        previous = self.diff_base
        copy = self.diff_base = dict.copy(self)
        if self.dirty:
            self._new_marks()  # (nothing marks a diffed map)
        self.all_dirty = False
        committed = int(getattr(self._context, "committed_snapshot_id", 0) or 0)
        if base == 0 or committed < base or previous is None:
            return key, StateMapSave(FULL, copy)
        upserts, removed = _changes(copy, previous)
        if len(upserts) >= len(copy):
            return key, StateMapSave(FULL, copy)
        return key, StateMapSave(DELTA, upserts, removed, base)

    def _marked_entry(
        self,
        sid: int,
        key: StateMap,
        dirty: Any,
        full: bool,
        base: int,
        sealed: list[Any] | None = None,
        pairs: tuple[list[bytes], int, bool | None] | None = None,
    ) -> tuple[StateMap, StateMapSave]:
        """The save of the map alone: full, or a delta of the marked keys (``dirty`` and
        the ``sealed`` sets of the interval, and the keys marked with their values,
        ``pairs``: :meth:`mark_pairs`'s fragments, their count and spill flag)."""
        ctx = self._context
        marked = len(dirty) + sum(map(len, sealed or ())) + (pairs[1] if pairs else 0)
        if full or marked >= len(self):
            del dirty, sealed, pairs  # before the copy: the marks may be as large as the map
            return key, StateMapSave(FULL, self._full(sid))
        if sealed or pairs:
            live = self._live_save(sid, DELTA, dirty, sealed, pairs)
            if live is not None:  # the changed keys' values are picked in steps
                return key, StateMapSave(DELTA, live, (), base)
            if pairs:  # (a small delta) their values first: a key of dirty's is read below
                from slipstream.state import live as live_mod

                first = live_mod.EncodedMap(pairs[0], pairs[1]).to_dict()
                upserts, removed = self._picked(dirty.union(*(sealed or ())), first)
                return key, StateMapSave(DELTA, upserts, removed, base)
            dirty = dirty.union(*(sealed or ()))  # (not where sets are sealed: seal_marks)
            del sealed
        if getattr(ctx, "snapshot_writer", "thread") == "fork":
            # a *live delta*: the map itself and the changed keys; the forked writer's
            # child picks their values out of its copy-on-write view (see
            # slipstream.state.forked.materialized), so the pause does not grow with them
            return key, StateMapSave(DELTA, self, dirty, base)  # type: ignore[arg-type]
        live = self._live_save(sid, DELTA, dirty)
        if live is not None:  # the changed keys' values are picked in steps
            return key, StateMapSave(DELTA, live, (), base)
        upserts, removed = self._picked(dirty, {})
        return key, StateMapSave(DELTA, upserts, removed, base)

    def _picked(self, keys: Any, upserts: dict[Any, Any]) -> tuple[dict[Any, Any], tuple[Any, ...]]:
        """A delta of ``keys`` read from the map now, over ``upserts`` (what an earlier
        part of the delta holds): each key's value, or its removal (which leaves
        ``upserts`` too)."""
        get = self.get
        missing = _MISSING
        removed = []
        for k in keys:
            v = get(k, missing)
            if v is missing:
                removed.append(k)
                upserts.pop(k, None)
            else:
                upserts[k] = v
        return upserts, tuple(removed)

    def _tail_save(self, sid: int, layer: dict[Any, Any], tail: int) -> Any:
        """A delta of the map's last ``tail`` keys (inserted since the last save) and
        ``layer`` (the changes of the keys before them; its value wins for a key in
        both). Small: a dict now, and the layer written into the map. Else a
        copy-on-write save (:class:`~slipstream.state.live.LiveSave` of mode ``"tail"``)
        that walks the tail from the map's end in steps after the barrier, then writes
        the layer into the map; meanwhile reads see the layer as :attr:`frozen`, writes
        of keys of the map go to the new layer (so the tail's values stay those of the
        barrier) and new keys too (:meth:`inserts_to_map`), which the save also notes
        (``LiveSave.fresh``) and inserts into the map once the walk is done: the layer
        never holds a key the map lacks, so writing it into the map adds nothing to the
        map's tail (a key saved in this layer is not saved again as the tail)."""
        from slipstream.state import live as live_mod

        saves = getattr(self._context, "live_saves", None)
        if saves is None or tail + len(layer) < live_mod.LIVE_SAVE_MIN_KEYS:
            out = dict(islice(reversed(dict.items(self)), tail))
            out.update(layer)
            self._freeze(layer)
            return out
        save = live_mod.LiveSave(
            self, sid, live_mod.TAIL, None, getattr(self._context, "spilled_keys", None)
        )
        if self._retains(layer, saves):
            # retained (:meth:`_retain`): into the map after the walk only if too large
            save.tail(tail, layer, self._retain(layer))
        else:
            save.tail(tail, layer, layer)
            self.frozen = layer
        self._merge = save
        saves.append(save)
        return save

    def dropped_entry(self) -> tuple[StateMap, StateMapSave] | None:
        """The entry that records this map as gone (call it instead of
        :meth:`snapshot_entry` in the first save after the processor dropped the map,
        e.g. a closed window frame); ``None`` when no snapshot holds it (nothing to drop).
        The snapshot that holds it may not have committed yet: at the save, leave out a
        drop whose ``base_id`` is above ``context.committed_snapshot_id`` (that save did
        not commit, so every other map of the processor saves FULL and the chain starts
        again without it), as the window processors do."""
        if self._saved_id == 0 or self.dirty is None:
            return None
        return dropped_entry(self.tag, self.detail, self._saved_id)


def restoring(state: Any, context: Any) -> None:
    """Record ``state`` (a keyed-state map being made) while its processor is restored
    from its own chain (see :func:`continue_restored_chain`)."""
    states = getattr(context, "_restored_states", None)
    if states is not None:
        states.append(state)


def continue_restored_chain(context: Any) -> bool:
    """Called by the engine once a processor took its restore entries (before
    ``finish_snapshot_restore``), when it was restored from exactly its own chain
    (``context.restored_snapshot_id``): the keyed-state maps it made meanwhile continue
    that chain, so their first save is a delta relative to that snapshot, not a full
    copy; what the restore wrote into them is not counted as a change.

    Only if the maps equal the chain's: each of the chain's maps was made again, under
    the same ``(tag, detail)``, with as many keys as the chain holds (the restore put
    every entry back where it came from; a processor that merged, dropped or moved
    restored entries fails this), and tracks changes. Otherwise nothing changes, the
    context's ``restored_snapshot_id`` becomes 0 and the first save is full (a new
    chain). A map made after the restore is new: its first save is full. Returns whether
    the chain is continued."""
    sid = int(getattr(context, "restored_snapshot_id", 0) or 0)
    states = getattr(context, "_restored_states", None)
    maps = getattr(context, "_restored_maps", None)
    context._restored_states = None
    context._restored_maps = None
    if not sid or states is None or maps is None:
        context.restored_snapshot_id = 0
        return False
    by_name: dict[Any, Any] = {}
    ok = True
    for s in states:
        name = (s.tag, s.detail)
        if s.dirty is None or name in by_name:
            ok = False
            break
        by_name[name] = s
    if ok:
        for name, size in maps.items():
            s = by_name.get(name)
            if s is None or len(s) != size:
                ok = False
                break
    if not ok:
        context.restored_snapshot_id = 0
        return False
    for name, s in by_name.items():
        if name in maps:
            s._saved_id = sid
            s._entry = None
            if getattr(s, "diff_base", None) is not None:  # what it holds now is saved
                if dict.__len__(s) <= DIFF_MAX:
                    s.diff_base = dict.copy(s)
                else:
                    s.diff_base = None
                    s.layer = {}
                    s._tail_from = dict.__len__(s)
            if getattr(s, "_tail_from", -1) >= 0:  # what the restore inserted is not new
                s._tail_from = dict.__len__(s)
            s.dirty.clear()  # in place: a processor may hold the set
            if getattr(s, "sealed", None):
                s.sealed = []
                s.sealed_count = 0
            if getattr(s, "mark_parts", None) is not None:
                s.mark_parts = None
                s.mark_count = 0
    return True


def dropped_entry(tag: str, detail: Any, base_id: int) -> tuple[StateMap, StateMapSave]:
    """The entry that records map ``(tag, detail)`` as gone since snapshot ``base_id``."""
    return StateMap(tag, detail), StateMapSave(DROP, {}, (), base_id)


def keyed_state(context: Any, tag: str = PLAIN, detail: Any = None) -> KeyedState:
    """A new :class:`KeyedState` for a processor with ``context``: the engine's factory,
    where the state backend is chosen (``context.state_backend``: ``"memory"``, or
    ``"sqlite"`` for a :class:`~slipstream.state.disk.DiskKeyedState`, which has the
    same interface, on disk behind a cache)."""
    if getattr(context, "state_backend", "memory") == "sqlite":
        from slipstream.state.disk import DiskKeyedState

        return cast(KeyedState, DiskKeyedState(tag, detail, context))
    return KeyedState(tag, detail, context)


def fast_keyed_state(context: Any, tag: str = PLAIN, detail: Any = None) -> dict[Any, Any]:
    """:func:`keyed_state`, or a plain ``dict`` when that would be an in-memory map that
    tracks nothing (the job takes no incremental snapshots): CPython specialises item
    stores and loads (``d[k] = v``) for exact dicts only, and a subclass costs ~5-10 ns
    per store, ~7 % of a window's summing loop. Save it with :func:`saved_entry`; read
    its ``dirty`` as ``getattr(state, "dirty", None)``."""
    state = keyed_state(context, tag, detail)
    if type(state) is KeyedState and state.dirty is None:
        return {}
    return state


def saved_entry(
    state: dict[Any, Any], tag: str = PLAIN, detail: Any = None
) -> tuple[StateMap, StateMapSave]:
    """The snapshot entry of a map from :func:`fast_keyed_state` (``tag`` and ``detail``
    as it was made with): a full copy of a plain ``dict``, else its
    :meth:`~KeyedState.snapshot_entry`."""
    if type(state) is dict:
        return StateMap(tag, detail), StateMapSave(FULL, dict(state))
    return state.snapshot_entry()  # type: ignore[attr-defined, no-any-return]


_MISSING: Any = object()


def _changes(cur: dict[Any, Any], base: dict[Any, Any]) -> tuple[dict[Any, Any], tuple[Any, ...]]:
    """What changed from ``base`` to ``cur`` (maps whose values are replaced, never
    changed in place): the entries of ``cur`` whose value is not the same object in
    ``base`` (new keys, and values replaced since: an equal value written again counts,
    which costs bytes, never correctness), and the keys of ``base`` that ``cur`` lacks.
    At C speed: ~40 ns an entry of ``cur``."""
    upserts = dict(
        compress(
            dict.items(cur),
            map(is_not, dict.values(cur), map(base.get, dict.keys(cur), repeat(_MISSING))),
        )
    )
    new = len(upserts.keys() - base.keys())
    if dict.__len__(cur) - new < len(base):  # some key of base is gone
        return upserts, tuple(base.keys() - dict.keys(cur))
    return upserts, ()


class _LayerMerge:
    """Writes a saved layer (:attr:`KeyedState.frozen`) into its map in slices, between
    two ``process()`` calls (an item of ``context.live_saves``, as a copy-on-write save):
    at 10M keys a write into the map is a few cache misses, ~1-3 us, so 100,000 changed
    keys written at once would be a pause of 0.1-0.3 s."""

    __slots__ = ("state", "_it", "steps", "step_max_s")

    def __init__(self, state: KeyedState, layer: dict[Any, Any]) -> None:
        self.state: KeyedState | None = state
        self._it = iter(layer.items())
        self.steps = 0
        self.step_max_s = 0.0

    def step(self, budget: int) -> bool:
        """Write up to ``budget`` more entries (slices of ``LIVE_SAVE_SLICE``, stopping
        after the slice that took the step past ``LIVE_SAVE_STEP_S``); ``True`` once all
        are written."""
        from time import perf_counter

        from slipstream.state import live as live_mod

        state = self.state
        if state is None:
            return True
        t0 = perf_counter()
        size = live_mod.LIVE_SAVE_SLICE
        while True:
            n = size if budget > size else budget
            pairs = list(islice(self._it, n))
            if pairs:
                state._write(pairs)
            budget -= n
            if len(pairs) < n:
                state.frozen = {}
                state._merge = None
                self.state = None
                done = True
                break
            if budget <= 0 or perf_counter() - t0 >= live_mod.LIVE_SAVE_STEP_S:
                done = False
                break
        self.steps += 1
        dt = perf_counter() - t0
        if dt > self.step_max_s:
            self.step_max_s = dt
        return done

    def finish(self, timed: bool = True) -> None:
        """Write the rest now (a save, :meth:`KeyedState.settle`, or the processor is
        closing)."""
        while not self.step(1 << 62):
            pass


#: KeyedState._entry after a full save: asked again, it copies the map again
_FULL_AGAIN: Any = (None, None)


class _SavingKeyedState(KeyedState):
    """The class of a :class:`KeyedState` while a copy-on-write *delta* of it is produced
    (:mod:`slipstream.state.live`): every mutator first lets the save record the key's
    pre-barrier value. Only then is a write a Python call; the map gets its class back
    when the save is complete."""

    __slots__ = ()

    def __setitem__(self, key: Any, value: Any) -> None:
        live = self._live
        old = live.old
        # the first write after the barrier of one of the delta's changed keys (no
        # other key's value is read: in the uniform pattern the keys written meanwhile
        # are other keys than the delta's, and each cost ~100 bytes in ``old``)
        if old is not None and key not in old:
            if key in live._keys:
                old[key] = dict.get(self, key, _LIVE_ABSENT)
            elif live._sealed and live.in_sealed(key):
                old[key] = dict.get(self, key, _LIVE_ABSENT)
        dict.__setitem__(self, key, value)

    def __delitem__(self, key: Any) -> None:
        if dict.__contains__(self, key):
            self._live.before_remove(self, key)
        dict.__delitem__(self, key)

    def pop(self, key: Any, *default: Any) -> Any:
        if dict.__contains__(self, key):
            self._live.before_remove(self, key)
        return dict.pop(self, key, *default)

    def popitem(self) -> tuple[Any, Any]:
        if dict.__len__(self):
            self._live.before_remove(self, next(reversed(self)))
        return dict.popitem(self)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        if not dict.__contains__(self, key):
            self[key] = default
            return default
        return dict.__getitem__(self, key)

    def update(self, *args: Any, **kwargs: Any) -> None:
        for k, v in dict(*args, **kwargs).items():
            self[k] = v

    def __ior__(self, other: Any) -> _SavingKeyedState:  # type: ignore[override, misc]
        self.update(other)
        return self

    def clear(self) -> None:
        self._live.finish()  # produced now: the map's class is KeyedState again
        dict.clear(self)


class _OverlayKeyedState(_SavingKeyedState):
    """The class of a :class:`KeyedState` while a copy-on-write *full* save of it is in
    progress: the save encodes the map's pre-barrier keys in its insertion order with
    one dict iterator, which an insertion would end (and finding the place again after
    one costs a pass over the part already encoded: tens of ms at a few million keys,
    a step that holds the GIL that long). So a key inserted after the barrier goes into
    the save's overlay (``LiveSave.new``) and every read looks there after the map
    itself, until the save merged the overlay into the map, in steps after its content
    is produced. A removal produces the rest of the save first (``finish``)."""

    __slots__ = ()

    def __setitem__(self, key: Any, value: Any) -> None:
        live = self._live
        old = live.old
        if old is not None:  # the content is being produced
            if key not in old:
                v = dict.get(self, key, _LIVE_ABSENT)
                if v is _LIVE_ABSENT:
                    live.new[key] = value  # inserted since the barrier: the overlay
                    return
                old[key] = v  # the first write of a pre-barrier key
        elif key in live.new and not dict.__contains__(self, key):
            live.new[key] = value  # the overlay is being merged, this key not yet
            return
        dict.__setitem__(self, key, value)

    def __missing__(self, key: Any) -> Any:  # d[key] (dict's own lookup comes first)
        return self._live.new[key]

    def get(self, key: Any, default: Any = None) -> Any:
        v = dict.get(self, key, _MISSING)
        if v is _MISSING:
            return self._live.new.get(key, default)
        return v

    def __contains__(self, key: object) -> bool:
        return dict.__contains__(self, key) or key in self._live.new

    def __len__(self) -> int:
        live = self._live
        return dict.__len__(self) + len(live.new) - live.merged

    def __iter__(self) -> Iterator[Any]:
        return chain(dict.__iter__(self), list(self._live.unmerged()))

    def __reversed__(self) -> Iterator[Any]:
        return chain(reversed(list(self._live.unmerged())), dict.__reversed__(self))

    def keys(self) -> KeysView[Any]:  # type: ignore[override]
        return KeysView(self)

    def values(self) -> ValuesView[Any]:  # type: ignore[override]
        return ValuesView(self)

    def items(self) -> ItemsView[Any, Any]:  # type: ignore[override]
        return ItemsView(self)

    def copy(self) -> dict[Any, Any]:
        out = dict.copy(self)
        new = self._live.new
        out.update({k: new[k] for k in self._live.unmerged()})
        return out

    def __eq__(self, other: object) -> bool:
        return self.copy() == other

    def __ne__(self, other: object) -> bool:
        return self.copy() != other

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(self.copy())

    def _settled(self) -> None:
        """Produce the rest of the save and merge the overlay now: the map is a plain
        :class:`KeyedState` again (before a change the save does not follow)."""
        self._live.finish()

    def __delitem__(self, key: Any) -> None:
        self._settled()
        dict.__delitem__(self, key)

    def pop(self, key: Any, *default: Any) -> Any:
        self._settled()
        return dict.pop(self, key, *default)

    def popitem(self) -> tuple[Any, Any]:
        self._settled()
        return dict.popitem(self)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        v = self.get(key, _MISSING)
        if v is _MISSING:
            self[key] = default
            return default
        return v

    def __ior__(self, other: Any) -> _OverlayKeyedState:  # type: ignore[override, misc]
        self.update(other)
        return self

    def __or__(self, other: Any) -> dict[Any, Any]:  # type: ignore[override]
        return self.copy() | other  # type: ignore[no-any-return]

    def __ror__(self, other: Any) -> dict[Any, Any]:  # type: ignore[override]
        return other | self.copy()  # type: ignore[no-any-return]
