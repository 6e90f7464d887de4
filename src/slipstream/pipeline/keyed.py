"""Processors that only the Pipeline API needs: keyed stateful mapping (``map_stateful``,
``rolling_aggregate``, and its once-per-epoch form: ``rolling_partials`` then
``rolling_latest``) and the joining side of ``hash_join``.

Keyed state lives in a :class:`~slipstream.state.keyed.KeyedState` (one ``PLAIN`` map:
it restores as entries under the grouping key itself), so a restore (also with another
parallelism) routes each key's state to the processor that owns the key's partition, as
the keyed aggregation processors do, and a job that takes incremental snapshots saves
only the keys that changed since the previous snapshot.
"""

from __future__ import annotations

import functools
import time
from collections import Counter
from collections.abc import Callable
from itertools import islice, repeat
from operator import itemgetter
from typing import Any

from slipstream.aggregate import AggregateOperation, identity, is_identity
from slipstream.core.inbox import Inbox, drop_head
from slipstream.core.item_errors import blame, failed_position
from slipstream.core.processor import AbstractProcessor, Context
from slipstream.core.traits import KEYED
from slipstream.state import keyed as keyed_state_mod
from slipstream.state.keyed import KeyedState, fast_keyed_state, saved_entry
from slipstream.state.keys import BroadcastKey
from slipstream.state.live import LiveSave

__all__ = [
    "HashJoinP",
    "MapStatefulP",
    "RollingLatestP",
    "RollingPartialsP",
    "hash_join",
    "map_stateful",
    "rolling_aggregate",
    "rolling_latest",
    "rolling_partials",
]

_NOTHING: Any = object()
_first = itemgetter(0)
_second = itemgetter(1)


def _mark_from(states: Any, dirty: set[Any], bucket: list[Any], start: int) -> None:
    """Mark the keys of the ``(key, result)`` pairs appended to ``bucket`` since
    ``start``; once more than a quarter of an in-memory map's keys are marked (and more
    than a few thousand; half of a large one's: :meth:`~slipstream.state.keyed.KeyedState.
    full_save_due`), the next save is full: :meth:`~slipstream.state.keyed.KeyedState.
    mark_all` lets the marks go and the additive path stops marking until that save (the
    uniform pattern: every key changes between two snapshots, and the set of marks would
    grow as large as the map; a set of marks holds ~40 bytes a key at its largest, a
    copy-on-write full save of numbers none). Saving a quarter of the keys as a delta
    or all of them in full costs about as much: the full save is encoded in slices after
    the barrier, at a few tens of ns an entry. Below that, a set of ``MARKS_SEAL`` marks
    is sealed and the next marks go into a new one (:meth:`~slipstream.state.keyed.
    KeyedState.seal_marks`: smaller set tables). A map that marks its changes with their
    values (:meth:`~slipstream.state.keyed.KeyedState.marks_pairs`: the bucket's
    results are its new values) gets the pairs as they are."""
    if type(states) is KeyedState and states.marks_pairs():
        part = bucket[start:] if start else bucket
        states.mark_pairs(list(map(_first, part)), list(map(_second, part)))
        n = states.marked()
        if n > _MARKS_WORTH_KEEPING and states.full_save_due(n):
            states.mark_all()
        return
    dirty.update(map(_first, bucket[start:] if start else bucket))
    n = len(dirty)
    seal = keyed_state_mod.MARKS_SEAL
    if (n > _MARKS_WORTH_KEEPING or n >= seal) and isinstance(states, KeyedState):
        if n > _MARKS_WORTH_KEEPING and states.full_save_due(n + states.sealed_count):
            states.mark_all()
        elif n >= seal:  # the next marks go into a new set (memory: KeyedState.seal_marks)
            states.seal_marks()


def _layer_found(
    states: Any, layer: dict[Any, Any], bucket: list[Any], start: int, size0: int, add: int
) -> None:
    """After a chunk of a rolling count (the constant int addend ``add``) written straight
    into a layered map whose layer was empty (the creation pass's loop in
    :meth:`MapStatefulP._rolling_layered`), when the map grew by fewer keys than the
    chunk had items: the map and the layer become what the layered loop would have made
    of the chunk. That loop inserts a key the map lacks (its first item) and writes
    every other item into the layer: the map keeps the value it had before such an item.
    The chunk's items are the ``(key, count)`` pairs appended to ``bucket`` since
    ``start``; the map had ``size0`` keys before it, and the keys it inserted are the
    map's last ones (a dict keeps insertion order; a layered map loses no key). A key's
    value before an item is its count then less ``add`` (ints: exact)."""
    grown = dict.__len__(states) - size0
    inserted = set(islice(reversed(dict.keys(states)), grown)) if grown > 0 else set()
    kept: dict[Any, Any] = {}  # the value the map keeps, of each key met
    for k, acc in islice(bucket, start, None):
        if k in kept:
            layer[k] = acc
        elif k in inserted:
            kept[k] = acc  # its first item inserted it
        else:
            kept[k] = acc - add  # the map's value before the chunk
            layer[k] = acc
    for k in layer:
        states[k] = kept[k]  # (through the map's mutators: a save in progress sees it)


#: below this many marks the set costs too little memory to let it go (and a small map's
#: saves stay deltas)
_MARKS_WORTH_KEEPING = 4096


