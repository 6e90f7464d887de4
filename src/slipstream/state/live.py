"""Copy-on-write saves of keyed state: no stop-the-world copy at the barrier.

A :class:`~slipstream.state.keyed.KeyedState` whose values are never changed in place
(``values_replaced``: numbers, strings, tuples of such, replaced with ``d[k] = new``)
saves in a job that drives its saves (``context.live_saves``, the embedded engine's
tasklet) as a :class:`LiveSave`: at the barrier the save takes O(1) work (it notes the
map's size and swaps the map's class for ``_OverlayKeyedState`` (a full save) or
``_SavingKeyedState`` (a delta), whose mutators record a
key's pre-barrier value the first time the key is written or removed after the
barrier); the tasklet then calls :meth:`LiveSave.step` between two ``process()`` calls,
each time encoding a bounded slice of the saved content, read from the live map or the
recorded pre-barrier values, until the save is complete; the map gets its class back.
The store thread waits for the save (:meth:`LiveSave.result`) and writes the encoded
slices as the chunk's payload (:func:`slipstream.state.format.encode_payload`): a chunk
that decodes to exactly the map as it was at the barrier, as the copy did, with no copy
of the map in memory (the slices are encoded bytes) and no long hold of the GIL by the
store thread (the encoding happened in the steps). A slice is a batch of the columnar
encoding (:class:`~slipstream.state.columnar.EncodedBatches`: keys and values of simple
types, cheaper to encode than the pickle) or, from the first slice that does not fit
it on, pickle fragments (:class:`EncodedMap`).

A *full* save walks the live map in insertion order with one dict iterator, which an
insertion would end (and finding the place again costs a pass over the part already
encoded: at a few million keys a step of tens of ms, holding the GIL, that lands in
every other processor's pause). So while a full save is in progress the map's class is
``_OverlayKeyedState``: a key inserted after the barrier goes into the save's overlay
(:attr:`LiveSave.new`), which every read of the map consults after the map itself, and
the map's size stays that of the barrier. Each slice reads its keys' live values and,
for a key written since the barrier, its recorded pre-barrier value (C-speed maps over
the slice; nothing is left for a last step that grows with the number of keys written).
Once the content is produced the overlay is merged into the map in steps of the same
size; then the map gets its class back. A removal while a full save is in progress
makes the rest of the save at once (the processors that save copy-on-write do not
remove keys; a custom one that does pays that then). A *delta* walks the changed keys
(a set nobody changes any more) and reads each one's value from the live map or its
recorded pre-barrier value, which is recorded only for a changed key (one of the set):
in the uniform pattern the keys written while a delta is produced are other keys than
the delta's, and recording them all cost ~100 bytes and a dict insertion each; keys
inserted meanwhile go into the map itself.

A full save of a map whose processor writes its changes into a layer (the additive
rolling aggregates, ``KeyedState.layered``) is neither: it is a walk of the whole map
as a tail save walks the map's tail (:meth:`LiveSave.tail`), the map unwritten
meanwhile, its keys and values read by two dict iterators in step. A delta of such a
map is produced beside a layer too (:attr:`LiveSave.beside_layer`): no pre-barrier
value is recorded, the map holds them until the delta is produced.

A slice whose keys or values the fast pickler cannot encode (``cloudpickle`` needed, a
recursive key) turns the save into a plain ``dict`` of the content, encoded by the store
thread as any other.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import signal
import sys
import threading
import time
import weakref
from collections.abc import Callable
from itertools import filterfalse, islice, repeat
from operator import is_
from typing import Any

from slipstream.core.resident import resident_kb
from slipstream.state.columnar import CHEAPER_KEYS, EncodedBatches

__all__ = [
    "LIVE_SAVE_MIN_KEYS",
    "LIVE_SAVE_FORK_MIN",
    "LIVE_SAVE_FULL_SLICE",
    "LIVE_SAVE_SLICE",
    "LIVE_SAVE_STEP",
    "LIVE_SAVE_STEP_S",
    "TAIL",
    "EncodedMap",
    "LiveSave",
    "fork_expected",
    "pushed",
    "setitems_fragment",
]

#: a map with fewer keys (a full save) or fewer changed keys (a delta) is copied at the
#: barrier as before: that costs less than the bookkeeping
LIVE_SAVE_MIN_KEYS = 20_000
#: entries encoded per step at most (the tasklet's budget)
LIVE_SAVE_STEP = 32_768
#: a step works in slices of at most this many entries and stops after the slice that
#: took it past :data:`LIVE_SAVE_STEP_S`: reading a delta's changed keys looks each key
#: up in the map, a few cache misses a key, and at 10M keys that
#: was 1.5-3.5 us a key on this 2-core machine (a 32,768-key step of 55-240 ms, which a
#: tasklet on the same thread counted in its pause); 1,024 lookups stay a few ms
LIVE_SAVE_SLICE = 1024
#: a full save's walk of the map reads it in order, and its overlay's merge copies keys
#: to the map's end (a fraction of that per key): larger slices, fewer column batches
LIVE_SAVE_FULL_SLICE = 16_384
#: the time after which a step stops at the end of its current slice
LIVE_SAVE_STEP_S = 0.003

#: a tail save (:meth:`LiveSave.tail`) of at least this many keys of the map (a creation
#: pass's new keys, or a full save's walk of a layered map) is encoded by a child process
#: forked at its first step, which writes the pickle fragments into a memory file and its
#: answer on a pipe, instead of in steps on the processor's thread (``None``: never; Linux
#: only). Encoding costs ~42 ns a pair of ints there (~0.45 s of the processor's thread for
#: a 10M-key creation pass); the fork 2-3 ms per 100 MB of the process
#: (:data:`LIVE_SAVE_FORK_MAX_S`; 7-9 ms at 10M keys), and the writes the processor
#: makes while the child lives copy their pages (a loop model of a 10M-key creation pass,
#: three tails of 2.5M keys: 1.33-1.35 s against 1.57-1.60 s encoded on the thread)
LIVE_SAVE_FORK_MIN: int | None = 1_000_000
#: a tail save forks only while the fork is expected to take at most this long (the
#: processor's thread waits for it, between two ``process()`` calls; half the pause
#: target): a fork copies the process's page tables, 2-3 ms per 100 MB of resident memory
#: on this 2-core guest, a little more per MB the larger the process (5.8 ms at 2.7M
#: keys, 10.5 ms at 5.5M, 17.2 ms at 8.5M in the 10M-key skewed bench job), predicted
#: from the process's resident size and the last fork's time per byte, never below
#: :data:`_FORK_S_PER_BYTE_MIN` (a 10M-key uniform run whose first fork was quick forked
#: again at ~550 MB: 18.8 ms)
LIVE_SAVE_FORK_MAX_S = 0.010
_FORK_S_PER_BYTE_MIN = 2.5e-11  # 2.5 ms per 100 MB
_fork_s_per_byte = _FORK_S_PER_BYTE_MIN
#: the store thread reads a forked encoder's output in pieces of at most this size (one
#: read of all of it, ~25 MB at 3M keys, raised glibc's mmap threshold to that size, and
#: the heap then kept up to twice as much of freed memory: +45 MB of peak RSS at 10M keys)
_READ_PIECE = 4 << 20
#: a forked encoder that nobody reads from for this long ends (SIGALRM)
FORK_CHILD_TIMEOUT_S = 600
_CAN_FORK = sys.platform.startswith("linux") and hasattr(os, "fork")
#: set once a forked encoder met what the fast pickler cannot encode: later tail saves of
#: this process encode in steps (which hand such content to the store thread as a dict)
_fork_unencodable = False

#: :attr:`LiveSave.mode` of a delta of a layered map: the keys inserted since the last
#: save (the map's tail in insertion order) and the layer (see :meth:`LiveSave.tail`)
TAIL = "tail"

ABSENT: Any = object()  # a key that was not in the map at the barrier
_ABSENT = ABSENT
_MISSING: Any = object()


def _columns_cheaper(state: Any, keys: Any) -> bool:
    """Whether this save's slices should be column batches: its first key (of the map,
    or of a delta's changed keys) is a str or bytes, whose maps encode as columns for
    less than the pickle fragments cost (:data:`~slipstream.state.columnar.CHEAPER_KEYS`;
    for numbers the pickle costs less, and compaction makes their base columnar later,
    off the processing threads)."""
    first = next(iter(dict.keys(state) if keys is None else keys), None)
    return type(first) in CHEAPER_KEYS


class EncodedMap:
    """A saved map's content as pickle fragments: each part pushes ``MARK k1 v1 ... kn vn
    SETITEMS`` onto a dict at the top of the unpickler's stack (see
    :func:`slipstream.state.format.encode_payload`); ``count`` entries in all (a key
    appears once)."""

    __slots__ = ("parts", "count")

    def __init__(self, parts: list[bytes], count: int) -> None:
        self.parts = parts
        self.count = count

    def __len__(self) -> int:
        return self.count

    def to_dict(self) -> dict[Any, Any]:
        """The content as a dict (our own fragments, just encoded in this process)."""
        return pickle.loads(b"\x80\x03}" + b"".join(self.parts) + b".")  # type: ignore[no-any-return]


def setitems_fragment(keys: list[Any], values: list[Any]) -> bytes:
    """``MARK k1 v1 ... SETITEMS`` for the pairs (protocol 3, no memo: fragments of
    separate pickler runs can be put together). Raises what the pickler raises."""
    n = len(keys)
    if not n:
        return b""
    flat: list[Any] = [None] * (2 * n)
    flat[0::2] = keys
    flat[1::2] = values
    buf = io.BytesIO()
    p = pickle.Pickler(buf, 3)
    p.fast = True  # no memo (no BINPUT/BINGET that would clash between fragments)
    p.dump(tuple(flat))
    raw = buf.getbuffer()
    if n == 1:  # PROTO 3, k, v, TUPLE2, STOP
        return b"(" + bytes(raw[2:-2]) + b"u"
    # PROTO 3, MARK, k1, v1, ..., TUPLE, STOP
    return bytes(raw[2:-2]) + b"u"


def pushed(objs: tuple[Any, ...]) -> bytes:
    """Pickle opcodes that push each of ``objs`` onto the unpickler's stack (protocol 3,
    no memo: they can be put between other fragments)."""
    pad = max(0, 4 - len(objs))  # a tuple of 4 or more: MARK ... TUPLE
    buf = io.BytesIO()
    p = pickle.Pickler(buf, 3)
    p.fast = True
    p.dump(tuple(objs) + (None,) * pad)
    raw = buf.getbuffer()
    return bytes(raw[3:-2]) + b"0" * pad  # no PROTO, MARK, TUPLE, STOP; POP the padding


class LiveSave:
    """A save of a keyed-state map as of a barrier, produced in steps (module doc).

    ``mode`` is ``"full"`` or ``"delta"`` (``keys``: the changed keys). It stands in a
    :class:`~slipstream.state.keyed.StateMapSave`'s ``upserts`` until the store thread
    takes :meth:`result`; ``detached`` tells the engine that no copy is needed (the
    content is produced from the pre-barrier values only)."""

    detached = True

    def __init__(
        self,
        state: Any,
        snapshot_id: int,
        mode: str,
        keys: Any = None,
        spilled: Callable[[list[Any]], bool] | None = None,
        sealed: list[Any] | None = None,
        encoded: tuple[list[bytes], int, bool | None] | None = None,
    ) -> None:
        self.state = state
        self.snapshot_id = snapshot_id
        self.mode = mode
        #: pre-barrier value of every key written or removed since the barrier (a
        #: delta: of its changed keys only) (``_ABSENT``: the key was not in the map);
        #: ``None`` once the content is produced (nothing to record any more)
        self.old: dict[Any, Any] | None = {}
        #: a full save's overlay: the keys inserted since the barrier, with their values,
        #: kept out of the map until its pre-barrier keys are encoded (an insertion would
        #: end the dict iterator the slices are read with); merged into the map in steps
        #: afterwards. ``None`` for a delta (it walks its own set of keys)
        self.new: dict[Any, Any] | None = {} if mode == "full" else None
        #: how many of the overlay's keys (the first ones, in its order) are in the map
        #: already: the merge copies them in order and leaves the overlay as it is (its
        #: size never changes once the content is produced: keys inserted then go into
        #: the map), so one iterator walks it, at C speed
        self.merged = 0
        self._mit: Any = None  # the merge's iterator over ``new.items()``
        #: the encoded content: column batches while every slice fits the columnar
        #: encoding (:mod:`~slipstream.state.columnar`), pickle fragments after one
        #: did not
        self.columns: EncodedBatches | None = (
            EncodedBatches()
            if _columns_cheaper(state, next((k for k in (*(sealed or ()), keys) if k), keys))
            else None
        )
        self.parts: list[bytes] = []
        self.out: dict[Any, Any] | None = None  # the content, if it could not be encoded
        self.count = 0  # entries produced
        self.removed: list[Any] = []  # a delta's removed keys
        self.size = len(state) if keys is None else len(keys) + sum(map(len, sealed or ()))
        #: a delta whose content starts with pairs encoded already (``KeyedState.
        #: mark_pairs``: ``(fragments, pairs, spill)``): the keys of ``keys`` and
        #: ``sealed`` follow, read from the map (their value at the barrier counts)
        self.encoded = encoded is not None
        if encoded is not None:
            self.columns = None
            self.parts = list(encoded[0])
            self.count = encoded[1]
            self.size += encoded[1]
        self._it: Any = None  # full: an iterator over the map's keys
        #: full, tail: an iterator over the map's values in step with ``_it``: both walk
        #: the same entries of the dict's table in the same order, and nothing is
        #: inserted meanwhile (a size change ends the walk as it ends ``_it``). Not a
        #: lookup per key: a ``dict`` subclass is subscripted through a Python-level
        #: slot (``dict.__getitem__`` is a method, so ``KeyedState`` gets CPython's
        #: ``slot_mp_subscript``: a type lookup and a method call per key), and
        #: ``itemgetter(*keys)(state)`` cost 21 ns a key against 8 for the iterator
        #: (3M keys; a plain dict's 9)
        self._vit: Any = None
        self._rest: list[Any] | None = None  # full: the keys still to encode, once listed
        self._rest_at = 0  # how many were encoded when they were listed
        self._it_len = -1  # full: the map's size when ``_it`` was made
        self._kit: Any = None  # delta: the iterator over the changed keys
        self._set_at = 0  # delta: which of its sets ``_kit`` walks (the last: ``_keys``)
        self._tail = 0  # tail: how many keys the map's tail holds
        #: tail: the tail is the whole map and there is no layer (a full save of a layered
        #: map, ``KeyedState._full_walk``): walked from the start, in the map's order
        self.whole = False
        #: the map's owner writes a layer while this save is produced (a tail save, or
        #: a delta of a layered map: ``KeyedState._layered_delta``), so nothing writes the
        #: map until then: no pre-barrier value is recorded, and the keys new to the map
        #: that the owner meets go into :attr:`fresh`. The save is the owner's
        #: ``_merge``; once produced it inserts ``fresh`` (and a tail save's layer) into
        #: the map in steps (:meth:`_layer_step`)
        self.beside_layer = False
        self._tail_done = 0  # tail: how many of them are produced
        self._layer: dict[Any, Any] | None = None  # tail: the layer saved with it
        #: tail: what is written into the map after the walk (the layer, or the owner's
        #: retained layers); ``None``: nothing
        self._into_map: dict[Any, Any] | None = None
        self._common: set[Any] = set()  # tail: the layer's keys the tail held
        #: tail: the keys new to the map that its owner's processor met while the tail
        #: was walked (no insertion then: it would end the walk's iterator), with their
        #: values: an overlay the processor reads after the map. They go into the map
        #: once the walk is done (:meth:`_layer_step`, :meth:`_release`), where they are
        #: the next delta's tail; not into the layer, which then never holds a key the
        #: map lacks (written into the map later, such a key would join the map's tail
        #: again and be saved twice) and stays empty during a creation pass (no retained
        #: layer to look in, no layer to intersect with the next tail)
        self.fresh: dict[Any, Any] = {}
        #: tail: ``fresh``'s keys in the order they were met (the processor appends each
        #: key it adds to ``fresh``, which it does only during the walk: after it, a
        #: key new to both goes into the map at once): they go into the map a step's
        #: budget at a time, with no copy of ``fresh``'s keys (2M of them took 28 ms)
        #: and no big write at the end (when keys met after the walk joined ``fresh``
        #: too, a 10M-key creation pass had a 108 ms step)
        self.fresh_order: list[Any] = []
        self._fresh_done = 0  # tail: how many of ``fresh_order``'s keys are in the map
        #: a delta: its changed keys (the set of marks taken at the barrier; nobody
        #: changes it any more)
        self._keys = keys
        #: a delta: the interval's sealed sets of marks (``KeyedState.seal_marks``),
        #: older than ``_keys``; a key may be in several: it is saved once (a layered
        #: map's are lists, produced beside its layer: a key of two is saved twice,
        #: with the same value)
        self._sealed: tuple[Any, ...] = tuple(sealed or ())
        self._done = threading.Event()
        self._error: BaseException | None = None
        #: tail: the child encoding the content (:meth:`_forked_tail`): its pid, the pipe
        #: it answers on and the memory file it writes, read by :meth:`result`;
        #: ``_reaper`` kills and reaps it and closes both (once)
        self._child: tuple[int, int, int] | None = None
        self._reaper: Any = None
        self._fork_tried = False
        self.steps = 0
        #: the longest step, seconds (the processor's thread was busy with it)
        self.step_max_s = 0.0
        #: with ``spilled`` (whether one of a list of keys goes to another processor at a
        #: restore, ``Context.spilled_keys``): whether one saved key does, checked as the
        #: slices are produced (the keys are at hand there; the store thread gets them
        #: encoded). The member processes record it as the chain's spill flag
        #: (engine/member_snapshots.py). ``None``: not checked
        self.spill: bool | None = None if spilled is None else False
        if encoded is not None and self.spill is False:
            self.spill = encoded[2]  # (None: the pairs' keys were not checked)
        self._spilled = spilled

    def __len__(self) -> int:
        return self.size

    def tail(
        self, count: int, layer: dict[Any, Any], into_map: dict[Any, Any] | None = None
    ) -> None:
        """Make this save (mode :data:`TAIL`) the delta of a layered map: its last
        ``count`` keys in insertion order (inserted since the last save; nothing writes
        them in the map until the save is complete: the map's owner writes a new layer,
        and inserts no key while the tail is walked) with their values, or the layer's
        for a key in both, and ``layer``'s other entries; then ``layer`` is written into
        the map (the owner reads it meanwhile as its ``frozen``): ``into_map`` is what is
        written (the layer, or the owner's retained layers, its ``frozen``, which hold
        it), ``None``: nothing (the owner retains the layer)."""
        self._tail = count
        self._layer = layer
        self._into_map = into_map
        self.size = count + len(layer)
        self.whole = count == dict.__len__(self.state) and not layer
        self.beside_layer = True

    @property
    def done(self) -> bool:
        return self._done.is_set()

    # -- the map's mutators call these (the processor's thread) -------------------------
    def before_remove(self, state: Any, key: Any) -> None:
        """``key`` (in the map) is about to be removed (a delta: a full save calls
        :meth:`finish` first, see ``_OverlayKeyedState``)."""
        old = self.old
        keys = self._keys
        if old is not None and key not in old and (
            keys is None or key in keys or self.in_sealed(key)
        ):
            old[key] = dict.__getitem__(state, key)

    def in_sealed(self, key: Any) -> bool:
        """Whether ``key`` is in one of the delta's sealed sets of marks (the interval's
        marks before its last set: ``KeyedState.seal_marks``)."""
        return any(key in keys for keys in self._sealed)

    def produced(self) -> bool:
        """Whether the save's content is produced (a tail save: its walk of the map is
        over; what is left is putting its new keys and layer into the map)."""
        return self._done.is_set()

    # -- production (the processor's thread) ---------------------------------------------
    def step(self, budget: int) -> bool:
        """Produce up to ``budget`` more entries, in slices (:data:`LIVE_SAVE_SLICE`),
        stopping early once the step took :data:`LIVE_SAVE_STEP_S`; ``True`` once the
        save is complete (the map has its class back)."""
        if self._done.is_set() and self.state is None:
            return True
        t0 = time.perf_counter()
        left = budget
        try:
            while True:
                merging = self._done.is_set()
                # a full save's walk and its overlay's merge copy keys in order; a
                # delta looks each of its keys up
                # (a tail save's layer is written into the map at random places, as a
                # delta's keys are read: small slices)
                size = (
                    LIVE_SAVE_SLICE
                    if self.mode == "delta" or (merging and self.beside_layer)
                    else LIVE_SAVE_FULL_SLICE
                )
                n = left if left < size else size
                if merging:
                    finished = self._merge_step(n)
                else:
                    if self.mode == "full":
                        produced = self._full_step(n)
                    elif self.mode == TAIL:
                        produced = self._forked_tail() or self._tail_step(n)
                    else:
                        produced = self._delta_step(n)
                    if produced:
                        self._complete()
                    finished = self.state is None
                left -= n
                if finished or left <= 0 or time.perf_counter() - t0 >= LIVE_SAVE_STEP_S:
                    break
        except BaseException as e:  # noqa: BLE001 - handed to the store thread
            if self._done.is_set():  # merging the overlay: the content is taken already
                raise
            self._fail(e)
            finished = True
        self.steps += 1
        dt = time.perf_counter() - t0
        if dt > self.step_max_s:
            self.step_max_s = dt
        return finished

    def finish(self, timed: bool = True) -> None:
        """Produce the rest now, and merge the overlay into the map (the processor is
        closing, or the map changes in a way the save does not follow: a removal during
        a full save, ``clear()``).
        ``timed=False``: not counted as a step (the processor is closing)."""
        longest = self.step_max_s
        while not self.step(1 << 62):
            pass
        if not timed:
            self.step_max_s = longest

    def _full_step(self, budget: int) -> bool:
        state = self.state
        pos = self.count
        remaining = self.size - pos
        if remaining <= 0:
            return True
        take = budget if budget < remaining else remaining
        rest = self._rest
        if rest is None and pos and dict.__len__(state) != self._it_len:
            # the map changed size behind the overlay (a write through ``dict`` itself):
            # a new iterator would have to pass the part already encoded after every
            # insertion; the keys still to encode are listed once instead (C speed, a
            # few ns a key: a step as long as the map is large, once per save at most)
            it = iter(dict.keys(state))
            next(islice(it, pos - 1, pos), None)
            rest = self._rest = list(islice(it, remaining))
            self._rest_at = pos
        if rest is not None:
            i = pos - self._rest_at
            keys = rest[i : i + take]
            values: Any = list(map(dict.__getitem__, repeat(state), keys))
        else:
            it = self._it
            if it is None:
                it = self._it = iter(dict.keys(state))
                self._vit = iter(dict.values(state))
                self._it_len = dict.__len__(state)
            keys = list(islice(it, take))
            values = list(islice(self._vit, take))
        if len(keys) < take:  # the map ended early: a bug
            raise RuntimeError("the map's pre-barrier keys ran out before their count")
        # the live values, and for a key written since the barrier its recorded value
        old = self.old
        if old:
            values = list(map(old.get, keys, values))
        self._add(keys, values)
        return take == remaining

    def _tail_step(self, budget: int) -> bool:
        state = self.state
        layer = self._layer
        assert layer is not None
        if self._tail_done < self._tail:  # the tail, from the map's end
            it = self._it
            if it is None:
                # the keys and the values by two iterators in step (``_vit``); the
                # whole map (a full save's walk) from its start, in its order
                keys_view, values_view = dict.keys(state), dict.values(state)
                if self.whole:
                    it, self._vit = iter(keys_view), iter(values_view)
                else:
                    it, self._vit = reversed(keys_view), reversed(values_view)
                self._it = it
                self._it_len = dict.__len__(state)
            elif dict.__len__(state) != self._it_len:
                raise RuntimeError("a key was inserted into the map while its tail was saved")
            left = self._tail - self._tail_done
            take = budget if budget < left else left
            keys = list(islice(it, take))
            values: Any = list(islice(self._vit, take))
            if len(keys) < take or len(values) < take:
                raise RuntimeError("the map's tail ran out before its count")
            self._tail_done += take
            if layer:
                common = layer.keys() & keys
                if common:  # changed again after its insertion: the layer's value
                    values = list(map(layer.get, keys, values))
                    self._common |= common
            self._add(keys, values)
            return self._tail_done >= self._tail and not layer
        # then the layer's entries the tail did not hold
        lit = self._kit
        if lit is None:
            lit = self._kit = iter(layer)
        keys = list(islice(lit, budget))
        done = len(keys) < budget
        common = self._common
        if common:
            keys = [k for k in keys if k not in common]
        if keys:
            self._add(keys, list(map(layer.__getitem__, keys)))
        return done

    def _forked_tail(self) -> bool:
        """At a large tail save's first step (:data:`LIVE_SAVE_FORK_MIN` keys or more):
        fork a child that produces the content from its copy-on-write view of the map as
        it is now (the barrier's: nothing wrote the tail since) and writes the pickle
        fragments into a memory file (:meth:`_tail_child`), which the store thread reads
        in a few large reads (:meth:`result`, :data:`_READ_PIECE` each; a pipe's 64 KiB
        reads would each let the GIL go and wait to take it back from the busy processing
        thread). ``True`` once forked: for
        the processor the content is produced (the map may be written from now on; the
        layer's merge follows as usual); ``False``: produced here in steps, as for a
        smaller save (the save's keys are checked for spilling, its content encodes as
        columns, a forked encoder met what the fast pickler cannot encode, or the fork
        failed)."""
        if (
            self._fork_tried
            or not _fork_possible(self._tail)  # (the fork's predicted time: below)
            or self._tail_done
            or self.columns is not None
            or self.out is not None
            or self.spill is not None
        ):
            return False
        self._fork_tried = True
        global _fork_s_per_byte
        resident = _resident_bytes()
        if not _fork_fast_enough(resident):
            return False
        from slipstream.state.forked import fork_writer
        from slipstream.state.store import write_all

        try:
            mem = os.memfd_create("slipstream-save", os.MFD_CLOEXEC)
        except OSError:
            return False
        r, w = os.pipe()
        t0 = time.perf_counter()
        try:
            pid = fork_writer(mem, w)
        except OSError:
            for fd in (mem, r, w):
                os.close(fd)
            return False
        if pid == 0:  # the child: never returns
            self._tail_child(mem, w, write_all)
        took = (time.perf_counter() - t0) / max(resident, 1 << 20)
        _fork_s_per_byte = took if took > _FORK_S_PER_BYTE_MIN else _FORK_S_PER_BYTE_MIN
        os.close(w)
        self._child = (pid, r, mem)
        self._reaper = weakref.finalize(self, _stop_child, pid, r, mem)
        return True

    def _tail_child(
        self, mem: int, w: int, write_all: Callable[[int, list[bytes]], None]
    ) -> None:
        """The forked encoder: the tail save's content as :meth:`_tail_step` makes it,
        its fragments written into ``mem``, then a JSON line on pipe ``w``: ``count``,
        ``common`` (how many of the layer's keys the tail held) and ``bytes``, or
        ``error``; ends the process."""
        code = 1
        try:
            if signal.getsignal(signal.SIGALRM) == signal.SIG_DFL:
                signal.alarm(FORK_CHILD_TIMEOUT_S)  # nobody reads it: end anyway
            while not self._tail_step(LIVE_SAVE_FULL_SLICE):
                pass
            if self.out is not None:
                head: dict[str, Any] = {"error": "unencodable"}
            else:
                write_all(mem, self.parts)
                head = {
                    "count": self.count,
                    "common": len(self._common),
                    "bytes": sum(map(len, self.parts)),
                }
            write_all(w, [json.dumps(head).encode("utf-8") + b"\n"])
            code = 0
        except BaseException as e:  # noqa: BLE001 - nothing may escape into the job's code
            try:
                text = json.dumps({"error": f"{type(e).__name__}: {e}"})
                write_all(w, [text.encode("utf-8") + b"\n"])
            except BaseException:  # noqa: BLE001, S110
                pass
        finally:
            os._exit(code)

    def _child_content(self) -> EncodedMap:
        """The store thread: the forked encoder's answer (blocking reads let the GIL
        go), then the child reaped. Raises ``RuntimeError`` with its error."""
        global _fork_unencodable
        assert self._child is not None
        _pid, r, mem = self._child
        try:
            head = b""
            while True:
                b = os.read(r, 65536)
                if not b:
                    break
                head += b
            try:
                msg = json.loads(head) if head.endswith(b"\n") else {}
            except ValueError:
                msg = {}
            if "count" not in msg:
                if msg.get("error") == "unencodable":
                    _fork_unencodable = True
                error = msg.get("error") or "no answer (it was killed?)"
                raise RuntimeError(f"its forked encoder failed: {error}")
            size = self.size - int(msg["common"])
            if int(msg["count"]) != size:
                raise RuntimeError(f"its forked encoder produced {msg['count']} entries of {size}")
            n = int(msg["bytes"])
            parts = []
            at = 0
            while at < n:
                piece = os.pread(mem, min(_READ_PIECE, n - at), at)
                if not piece:
                    raise RuntimeError(f"its forked encoder wrote {at} bytes of {n}")
                parts.append(piece)
                at += len(piece)
        finally:
            self._reaper()
        self.size = size
        return EncodedMap(parts, size)

    def _delta_step(self, budget: int) -> bool:
        # sets nobody changes any more: the sealed ones, oldest first, then the last, a
        # slice of one set at a time; a key of an earlier set is left out of a later
        # one: each slice is checked against each earlier set at C speed
        # (``isdisjoint``, ~25 ns a key) and filtered only where it meets one (a
        # ``filterfalse`` over every key cost ~45 ns a key: at 10M keys in the uniform
        # pattern, deltas of ~1.7M keys in three sets, 75 ms a save). A layered map's
        # sealed marks are lists, not checked: a key of two is saved twice, with the
        # same value (beside a layer the map holds the barrier's values)
        it = self._kit
        if it is None:
            it = self._kit = iter(self._sealed[0] if self._sealed else self._keys)
        keys = list(islice(it, budget))
        ended = len(keys) < budget
        i = self._set_at
        if i:
            for earlier in self._sealed[:i]:
                # (a sealed list is not checked: KeyedState.seal_marks)
                if type(earlier) is set and not earlier.isdisjoint(keys):
                    keys = list(filterfalse(earlier.__contains__, keys))
        if ended and i < len(self._sealed):  # the next set
            i = self._set_at = i + 1
            self._kit = iter(self._sealed[i] if i < len(self._sealed) else self._keys)
            ended = False
        if keys:
            live = map(dict.get, repeat(self.state), keys, repeat(_MISSING))
            old = self.old
            # (beside a layer the map holds the pre-barrier values: none is recorded)
            values = list(map(old.get, keys, live)) if old else list(live)
            if any(map(is_, values, repeat(_MISSING))) or (
                old and any(map(is_, values, repeat(_ABSENT)))
            ):
                kept_k, kept_v = [], []
                for k, v in zip(keys, values, strict=True):
                    if v is _MISSING or v is _ABSENT:  # not in the map at the barrier
                        self.removed.append(k)
                    else:
                        kept_k.append(k)
                        kept_v.append(v)
                keys, values = kept_k, kept_v
            self._add(keys, values)
        return ended

    def _add(self, keys: list[Any], values: list[Any]) -> None:
        self.count += len(keys)
        if self.spill is False:  # checked until one key is another processor's
            try:
                self.spill = self._spilled(keys)  # type: ignore[misc]
            except Exception:  # noqa: BLE001 - a partitioner's error: taken as spilling
                self.spill = True
        columns = self.columns
        if columns is not None:
            if columns.add(keys, values):
                return
            # a slice no column holds: pickle fragments from here on, the batches so
            # far included (decoded once; a map of mixed types pays it once a save)
            self.columns = None
            done_keys, done_values = columns.pairs()
            keys = done_keys + list(keys)
            values = done_values + list(values)
        if self.out is None:
            try:
                self.parts.append(setitems_fragment(keys, values))
                return
            except Exception:  # noqa: BLE001 - the store thread's pickler (cloudpickle)
                self.out = EncodedMap(self.parts, 0).to_dict()
                self.parts = []
        self.out.update(zip(keys, values, strict=True))

    def _complete(self) -> None:
        """The content is produced (the store thread may take it); a full save's overlay
        is merged into the map by the next steps (:meth:`_merge_step`)."""
        if self.mode == "full" and self.count != self.size:
            raise RuntimeError(
                f"a copy-on-write save produced {self.count} entries of a map of {self.size} keys"
            )
        if self.mode == TAIL and self._child is None:  # (forked: the child counts)
            self.size -= len(self._common)  # a key of both counts once
            if self.count != self.size:
                raise RuntimeError(
                    f"a tail save produced {self.count} entries of {self.size} "
                    f"({self._tail} keys of the tail, the layer's others)"
                )
        self.old = None
        self._it = None
        self._vit = None
        self._rest = None
        self._kit = None
        self._keys = None
        self._sealed = ()
        self._common = set()
        if not self.new and (
            not self.beside_layer or (self._into_map is None and not self.fresh)
        ):
            self._release()  # (a tail save writes its new keys and layer into the map next)
        self._done.set()

    def _merge_step(self, budget: int) -> bool:
        """Copy up to ``budget`` more keys of the overlay into the map (oldest first; a
        key's value as the overlay holds it now: a write of a key not merged yet goes
        there); ``True`` once all are (the map has its class back)."""
        if self.beside_layer:
            return self._layer_step(budget)
        new = self.new
        assert new is not None
        it = self._mit
        if it is None:
            it = self._mit = iter(new.items())
        pairs = list(islice(it, budget))
        dict.update(self.state, pairs)  # type: ignore[call-overload]
        self.merged += len(pairs)
        if self.merged >= len(new):
            self._release()
            return True
        return False

    def _layer_step(self, budget: int) -> bool:
        """After a tail save's walk: the keys new to the map met meanwhile (:attr:`fresh`)
        inserted into it, then its layer written into it, ``budget`` entries more; the
        save ends (:meth:`_release`) once both are, keys met during the layer's steps
        included."""
        if not self._insert_fresh(budget):
            return False
        layer = self._into_map
        if layer is not None:
            it = self._mit
            if it is None:
                it = self._mit = iter(layer.items())
            pairs = list(islice(it, budget))
            if pairs:
                self.state._write(pairs)  # type: ignore[union-attr]
            if len(pairs) >= budget:
                return False
        if self._fresh_done < len(self.fresh_order):
            return False  # keys met during the layer's steps: the next steps insert them
        self._release()
        return True

    def _insert_fresh(self, budget: int) -> bool:
        """Insert up to ``budget`` more of :attr:`fresh`'s keys into the map, oldest
        first, with their values; ``True`` once all it holds now are. They join the
        map's tail: the next delta takes them from there; a key inserted is read in the
        map from then on (before the overlay), and changed in the layer."""
        keys = self.fresh_order
        i = self._fresh_done
        part = keys[i : i + budget]
        if part:
            self._fresh_done = i + len(part)
            fresh = self.fresh
            self.state._write([(k, fresh[k]) for k in part])  # type: ignore[union-attr]
        return self._fresh_done >= len(keys)

    def unmerged(self) -> Any:
        """The overlay's keys not in the map yet, in its order."""
        return islice(self.new or (), self.merged, None)

    def _fail(self, error: BaseException) -> None:
        self._error = error
        if self._reaper is not None:
            self._reaper()  # a forked encoder nobody will read
        self._release()
        self._done.set()

    def _release(self) -> None:
        state = self.state
        if state is not None and self.beside_layer and state._merge is self:
            # the new keys met during the walk and the rest of the layer join the map
            # (the save failed, or the last step), whose owner reads it there from now on
            fresh = self.fresh
            rest = self.fresh_order[self._fresh_done :]  # (the others are in the map)
            if rest:
                state._write([(k, fresh[k]) for k in rest])
            self.fresh = {}
            self.fresh_order = []
            layer = self._into_map
            if layer is not None:
                rest = list(self._mit if self._mit is not None else layer.items())
                if rest:
                    state._write(rest)
                state.frozen = {}
            state._merge = None
        elif state is not None and getattr(state, "_live", None) is self:
            from slipstream.state.keyed import KeyedState

            if self.new:  # the keys inserted since the barrier join the map now
                new = self.new
                dict.update(state, {k: new[k] for k in self.unmerged()})
            state._live = None
            state.__class__ = KeyedState
        self.state = None
        self.new = None
        self._mit = None
        self.old = None
        self._it = None
        self._vit = None
        self._rest = None
        self._kit = None
        self._keys = None
        self._sealed = ()
        self._layer = None
        self._into_map = None

    # -- the store thread ----------------------------------------------------------------
    def result(
        self, stopped: threading.Event | None = None
    ) -> tuple[dict[Any, Any] | EncodedMap | EncodedBatches, tuple[Any, ...]]:
        """Wait for the save: ``(content, removed keys)``, the content encoded (column
        batches, :class:`~slipstream.state.columnar.EncodedBatches`, or pickle fragments,
        :class:`EncodedMap`) or, if it could not be, a ``dict``. Raises the error
        production met, or ``RuntimeError`` when ``stopped`` is set first (the job is
        stopping)."""
        while not self._done.wait(0.05):
            if stopped is not None and stopped.is_set():
                raise RuntimeError(
                    f"the processor stopped before its copy-on-write save of snapshot "
                    f"{self.snapshot_id} was complete"
                )
        if self._error is not None:
            raise RuntimeError(
                f"the copy-on-write save of snapshot {self.snapshot_id} failed: "
                f"{type(self._error).__name__}: {self._error}"
            ) from self._error
        content: dict[Any, Any] | EncodedMap | EncodedBatches
        if self._child is not None:
            try:
                content = self._child_content()
            except RuntimeError as e:
                raise RuntimeError(
                    f"the copy-on-write save of snapshot {self.snapshot_id} failed: {e}"
                ) from None
            finally:
                self._child = None
        elif self.out is not None:
            content = self.out
        elif self.columns is not None:
            content = self.columns
            content.count = self.count
        else:
            content = EncodedMap(self.parts, self.count)
        removed = tuple(self.removed)
        if removed and self.encoded:
            # a key marked with a value, then removed (a custom processor's removal in
            # a layered map): the delta's upserts hold no removed key
            upserts = content if isinstance(content, dict) else content.to_dict()
            for k in removed:
                upserts.pop(k, None)
            content = upserts
        self.out = None
        self.columns = None
        self.parts = []
        self.removed = []
        return content, removed

    def cancel(self) -> None:
        """Nobody will take this save (its snapshot failed), or a new save of the map
        begins: let the map go as it is (with the overlay merged)."""
        if not self._done.is_set():
            self._fail(RuntimeError("cancelled"))
        else:
            self._release()
        if self._reaper is not None:
            self._reaper()  # a forked encoder nobody will read


def fork_expected(keys: int) -> bool:
    """Whether a tail save of ``keys`` keys would be encoded by a forked child now
    (:meth:`LiveSave._forked_tail`, as far as the process decides it): large enough, on
    Linux, no forked encoder met what the fast pickler cannot encode, and the fork is
    predicted to take at most :data:`LIVE_SAVE_FORK_MAX_S` from the process's resident
    size (read from /proc)."""
    return _fork_possible(keys) and _fork_fast_enough(_resident_bytes())


def _fork_possible(keys: int) -> bool:
    """A tail save of ``keys`` keys is large enough to fork for, on Linux, and no forked
    encoder met what the fast pickler cannot encode."""
    return (
        LIVE_SAVE_FORK_MIN is not None
        and keys >= LIVE_SAVE_FORK_MIN
        and _CAN_FORK
        and not _fork_unencodable
    )


def _fork_fast_enough(resident: int) -> bool:
    """A fork of a process of ``resident`` bytes is predicted to take at most
    :data:`LIVE_SAVE_FORK_MAX_S` (at the fastest rate forks took here)."""
    return resident * _fork_s_per_byte <= LIVE_SAVE_FORK_MAX_S


def _resident_bytes() -> int:
    """This process's resident memory (what a fork copies the page tables of)."""
    kb = resident_kb()
    return kb * 1024 if kb else 1 << 62  # unknown: no fork


def _stop_child(pid: int, *fds: int) -> None:
    """Close a forked encoder's pipe and memory file, kill it (it may have ended: then
    nothing happens) and reap it."""
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass
