"""Tests of the processor test harness (slipstream.testing, Jet's TestSupport).

Two kinds: correct processors must pass every mode (checked against plain-Python
oracles, also with hypothesis), and processors with a specific bug must be caught, in
the mode designed to catch it, with an AssertionError naming that mode.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slipstream.core.config import ProcessingGuarantee
from slipstream.core.inbox import Inbox
from slipstream.core.items import Watermark
from slipstream.core.outbox import Outbox
from slipstream.core.processor import AbstractProcessor, Context, Processor
from slipstream.core.services import InMemoryServices
from slipstream.core.suppliers import (
    MemberAddress,
    ProcessorMetaSupplier,
    ProcessorSupplier,
    SupplierContext,
)
from slipstream.testing import (
    EXACT,
    SAME_ITEMS_ANY_ORDER,
    ProcessorVerifier,
    TestSupport,
    collect_outbox,
    verify_processor,
)

MODE1 = "mode 1 (snapshots off, inbox limit 1, outbox capacity 1)"
MODE3 = "mode 3 (snapshots on, restore after every snapshot"


# -- processors under test -------------------------------------------------------------
class Doubler(AbstractProcessor):
    """Correct per-item mapping; forwards watermarks (default try_process_watermark)."""

    def try_process_item(self, ordinal: int, item: Any) -> bool:
        return self.try_emit(item * 2)


class Repeater(AbstractProcessor):
    """FlatMapper-based: item n becomes n copies of n."""

    def init_processor(self, context: Context) -> None:
        self._fm = self.flat_mapper(lambda n: [n] * n)

    def try_process_item(self, ordinal: int, item: Any) -> bool:
        return self._fm.try_process(item)


class Summer(AbstractProcessor):
    """Sums its input, emits the sum in complete(); saves/restores the sum."""

    def init_processor(self, context: Context) -> None:
        self.total = 0

    def try_process_item(self, ordinal: int, item: Any) -> bool:
        self.total += item
        return True

    def complete(self) -> bool:
        return self.try_emit(self.total)

    def save_to_snapshot(self) -> bool:
        return self.try_emit_to_snapshot("total", self.total)

    def restore_from_snapshot_entry(self, key: Any, value: Any) -> None:
        assert key == "total"
        self.total = value


class ForgetfulSummer(Summer):
    """Bug: does not save its state, so a restored processor starts from 0."""

    def save_to_snapshot(self) -> bool:
        return True


class SortingEmitter(AbstractProcessor):
    """Collects items, emits them sorted in complete() through a resumable iterator
    (several complete() calls under capacity 1)."""

    def init_processor(self, context: Context) -> None:
        self.items: list[Any] = []
        self._it: Iterator[Any] | None = None

    def try_process_item(self, ordinal: int, item: Any) -> bool:
        self.items.append(item)
        return True

    def complete(self) -> bool:
        if self._it is None:
            self._it = iter(sorted(self.items))
        return self.emit_from(self._it)

    def save_to_snapshot(self) -> bool:
        return self.try_emit_to_snapshot("items", self.items)

    def restore_from_snapshot_entry(self, key: Any, value: Any) -> None:
        self.items = value


class CountingSource(AbstractProcessor):
    """A batch source: one item per complete() call, returns False in between, so the
    harness takes snapshots inside the complete() loop. Saves its position."""

    def __init__(self, n: int = 5) -> None:
        self.n = n
        self.next = 0

    def complete(self) -> bool:
        if self.next >= self.n:
            return True
        if self.try_emit(self.next):
            self.next += 1
        return False

    def save_to_snapshot(self) -> bool:
        return self.try_emit_to_snapshot("next", self.next)

    def restore_from_snapshot_entry(self, key: Any, value: Any) -> None:
        self.next = value


class ForgetfulSource(CountingSource):
    """Bug: restarts from 0 after a restore."""

    def save_to_snapshot(self) -> bool:
        return True


class StreamingSource(AbstractProcessor):
    """complete() never returns True: emits 0..n-1, then nothing (or ``extra`` later)."""

    def __init__(self, n: int = 3, extra_after: int | None = None) -> None:
        self.n = n
        self.next = 0
        self.calls = 0
        self.extra_after = extra_after

    def complete(self) -> bool:
        self.calls += 1
        if self.next < self.n:
            if self.try_emit(self.next):
                self.next += 1
        elif self.extra_after is not None and self.calls > self.extra_after:
            self.try_emit("surprise")
            self.extra_after = None
        return False

    def save_to_snapshot(self) -> bool:
        return self.try_emit_to_snapshot("next", self.next)

    def restore_from_snapshot_entry(self, key: Any, value: Any) -> None:
        self.next = value


class IgnoresRefusal(Processor):
    """Bug: emits three items per input item and ignores offer() returning False."""

    def process(self, ordinal: int, inbox: Inbox) -> None:
        while inbox:
            x = inbox.popleft()
            self.outbox.offer(x)
            self.outbox.offer(10 * x)
            self.outbox.offer(100 * x)


class DropsOnRefusal(Processor):
    """Bug: emits two items per input item but removes the input item before offering;
    on a refusal it returns and the refused item is lost."""

    def process(self, ordinal: int, inbox: Inbox) -> None:
        while inbox:
            x = inbox.popleft()
            if not self.outbox.offer(x):
                return
            if not self.outbox.offer(10 * x):
                return


class AssumesRoomAtCallStart(Processor):
    """Bug: emits two items per input item and, when resuming, assumes the outbox is
    empty at the start of a call (ignores the refusal of its pending item). Only the
    harness's "call process() again with the outbox still full" step shows it."""

    def init(self, outbox: Outbox, context: Context) -> None:
        super().init(outbox, context)
        self.second_pending = False

    def process(self, ordinal: int, inbox: Inbox) -> None:
        while inbox:
            x = inbox[0]
            if self.second_pending:
                self.outbox.offer(10 * x)  # bug: result ignored
                self.second_pending = False
                inbox.popleft()
                continue
            if not self.outbox.offer(x):
                return
            if not self.outbox.offer(10 * x):
                self.second_pending = True
                return
            inbox.popleft()


class CorrectTwoPerItem(AssumesRoomAtCallStart):
    """The fixed version: re-offers the pending item and checks the result."""

    def process(self, ordinal: int, inbox: Inbox) -> None:
        while inbox:
            x = inbox[0]
            if not self.second_pending:
                if not self.outbox.offer(x):
                    return
                self.second_pending = True
            if not self.outbox.offer(10 * x):
                return
            self.second_pending = False
            inbox.popleft()


class BulkRepeater(Processor):
    """Like Repeater, through the offer_many fast path (keeps the iterator of the rest)."""

    rest: Any = None

    def process(self, ordinal: int, inbox: Inbox) -> None:
        while inbox:
            if self.rest is None:
                self.rest = iter([inbox[0]] * inbox[0])
            self.rest = self.outbox.offer_many(self.rest, 0)
            if self.rest is not None:
                return
            inbox.popleft()


class NoProgress(Processor):
    """Bug: process() neither consumes nor emits."""

    def process(self, ordinal: int, inbox: Inbox) -> None:
        pass


class Sleepy(AbstractProcessor):
    """Sleeps in every call (a cooperative processor must not)."""

    def __init__(self, seconds: float = 0.03, cooperative: bool = True) -> None:
        self.seconds = seconds
        self.cooperative = cooperative

    def is_cooperative(self) -> bool:
        return self.cooperative

    def try_process_item(self, ordinal: int, item: Any) -> bool:
        time.sleep(self.seconds)
        return self.try_emit(item)


class OrdinalTagger(AbstractProcessor):
    """Emits (ordinal, item); records inbox batches and edge completions in a list."""

    def init_processor(self, context: Context) -> None:
        self.log = context.get_list("log")

    def process(self, ordinal: int, inbox: Inbox) -> None:
        self.log.append(("batch", ordinal, list(inbox)))
        super().process(ordinal, inbox)

    def try_process_item(self, ordinal: int, item: Any) -> bool:
        return self.try_emit((ordinal, item))

    def try_process_watermark(self, watermark: Watermark) -> bool:
        self.log.append(("wm", watermark.timestamp))
        return self.try_emit(watermark)