class MapStatefulP(AbstractProcessor):
    """State per key; for each item emits ``fn(state, key, item)`` (``None``: nothing).

    ``create()`` makes a key's state the first time the key is seen; ``fn`` may mutate
    it (Jet's ``mapStateful``). With ``rolling_op`` set instead, the state is that
    operation's accumulator (``accumulate`` returns the new one, so immutable
    accumulators work) and each item emits ``(key, finish(acc))``: a rolling aggregate.

    The states are a :class:`~slipstream.state.keyed.KeyedState` (a plain dict when
    nothing is tracked: ``fast_keyed_state``): while the job takes
    incremental snapshots, every key an item touched is marked (``fn`` may mutate the
    state in place, so the key is marked before ``fn`` runs, on every item), and a
    snapshot saves only those keys; otherwise nothing is tracked per item.
    """

    slipstream_traits = frozenset({KEYED})  # each key must reach one processor
    # the key function, create, fn and the operation's functions; a fn that changed the
    # state and then raised leaves the state as it left it
    handles_item_errors = True

    def __init__(
        self,
        key_fn: Callable[[Any], Any],
        create: Callable[[], Any] | None,
        fn: Callable[[Any, Any, Any], Any] | None,
        rolling_op: AggregateOperation[Any, Any, Any] | None = None,
    ) -> None:
        self._key_fn = key_fn
        self._create = create
        self._fn = fn
        self._op = rolling_op
        #: the key function returns its item (``lambda k: k``, ``is_identity``): the rolling
        #: loops take the items as their keys, no call per item
        self._key_is_item = is_identity(key_fn)
        self.states: dict[Any, Any] = {}  # replaced in init_processor
        self._pending: Any = _NOTHING  # the head item's result, refused by the outbox

    def init_processor(self, context: Context) -> None:
        self.states = fast_keyed_state(context)
        if (
            type(self.states) is KeyedState
            and self._op is not None
            and self._op.additive is not None
        ):
            # sums and counts: numbers, replaced on every item, never changed in place, so
            # a save may be taken copy-on-write (state/live.py): no copy at the barrier
            self.states.values_replaced = True
            if self._op.finish is identity:
                # and while few keys change between two snapshots, the loop writes the
                # changes into a small layer that is the next delta (state/keyed.py),
                # from the start: the keys the creation pass inserts are the map's tail;
                # a small map (state.keyed.DIFF_MAX) is diffed instead: updated as a
                # plain dict, its save compares it with its previous save's copy
                self.states.layered = True
                self.states.start_layer()

    def process(self, ordinal: int, inbox: Inbox) -> None:
        outbox = self.outbox
        if (
            self._op is not None
            and self._op.additive is not None
            and self._pending is _NOTHING
            and outbox.data_ordinal_count == 1
            and outbox.is_cooperative_outbox()
        ):
            self._rolling_additive(inbox)
            return
        offer = outbox.offer
        if self._pending is not _NOTHING:
            if not offer(self._pending):
                return
            self._pending = _NOTHING
            inbox.popleft()
        states = self.states
        if (
            getattr(states, "layer", None) is not None
            or getattr(states, "frozen", None)
            or getattr(states, "diff_base", None) is not None
        ):
            states.settle()  # type: ignore[attr-defined]  # the map alone, marked from here
        dirty = getattr(states, "dirty", None)
        key_fn = self._key_fn
        prefetch = getattr(states, "prefetch", None)
        if prefetch is not None:  # disk-backed state: one query for the chunk's misses
            prefetch(map(key_fn, inbox))
        op = self._op
        missing = _NOTHING
        errors = self.context.item_errors
        key: Any = missing
        while inbox:
            item = inbox[0]
            try:
                key = key_fn(item)
                if dirty is not None:  # before fn or accumulate, which may mutate it
                    dirty.add(key)
                state = states.get(key, missing)
                if op is not None:
                    state = op.accumulate(op.create() if state is missing else state, item)
                    states[key] = state
                    result = (key, op.finish(state))
                else:
                    if state is missing:
                        state = states[key] = self._create()  # type: ignore[misc]
                    result = self._fn(state, key, item)  # type: ignore[misc]
            except Exception as e:
                if dirty is not None and key is not missing and key not in states:
                    dirty.discard(key)  # a new key that got no state: nothing to save
                if not errors.handle(item, e):
                    raise
                inbox.popleft()
                continue
            if result is None:
                inbox.popleft()
                continue
            if not offer(result):
                self._pending = result
                return
            inbox.popleft()

    def _rolling_additive(self, inbox: Inbox) -> None:
        """Rolling sum/count of an additive op (``create()`` is 0, ``accumulate`` adds):
        added inline, results appended straight to the single bucket, at most as many
        as it has room for; the keys (and addends) by a C-level map over the chunk when
        ``finish`` is the identity (sums and counts), else one item at a time. Every item appends ``(key, result)`` to the bucket, so the
        keys it changed are marked from there, in one C-speed step after the loop (also
        after an item the policy set aside: those before it are in), and only while
        the job takes incremental snapshots: ~28 ns per item, nothing while every key is
        marked already (``dirty`` only holds keys of ``states``, which never loses one,
        so that is when it is as large as ``states`` and the chunk added no key)."""
        op = self._op
        assert op is not None
        bucket = self.outbox.buckets[0]
        n = min(self.outbox.capacity - len(bucket), len(inbox))
        if n <= 0:
            return
        finish = op.finish
        states = self.states
        diffed = getattr(states, "diff_base", None) is not None
        if diffed and len(states) > keyed_state_mod.DIFF_MAX:
            states.undiff()  # type: ignore[attr-defined]  # grown: layered from here
            diffed = False
        if finish is identity and getattr(states, "layer", None) is not None:
            self._rolling_layered(inbox, n, bucket)
            return
        if getattr(states, "layer", None) is not None or getattr(states, "frozen", None):
            states.settle()  # type: ignore[attr-defined]  # the map alone, marked from here
        dirty = getattr(states, "dirty", None)
        if dirty is not None and (diffed or getattr(states, "all_dirty", False)):
            # a diffed map: its save finds what changed; all dirty: the next save is
            # full anyway. Nothing to mark until then
            dirty = None
        start = len(bucket)
        size = len(states) if dirty is not None else 0  # (a disk state may query it)
        get = states.get
        key_fn = self._key_fn
        add = op.additive
        pop = inbox.popleft
        append = bucket.append
        if finish is identity:
            # keys (and addends) by C-level map over the chunk, then one tight loop
            chunk = inbox if n == len(inbox) else list(islice(inbox, n))
            prefetch = getattr(states, "prefetch", None)
            if prefetch is not None:  # disk-backed state: one query for the chunk's misses
                prefetch(map(key_fn, chunk))
            keys = iter(chunk)  # zip takes the key first: it is at the failing item
            ks = keys if self._key_is_item else map(key_fn, keys)
            try:
                if callable(add):
                    for k, v in zip(ks, map(add, chunk)):  # noqa: B905
                        acc = states[k] = get(k, 0) + v
                        append((k, acc))
                else:  # counting: the addend is a constant
                    for k in ks:
                        acc = states[k] = get(k, 0) + add
                        append((k, acc))
            except Exception as e:
                i = failed_position(n, keys)
                if dirty is not None and (len(dirty) < size or len(states) > size):
                    _mark_from(states, dirty, bucket, start)
                if not self.context.item_errors.handle(chunk[i], e):
                    raise
                n = i + 1  # the items before it are done: drop them and it
            else:
                if dirty is not None and (len(dirty) < size or len(states) > size):
                    _mark_from(states, dirty, bucket, start)
            drop_head(inbox, n)
            return
        errors = self.context.item_errors
        k = _NOTHING
        try:
            for _ in range(n):
                item = pop()
                try:
                    k = key_fn(item)
                    acc = states[k] = get(k, 0) + (add(item) if callable(add) else add)
                    append((k, finish(acc)))
                except Exception as e:
                    if dirty is not None and k is not _NOTHING and k in states:
                        dirty.add(k)  # finish raised after the state changed
                    if not errors.handle(item, e):
                        raise
        finally:
            if dirty is not None and (len(dirty) < size or len(states) > size):
                _mark_from(states, dirty, bucket, start)

    def _rolling_layered(self, inbox: Inbox, n: int, bucket: list[Any]) -> None:
        """:meth:`_rolling_additive` for sums and counts while the state writes a layer
        (:attr:`~slipstream.state.keyed.KeyedState.layer`): each new value goes into the
        layer, a small exact dict of the keys changed since the last save, which is read
        first (then the previous layer while it is written into the map, then the map).
        Nothing is marked: the layer is the next snapshot's delta. A key the map does not
        hold yet goes into the map itself (``states.inserts_to_map()``): the keys inserted
        since the last save are the map's tail, which the next delta takes from there,
        so a creation pass neither marks its keys nor fills the layer. Once it holds more
        keys than the state's ``layer_limit()`` the state settles (the layer goes into
        the map, its keys into ``dirty``) and the next chunks mark, as for many changes."""
        op = self._op
        assert op is not None
        states: Any = self.states
        layer = states.layer
        lget = layer.get
        fget = states.frozen.get
        get = states.get
        key_fn = self._key_fn
        add = op.additive
        append = bucket.append
        missing = _NOTHING
        chunk = inbox if n == len(inbox) else list(islice(inbox, n))
        keys = iter(chunk)  # zip takes the key first: it is at the failing item
        # the keys, once per chunk: each branch below consumes them in one pass
        ks = keys if self._key_is_item else map(key_fn, keys)
        live = states._live
        if live is not None and live.new is not None and live.old is not None:
            # a full copy-on-write save is produced (the map is an _OverlayKeyedState,
            # whose get() and item store are Python calls): the map's own keys by C-level
            # dict.get, then the save's overlay, where a new key goes (as the overlay's
            # __setitem__ would put it: nothing else writes the map's keys here)
            get = dict.get.__get__(states)
            nget = live.new.get
            new = live.new
        else:
            new = None
        try:
            if new is not None and states.inserts_to_map():
                addends = map(add, chunk) if callable(add) else repeat(add)
                for k, v in zip(ks, addends):  # noqa: B905
                    acc = lget(k, missing)
                    if acc is missing:
                        acc = fget(k, missing)
                        if acc is missing:
                            acc = get(k, missing)
                            if acc is missing:
                                acc = nget(k, missing)
                                if acc is missing:
                                    acc = new[k] = 0 + v
                                    append((k, acc))
                                    continue
                    acc = layer[k] = acc + v
                    append((k, acc))
            elif states.inserts_to_map() and not states.frozen:
                # no retained or saved layer to read (the creation pass, mostly): the
                # layer, then the map (a lookup call less a new key: ~20 ns of ~200);
                # while the layer is empty (a creation pass's chunks) the map alone holds
                # the state: its lookup first, and the layer's from the first key of the
                # map that changes on (the same iterators: a loop model of 3M new keys,
                # 184-189 ns a key against 208-217, plain dict 170-182)
                if callable(add):
                    pairs = zip(ks, map(add, chunk))  # noqa: B905
                    if not layer:
                        for k, v in pairs:
                            acc = get(k, missing)
                            if acc is missing:
                                acc = states[k] = 0 + v
                                append((k, acc))
                                continue
                            acc = layer[k] = acc + v
                            append((k, acc))
                            break
                    for k, v in pairs:
                        acc = lget(k, missing)
                        if acc is missing:
                            acc = get(k, missing)
                            if acc is missing:
                                acc = states[k] = 0 + v
                                append((k, acc))
                                continue
                        acc = layer[k] = acc + v
                        append((k, acc))
                elif not layer and type(add) is int:
                    # a count while the layer is empty: the chunk goes into the map as
                    # with no guarantee (a lookup and a store a key, no test of each key
                    # met: a loop model of 3M new keys, 161-166 ns a key against 178-183,
                    # a plain dict's loop 156-178); if the map grew by fewer keys than
                    # the chunk had items (a key it held, or one met twice),
                    # _layer_found makes the map and the layer what the loop below
                    # would have made of the chunk (it counts from then on)
                    size0 = dict.__len__(states)
                    start = len(bucket)
                    try:
                        for k in ks:
                            acc = states[k] = get(k, 0) + add
                            append((k, acc))
                    finally:
                        if dict.__len__(states) - size0 != len(bucket) - start:
                            _layer_found(states, layer, bucket, start, size0, add)
                else:  # counting: the addend is a constant
                    if not layer:
                        for k in ks:
                            acc = get(k, missing)
                            if acc is missing:
                                acc = states[k] = 0 + add
                                append((k, acc))
                                continue
                            acc = layer[k] = acc + add
                            append((k, acc))
                            break
                    for k in ks:
                        acc = lget(k, missing)
                        if acc is missing:
                            acc = get(k, missing)
                            if acc is missing:
                                acc = states[k] = 0 + add
                                append((k, acc))
                                continue
                        acc = layer[k] = acc + add
                        append((k, acc))
            elif states.inserts_to_map():
                # a new key joins the map's tail; a key of the map (or of a layer) is
                # written into the layer
                if callable(add):
                    for k, v in zip(ks, map(add, chunk)):  # noqa: B905
                        acc = lget(k, missing)
                        if acc is missing:
                            acc = fget(k, missing)
                            if acc is missing:
                                acc = get(k, missing)
                                if acc is missing:
                                    acc = states[k] = 0 + v
                                    append((k, acc))
                                    continue
                        acc = layer[k] = acc + v
                        append((k, acc))
                else:  # counting: the addend is a constant
                    for k in ks:
                        acc = lget(k, missing)
                        if acc is missing:
                            acc = fget(k, missing)
                            if acc is missing:
                                acc = get(k, missing)
                                if acc is missing:
                                    acc = states[k] = 0 + add
                                    append((k, acc))
                                    continue
                        acc = layer[k] = acc + add
                        append((k, acc))
            elif type(states._merge) is LiveSave:
                # a tail save walks the map (no insertion: it would end the walk's
                # iterator): a key of the map (or of a layer) is written into the layer,
                # a key new to the map into the save's overlay (``fresh``, read after the
                # map), which goes into the map once the walk is done, as the next
                # delta's tail (not into the layer: see LiveSave.fresh)
                merge = states._merge
                fresh = merge.fresh
                wget = fresh.get
                met = merge.fresh_order.append  # its keys in order (LiveSave)
                # once the walk is over (the save's content is produced) a key new to
                # the map and to ``fresh`` joins the map's tail at once: ``fresh`` stops
                # growing, so the steps that put its keys into the map come to an end
                walking = not merge.produced()
                addends = map(add, chunk) if callable(add) else repeat(add)
                for k, v in zip(ks, addends):  # noqa: B905
                    acc = lget(k, missing)
                    if acc is missing:
                        acc = fget(k, missing)
                        if acc is missing:
                            acc = get(k, missing)
                            if acc is missing:
                                acc = wget(k, missing)
                                if acc is missing:
                                    if walking:
                                        met(k)
                                        acc = fresh[k] = 0 + v
                                    else:
                                        acc = states[k] = 0 + v
                                else:
                                    acc = fresh[k] = acc + v
                                append((k, acc))
                                continue
                    acc = layer[k] = acc + v
                    append((k, acc))
            elif callable(add):  # the tail is not tracked: a new key joins the layer too
                for k, v in zip(ks, map(add, chunk)):  # noqa: B905
                    acc = lget(k, missing)
                    if acc is missing:
                        acc = fget(k, missing)
                        if acc is missing:
                            acc = get(k, 0)
                    acc = layer[k] = acc + v
                    append((k, acc))
            else:  # counting: the addend is a constant
                for k in ks:
                    acc = lget(k, missing)
                    if acc is missing:
                        acc = fget(k, missing)
                        if acc is missing:
                            acc = get(k, 0)
                    acc = layer[k] = acc + add
                    append((k, acc))
        except Exception as e:
            i = failed_position(n, keys)
            if not self.context.item_errors.handle(chunk[i], e):
                raise
            n = i + 1  # the items before it are done: drop them and it
        drop_head(inbox, n)
        if (len(layer) > states.layer_limit() or states.interim_layer) and not states.walking():
            # many keys change (the uniform pattern): mark from here until the next save
            # (not while a save is produced beside the layer: settle() would produce the
            # rest of it at once)
            states.settle()
            if states.dirty is not None:
                size = states.marked()
                if size > _MARKS_WORTH_KEEPING and states.full_save_due(size):
                    states.mark_all()

    def save_to_snapshot(self) -> bool:
        return self.save_state(lambda: [saved_entry(self.states)])

    def restore_from_snapshot_entry(self, key: Any, value: Any) -> None:
        self.states[key] = value


#: with no processing guarantee (no snapshots end an epoch) the per-epoch stages of
#: ``rolling_aggregate(op, per_epoch=True)`` end one every this many seconds
EPOCH_WITHOUT_SNAPSHOTS_S = 1.0


class _TimedEpochs:
    """Epochs of a job without snapshots: the per-epoch stages emit at snapshots and at
    the end of the input, so on an unbounded embedded job with no processing guarantee
    they would never emit at all; there an epoch ends every
    :data:`EPOCH_WITHOUT_SNAPSHOTS_S` seconds instead (checked in ``try_process``,
    which the tasklet calls before each inbox and in lulls). A Spark streaming task
    always snapshots, so its epochs stay the micro-batches."""

    context: Context
    _epoch_started: float | None = None
    _out: Any  # what the epoch's end is emitting (resumable), ``None`` between

    def _end_epoch(self) -> bool:
        """Emit what the epoch holds (resumable); ``True`` when done."""
        raise NotImplementedError

    def try_process(self) -> bool:
        if self._out is not None or self._epoch_due():
            return self._end_epoch()
        return True

    def _epoch_due(self) -> bool:
        if self.context.snapshotting_enabled:
            return False
        now = time.monotonic()
        if self._epoch_started is None:
            self._epoch_started = now
            return False
        if now - self._epoch_started < EPOCH_WITHOUT_SNAPSHOTS_S:
            return False
        self._epoch_started = now
        return True


