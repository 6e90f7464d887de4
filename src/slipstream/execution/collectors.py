"""Outbound routing: moves a processor's output chunks into the channels of its consumers
(:class:`~slipstream.execution.channels.ChannelWriter`: in-process queues, or the local
queues a cross-process sender drains; a collector cannot tell them apart).

A collector serves one outbound ordinal of one processor. It takes ownership of data
chunks and special items, keeps them in order, and pushes what the queues accept on
each ``flush``. The tasklet does not call its processor again until every collector is
drained, so the backlog is bounded by one outbox bucket.

* :class:`RoundRobinCollector` (unicast, isolated, all-to-one): each chunk goes whole to
  the next consumer with room, skipping full ones (Jet's unicast rule, per chunk).
* :class:`PerTargetCollector` (partitioned, broadcast): chunks are split per consumer by
  key (or copied to all); each consumer has its own backlog.

A key function (or partitioner) that raises fails the job with a
:class:`~slipstream.core.errors.KeyFunctionError` naming the edge, the function and the
item. With one consumer the key is not needed; the key function is then called on the
first item of each chunk only (a broken key function shows at parallelism 1, not only
when the job is scaled out), or on every item when ``validate_keys`` is set
(``JobConfig(validate_keys=True)``: a Python call per item, see docs/performance.md).

Special items are always broadcast to every consumer of the collector.

A :class:`~slipstream.core.groups.KeyedGroup` (the entries of many keys as one item) on a
partitioned edge is split by its entries' keys, each consumer getting one group of the
entries whose keys it owns, routed as items with those keys would be; the key function
is not called on it. A chunk is taken for groups when its first item is one (the
engine's window stage 1 emits nothing else); any other item in it is routed as usual.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from itertools import chain
from operator import itemgetter
from typing import Any

from slipstream.core.describe import describe_fn, short_repr
from slipstream.core.errors import KeyFunctionError
from slipstream.core.groups import KeyedGroup
from slipstream.core.partition import (
    DEFAULT_PARTITION_COUNT,
    default_partitioner,
    default_partitions,
)
from slipstream.execution.channels import ChannelWriter

_KEY_CACHE_LIMIT = 1 << 16
_SPLIT_AT = 256
#: chunks at least this long whose first key is new are routed with _new_targets
_BULK_FROM = 64


class Collector:
    """Common interface; ``items_out`` counts data items handed over."""

    queues: Sequence[ChannelWriter]
    items_out: int

    def add_chunk(self, chunk: list[Any]) -> None:
        raise NotImplementedError

    def add_special(self, item: Any) -> None:
        raise NotImplementedError

    def flush(self) -> bool:
        """Push what the queues accept; ``True`` if nothing is left."""
        raise NotImplementedError

    def is_empty(self) -> bool:
        raise NotImplementedError


class RoundRobinCollector(Collector):
    __slots__ = (
        "queues",
        "backlog",
        "cursor",
        "special_done",
        "items_out",
        "progress",
        "max_chunk",
    )

    def __init__(self, queues: Sequence[ChannelWriter]) -> None:
        if not queues:
            raise ValueError("a collector needs at least one queue")
        self.queues = list(queues)
        # a chunk never exceeds a queue's capacity, so queue_size bounds what is in flight
        self.max_chunk = min(q.capacity for q in self.queues)
        self.backlog: deque[Any] = deque()
        self.cursor = 0
        self.special_done: list[bool] | None = None
        self.items_out = 0
        self.progress = False

    def add_chunk(self, chunk: list[Any]) -> None:
        n = len(self.queues)
        size = len(chunk)
        step = self.max_chunk
        if n > 1 and size >= _SPLIT_AT:
            # spread a big chunk over the consumers instead of handing it all to one
            step = min(step, -(-size // n))
        if size <= step:
            self.backlog.append(chunk)
        else:
            for i in range(0, size, step):
                self.backlog.append(chunk[i : i + step])

    def add_special(self, item: Any) -> None:
        self.backlog.append(_Special(item))

    def is_empty(self) -> bool:
        return not self.backlog

    def flush(self) -> bool:
        backlog = self.backlog
        queues = self.queues
        n = len(queues)
        while backlog:
            entry = backlog[0]
            if type(entry) is list:
                size = len(entry)
                for _ in range(n):
                    q = queues[self.cursor]
                    self.cursor += 1
                    if self.cursor == n:
                        self.cursor = 0
                    if q.offer(entry, size):
                        break
                else:
                    return False
                self.items_out += size
            else:
                done = self.special_done
                if done is None:
                    done = self.special_done = [False] * n
                item = entry.item
                for i, q in enumerate(queues):
                    if not done[i]:
                        if q.offer(item, 1):
                            done[i] = True
                if not all(done):
                    return False
                self.special_done = None
            backlog.popleft()
            self.progress = True
        return True


def _fast_key(key_fn: Callable[[Any], Any] | None) -> Callable[[Any], Any] | None:
    from slipstream import entry_key

    return _FIRST if key_fn is entry_key else key_fn


_FIRST = itemgetter(0)


class _Special:
    __slots__ = ("item",)

    def __init__(self, item: Any) -> None:
        self.item = item


class PerTargetCollector(Collector):
    """Partitioned (``key_fn`` given) or broadcast (``key_fn`` is ``None``) routing.

    ``label`` names the edge in errors; ``validate_keys``: with one consumer, call the
    key function on every item instead of on each chunk's first (module docstring)."""

    __slots__ = (
        "queues",
        "backlogs",
        "key_fn",
        "partitioner",
        "partition_to_target",
        "partition_count",
        "key_cache",
        "items_out",
        "progress",
        "pending",
        "max_chunk",
        "label",
        "validate_keys",
        "fast_key",
        "key_is_item",
    )

    def __init__(
        self,
        queues: Sequence[ChannelWriter],
        key_fn: Callable[[Any], Any] | None = None,
        partitioner: Callable[[Any, int], int] | None = None,
        partition_to_target: Sequence[int] | None = None,
        partition_count: int = DEFAULT_PARTITION_COUNT,
        label: str = "a partitioned edge",
        validate_keys: bool = False,
    ) -> None:
        self.queues = list(queues)
        self.backlogs: list[deque[Any]] = [deque() for _ in self.queues]
        self.key_fn = key_fn
        self.partitioner = partitioner or default_partitioner
        self.partition_count = partition_count
        self.partition_to_target = list(partition_to_target) if partition_to_target else []
        self.key_cache: dict[Any, int] = {}
        self.items_out = 0
        self.progress = False
        self.pending = 0
        self.max_chunk = min((q.capacity for q in self.queues), default=1)
        self.label = label
        self.validate_keys = validate_keys
        #: what the routing calls for a key: ``key_fn``, or for ``ss.entry_key`` (a
        #: Python function: ``entry[0]``) ``itemgetter(0)``, which does the same at C
        #: speed; errors still name ``key_fn`` (_route_carefully)
        self.fast_key = _fast_key(key_fn)
        #: the key function returns its item (``lambda k: k``, :func:`~slipstream.aggregate.
        #: is_identity`): the split looks each item up as its own key, no call per item
        #: (docs/performance.md, "count-10k: identity keys")
        if key_fn is None:
            self.key_is_item = False
        else:
            # imported here: a job without a keyed edge loads no aggregate module
            # (tests/test_public_api.py checks what a pipeline of maps loads)
            from slipstream.aggregate import is_identity

            self.key_is_item = is_identity(key_fn)

    def is_empty(self) -> bool:
        return self.pending == 0

    def _append(self, i: int, chunk: list[Any]) -> None:
        step = self.max_chunk
        if len(chunk) <= step:
            self.backlogs[i].append(chunk)
            self.pending += 1
        else:
            for j in range(0, len(chunk), step):
                self.backlogs[i].append(chunk[j : j + step])
                self.pending += 1

    def add_special(self, item: Any) -> None:
        for b in self.backlogs:
            b.append(item)
        self.pending += len(self.backlogs)

    def add_chunk(self, chunk: list[Any]) -> None:
        backlogs = self.backlogs
        n = len(backlogs)
        self.items_out += len(chunk)
        if self.key_fn is None:  # broadcast: consumers never mutate chunks, share it
            for i in range(n):
                self._append(i, chunk)
            return
        if chunk and type(chunk[0]) is KeyedGroup:  # counted as one item each, as the inbox does
            parts = self._split_groups(chunk, n)
        elif n == 1:
            # the key is not needed; check that it can be had (module docstring)
            self._check_keys(chunk if self.validate_keys else chunk[:1])
            self._append(0, chunk)
            return
        else:
            parts = self._split(chunk, n)
        for i, part in enumerate(parts):
            if part:
                self._append(i, part)

    def check_keys(self, chunk: list[Any]) -> None:
        """What :meth:`add_chunk` checks of ``chunk`` with one consumer, without
        routing it: the key of its first item (of every item with ``validate_keys``).
        A fused edge's producer hands its output over this way (execution/fusion.py)."""
        self._check_keys(chunk if self.validate_keys else chunk[:1])

    def _split(self, chunk: list[Any], n: int) -> list[list[Any]]:
        # one Python loop, a dict lookup of the key's target (cached partition lookup),
        # a bound append: measured faster than map/compress variants on keys seen
        # before. A big chunk whose first key is new, with the default partitioner,
        # has the targets of all its keys computed at once instead (_new_targets)
        parts: list[list[Any]] = [[] for _ in range(n)]
        appends = [p.append for p in parts]
        key_fn = self.fast_key
        cache, get, table, partitioner, pc = self._routing()
        try:
            items: Any = chunk
            if len(chunk) >= _BULK_FROM and partitioner is default_partitioner:
                items = iter(chunk)
                first = next(items)
                k = key_fn(first)  # type: ignore[misc]
                if k in cache:
                    appends[cache[k]](first)
                else:
                    if self.key_is_item:
                        keys = chunk
                    else:
                        keys = [k]
                        keys.extend(map(key_fn, items))  # type: ignore[arg-type]
                    targets = self._new_targets(keys)
                    if targets is None:  # not all str or int: per new key, as below
                        targets = []
                        for k in keys:
                            t = get(k)
                            if t is None:
                                t = cache[k] = table[partitioner(k, pc)]
                            targets.append(t)
                    for item, target in zip(chunk, targets):  # noqa: B905 - equal lengths
                        appends[target](item)
                    return parts
            rest = iter(items)
            item = None
            try:
                # keys seen before: the cache's own subscript, no test (8 ns a line of
                # the CSV running sum's 130; docs/performance.md, "The running sum
                # with two processes")
                if self.key_is_item:
                    for item in rest:
                        appends[cache[item]](item)
                else:
                    for item in rest:
                        appends[cache[key_fn(item)]](item)  # type: ignore[misc]
                return parts
            except KeyError:
                # ``item``'s key is new (or the key function raised KeyError: called
                # again below, it fails the chunk as any error of it does)
                rest = chain((item,), rest)
            for item in rest:
                k = key_fn(item)  # type: ignore[misc]
                t = get(k)
                if t is None:
                    t = cache[k] = table[partitioner(k, pc)]
                appends[t](item)
        except Exception:  # noqa: BLE001 - an unhashable key, or a failing function
            parts = self._route_carefully(chunk, n)
        return parts

    def _split_groups(self, chunk: list[Any], n: int) -> list[list[Any]]:
        """A chunk of :class:`KeyedGroup` items: each split into one group per consumer
        that owns some of its keys (with one consumer it goes on whole, its first key's
        partition checked, every key's with ``validate_keys``, as :meth:`_check_keys`
        does for items). One Python loop per entry (a cached lookup of the key's target
        and a store): measured faster than building a mask per consumer and filtering
        the entries at C speed with ``itertools.compress`` (54 against 99 ns an entry,
        1,000 int keys to 2 consumers)."""
        parts: list[list[Any]] = [[] for _ in range(n)]
        cache, get, table, partitioner, pc = self._routing()
        for item in chunk:
            if type(item) is not KeyedGroup:
                for i, part in enumerate(self._route_carefully([item], n)):
                    parts[i] += part
                continue
            entries = item.entries
            if n == 1:
                self._check_group(item, entries if self.validate_keys else list(entries)[:1])
                parts[0].append(item)
                continue
            split: list[dict[Any, Any]] = [{} for _ in range(n)]
            targets = None
            if (
                len(entries) >= _BULK_FROM
                and partitioner is default_partitioner
                and next(iter(entries)) not in cache
            ):
                # a group of new keys (a word count's partial counts): all its targets
                # at once, as _split does for a chunk of items (_new_targets)
                targets = self._new_targets(list(entries))
            try:
                if targets is not None:
                    for (k, v), t in zip(entries.items(), targets):  # noqa: B905 - equal lengths
                        split[t][k] = v
                else:
                    for k, v in entries.items():
                        t = get(k)
                        if t is None:
                            t = cache[k] = table[partitioner(k, pc)]
                        split[t][k] = v
            except Exception:  # noqa: BLE001 - a failing partitioner: name it
                self._check_group(item, entries)
                raise
            head = item.head
            for i, d in enumerate(split):
                if d:
                    parts[i].append(KeyedGroup(head, d))
        return parts

    def _check_group(self, group: KeyedGroup, keys: Any) -> None:
        """Route ``keys`` of ``group`` through the partitioner, raising
        :class:`KeyFunctionError` for the first that fails."""
        table = self.partition_to_target
        for k in keys:
            try:
                p = self.partitioner(k, self.partition_count)
            except Exception as e:
                raise KeyFunctionError(
                    f"{self.label}: partitioner {describe_fn(self.partitioner)} raised "
                    f"{type(e).__name__}: {e} on the key {short_repr(k)} of "
                    f"{short_repr(group)}"
                ) from e
            try:
                table[p]
            except (IndexError, TypeError) as e:
                raise KeyFunctionError(
                    f"{self.label}: partitioner {describe_fn(self.partitioner)} returned "
                    f"{short_repr(p)} for the key {short_repr(k)} of {short_repr(group)}, "
                    f"not a partition number in 0..{self.partition_count - 1}"
                ) from e

    def _new_targets(self, keys: list[Any]) -> list[int] | None:
        """The target of each of ``keys`` under the default partitioner, computed for
        all of them at C speed and cached, when they are all ``str`` or all
        non-negative ``int`` (:func:`default_partitions`), else ``None``. For a chunk
        of keys not seen before, such as the ~50,000 partial counts a word count's first
        stage emits at its end with processes=2 (each member): ~300 ns a key through
        the loop of :meth:`_split` with the partitioner called per key, ~260 this way
        (str keys; int keys ~255 -> ~215; docs/performance.md, "Word count: the
        engine's share of two processes")."""
        parts = default_partitions(keys, self.partition_count)
        if parts is None:
            return None
        targets = list(map(self.partition_to_target.__getitem__, parts))
        self.key_cache.update(zip(keys, targets))  # noqa: B905 - equal lengths
        return targets

    def _routing(self) -> tuple[dict[Any, int], Callable[..., Any], Any, Any, int]:
        """What a routing loop binds to locals (:meth:`_split`, :meth:`_split_groups`,
        :meth:`_check_keys`): the key cache, cleared first once it holds more than
        ``_KEY_CACHE_LIMIT`` keys, its ``get``, and what a new key's target is computed
        from (the partition table, the partitioner, the partition count)."""
        cache = self.key_cache
        if len(cache) > _KEY_CACHE_LIMIT:
            cache.clear()
        return cache, cache.get, self.partition_to_target, self.partitioner, self.partition_count

    def _check_keys(self, items: Sequence[Any]) -> None:
        """Take the key of every item (and the partition of every new key) as ``_split``
        does, keeping nothing but the key cache."""
        key_fn = self.key_fn
        cache, get, table, partitioner, pc = self._routing()
        try:
            for item in items:
                k = key_fn(item)  # type: ignore[misc]
                if get(k) is None:
                    cache[k] = table[partitioner(k, pc)]
        except Exception:  # noqa: BLE001 - an unhashable key, or a failing function
            self._route_carefully(list(items), 1)

    def _route_carefully(self, chunk: list[Any], n: int) -> list[list[Any]]:
        """Split ``chunk`` without the key cache (an unhashable key routes fine this
        way; a :class:`KeyedGroup` is split by its keys), raising :class:`KeyFunctionError` for the first item whose key function or
        partitioner fails."""
        parts: list[list[Any]] = [[] for _ in range(n)]
        key_fn = self.key_fn
        assert key_fn is not None
        table = self.partition_to_target
        for item in chunk:
            if type(item) is KeyedGroup:  # among other items: routed by its keys
                for i, part in enumerate(self._split_groups([item], n)):
                    parts[i] += part
                continue
            try:
                k = key_fn(item)
            except Exception as e:
                raise self._error("key function", key_fn, item, e) from e
            try:
                p = self.partitioner(k, self.partition_count)
            except Exception as e:
                raise self._error("partitioner", self.partitioner, item, e, k) from e
            try:
                t = table[p]
            except (IndexError, TypeError) as e:
                raise KeyFunctionError(
                    f"{self.label}: partitioner {describe_fn(self.partitioner)} returned "
                    f"{short_repr(p)} for the key {short_repr(k)} of item {short_repr(item)}, "
                    f"not a partition number in 0..{self.partition_count - 1}"
                ) from e
            parts[t].append(item)
        return parts

    def _error(
        self, role: str, fn: Any, item: Any, e: Exception, key: Any = None
    ) -> KeyFunctionError:
        of_key = f" (its key {short_repr(key)})" if role == "partitioner" else ""
        return KeyFunctionError(
            f"{self.label}: {role} {describe_fn(fn)} raised {type(e).__name__}: {e} on "
            f"item {short_repr(item)}{of_key}"
        )

    def flush(self) -> bool:
        if not self.pending:
            return True
        for q, b in zip(self.queues, self.backlogs, strict=True):
            while b:
                entry = b[0]
                if not q.offer(entry, len(entry) if type(entry) is list else 1):
                    break
                b.popleft()
                self.pending -= 1
                self.progress = True
        return self.pending == 0
