"""Small processors and DAG builders for the Spark-engine tests.

They are deliberately independent of the library modules (``slipstream.processors``,
``sources``, ``sinks``) so the engine is tested on its own. conftest.py registers this
module for pickling by value, so executors need not import it.
"""

from __future__ import annotations

import functools
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import slipstream as ss
from slipstream import DAG, Edge
from slipstream.core.inbox import Inbox
from slipstream.core.items import Watermark
from slipstream.core.processor import AbstractProcessor, Context
from slipstream.core.suppliers import (
    FactorySupplier,
    MemberAddress,
    ProcessorMetaSupplier,
    ProcessorSupplier,
)

# ------------------------------------------------------------------ processors


class ListSource(AbstractProcessor):
    """Emits ``data[global_index::total_parallelism]`` (all of ``data`` if ``whole``);
    with ``ts_fn``, a watermark ``ts_fn(item)`` after each item that raises the top
    timestamp (the source's share must then be ordered by ts)."""

    def __init__(
        self,
        data: Sequence[Any],
        ts_fn: Callable[[Any], int] | None = None,
        whole: bool = False,
    ) -> None:
        self.data = data
        self.ts_fn = ts_fn
        self.whole = whole
        self._it: Iterator[Any] | None = None

    def init_processor(self, context: Context) -> None:
        if self.whole:
            mine = list(self.data)
        else:
            mine = list(self.data[context.global_processor_index :: context.total_parallelism])
        if self.ts_fn is None:
            self._it = iter(mine)
        else:
            ts_fn = self.ts_fn
            out: list[Any] = []
            top = -(2**63)
            for x in mine:
                out.append(x)
                if ts_fn(x) > top:  # watermarks must strictly increase
                    top = ts_fn(x)
                    out.append(Watermark(top))
            self._it = iter(out)

    def complete(self) -> bool:
        assert self._it is not None
        return self.emit_from(self._it)