class RollingPartialsP(_TimedEpochs, AbstractProcessor):
    """The map side of ``rolling_aggregate(op, per_epoch=True)``: accumulates its items
    per key and emits ``(key, accumulator)`` for every key it saw, then forgets them, at
    each snapshot (before the barrier, so the partials belong to the epoch the snapshot
    ends: one micro-batch of a Spark streaming job) and at the end of its input. It
    saves nothing: its state is empty at every barrier.

    Why: a rolling aggregate that emits once per key and epoch need not send every item
    through the shuffle; this stage sends one partial per key it saw (Spark's map-side
    combine, what native Structured Streaming does before its shuffle). A count
    (``additive`` a constant) counts the keys of a whole inbox at C speed
    (``Counter.update``)."""

    handles_item_errors = True  # the key function and accumulate

    def __init__(self, key_fn: Callable[[Any], Any], op: AggregateOperation[Any, Any, Any]) -> None:
        self._key_fn = key_fn
        self._key_is_item = is_identity(key_fn)
        self._op = op
        add = op.additive
        self._counting = add is not None and not callable(add)
        self.partials: dict[Any, Any] = Counter() if self._counting else {}
        self._out: Any = None  # the partials being emitted

    def process(self, ordinal: int, inbox: Inbox) -> None:
        errors = self.context.item_errors
        while inbox:
            n = len(inbox)
            keys = iter(inbox)
            try:
                self._accumulate(keys)
            except Exception as e:
                i = failed_position(n, keys)
                item = inbox[i]
                drop_head(inbox, i + 1)  # those before it are in; it is set aside
                if not errors.handle(item, e):
                    raise
                continue
            inbox.clear()

    def _accumulate(self, items: Any) -> None:
        """Add ``items`` (an iterator the caller locates a failure in) to the partials."""
        partials = self.partials
        key_fn = self._key_fn
        if self._counting:
            # an identity key function (``lambda k: k``) is not called per item
            partials.update(items if self._key_is_item else map(key_fn, items))  # type: ignore[call-arg]
            return
        op = self._op
        get = partials.get
        add = op.additive
        if add is not None:
            for item in items:
                k = key_fn(item)
                partials[k] = get(k, 0) + add(item)
            return
        accumulate, create, missing = op.accumulate, op.create, _NOTHING
        for item in items:
            k = key_fn(item)
            acc = get(k, missing)
            partials[k] = accumulate(create() if acc is missing else acc, item)

    def _flush(self) -> bool:
        """Emit every partial (resumable when the outbox fills up); ``True`` when done."""
        if self._out is None:
            partials = self.partials
            if not partials:
                return True
            if self._counting:
                scale = self._op.additive
                pairs = partials.items() if scale == 1 else ((k, n * scale) for k, n in partials.items())
                self._out = iter(list(pairs))
            else:
                self._out = iter(list(partials.items()))
            self.partials = Counter() if self._counting else {}
        if not self.emit_from(self._out):
            return False
        self._out = None
        return True

    def _end_epoch(self) -> bool:
        return self._flush()

    def save_to_snapshot(self) -> bool:
        return self._flush()

    def complete(self) -> bool:
        return self._flush()