class EdgeMarker(AbstractProcessor):
    """Emits ("done", ordinal) once when an edge completes; remembers completed edges
    in its snapshot so a restored processor does not emit it twice."""

    def init_processor(self, context: Context) -> None:
        self.done: set[int] = set()

    def try_process_item(self, ordinal: int, item: Any) -> bool:
        return self.try_emit(item)

    def complete_edge(self, ordinal: int) -> bool:
        if ordinal in self.done:
            return True
        if self.try_emit(("done", ordinal)):
            self.done.add(ordinal)
            return True
        return False

    def save_to_snapshot(self) -> bool:
        return self.try_emit_to_snapshot("done", sorted(self.done))

    def restore_from_snapshot_entry(self, key: Any, value: Any) -> None:
        self.done = set(value)


class NaiveEdgeMarker(EdgeMarker):
    """Bug: doesn't save the completed edges; after a restore complete_edge emits again."""

    def save_to_snapshot(self) -> bool:
        return True


class PairEmitter(AbstractProcessor):
    """Needs room for two items at once; cannot work with outbox capacity 1."""

    def process(self, ordinal: int, inbox: Inbox) -> None:
        while inbox and self.outbox.room(0) >= 2:
            item = inbox.popleft()
            self.outbox.offer(item)
            self.outbox.offer(item)


class FullOutboxRecorder(Repeater):
    """Records how often process() was entered with the outbox already full."""

    def process(self, ordinal: int, inbox: Inbox) -> None:
        if self.outbox.room(0) == 0:
            self.context.get_list("entered_full").append(inbox[0])
        super().process(ordinal, inbox)


class ListSink(AbstractProcessor):
    """Appends every item to the named list ``sink`` (no output)."""

    def init_processor(self, context: Context) -> None:
        self.target = context.get_list("sink")

    def try_process_item(self, ordinal: int, item: Any) -> bool:
        self.target.append(item)
        return True


class ContextReporter(AbstractProcessor):
    """Emits what its context says, in complete()."""

    def complete(self) -> bool:
        c = self.context
        self.context.get_list("guarantees").append(c.processing_guarantee)
        return self.try_emit(
            (
                c.local_processor_index,
                c.global_processor_index,
                c.local_parallelism,
                c.total_parallelism,
                c.member_index,
                c.member_count,
            )
        )


class ReusesScratch(AbstractProcessor):
    """Counts items per key; saves one entry per key through ONE reused mutable object
    (entries span several save_to_snapshot calls under capacity 1). Correct only
    because snapshot entries are serialised when offered, as in Jet."""

    def init_processor(self, context: Context) -> None:
        self.counts: dict[Any, int] = {}
        self.scratch: list[Any] = [None, 0]
        self._save_it: Iterator[Any] | None = None
        self._emit_it: Iterator[Any] | None = None

    def try_process_item(self, ordinal: int, item: Any) -> bool:
        self.counts[item] = self.counts.get(item, 0) + 1
        return True

    def complete(self) -> bool:
        if self._emit_it is None:
            self._emit_it = iter(sorted(self.counts.items()))
        return self.emit_from(self._emit_it)

    def _entries(self) -> Iterator[tuple[Any, Any]]:
        for key, count in sorted(self.counts.items()):
            self.scratch[0] = key
            self.scratch[1] = count
            yield key, self.scratch

    def save_to_snapshot(self) -> bool:
        if self._save_it is None:
            self._save_it = self._entries()
        if self.emit_to_snapshot_from(self._save_it):
            self._save_it = None
            return True
        return False

    def restore_from_snapshot_entry(self, key: Any, value: Any) -> None:
        assert value[0] == key
        self.counts[key] = value[1]


class Unpicklable(AbstractProcessor):
    def save_to_snapshot(self) -> bool:
        return self.try_emit_to_snapshot("lock", __import__("threading").Lock())


class SnapshotOutsideSave(AbstractProcessor):
    def try_process_item(self, ordinal: int, item: Any) -> bool:
        return self.try_emit_to_snapshot("k", item)


class Exploding(AbstractProcessor):
    def try_process_item(self, ordinal: int, item: Any) -> bool:
        raise ValueError(f"cannot handle {item!r}")