class NamedListSource(AbstractProcessor):
    """Reads its share of ``context.get_list(name)`` (the driver's list on Spark)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def init_processor(self, context: Context) -> None:
        data = context.get_list(self.name)
        self._it = iter(data[context.global_processor_index :: context.total_parallelism])

    def complete(self) -> bool:
        return self.emit_from(self._it)


class Mapper(AbstractProcessor):
    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn

    def try_process_item(self, ordinal: int, item: Any) -> bool:
        return self.try_emit(self.fn(item))


class Filterer(AbstractProcessor):
    def __init__(self, pred: Callable[[Any], bool]) -> None:
        self.pred = pred

    def try_process_item(self, ordinal: int, item: Any) -> bool:
        return not self.pred(item) or self.try_emit(item)


class Splitter(AbstractProcessor):
    """Flat-maps lines to words."""

    def init_processor(self, context: Context) -> None:
        self._words: Iterator[str] | None = None

    def process(self, ordinal: int, inbox: Inbox) -> None:
        while inbox:
            if self._words is None:
                self._words = iter(inbox[0].split())
            if not self.emit_from(self._words):
                return
            self._words = None
            inbox.popleft()


class KeyedSum(AbstractProcessor):
    """Sums ``value_fn(item)`` per ``key_fn(item)``; emits ``(key, sum)`` at completion."""

    def __init__(
        self,
        key_fn: Callable[[Any], Any] = lambda x: x,
        value_fn: Callable[[Any], int] = lambda x: 1,
    ) -> None:
        self.key_fn = key_fn
        self.value_fn = value_fn
        self.sums: Counter[Any] = Counter()
        self._out: Iterator[Any] | None = None

    def process(self, ordinal: int, inbox: Inbox) -> None:
        key_fn, value_fn, sums = self.key_fn, self.value_fn, self.sums
        for item in inbox:
            sums[key_fn(item)] += value_fn(item)
        inbox.clear()

    def complete(self) -> bool:
        if self._out is None:
            self._out = iter(sorted(self.sums.items(), key=repr))
        return self.emit_from(self._out)


class CountByMod(AbstractProcessor):
    """Counts items (ints) per ``item % modulus``; at completion emits one int per key,
    ``key * 1_000_000 + count``, so downstream int processors can keep going."""

    def __init__(self, modulus: int = 7) -> None:
        self.modulus = modulus
        self.counts: Counter[int] = Counter()
        self._out: Iterator[int] | None = None

    def process(self, ordinal: int, inbox: Inbox) -> None:
        m = self.modulus
        self.counts.update(x % m for x in inbox)
        inbox.clear()

    def complete(self) -> bool:
        if self._out is None:
            self._out = iter(sorted(k * 1_000_000 + n for k, n in self.counts.items()))
        return self.emit_from(self._out)


class Tagger(AbstractProcessor):
    """Emits ``(global index, member, ordinal, item)``."""

    def try_process_item(self, ordinal: int, item: Any) -> bool:
        c = self.context
        return self.try_emit((c.global_processor_index, c.member_index, ordinal, item))


class Collect(AbstractProcessor):
    """Appends items to ``context.get_list(name)``; with ``tag``, as
    ``(global index, item)``."""

    def __init__(self, name: str, tag: bool = False) -> None:
        self.name = name
        self.tag = tag

    def init_processor(self, context: Context) -> None:
        self.out = context.get_list(self.name)

    def process(self, ordinal: int, inbox: Inbox) -> None:
        if self.tag:
            g = self.context.global_processor_index
            self.out.extend((g, item) for item in inbox)
        else:
            self.out.extend(inbox)
        inbox.clear()


class MapWriter(AbstractProcessor):
    """Puts ``(key, value)`` items into ``context.get_map(name)``."""

    def __init__(self, name: str) -> None:
        self.name = name

    def init_processor(self, context: Context) -> None:
        self.out = context.get_map(self.name)

    def process(self, ordinal: int, inbox: Inbox) -> None:
        for k, v in inbox:
            self.out[k] = v
        inbox.clear()


class HashJoin(AbstractProcessor):
    """Ordinal 0: build side ``(key, name)``; ordinal 1: probe items ``(key, x)``.

    Relies on the build edge having priority: a probe item before the build side is
    complete is an error (a priority violation)."""

    def init_processor(self, context: Context) -> None:
        self.table: dict[Any, Any] = {}
        self.build_done = False

    def process(self, ordinal: int, inbox: Inbox) -> None:
        if ordinal == 0:
            for k, name in inbox:
                self.table[k] = name
            inbox.clear()
            return
        if not self.build_done:
            raise AssertionError("probe item before the build side completed")
        while inbox:
            k, x = inbox[0]
            if k in self.table and not self.try_emit((k, self.table[k], x)):
                return
            inbox.popleft()

    def complete_edge(self, ordinal: int) -> bool:
        if ordinal == 0:
            self.build_done = True
        return True


class TumblingCount(AbstractProcessor):
    """Counts items per tumbling window of ``size`` (by ``ts_fn``); emits
    ``(start, count)`` when the watermark passes the window end, the rest at completion.
    Counts late items (ts below the current watermark) in the ``late`` metric."""

    def __init__(self, size: int, ts_fn: Callable[[Any], int]) -> None:
        self.size = size
        self.ts_fn = ts_fn
        self.counts: Counter[int] = Counter()
        self.wm = -(2**63)
        self._out: Iterator[Any] | None = None

    def try_process_item(self, ordinal: int, item: Any) -> bool:
        ts = self.ts_fn(item)
        if ts < self.wm:
            self.context.increment_metric("late")
        self.counts[ts - ts % self.size] += 1
        return True

    def try_process_watermark(self, watermark: Watermark) -> bool:
        if self._out is None:
            self.wm = watermark.timestamp
            ready = sorted(s for s in self.counts if s + self.size <= watermark.timestamp)
            self._out = iter([*((s, self.counts.pop(s)) for s in ready), watermark])
        if not self.emit_from(self._out):
            return False
        self._out = None
        return True

    def complete(self) -> bool:
        if self._out is None:
            self._out = iter(sorted(self.counts.items()))
        return self.emit_from(self._out)


class WatermarkLog(AbstractProcessor):
    """Sink: records ``("wm", global index, ts)`` per watermark and items as they are."""

    def __init__(self, name: str) -> None:
        self.name = name

    def init_processor(self, context: Context) -> None:
        self.out = context.get_list(self.name)

    def process(self, ordinal: int, inbox: Inbox) -> None:
        self.out.extend(inbox)
        inbox.clear()

    def try_process_watermark(self, watermark: Watermark) -> bool:
        self.out.append(("wm", self.context.global_processor_index, watermark.timestamp))
        return True


class Boom(AbstractProcessor):
    """Raises on the item ``bad``."""

    def __init__(self, bad: Any) -> None:
        self.bad = bad

    def try_process_item(self, ordinal: int, item: Any) -> bool:
        if item == self.bad:
            raise ValueError(f"boom on {item!r}")
        return self.try_emit(item)


class Sleeper(AbstractProcessor):
    """A source that never completes and emits nothing (for cancel/timeout tests)."""

    def complete(self) -> bool:
        time.sleep(0.005)
        return False


class Blocking(AbstractProcessor):
    """A non-cooperative mapper (blocking outbox)."""

    def is_cooperative(self) -> bool:
        return False

    def try_process_item(self, ordinal: int, item: Any) -> bool:
        assert self.try_emit(item * 10), "a blocking outbox never refuses"
        return True


class PerMemberMeta(ProcessorMetaSupplier):
    """A meta-supplier giving member ``m`` a supplier of ``ListSource(blocks[m])`` with
    items tagged by the address the member got."""

    def __init__(self, blocks: list[list[int]]) -> None:
        self.blocks = blocks

    def get(
        self, addresses: Sequence[MemberAddress]
    ) -> Callable[[MemberAddress], ProcessorSupplier]:
        assert len(addresses) == len(self.blocks), (addresses, self.blocks)
        suppliers = {
            a: FactorySupplier(
                functools.partial(ListSource, [(str(a), x) for x in block], None, True)
            )
            for a, block in zip(addresses, self.blocks, strict=True)
        }
        return suppliers.__getitem__


class WrongCountSupplier(ProcessorSupplier):
    def get(self, count: int) -> list[Any]:
        return [Mapper(str)]  # always one, whatever count is asked


# ------------------------------------------------------------------ DAG builders


def word_count_dag(
    lines: list[str], sink: str = "counts", lp: int | None = None, source: Any = None
) -> DAG:
    """source -> split -(partitioned)-> accumulate -(distributed partitioned)-> combine -> sink

    ``source`` replaces the default source of ``lines`` (e.g. a Spark RDD source)."""
    dag = DAG()
    src = dag.new_vertex("source", source or functools.partial(ListSource, lines))
    split = dag.new_vertex("split", Splitter)
    acc = dag.new_vertex("accumulate", KeyedSum)
    comb = dag.new_vertex("combine", functools.partial(KeyedSum, ss.entry_key, ss.entry_value))
    out = dag.new_vertex("sink", functools.partial(Collect, sink)).local_parallelism(1)
    if lp is not None:
        for v in (src, split, acc, comb):
            v.local_parallelism(lp)
    dag.edge(Edge.between(src, split))
    dag.edge(Edge.between(split, acc).partitioned(lambda w: w))
    dag.edge(Edge.between(acc, comb).distributed().partitioned(ss.entry_key))
    dag.edge(Edge.between(comb, out))
    return dag


def map_filter_dag(data: list[int], sink: str = "out") -> DAG:
    dag = DAG()
    src = dag.new_vertex("source", functools.partial(ListSource, data))
    m1 = dag.new_vertex("square", functools.partial(Mapper, lambda x: x * x))
    f = dag.new_vertex("odd", functools.partial(Filterer, lambda x: x % 2 == 1))
    m2 = dag.new_vertex("label", functools.partial(Mapper, lambda x: f"n{x}"))
    out = dag.new_vertex("sink", functools.partial(Collect, sink))
    dag.edge(Edge.between(src, m1)).edge(Edge.between(m1, f).isolated())
    dag.edge(Edge.between(f, m2)).edge(Edge.between(m2, out).partitioned(len))
    return dag


def word_count_oracle(lines: list[str]) -> list[tuple[str, int]]:
    return sorted(Counter(w for line in lines for w in line.split()).items())