class RollingLatestP(_TimedEpochs, MapStatefulP):
    """The keyed side of ``rolling_aggregate(op, per_epoch=True)``: combines the
    ``(key, accumulator)`` partials of :class:`RollingPartialsP` into each key's
    accumulator (``op.combine``) and, at each snapshot (before saving, so the output
    belongs to the epoch the snapshot ends) and at the end of its input, emits
    ``(key, op.finish(acc))`` once for every key that changed since the last time:
    Structured Streaming's update mode, one row per changed key per micro-batch.
    The accumulators are saved and restored as :class:`MapStatefulP`'s (same entries)."""

    def __init__(self, op: AggregateOperation[Any, Any, Any]) -> None:
        super().__init__(_first, None, None, op)
        self._changed: dict[Any, None] = {}
        self._out: Any = None

    def init_processor(self, context: Context) -> None:
        super().init_processor(context)
        if isinstance(self.states, KeyedState):
            # process() writes the map and marks each changed key itself: the write
            # layer MapStatefulP asks for with an additive op would stay empty here
            self.states.layered = False
            self.states.settle()  # (the layer it started, empty)

    def process(self, ordinal: int, inbox: Inbox) -> None:
        op = self._op
        assert op is not None and op.combine is not None
        combine = op.combine
        states = self.states
        dirty = getattr(states, "dirty", None)
        if dirty is not None and getattr(states, "all_dirty", False):
            dirty = None  # the next save is full anyway
        prefetch = getattr(states, "prefetch", None)
        if prefetch is not None:  # disk-backed state: one query for the chunk's misses
            prefetch(map(_first, inbox))
        changed = self._changed
        get = states.get
        missing = _NOTHING
        errors = self.context.item_errors
        for pair in inbox:
            k, partial = pair
            if dirty is not None:  # before combine, which may change the old one in place
                dirty.add(k)
            try:
                acc = get(k, missing)
                states[k] = partial if acc is missing else combine(acc, partial)
            except Exception as e:
                if not errors.handle(pair, e):
                    raise
                continue
            changed[k] = None
        inbox.clear()
        if dirty is not None:
            n = len(dirty)
            if n > _MARKS_WORTH_KEEPING and isinstance(states, KeyedState) and n * 4 > len(states):
                states.mark_all()

    def _emit_changed(self) -> bool:
        """Emit ``(key, finish(acc))`` of every changed key (resumable); ``True`` when
        done."""
        if self._out is None:
            if not self._changed:
                return True
            op = self._op
            assert op is not None
            finish, states = op.finish, self.states
            if finish is identity:
                latest = [(k, states[k]) for k in self._changed]
            else:
                latest = [(k, finish(states[k])) for k in self._changed]
            self._out = iter(latest)
            self._changed = {}
        if not self.emit_from(self._out):
            return False
        self._out = None
        return True

    def _end_epoch(self) -> bool:
        return self._emit_changed()

    def save_to_snapshot(self) -> bool:
        if not self._emit_changed():
            return False
        return super().save_to_snapshot()

    def complete(self) -> bool:
        return self._emit_changed()