class Unordered(AbstractProcessor):
    """Emits its input in reverse order at the end."""

    def init_processor(self, context: Context) -> None:
        self.items: list[Any] = []
        self._it: Iterator[Any] | None = None

    def try_process_item(self, ordinal: int, item: Any) -> bool:
        self.items.append(item)
        return True

    def complete(self) -> bool:
        if self._it is None:
            self._it = iter(list(reversed(self.items)))
        return self.emit_from(self._it)

    def save_to_snapshot(self) -> bool:
        return self.try_emit_to_snapshot("items", self.items)

    def restore_from_snapshot_entry(self, key: Any, value: Any) -> None:
        self.items = value


class BlockingDoubler(Processor):
    """Non-cooperative: relies on the blocking outbox (never checks offer's result)."""

    def is_cooperative(self) -> bool:
        return False

    def process(self, ordinal: int, inbox: Inbox) -> None:
        while inbox:
            self.outbox.offer(inbox.popleft() * 2)


# -- oracles ---------------------------------------------------------------------------
def mixed_order(
    inputs: Sequence[Sequence[Any]], priorities: Sequence[int]
) -> list[tuple[int, Any]]:
    """Plain-Python oracle of the harness's input order: key (priority, position within
    the ordinal's input, ordinal's rank within its priority group)."""
    keyed = []
    for o, seq in enumerate(inputs):
        rank = sorted(i for i, p in enumerate(priorities) if p == priorities[o]).index(o)
        for pos, item in enumerate(seq):
            keyed.append(((priorities[o], pos, rank), (o, item)))
    return [pair for _, pair in sorted(keyed, key=lambda kv: kv[0])]


# -- correct processors pass -----------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(-1000, 1000), max_size=12))
def test_doubler_matches_oracle(xs: list[int]) -> None:
    verify_processor(Doubler).input(xs).expect_output([2 * x for x in xs])


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 4), max_size=8))
def test_flat_mapper_processor_matches_oracle(xs: list[int]) -> None:
    expected = [n for n in xs for _ in range(n)]
    verify_processor(Repeater).input(xs).expect_output(expected)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(-50, 50), max_size=10))
def test_summing_processor_with_snapshots(xs: list[int]) -> None:
    verify_processor(Summer).input(xs).expect_output([sum(xs)])


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 30), max_size=10))
def test_processor_emitting_several_items_in_complete(xs: list[int]) -> None:
    verify_processor(SortingEmitter).input(xs).expect_output(sorted(xs))


@settings(max_examples=20, deadline=None)
@given(st.lists(st.integers(0, 4), max_size=8))
def test_offer_many_processor_matches_oracle(xs: list[int]) -> None:
    expected = [n for n in xs for _ in range(n)]
    verify_processor(BulkRepeater).input(xs).expect_output(expected)


def test_source_emitting_in_complete_with_snapshots_in_complete_loop() -> None:
    verify_processor(functools.partial(CountingSource, 6)).expect_output(list(range(6)))


def test_source_without_items() -> None:
    verify_processor(functools.partial(CountingSource, 0)).expect_output([])


def test_watermarks_in_input_are_forwarded_in_place() -> None:
    items = [1, Watermark(10), 2, 3, Watermark(20), Watermark(30), 4]
    expected = [2, Watermark(10), 4, 6, Watermark(20), Watermark(30), 8]
    verify_processor(Doubler).input(items).expect_output(expected)


@settings(max_examples=30, deadline=None)
@given(
    st.lists(
        st.one_of(st.integers(0, 100), st.integers(0, 100).map(Watermark)),
        max_size=12,
    )
)
def test_watermarks_anywhere_in_input(items: list[Any]) -> None:
    expected = [i if isinstance(i, Watermark) else 2 * i for i in items]
    verify_processor(Doubler).input(items).expect_output(expected)


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 4).flatmap(
        lambda n: st.tuples(
            st.lists(st.lists(st.integers(0, 9), max_size=5), min_size=n, max_size=n),
            st.lists(st.integers(-1, 2), min_size=n, max_size=n),
        )
    )
)
def test_multiple_inputs_mixed_by_priority_then_round_robin(
    data: tuple[list[list[int]], list[int]],
) -> None:
    inputs, priorities = data
    expected = mixed_order(inputs, priorities)
    verify_processor(OrdinalTagger).inputs(inputs, priorities=priorities).expect_output(expected)


