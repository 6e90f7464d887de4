"""Copy-on-write saves of keyed state: no stop-the-world copy at the barrier.

A :class:`~slipstream.state.keyed.KeyedState` whose values are never changed in place
(``values_replaced``: numbers, strings, tuples of such, replaced with ``d[k] = new``)
saves in a job that drives its saves (``context.live_saves``, the embedded engine's
tasklet) as a :class:`LiveSave`: at the barrier the save takes O(1) work (it notes the
map's size and swaps the map's class for ``_SavingKeyedState``, whose mutators record a
key's pre-barrier value the first time the key is written or removed after the
barrier); the tasklet then calls :meth:`LiveSave.step` between two ``process()`` calls,
each time encoding a bounded slice of the saved content, read from the live map or the
recorded pre-barrier values, until the save is complete; the map gets its class back.
The store thread waits for the save (:meth:`LiveSave.result`) and writes the encoded
slices as the chunk's payload (:func:`slipstream.state.format.encode_payload`): a chunk
that decodes to exactly the map as it was at the barrier, as the copy did, with no copy
of the map in memory (the slices are pickled bytes) and no long hold of the GIL by the
store thread (the pickling happened in the steps).

A *full* save walks the live map in insertion order: the keys the map held at the
barrier form a prefix of that order while none is removed (a value written in place
keeps its key's place, a key inserted after the barrier goes to the end). A dict
iterator is kept from one step to the next while the map's size does not change; after
an insertion (new keys coming in while the save is made) the keys still to encode are
listed once, from a new iterator advanced past the part already encoded (C speed, a few
ns a key: the only step whose cost grows with the map, once per save at most). A removal while a full save is in progress makes the rest of the save at once
(the processors that save copy-on-write do not remove keys; a custom one that does pays
that then). A *delta* walks the changed keys (a set nobody changes any more) and reads
each one's value from the live map or its recorded pre-barrier value.

A slice whose keys or values the fast pickler cannot encode (``cloudpickle`` needed, a
recursive key) turns the save into a plain ``dict`` of the content, encoded by the store
thread as any other.
"""

from __future__ import annotations

import io
import pickle
import threading
import time
from itertools import islice, repeat
from operator import is_, itemgetter
from typing import Any

__all__ = [
    "LIVE_SAVE_MIN_KEYS",
    "LIVE_SAVE_STEP",
    "EncodedMap",
    "LiveSave",
    "pushed",
    "setitems_fragment",
]

#: a map with fewer keys (a full save) or fewer changed keys (a delta) is copied at the
#: barrier as before: that costs less than the bookkeeping
LIVE_SAVE_MIN_KEYS = 20_000
#: entries encoded per step (a few ms of the processor's thread at most, also on a
#: loaded machine)
LIVE_SAVE_STEP = 32_768