class HashJoinP(AbstractProcessor):
    """Ordinal 0 is the stream to enrich; ordinals 1.. are the build sides, drained first
    (their edges have a higher priority), each into a table ``key -> [items]``.

    For each item of ordinal 0 the output is ``output_fn(item, match_1, ..., match_n)``
    for every combination of matches; a side without a match contributes ``None``
    (left outer join, Jet's ``hashJoin``), or drops the item when ``inner`` is set.
    The key functions and ``output_fn`` apply the bad-record policy (a build-side item
    set aside is missing from the table).
    """

    handles_item_errors = True

    def __init__(
        self,
        key_fns: list[Callable[[Any], Any]],
        build_key_fns: list[Callable[[Any], Any]],
        output_fn: Callable[..., Any],
        inner: bool,
    ) -> None:
        self._key_fns = key_fns
        self._build_key_fns = build_key_fns
        self._output_fn = output_fn
        self._inner = inner
        self.tables: list[dict[Any, list[Any]]] = [{} for _ in build_key_fns]
        self._it: Any = None

    def process(self, ordinal: int, inbox: Inbox) -> None:
        if ordinal > 0:
            table = self.tables[ordinal - 1]
            key_fn = self._build_key_fns[ordinal - 1]
            errors = self.context.item_errors
            for item in inbox:
                try:
                    k = key_fn(item)
                except Exception as e:
                    if not errors.handle(item, e):
                        raise
                    continue
                found = table.get(k)
                if found is None:
                    table[k] = [item]
                else:
                    found.append(item)
            inbox.clear()
            return
        errors = self.context.item_errors
        while inbox:
            it = self._it
            if it is None:
                try:
                    it = self._joined(inbox[0])
                    if not errors.fails:  # whole: output_fn raising emits nothing
                        it = iter(list(it))
                except Exception as e:
                    if not errors.handle(inbox[0], e):
                        raise
                    inbox.popleft()
                    continue
                self._it = it
            try:
                done = self.emit_from(it)
            except Exception as e:  # output_fn raised
                blame(e, inbox[0])
                raise
            if not done:
                return
            self._it = None
            inbox.popleft()

    def _joined(self, item: Any) -> Any:
        sides: list[list[Any]] = []
        for table, key_fn in zip(self.tables, self._key_fns, strict=True):
            matches = table.get(key_fn(item))
            if matches is None:
                if self._inner:
                    return iter(())
                matches = [None]
            sides.append(matches)
        output_fn = self._output_fn
        if len(sides) == 1:
            return (output_fn(item, m) for m in sides[0])
        return (output_fn(item, *combo) for combo in _product(sides))

    def save_to_snapshot(self) -> bool:
        # every processor holds the same tables (the build sides are broadcast): one copy
        # is saved, and restored to every processor
        if self.context.global_processor_index != 0:
            return True
        return self.save_state(
            lambda: (
                (BroadcastKey(("hash_join", side, k)), v)
                for side, table in enumerate(self.tables)
                for k, v in table.items()
            )
        )

    def restore_from_snapshot_entry(self, key: Any, value: Any) -> None:
        _tag, side, k = key.name
        self.tables[side][k] = list(value)