def test_mixing_example_from_reference() -> None:
    # item0 of input0, item0 of input1, item1 of input0, ...; priority 0 before 1
    inputs = [["a0", "a1", "a2"], ["b0"], ["c0", "c1"]]
    expected = [(0, "a0"), (1, "b0"), (0, "a1"), (0, "a2"), (2, "c0"), (2, "c1")]
    verify_processor(OrdinalTagger).inputs(inputs, [0, 0, 1]).expect_output(expected)


def test_watermarks_in_several_inputs() -> None:
    inputs = [[1, Watermark(5), 2], [Watermark(3), 4]]
    expected = [(0, 1), Watermark(3), Watermark(5), (1, 4), (0, 2)]
    verify_processor(OrdinalTagger).inputs(inputs).expect_output(expected)


def test_inbox_batches_never_mix_ordinals_and_watermark_only_first() -> None:
    h = verify_processor(OrdinalTagger)
    h.execute_before_each_run(lambda: h.services.get_list("log").clear())
    h.disable_snapshots().disable_outbox_capacity_one()  # only mode 2: inbox limit 1024
    h.input([1, 2, Watermark(5), 3, 4, Watermark(6)]).expect_output(
        [(0, 1), (0, 2), Watermark(5), (0, 3), (0, 4), Watermark(6)]
    )
    assert h.services.get_list("log") == [
        ("batch", 0, [1, 2]),
        ("wm", 5),
        ("batch", 0, [3, 4]),
        ("wm", 6),
    ]

    h2 = verify_processor(OrdinalTagger)
    h2.execute_before_each_run(lambda: h2.services.get_list("log").clear())
    h2.disable_snapshots().disable_outbox_capacity_one()
    h2.inputs([[1, 2], [3, 4]]).expect_output([(0, 1), (1, 3), (0, 2), (1, 4)])
    batches = [e for e in h2.services.get_list("log") if e[0] == "batch"]
    assert batches == [("batch", 0, [1]), ("batch", 1, [3]), ("batch", 0, [2]), ("batch", 1, [4])]


def test_process_is_called_again_with_the_outbox_still_full() -> None:
    h = verify_processor(FullOutboxRecorder).disable_snapshots()
    h.input([3, 2]).expect_output([3, 3, 3, 2, 2])
    # Repeater leaves the outbox full with its input still in the inbox; the harness
    # must call process() again before draining
    assert len(h.services.get_list("entered_full")) > 0


def test_complete_edge_called_once_per_ordinal_and_again_after_restore() -> None:
    # the empty ordinal 1 completes first; ordinal 2 right after its only item
    inputs = [[1, 2], [], [3]]
    expected = [("done", 1), 1, 3, ("done", 2), 2, ("done", 0)]
    verify_processor(EdgeMarker).inputs(inputs).expect_output(expected)


def test_complete_edge_state_not_saved_is_caught_in_mode_3() -> None:
    with pytest.raises(AssertionError, match="mode 3"):
        verify_processor(NaiveEdgeMarker).inputs([[1, 2], [3]]).expect_output(
            [1, 3, ("done", 1), 2, ("done", 0)]
        )


@settings(max_examples=20, deadline=None)
@given(st.lists(st.sampled_from("abc"), max_size=10))
def test_snapshot_entries_are_copied_when_offered(xs: list[str]) -> None:
    expected = sorted((k, xs.count(k)) for k in set(xs))
    verify_processor(ReusesScratch).input(xs).expect_output(expected)


def test_non_cooperative_processor_gets_a_blocking_outbox() -> None:
    verify_processor(BlockingDoubler).input([1, 2, 3, 4]).expect_output([2, 4, 6, 8])


def test_non_cooperative_processor_has_no_time_limit() -> None:
    supplier = functools.partial(Sleepy, 0.02, False)
    verify_processor(supplier).cooperative_timeout(1).disable_snapshots().input([1]).expect_output(
        [1]
    )


def test_same_items_any_order_checker() -> None:
    verify_processor(Unordered).input([1, 2, 3]).output_checker(SAME_ITEMS_ANY_ORDER).expect_output(
        [1, 2, 3]
    )
    with pytest.raises(AssertionError, match="mode 1"):
        verify_processor(Unordered).input([1, 2, 3]).expect_output([1, 2, 3])


