"""Batch aggregation processors (docs/semantics.md §8): the non-windowed rows of Jet's
aggregation matrix.

=========================  =====================================  ===========================
factory                    input                                  output in ``complete()``
=========================  =====================================  ===========================
``aggregate(op)``          items                                  exactly one ``finish(acc)``
``accumulate(op)``         items                                  exactly one ``acc``
``combine(op)``            accumulators                           exactly one ``finish(acc)``
``aggregate_by_key``       items                                  ``(key, finish(acc))`` per key
``accumulate_by_key``      items                                  ``(key, acc)`` per key
``combine_by_key(op)``     ``(key, acc)`` tuples                  ``(key, finish(acc))`` per key
=========================  =====================================  ===========================

The unkeyed processors emit one item **even with no input** (``finish(create())``);
the keyed ones emit nothing for no input. Two-stage aggregation is ``accumulate*`` on a
local edge followed by ``combine*`` on a distributed partitioned (keyed) or distributed
all-to-one (unkeyed) edge.

Operations are functional (``slipstream.aggregate``): the processors keep whatever
``accumulate``/``combine`` return.

Emission happens in ``complete()``, bounded by outbox room, and resumes on the next call
when the outbox is full. Once emission starts, the emitted entries leave the processor's
state, so a snapshot taken between two ``complete()`` calls holds only what was not
emitted yet.

Snapshots. Keyed processors keep their accumulators in a
:class:`~slipstream.state.keyed.KeyedState` and save it as one map whose entries restore
under the grouping key itself, so a restore (with any parallelism) routes each key to
the processor that owns its partition; if a key arrives twice, the two accumulators are
combined. While the job takes incremental snapshots, a save holds only the keys changed
(or emitted) since the previous one. Unkeyed
processors save their accumulator under the key ``("__acc__", global_processor_index)``:
every entry reaches exactly one processor on restore, and each processor *combines*
whatever entries it receives, so the total is counted exactly once whatever the new
parallelism (this needs ``op.combine`` when the saved total parallelism was above 1).
"""

from __future__ import annotations

import collections
import functools
import operator
from collections.abc import Callable, Sequence
from enum import Enum
from operator import itemgetter
from typing import Any

from slipstream.aggregate import AggregateOperation, counting, identity, is_identity
from slipstream.core.groups import GROUP_MAX, KeyedGroup
from slipstream.core.inbox import Inbox
from slipstream.core.item_errors import failed_position
from slipstream.core.processor import AbstractProcessor, Context
from slipstream.core.traits import BUFFERS_INPUT, KEYED, declare
from slipstream.core.validation import per_input_fns
from slipstream.state.keyed import fast_keyed_state, saved_entry

__all__ = [
    "aggregate",
    "accumulate",
    "combine",
    "aggregate_by_key",
    "accumulate_by_key",
    "combine_by_key",
]

Op = AggregateOperation[Any, Any, Any]

_MISSING: Any = object()
_builtin_map = map
_first = itemgetter(0)

# The accumulate primitive of ``counting()``: recognised to count keys at C speed.
_COUNT_ONE = counting().accumulate
_COUNT_CREATE = counting().create
_count_elements: Callable[[Any, Any], None] | None = getattr(collections, "_count_elements", None)

# Types whose values cannot be mutated in place: an accumulator of such a type can be
# created once and shared as the starting value of every key.
_IMMUTABLE_TYPES = (int, float, complex, bool, str, bytes, type(None), frozenset, Enum)

UNKEYED_SNAPSHOT_TAG = "__acc__"


def _is_immutable(value: Any) -> bool:
    if isinstance(value, tuple):
        return all(_is_immutable(v) for v in value)
    return isinstance(value, _IMMUTABLE_TYPES)


def _shared_initial(create: Callable[[], Any]) -> Any:
    """``create()``'s value if it is immutable (so one instance can seed every key),
    else ``_MISSING``. Two calls must give equal values: a create() that returns
    something different each time is not shared."""
    first = create()
    if not _is_immutable(first):
        return _MISSING
    try:
        same = bool(first == create())
    except Exception:  # noqa: BLE001 - odd __eq__: just do not share
        return _MISSING
    return first if same else _MISSING


def _check_op(op: Any, factory: str, *, needs_combine: bool = False) -> None:
    if not isinstance(op, AggregateOperation):
        raise TypeError(
            f"{factory}(): argument 'op' must be an AggregateOperation "
            f"(see slipstream.aggregate), got {op!r}"
        )
    if needs_combine and op.combine is None:
        raise ValueError(
            f"{factory}(): the AggregateOperation has no combine primitive, which "
            "combining accumulators needs"
        )


def _set_aside(p: AbstractProcessor, inbox: Inbox, it: Any, error: Exception) -> bool:
    """A function raised ``error`` on the item the loop over ``it`` (an iterator of
    ``inbox``) was on; the items before it are accumulated. ``True``: the policy set it
    aside, go on with ``it``; ``False``: re-raise."""
    return p.context.item_errors.handle(inbox[failed_position(len(inbox), it)], error)


# -- unkeyed -------------------------------------------------------------------------


class AggregateP(AbstractProcessor):
    """One accumulator over every item; emits exactly one result in ``complete()``.

    ``mode`` is ``"aggregate"`` (accumulate items, emit ``finish(acc)``),
    ``"accumulate"`` (accumulate items, emit ``acc``) or ``"combine"`` (items are
    accumulators, combined; emit ``finish(acc)``).

    At-least-once: after a restore, the items that arrived after the snapshot's barrier
    on some input and before the snapshot was taken are replayed, so they are counted
    twice. Exactly-once (or no restore) counts every item once.
    """

    slipstream_traits = frozenset({BUFFERS_INPUT})
    handles_item_errors = True  # accumulate (combine) raising on an item

    def __init__(self, op: Op, mode: str) -> None:
        self._op = op
        self._mode = mode
        fold = op.combine if mode == "combine" else op.accumulate
        assert fold is not None  # combine() checked it
        self._fold: Callable[[Any, Any], Any] = fold
        self._finish = identity if mode == "accumulate" else op.finish
        self._acc: Any = None
        self._result: Any = _MISSING
        self._restored_entries = 0

    def init_processor(self, context: Context) -> None:
        # pre-created: the result exists even when no item arrives
        self._acc = self._op.create()

    def process(self, ordinal: int, inbox: Inbox) -> None:
        fold = self._fold
        if ordinal and self._mode != "combine":  # co-aggregation: this input's function
            fold = self._op.accumulate_fn(ordinal)
        acc = self._acc
        it = iter(inbox)
        while True:
            try:
                for item in it:
                    acc = fold(acc, item)
            except Exception as e:  # the items before the bad one are in
                if not _set_aside(self, inbox, it, e):
                    self._acc = acc
                    raise
                continue
            break
        self._acc = acc
        inbox.clear()

    def complete(self) -> bool:
        result = self._result
        if result is _MISSING:
            result = self._result = self._finish(self._acc)
        # a refused result is kept in _result and offered again on the next call
        return self.outbox.offer(result)

    def save_to_snapshot(self) -> bool:
        ctx = self.context
        if self._op.combine is None and ctx.total_parallelism > 1:
            raise ValueError(
                f"vertex {ctx.vertex_name!r}: cannot snapshot an unkeyed {self._mode} "
                f"with total parallelism {ctx.total_parallelism}: its AggregateOperation "
                "has no combine primitive, and restoring needs to combine the saved "
                "accumulators of all processors"
            )
        return self.outbox.offer_to_snapshot(
            (UNKEYED_SNAPSHOT_TAG, ctx.global_processor_index), self._acc
        )

    def restore_from_snapshot_entry(self, key: Any, value: Any) -> None:
        if not (type(key) is tuple and len(key) == 2 and key[0] == UNKEYED_SNAPSHOT_TAG):
            raise ValueError(
                f"vertex {self.context.vertex_name!r}: unexpected snapshot entry key "
                f"{key!r} for an unkeyed {self._mode} processor"
            )
        self._restored_entries += 1
        if self._restored_entries == 1:
            # the accumulator is still the fresh one from create(): take the saved one
            self._acc = value
            return
        combine_fn = self._op.combine
        if combine_fn is None:
            raise ValueError(
                f"vertex {self.context.vertex_name!r}: restoring several saved "
                "accumulators needs an AggregateOperation with a combine primitive"
            )
        self._acc = combine_fn(self._acc, value)


# -- keyed ---------------------------------------------------------------------------


class GroupByKeyP(AbstractProcessor):
    """Accumulator per key; emits ``(key, result)`` tuples in ``complete()`` (key order is
    first-seen order).

    ``mode`` is ``"aggregate"`` (emit ``finish(acc)``), ``"accumulate"`` (emit ``acc``) or
    ``"combine"`` (input items are ``(key, acc)`` tuples; emit ``finish(acc)``).

    At-least-once: after a restore, items that arrived after the snapshot barrier on
    some input but before the snapshot was taken are replayed and accumulated twice for
    their keys. Exactly-once (or no restore) accumulates every item once.

    ``groups`` is a :class:`~slipstream.state.keyed.KeyedState` (a plain dict when
    nothing is tracked: ``fast_keyed_state``): while the job takes
    incremental snapshots each changed key is marked (at C speed where the loop runs at
    C speed: counting, combining), and during emission the emitted keys leave it at the
    next save (as removed keys) or at the end.
    """

    slipstream_traits = frozenset({BUFFERS_INPUT})
    handles_item_errors = True  # the key function and accumulate raising on an item

    def __init__(self, key_fn: Any, op: Op, mode: str, groups_out: bool = False) -> None:
        # one key function per input ordinal (co-grouping), or None for combine
        self._key_fns: tuple[Any, ...] = key_fn if isinstance(key_fn, tuple) else (key_fn,)
        self._key_fn = self._key_fns[0]
        self._op = op
        self._mode = mode
        self.groups: dict[Any, Any] = {}  # replaced in init_processor
        self._initial: Any = _MISSING
        self._counting = False
        self._key_is_identity = False
        self._finish = identity if mode == "accumulate" else op.finish
        # emission state: the (key, acc) pairs not emitted yet, from position _pos; those
        # before _gone have left ``groups`` too (at a save)
        self._results: list[tuple[Any, Any]] | None = None
        self._pos = 0
        self._gone = 0
        # stage 1 of the Pipeline's two-stage aggregation: the accumulators leave as
        # KeyedGroup items (accumulate_by_key_groups)
        self._groups_out = groups_out and mode == "accumulate"

    def init_processor(self, context: Context) -> None:
        self.groups = fast_keyed_state(context)
        op = self._op
        self._key_is_identity = is_identity(self._key_fn)
        self._initial = _shared_initial(op.create)
        self._counting = (
            self._mode != "combine"
            and op.accumulate is _COUNT_ONE
            and op.create is _COUNT_CREATE
            and _count_elements is not None
        )

    def process(self, ordinal: int, inbox: Inbox) -> None:
        if self._mode == "combine":
            self._combine_inbox(inbox)
        elif self._counting and not ordinal:
            dirty = getattr(self.groups, "dirty", None)
            # an identity key function (``lambda w: w``) is not called per item
            if self._key_is_identity:
                _count_elements(self.groups, inbox)  # type: ignore[misc]
                if dirty is not None:
                    dirty.update(inbox)
            elif dirty is not None:
                self._count_marked(inbox, dirty)
            else:
                it = iter(inbox)
                while True:
                    try:
                        _count_elements(self.groups, _builtin_map(self._key_fn, it))  # type: ignore[misc]
                    except Exception as e:  # the keys before the bad item are counted
                        if not _set_aside(self, inbox, it, e):
                            raise
                        continue
                    break
            inbox.clear()
        else:
            self._accumulate_inbox(ordinal, inbox)

    def counting_map(self, ordinal: int) -> dict[Any, Any] | None:
        """The map :meth:`process` counts the items of input ``ordinal`` into when that
        is all it does with them (``counting()``, the item itself the key, no key
        tracked for incremental snapshots, no emission begun), else ``None``. A fused
        ``flat_map`` in front counts its results into it with
        :func:`~slipstream.core.counting.count_flat_mapped`, one item's results at a
        time, instead of handing a chunk's results over through an inbox first."""
        if ordinal or not (self._counting and self._key_is_identity) or self._results is not None:
            return None
        groups = self.groups
        return groups if type(groups) is dict else None

    def _count_marked(self, inbox: Inbox, dirty: set[Any]) -> None:
        """Counting by a key function while keys are tracked: the keys go to a list at C
        speed (``extend`` keeps those before an item whose key function raised), which
        is then counted and marked."""
        keys: list[Any] = []
        it = iter(inbox)
        try:
            while True:
                try:
                    keys.extend(_builtin_map(self._key_fn, it))
                except Exception as e:  # the keys before the bad item are in the list
                    if not _set_aside(self, inbox, it, e):
                        raise
                    continue
                break
        finally:
            _count_elements(self.groups, keys)  # type: ignore[misc]
            dirty.update(keys)
        inbox.clear()

    def _accumulate_inbox(self, ordinal: int, inbox: Inbox) -> None:
        d = self.groups
        dirty = getattr(d, "dirty", None)
        get = d.get
        acc_fn = self._op.accumulate
        key_fn = self._key_fn
        if ordinal:  # co-grouping: this input's key and accumulate functions
            acc_fn = self._op.accumulate_fn(ordinal)
            if ordinal >= len(self._key_fns):
                raise ValueError(
                    f"vertex {self.context.vertex_name!r}: items arrived on input ordinal "
                    f"{ordinal} but there are key functions for {len(self._key_fns)} input(s)"
                )
            key_fn = self._key_fns[ordinal]
        assert key_fn is not None
        initial = self._initial
        create = self._op.create
        missing = _MISSING
        it = iter(inbox)
        while True:
            try:
                if initial is not _MISSING:
                    for item in it:
                        k = key_fn(item)
                        d[k] = acc_fn(get(k, initial), item)
                        if dirty is not None:
                            dirty.add(k)
                else:
                    for item in it:
                        k = key_fn(item)
                        acc = get(k, missing)
                        if acc is missing:
                            d[k] = acc_fn(create(), item)
                            if dirty is not None:
                                dirty.add(k)
                        else:
                            if dirty is not None:  # before: it may change acc in place
                                dirty.add(k)
                            d[k] = acc_fn(acc, item)
            except Exception as e:  # the items before the bad one are in
                if not _set_aside(self, inbox, it, e):
                    raise
                continue
            break
        inbox.clear()

    def _combine_inbox(self, inbox: Inbox) -> None:
        if inbox and type(inbox[0]) is KeyedGroup:
            self._combine_groups(inbox)
            return
        d = self.groups
        get = d.get
        combine_fn = self._op.combine
        assert combine_fn is not None
        initial = self._initial
        try:
            if initial is not _MISSING:
                for k, acc in inbox:
                    d[k] = combine_fn(get(k, initial), acc)
            else:
                # combine into a fresh accumulator rather than adopting the incoming
                # one: the sender (or a broadcast sibling) may still hold it
                create = self._op.create
                missing = _MISSING
                for k, acc in inbox:
                    mine = get(k, missing)
                    if mine is missing:
                        mine = create()
                    d[k] = combine_fn(mine, acc)
        except (TypeError, ValueError) as e:
            bad = next((x for x in inbox if not (isinstance(x, tuple) and len(x) == 2)), _MISSING)
            if bad is not _MISSING:
                raise TypeError(
                    f"vertex {self.context.vertex_name!r}: combine_by_key expects "
                    f"(key, accumulator) tuples, got {bad!r}"
                ) from e
            raise
        dirty = getattr(d, "dirty", None)
        if dirty is not None:
            dirty.update(_builtin_map(_first, inbox))
        inbox.clear()

    def _combine_groups(self, inbox: Inbox) -> None:
        """Combine stage 1's :class:`~slipstream.core.groups.KeyedGroup` items
        (:func:`accumulate_by_key_groups`; a ``(key, acc)`` pair among them as one
        entry). With an additive op (counting, summing: ``combine`` is ``+``) an entry
        is added inline, and a group none of whose keys are here yet is taken with one
        ``dict.update``: each accumulator is one of stage 1's, which began as
        ``create()`` (``0``), so ``0 + acc`` would be ``acc`` again (as the window's
        stage 2 does with a new frame). Why groups: with ``processes=2`` each member's
        stage 1 emits an accumulator for nearly every key at its end (a word count's
        ~50,000 words in each member), and as pairs each costs a tuple, a key read in the
        split, a pickled tuple when it crosses and a call of ``combine`` here
        (docs/performance.md, "Scaling 1 -> 2: where the second process loses")."""
        d = self.groups
        get = d.get
        combine_fn = self._op.combine
        assert combine_fn is not None
        initial = self._initial
        create = self._op.create
        missing = _MISSING
        dirty = getattr(d, "dirty", None)
        inline_add = self._op.additive is not None and combine_fn is operator.add
        for item in inbox:
            if type(item) is KeyedGroup:
                entries = item.entries
            else:
                try:
                    k, acc = item
                except (TypeError, ValueError) as e:
                    raise TypeError(
                        f"vertex {self.context.vertex_name!r}: combine_by_key expects "
                        f"(key, accumulator) tuples, got {item!r}"
                    ) from e
                entries = {k: acc}
            if inline_add:
                if type(d) is dict and d.keys().isdisjoint(entries):
                    d.update(entries)
                else:
                    for k, acc in entries.items():
                        d[k] = get(k, 0) + acc
            elif initial is not _MISSING:
                for k, acc in entries.items():
                    d[k] = combine_fn(get(k, initial), acc)
            else:
                # a fresh accumulator, not the incoming one (see _combine_inbox)
                for k, acc in entries.items():
                    mine = get(k, missing)
                    if mine is missing:
                        mine = create()
                    d[k] = combine_fn(mine, acc)
            if dirty is not None:
                dirty.update(entries)
        inbox.clear()

    def complete(self) -> bool:
        results = self._results
        if results is None:
            # freeze the state into a list: emitted entries then leave the state by
            # advancing _pos; a snapshot between calls takes them out of ``groups``
            results = self._results = list(self.groups.items())
            self._pos = self._gone = 0
        pos = self._pos
        end = len(results)
        if pos >= end:
            return True
        outbox = self.outbox
        buckets = outbox.buckets
        finish = self._finish
        if outbox.data_ordinal_count == 1:
            bucket = buckets[0]
            room = outbox.capacity - len(bucket)
            if room <= 0:
                return False
            stop = min(end, pos + room)
            if self._groups_out:
                # one item of room per group of at most GROUP_MAX entries
                stop = min(end, pos + room * GROUP_MAX)
                bucket.extend(
                    [
                        KeyedGroup(None, dict(results[i : min(stop, i + GROUP_MAX)]))
                        for i in range(pos, stop, GROUP_MAX)
                    ]
                )
            elif finish is identity:
                bucket.extend(results[pos:stop])
            else:
                bucket.extend([(k, finish(a)) for k, a in results[pos:stop]])
            self._pos = stop
        else:
            offer = outbox.offer
            while pos < end:
                k, a = results[pos]
                if not offer((k, finish(a))):
                    self._pos = pos
                    return False
                pos += 1
            self._pos = pos
        if self._pos >= end:
            groups = self.groups
            dirty = getattr(groups, "dirty", None)
            if dirty is not None:  # the keys not taken out at a save yet
                dirty.update(groups)
            groups.clear()
            self._results = None
            self._pos = self._gone = 0
            return True
        return False

    def _saved_map(self) -> list[tuple[Any, Any]]:
        """The one entry of a save: ``groups``, without the entries emitted since the
        previous save (taken out now, so a save costs what changed)."""
        groups = self.groups
        results = self._results
        if results is not None and self._pos > self._gone:
            gone = results[self._gone : self._pos]
            for k in _builtin_map(_first, gone):
                del groups[k]
            dirty = getattr(groups, "dirty", None)
            if dirty is not None:
                dirty.update(_builtin_map(_first, gone))
            self._gone = self._pos
        return [saved_entry(groups)]

    def save_to_snapshot(self) -> bool:
        return self.save_state(self._saved_map)

    def restore_from_snapshot_entry(self, key: Any, value: Any) -> None:
        d = self.groups
        if key in d:
            combine_fn = self._op.combine
            if combine_fn is None:
                raise ValueError(
                    f"vertex {self.context.vertex_name!r}: key {key!r} was restored "
                    "twice and the AggregateOperation has no combine primitive to merge "
                    "the two accumulators"
                )
            d[key] = combine_fn(d[key], value)
        else:
            d[key] = value