def _product(sides: list[list[Any]]) -> Any:
    import itertools

    return itertools.product(*sides)


def map_stateful(
    key_fn: Callable[[Any], Any], create: Callable[[], Any], fn: Callable[[Any, Any, Any], Any]
) -> Callable[[], MapStatefulP]:
    return functools.partial(MapStatefulP, key_fn, create, fn, None)


def rolling_aggregate(
    key_fn: Callable[[Any], Any], op: AggregateOperation[Any, Any, Any]
) -> Callable[[], MapStatefulP]:
    return functools.partial(MapStatefulP, key_fn, None, None, op)


def rolling_partials(
    key_fn: Callable[[Any], Any], op: AggregateOperation[Any, Any, Any]
) -> Callable[[], RollingPartialsP]:
    """The map side of a once-per-epoch rolling aggregate (:class:`RollingPartialsP`):
    put it before the distributed edge partitioned by ``operator.itemgetter(0)`` that
    leads to :func:`rolling_latest`."""
    return functools.partial(RollingPartialsP, key_fn, op)


def rolling_latest(op: AggregateOperation[Any, Any, Any]) -> Callable[[], RollingLatestP]:
    """The keyed side of a once-per-epoch rolling aggregate (:class:`RollingLatestP`);
    ``op`` must combine accumulators (``op.combine``)."""
    if op.combine is None:
        raise ValueError(
            "rolling_latest(op): op cannot combine accumulators (op.combine is None); a "
            "once-per-epoch rolling aggregate combines the partials of each epoch"
        )
    return functools.partial(RollingLatestP, op)


def hash_join(
    key_fns: list[Callable[[Any], Any]],
    build_key_fns: list[Callable[[Any], Any]],
    output_fn: Callable[..., Any],
    inner: bool,
) -> Callable[[], HashJoinP]:
    return functools.partial(HashJoinP, list(key_fns), list(build_key_fns), output_fn, inner)