@given(st.lists(st.integers(0, 3), max_size=6), st.randoms())
def test_same_items_any_order_oracle(xs: list[int], rnd: Any) -> None:
    shuffled = list(xs)
    rnd.shuffle(shuffled)
    assert SAME_ITEMS_ANY_ORDER(xs, shuffled)
    assert not SAME_ITEMS_ANY_ORDER(xs, shuffled + [0])
    assert SAME_ITEMS_ANY_ORDER([[x] for x in xs], [[x] for x in shuffled])  # unhashable
    assert EXACT(xs, list(xs))
    assert not EXACT(xs, xs + [1])


def test_custom_output_checker_receives_expected_and_actual() -> None:
    seen = []

    def checker(expected: list[Any], actual: list[Any]) -> bool:
        seen.append((list(expected), list(actual)))
        return True

    verify_processor(Doubler).input([1]).output_checker(checker).expect_output(["anything"])
    assert seen and all(s == (["anything"], [2]) for s in seen)


def test_disable_complete_call() -> None:
    verify_processor(Summer).input([1, 2]).disable_complete_call().expect_output([])


def test_disable_outbox_capacity_one_allows_processors_needing_room() -> None:
    with pytest.raises(AssertionError, match="mode 1"):
        verify_processor(PairEmitter).input([1, 2]).expect_output([1, 1, 2, 2])
    verify_processor(PairEmitter).input([1, 2]).disable_outbox_capacity_one().expect_output(
        [1, 1, 2, 2]
    )


def test_list_sink_with_shared_services() -> None:
    services = InMemoryServices()
    h = verify_processor(ListSink, services=services)
    runs: list[int] = []

    def before_run() -> None:
        runs.append(1)
        services.get_list("sink").clear()

    h.execute_before_each_run(before_run)
    h.input(["a", "b"]).expect_output([])
    assert services.get_list("sink") == ["a", "b"]
    assert len(runs) == 5


def test_context_reports_configured_indices_and_guarantee() -> None:
    h = (
        verify_processor(ContextReporter)
        .local_processor_index(1)
        .global_processor_index(5)
        .local_parallelism(2)
        .total_parallelism(6)
    )
    h.expect_output([(1, 5, 2, 6, 2, 3)])
    guarantees = set(h.services.get_list("guarantees"))
    assert guarantees == {ProcessingGuarantee.NONE, ProcessingGuarantee.EXACTLY_ONCE}

    h2 = verify_processor(ContextReporter).processing_guarantee(ProcessingGuarantee.AT_LEAST_ONCE)
    h2.expect_output([(0, 0, 1, 1, 0, 1)])
    assert set(h2.services.get_list("guarantees")) == {ProcessingGuarantee.AT_LEAST_ONCE}


def test_fresh_processor_for_every_run_and_restore() -> None:
    made: list[Processor] = []

    def supplier() -> Processor:
        p = Summer()
        made.append(p)
        return p

    verify_processor(supplier).input([1, 2, 3]).expect_output([6])
    assert len({id(p) for p in made}) == len(made)
    # 5 runs + restores: mode 3 restores at each of 4 snapshot points (before the first
    # item and after each of 3 items), mode 4 at 2 of them
    assert len(made) == 5 + 4 + 2


def test_supplier_returning_the_same_instance_is_rejected() -> None:
    shared = Doubler()
    with pytest.raises(AssertionError, match="new processor"):
        verify_processor(lambda: shared).input([1]).expect_output([2])


def test_meta_supplier_and_supplier_lifecycle() -> None:
    calls: list[Any] = []

    class Supplier(ProcessorSupplier):
        def init(self, context: SupplierContext) -> None:
            calls.append(("init", context.local_parallelism))

        def get(self, count: int) -> list[Processor]:
            calls.append(("get", count))
            return [Doubler() for _ in range(count)]

        def close(self, error: BaseException | None) -> None:
            calls.append(("close", error))

    class Meta(ProcessorMetaSupplier):
        def get(self, addresses: Sequence[MemberAddress]) -> Any:
            calls.append(("addresses", len(addresses)))
            s = Supplier()
            return lambda address: s

    verify_processor(Meta()).input([1]).expect_output([2])
    assert calls[0] == ("addresses", 1)
    assert calls[1] == ("init", 1)
    assert all(c == ("get", 1) for c in calls[2:-1])
    assert calls[-1] == ("close", None)

    calls.clear()
    verify_processor(Supplier()).input([1]).expect_output([2])
    assert calls[0] == ("init", 1) and calls[-1] == ("close", None)

    calls.clear()
    with pytest.raises(AssertionError):
        verify_processor(Supplier()).input([1]).expect_output([3])
    assert calls[-1][0] == "close" and isinstance(calls[-1][1], AssertionError)


def test_run_until_output_matches_for_streaming_source() -> None:
    verify_processor(
        functools.partial(StreamingSource, 3)
    ).disable_progress_assertion().run_until_output_matches(5000, 20).expect_output([0, 1, 2])


def test_run_until_output_matches_times_out() -> None:
    h = verify_processor(functools.partial(StreamingSource, 2)).disable_progress_assertion()
    with pytest.raises(AssertionError, match="mode 1"):
        h.run_until_output_matches(30, 10).expect_output([0, 1, 2])


def test_run_until_output_matches_fails_when_output_stops_matching() -> None:
    h = verify_processor(functools.partial(StreamingSource, 2, 8)).disable_progress_assertion()
    with pytest.raises(AssertionError, match="already matched"):
        h.run_until_output_matches(5000, 2000).expect_output([0, 1])


def test_collect_outbox_helper() -> None:
    ob = Outbox(2, capacity=4)
    ob.offer("x")
    ob.offer("y", 1)
    assert collect_outbox(ob) == [["x"], ["x", "y"]]
    assert collect_outbox(ob) == [[], []]


def test_alias_and_argument_validation() -> None:
    assert TestSupport is ProcessorVerifier
    with pytest.raises(ValueError, match="priorities"):
        verify_processor(Doubler).inputs([[1], [2]], priorities=[0])
    with pytest.raises(ValueError, match="local_processor_index"):
        verify_processor(Doubler).local_processor_index(2).local_parallelism(2).input(
            [1]
        ).expect_output([2])
    with pytest.raises(ValueError, match="outbox_capacity"):
        verify_processor(Doubler).outbox_capacity(0)
    with pytest.raises(TypeError, match="Processor instance"):
        verify_processor(Doubler())


# -- buggy processors are caught -------------------------------------------------------
def test_processor_ignoring_refusal_is_caught_in_mode_1() -> None:
    with pytest.raises(AssertionError) as info:
        verify_processor(IgnoresRefusal).input([1, 2]).expect_output([1, 10, 100, 2, 20, 200])
    msg = str(info.value)
    assert msg.startswith(MODE1)
    assert "offer(100) after offer() returned False in the same call" in msg


def test_processor_ignoring_refusal_passes_with_big_outbox() -> None:
    # proves the failure above comes from the capacity-1 modes, not from the output
    verify_processor(IgnoresRefusal).disable_outbox_capacity_one().input([1, 2]).expect_output(
        [1, 10, 100, 2, 20, 200]
    )


def test_processor_dropping_refused_item_is_caught() -> None:
    with pytest.raises(AssertionError) as info:
        verify_processor(DropsOnRefusal).input([1, 2]).expect_output([1, 10, 2, 20])
    msg = str(info.value)
    assert msg.startswith(MODE1)
    assert "offered 2 to ordinal None, but the outbox had refused 10" in msg


def test_processor_dropping_its_last_refused_item_is_reported_lost() -> None:
    with pytest.raises(AssertionError) as info:
        verify_processor(DropsOnRefusal).input([5]).expect_output([5, 50])
    msg = str(info.value)
    assert msg.startswith(MODE1)
    assert "complete() returned True, but the outbox had refused 50" in msg
    assert "the item is lost" in msg


def test_processor_not_coping_with_a_full_outbox_is_caught() -> None:
    with pytest.raises(AssertionError, match="^mode 1"):
        verify_processor(AssumesRoomAtCallStart).input([1, 2]).expect_output([1, 10, 2, 20])
    verify_processor(CorrectTwoPerItem).input([1, 2]).expect_output([1, 10, 2, 20])


def test_state_lost_across_restore_is_caught_in_mode_3() -> None:
    with pytest.raises(AssertionError) as info:
        verify_processor(ForgetfulSummer).input([1, 2, 3]).expect_output([6])
    msg = str(info.value)
    assert msg.startswith(MODE3)
    assert "expected (1 items):\n  6" in msg
    # the last restore happens after the last item: the new processor starts from 0
    assert "actual (1 items):\n  0" in msg


def test_source_position_lost_across_restore_is_caught_in_mode_3() -> None:
    # restarting from 0 after every restore would never finish: the harness gives up
    with pytest.raises(AssertionError, match="^mode 3") as info:
        verify_processor(functools.partial(ForgetfulSource, 3)).expect_output([0, 1, 2])
    assert "seems to never finish" in str(info.value)
    # restoring only every second snapshot point, the lost position shows as duplicates
    with pytest.raises(AssertionError, match="^mode 4") as info:
        verify_processor(
            functools.partial(ForgetfulSource, 3)
        ).disable_restore_after_every_item().expect_output([0, 1, 2])


def test_forgetful_processor_passes_without_snapshots() -> None:
    verify_processor(ForgetfulSummer).input([1, 2, 3]).disable_snapshots().expect_output([6])
    # mode 4 restores only every second snapshot point but still loses state
    with pytest.raises(AssertionError, match="^mode 4"):
        verify_processor(ForgetfulSummer).input(
            [1, 2, 3]
        ).disable_restore_after_every_item().expect_output([6])


def test_no_progress_is_caught() -> None:
    with pytest.raises(AssertionError) as info:
        verify_processor(NoProgress).input([1]).expect_output([1])
    msg = str(info.value)
    assert msg.startswith(MODE1)
    assert "process() call without progress" in msg


def test_slow_cooperative_call_fails() -> None:
    with pytest.raises(AssertionError) as info:
        verify_processor(functools.partial(Sleepy, 0.03)).cooperative_timeout(1).input(
            [1]
        ).expect_output([1])
    msg = str(info.value)
    assert msg.startswith(MODE1)
    assert "process()" in msg and "cooperative_timeout" in msg


def test_slow_cooperative_call_only_warns_under_the_timeout(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level("WARNING", logger="slipstream.testing"):
        verify_processor(functools.partial(Sleepy, 0.01)).disable_snapshots().input(
            [1]
        ).expect_output([1])
    assert any("process()" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level("WARNING", logger="slipstream.testing"):
        verify_processor(
            functools.partial(Sleepy, 0.01)
        ).disable_logging().disable_snapshots().input([1]).expect_output([1])
    assert not caplog.records


def test_unpicklable_snapshot_state_is_caught() -> None:
    with pytest.raises(AssertionError, match="mode 3.*'lock'.*cannot be pickled"):
        verify_processor(Unpicklable).input([]).expect_output([])


def test_offer_to_snapshot_outside_save_is_caught() -> None:
    with pytest.raises(AssertionError, match="only allowed in save_to_snapshot"):
        verify_processor(SnapshotOutsideSave).input([1]).expect_output([])


def test_processor_exception_gets_a_note_naming_the_mode() -> None:
    with pytest.raises(ValueError, match="cannot handle 1") as info:
        verify_processor(Exploding).input([1]).expect_output([])
    assert any("mode 1" in note for note in info.value.__notes__)


def test_wrong_expected_output_names_mode_and_shows_both_lists() -> None:
    with pytest.raises(AssertionError) as info:
        verify_processor(Doubler).input([1, 2]).expect_output([2, 5])
    msg = str(info.value)
    assert msg.startswith(MODE1)
    assert "expected (2 items):\n  2\n  5" in msg
    assert "actual (2 items):\n  2\n  4" in msg


def test_multiple_output_ordinals() -> None:
    class Splitter(AbstractProcessor):
        def try_process_item(self, ordinal: int, item: Any) -> bool:
            return self.try_emit(item, item % 2)

    verify_processor(Splitter).input([1, 2, 3, 4]).expect_outputs([[2, 4], [1, 3]])
    # a watermark offered to all ordinals appears in each output
    verify_processor(Splitter).input([1, Watermark(3), 2]).expect_outputs(
        [[Watermark(3), 2], [1, Watermark(3)]]
    )