# -- factories -----------------------------------------------------------------------


def aggregate(op: Op) -> Callable[[], AggregateP]:
    """One result, ``op.finish(acc)`` over all items (also with no input).

    Use parallelism 1 behind an all-to-one edge for a global result, or
    ``accumulate`` + ``combine`` for two stages.
    """
    _check_op(op, "aggregate")
    return functools.partial(AggregateP, op, "aggregate")


def accumulate(op: Op) -> Callable[[], AggregateP]:
    """Stage 1 of a two-stage unkeyed aggregation: emits this processor's accumulator."""
    _check_op(op, "accumulate")
    return functools.partial(AggregateP, op, "accumulate")


def combine(op: Op) -> Callable[[], AggregateP]:
    """Stage 2 of a two-stage unkeyed aggregation: combines received accumulators and
    emits ``op.finish`` of the total."""
    _check_op(op, "combine", needs_combine=True)
    return functools.partial(AggregateP, op, "combine")


KeyFns = Callable[[Any], Any] | Sequence[Callable[[Any], Any]]


def aggregate_by_key(key_fn: KeyFns, op: Op) -> Callable[[], GroupByKeyP]:
    """``(key, op.finish(acc))`` per distinct ``key_fn(item)``.

    Co-grouping: with an ``op`` of several inputs (``co_aggregate``), ``key_fn`` may be a
    list with one key function per inbound edge (ordinal); items of every input that
    share a key are aggregated together, each input by its own component op.
    """
    _check_op(op, "aggregate_by_key")
    key_fns = per_input_fns(key_fn, "key_fn", "aggregate_by_key()", op.arity)
    return declare(functools.partial(GroupByKeyP, key_fns, op, "aggregate"), KEYED, BUFFERS_INPUT)