ABSENT: Any = object()  # a key that was not in the map at the barrier
_ABSENT = ABSENT
_MISSING: Any = object()


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

    def __init__(self, state: Any, snapshot_id: int, mode: str, keys: Any = None) -> None:
        self.state = state
        self.snapshot_id = snapshot_id
        self.mode = mode
        #: pre-barrier value of every key written or removed since the barrier
        #: (``_ABSENT``: the key was not in the map)
        self.old: dict[Any, Any] = {}
        self.parts: list[bytes] = []  # the encoded content
        self.out: dict[Any, Any] | None = None  # the content, if it could not be encoded
        self.count = 0  # entries produced
        self.removed: list[Any] = []  # a delta's removed keys
        self.size = len(state) if keys is None else len(keys)
        self._it: Any = None  # full: an iterator over the map's keys
        self._rest: list[Any] | None = None  # full: the keys still to encode, once listed
        self._rest_at = 0  # how many were encoded when they were listed
        self._kit: Any = None  # delta: the iterator over the changed keys
        self._keys = keys
        self._done = threading.Event()
        self._error: BaseException | None = None
        self.steps = 0
        #: the longest step, seconds (the processor's thread was busy with it)
        self.step_max_s = 0.0

    def __len__(self) -> int:
        return self.size

    @property
    def done(self) -> bool:
        return self._done.is_set()

    # -- the map's mutators call these (the processor's thread) -------------------------
    def before_set(self, state: Any, key: Any) -> None:
        old = self.old
        if key not in old:
            v = dict.get(state, key, _ABSENT)
            old[key] = v
            if v is _ABSENT:
                self._it = None  # the map grows: its iterator is no good any more
        elif self._it is not None and not dict.__contains__(state, key):
            self._it = None

    def before_remove(self, state: Any, key: Any) -> None:
        """``key`` (in the map) is about to be removed."""
        if self.mode == "full":
            self.finish()  # the rest now: the map's order no longer tells what is left
            return
        old = self.old
        if key not in old:
            old[key] = dict.__getitem__(state, key)

    # -- production (the processor's thread) ---------------------------------------------
    def step(self, budget: int) -> bool:
        """Produce up to ``budget`` more entries; ``True`` once the save is complete (the
        map has its class back)."""
        if self._done.is_set():
            return True
        t0 = time.perf_counter()
        try:
            finished = self._full_step(budget) if self.mode == "full" else self._delta_step(budget)
            if finished:
                self._complete()
        except BaseException as e:  # noqa: BLE001 - handed to the store thread
            self._fail(e)
            finished = True
        self.steps += 1
        dt = time.perf_counter() - t0
        if dt > self.step_max_s:
            self.step_max_s = dt
        return finished

    def finish(self, timed: bool = True) -> None:
        """Produce the rest now (the processor is closing, or the map changes in a way
        the save does not follow: a removal during a full save, ``clear()``).
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
        if rest is None and self._it is None and pos:
            # the map grew since the last step: a new iterator would have to pass the
            # part already encoded after every insertion; the keys still to encode are
            # listed once instead (C speed; 8 bytes a key until the save is complete)
            it = iter(dict.keys(state))
            next(islice(it, pos - 1, pos), None)
            rest = self._rest = list(islice(it, remaining))
            self._rest_at = pos
        if rest is not None:
            i = pos - self._rest_at
            keys = rest[i : i + take]
        else:
            it = self._it
            if it is None:
                it = iter(dict.keys(state))
            keys = list(islice(it, take))
            self._it = it
        if len(keys) < take:  # the map ended early: a bug
            raise RuntimeError("the map's pre-barrier keys ran out before their count")
        # the live values: a key written since the barrier gets its recorded value in a
        # last fragment (it comes later: the unpickled dict keeps that one)
        values: Any = (
            itemgetter(*keys)(state) if take > 1 else [dict.__getitem__(state, keys[0])]
        )
        self._add(keys, values)
        return take == remaining

    def _delta_step(self, budget: int) -> bool:
        it = self._kit
        if it is None:
            it = self._kit = iter(self._keys)  # a set nobody changes any more
        keys = list(islice(it, budget))
        n = len(keys)
        if keys:
            live = map(dict.get, repeat(self.state), keys, repeat(_MISSING))
            values = list(map(self.old.get, keys, live))
            if any(map(is_, values, repeat(_MISSING))) or any(map(is_, values, repeat(_ABSENT))):
                kept_k, kept_v = [], []
                for k, v in zip(keys, values, strict=True):
                    if v is _MISSING or v is _ABSENT:  # not in the map at the barrier
                        self.removed.append(k)
                    else:
                        kept_k.append(k)
                        kept_v.append(v)
                keys, values = kept_k, kept_v
            self._add(keys, values)
        return n < budget

    def _add(self, keys: list[Any], values: list[Any]) -> None:
        self.count += len(keys)
        if self.out is None:
            try:
                self.parts.append(setitems_fragment(keys, values))
                return
            except Exception:  # noqa: BLE001 - the store thread's pickler (cloudpickle)
                self.out = EncodedMap(self.parts, 0).to_dict()
                self.parts = []
        self.out.update(zip(keys, values, strict=True))

    def _complete(self) -> None:
        if self.mode == "full":
            if self.count != self.size:
                raise RuntimeError(
                    f"a copy-on-write save produced {self.count} entries of a map of "
                    f"{self.size} keys"
                )
            old = self.old
            keys = [k for k, v in old.items() if v is not _ABSENT]
            if keys:  # their pre-barrier values, after what the slices read
                count = self.count
                self._add(keys, list(map(old.__getitem__, keys)))
                self.count = count
        self._release()
        self._done.set()

    def _fail(self, error: BaseException) -> None:
        self._error = error
        self._release()
        self._done.set()

    def _release(self) -> None:
        state = self.state
        if state is not None and getattr(state, "_live", None) is self:
            from slipstream.state.keyed import KeyedState

            state._live = None
            state.__class__ = KeyedState
        self.state = None
        self.old = {}
        self._it = None
        self._rest = None
        self._kit = None
        self._keys = None

    # -- the store thread ----------------------------------------------------------------
    def result(
        self, stopped: threading.Event | None = None
    ) -> tuple[dict[Any, Any] | EncodedMap, tuple[Any, ...]]:
        """Wait for the save: ``(content, removed keys)``, the content encoded
        (:class:`EncodedMap`) or, if it could not be, a ``dict``. Raises the error
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
        content: dict[Any, Any] | EncodedMap
        content = self.out if self.out is not None else EncodedMap(self.parts, self.count)
        removed = tuple(self.removed)
        self.out = None
        self.parts = []
        self.removed = []
        return content, removed

    def cancel(self) -> None:
        """Nobody will take this save (its snapshot failed): let the map go as it is."""
        if not self._done.is_set():
            self._fail(RuntimeError("cancelled"))