def accumulate_by_key(key_fn: KeyFns, op: Op) -> Callable[[], GroupByKeyP]:
    """Stage 1 of a two-stage keyed aggregation: ``(key, acc)`` per distinct key (one
    key function per input as in :func:`aggregate_by_key`)."""
    _check_op(op, "accumulate_by_key")
    key_fns = per_input_fns(key_fn, "key_fn", "accumulate_by_key()", op.arity)
    return functools.partial(GroupByKeyP, key_fns, op, "accumulate")


def accumulate_by_key_groups(key_fn: KeyFns, op: Op) -> Callable[[], GroupByKeyP]:
    """Stage 1 of the Pipeline's two-stage keyed aggregation: :func:`accumulate_by_key`
    whose accumulators leave at its end as :class:`~slipstream.core.groups.KeyedGroup`
    items (head ``None``, at most ``GROUP_MAX`` keys each) instead of ``(key, acc)``
    pairs. Only :func:`combine_by_key` takes them (the Pipeline compiler wires nothing
    else behind it); a partitioned edge splits a group by its keys. Not part of the Core
    API: :func:`accumulate_by_key`'s pairs are what user processors read."""
    _check_op(op, "accumulate_by_key")
    key_fns = per_input_fns(key_fn, "key_fn", "accumulate_by_key()", op.arity)
    return functools.partial(GroupByKeyP, key_fns, op, "accumulate", True)


def combine_by_key(op: Op) -> Callable[[], GroupByKeyP]:
    """Stage 2 of a two-stage keyed aggregation: input items are ``(key, acc)`` tuples;
    emits ``(key, op.finish(combined acc))`` per key. Put it behind a distributed edge
    partitioned by ``slipstream.entry_key``."""
    _check_op(op, "combine_by_key", needs_combine=True)
    return declare(functools.partial(GroupByKeyP, None, op, "combine"), KEYED, BUFFERS_INPUT)
