"""The processor test harness (Jet's ``TestSupport``).

A processor that gives the right output when fed all of its input in one call can still
be wrong in the engine: the engine hands it small batches, its outbox fills up in the
middle of a batch, and with a processing guarantee it is snapshotted, thrown away and
restored from that snapshot at arbitrary points. :func:`verify_processor` drives one
processor through the same scenario in several *modes*, each with a FRESH processor, and
asserts that every mode produces the same expected output::

    from slipstream.testing import verify_processor

    verify_processor(Doubler).input([1, 2, 3]).expect_output([2, 4, 6])

Why each mode exists:

1. **Snapshots off, inbox limit 1, outbox capacity 1.** Every item arrives in its own
   ``process()`` call and every second offer is refused. This flushes out processors that
   ignore ``offer()`` returning ``False`` (they lose items) or that cannot resume where the
   full outbox stopped them. After a ``process()`` call that left the outbox full while
   items remain, ``process()`` is called *again with the outbox still full*: a cooperative
   processor must cope (offer the same item again, not lose or duplicate it).
2. **Snapshots off, inbox limit 1024, normal outbox capacity** (only if there is input).
   The ordinary fast path: many items per call, little back-pressure. Catches processors
   that only work one item at a time.
3. **Snapshots on, save and restore at every snapshot point, inbox limit 1, outbox
   capacity 1.** After every item the processor saves its state, is closed, and a new
   processor restored from the saved entries continues. Any state the processor forgets
   to save (or restores wrongly) shows up as wrong output.
4. **Snapshots on, restore every second snapshot.** A processor that is snapshotted, keeps
   running and later snapshotted again must not be disturbed by the first save (e.g.
   clearing state in ``save_to_snapshot``), and restoring must not depend on the previous
   save having been restored.
5. **Snapshots on, never restore (save only).** Saving must not change what the
   processor emits.

Mechanics (docs/semantics.md §10):

* Input of several ordinals is mixed by priority (lower number first; a group is
  exhausted before the next starts), round robin within a priority. An inbox batch never
  mixes ordinals. A :class:`~slipstream.core.items.Watermark` in the input can only be the
  first item of a batch; it is presented with ``try_process_watermark`` and removed from
  the inbox when that returns ``True``. Watermarks are not coalesced: this is one
  processor, not a tasklet.
* When an ordinal has delivered its last item, ``complete_edge(ordinal)`` is called until
  it returns ``True`` (this harness adds that call to Jet's; the engine makes it). A
  restored processor gets ``complete_edge`` again for every ordinal already completed, as
  a restarted job's finished upstream would send end-of-stream again.
* Snapshot points: once before the first item, every time the inbox becomes empty, and
  during the ``complete()`` loop after every ``False`` return that made progress and left
  no refused item waiting. Saved entries are pickled and unpickled at once (Jet
  serialises them immediately), so a processor may mutate its state after saving.
* Restore: close the old processor, make a new one from the supplier with a new outbox,
  ``init`` it, feed every saved entry to ``restore_from_snapshot``, then call
  ``finish_snapshot_restore`` until ``True``.
* ``complete()`` is called until ``True`` (unless disabled). A streaming source whose
  ``complete()`` never returns ``True`` uses :meth:`ProcessorVerifier.run_until_output_matches`.
* Progress assertion: every call of ``process``, ``try_process_watermark``,
  ``complete_edge``, ``complete``, ``save_to_snapshot``, ``restore_from_snapshot`` and
  ``finish_snapshot_restore`` must take from the inbox, offer to the outbox or (boolean
  methods) return ``True``. A call without progress would make the engine spin.
* Outbox discipline: after ``offer()`` returned ``False`` in a call, offering anything
  else in the same call is an error, and the next offer (in a later call) must be the same
  item to the same ordinals. ``complete()`` returning ``True`` while a refused item was
  never offered again is reported as a lost item.
* A run whose output grows far beyond the expected output (``RUNAWAY_FACTOR``) fails
  instead of running forever (e.g. a source that restarts from zero after a restore).
* ``try_process()`` is never called (like Jet). Each call of a cooperative processor is
  timed: more than 5 ms logs a warning, more than ``cooperative_timeout`` fails. A
  non-cooperative processor gets a *blocking* outbox, as in the engine (offers never
  fail), and no time limit.

A failure raises ``AssertionError`` whose message names the mode; an exception raised by
the processor itself gets a note naming the mode.
"""

from __future__ import annotations

import logging
import pickle
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from slipstream.core.config import ProcessingGuarantee
from slipstream.core.inbox import Inbox
from slipstream.core.items import Watermark
from slipstream.core.outbox import DEFAULT_BUCKET_CAPACITY, Outbox
from slipstream.core.processor import Context, Processor
from slipstream.core.services import InMemoryServices
from slipstream.core.suppliers import (
    FactorySupplier,
    MemberAddress,
    ProcessorMetaSupplier,
    ProcessorSupplier,
    SupplierContext,
    to_meta_supplier,
)
from slipstream.state.keys import expand_entries

__all__ = [
    "verify_processor",
    "ProcessorVerifier",
    "TestSupport",
    "RunMode",
    "SAME_ITEMS_ANY_ORDER",
    "EXACT",
    "collect_outbox",
    "DEFAULT_INBOX_LIMIT",
    "DEFAULT_COOPERATIVE_TIMEOUT_MS",
]

_log = logging.getLogger("slipstream.testing")

DEFAULT_INBOX_LIMIT = 1024
"""Inbox batch size of mode 2 (the engine's default edge queue size)."""

DEFAULT_COOPERATIVE_TIMEOUT_MS = 5000
"""A cooperative call taking longer than this fails the test (Jet 4.x default)."""

COOPERATIVE_WARN_MS = 5.0
"""A cooperative call taking longer than this logs a warning (not a failure)."""

NON_COOPERATIVE_WARN_MS = 10_000.0
"""A non-cooperative call taking longer than this logs a warning."""

RUNAWAY_FACTOR = 10
RUNAWAY_SLACK = 10_000
"""A run fails once an output ordinal holds more than ``RUNAWAY_FACTOR * len(expected)
+ RUNAWAY_SLACK`` items: the processor would otherwise keep the test running forever."""

_NEVER = 0
_LOCAL_ADDRESS = MemberAddress("127.0.0.1", 5701)

OutputChecker = Callable[[list[Any], list[Any]], bool]


# -- output checkers -------------------------------------------------------------------
def EXACT(expected: list[Any], actual: list[Any]) -> bool:
    """The default checker: equal items in the same order."""
    return list(expected) == list(actual)


def SAME_ITEMS_ANY_ORDER(expected: list[Any], actual: list[Any]) -> bool:
    """Equal items, each as often, in any order (for processors whose output order is
    not defined, e.g. keyed aggregations emitting from a dict)."""
    if len(expected) != len(actual):
        return False
    try:
        return Counter(expected) == Counter(actual)
    except TypeError:  # unhashable items: quadratic matching
        remaining = list(actual)
        for e in expected:
            for i, a in enumerate(remaining):
                if a == e:
                    del remaining[i]
                    break
            else:
                return False
        return True


def collect_outbox(outbox: Outbox) -> list[list[Any]]:
    """Drain every data bucket of ``outbox``: one list per outbound ordinal.

    Handy when driving a processor by hand in a unit test; the snapshot bucket is left
    alone.
    """
    out = []
    for bucket in outbox.buckets:
        out.append(bucket.copy())
        bucket.clear()
    return out


# -- modes -----------------------------------------------------------------------------
@dataclass(frozen=True)
class RunMode:
    """One run of the scenario. ``restore_interval``: restore at every n-th snapshot
    point (0: never restore)."""

    __test__ = False  # not a pytest test class

    number: int
    snapshots: bool
    restore_interval: int
    inbox_limit: int
    outbox_capacity: int

    def __str__(self) -> str:
        if not self.snapshots:
            snap = "snapshots off"
        elif self.restore_interval == 1:
            snap = "snapshots on, restore after every snapshot"
        elif self.restore_interval == _NEVER:
            snap = "snapshots on, never restore"
        else:
            snap = f"snapshots on, restore every {self.restore_interval} snapshots"
        return (
            f"mode {self.number} ({snap}, inbox limit {self.inbox_limit}, "
            f"outbox capacity {self.outbox_capacity})"
        )


# -- the harness outbox ----------------------------------------------------------------
_NOTHING: Any = object()


def _same_item(a: Any, b: Any) -> bool:
    if a is b:
        return True
    try:
        return bool(a == b)
    except Exception:  # e.g. array-like items with element-wise ==: don't judge
        return True


class _HarnessOutbox(Outbox):
    """An :class:`Outbox` that checks the offer discipline, counts accepted offers (the
    progress assertion) and copies snapshot entries through pickle on the spot."""

    __slots__ = (
        "accepted",
        "refused_in_call",
        "pending",
        "pending_targets",
        "pending_method",
        "pending_snapshot",
        "current_method",
    )

    def __init__(
        self,
        ordinal_count: int,
        capacity: int,
        flush_fn: Callable[[], None] | None,
    ) -> None:
        super().__init__(ordinal_count, capacity, capacity, flush_fn)
        self.accepted = 0
        self.refused_in_call: str | None = None
        self.pending: Any = _NOTHING
        self.pending_targets: tuple[int, ...] = ()
        self.pending_method = ""
        self.pending_snapshot: Any = _NOTHING
        self.current_method = ""

    def _targets(self, ordinal: Any) -> tuple[int, ...]:
        if ordinal is None:
            return self._all
        if isinstance(ordinal, int):
            return (ordinal,)
        return tuple(ordinal)

    def start_call(self, method: str) -> None:
        self.accepted = 0
        self.refused_in_call = None
        self.current_method = method

    def _check_again(self, what: str) -> None:
        if self.refused_in_call is not None:
            raise AssertionError(
                f"{self.current_method}() called {what} after {self.refused_in_call} "
                "returned False in the same call; a cooperative processor must return "
                "after a refusal and offer the same item again in its next call"
            )

    def offer(self, item: Any, ordinal: Any = None) -> bool:
        self._check_again(f"offer({item!r})")
        pending = self.pending
        if pending is not _NOTHING and (
            not _same_item(item, pending) or self._targets(ordinal) != self.pending_targets
        ):
            raise AssertionError(
                f"{self.current_method}() offered {item!r} to ordinal {ordinal!r}, but "
                f"the outbox had refused {pending!r} (ordinals {self.pending_targets!r}, in "
                f"{self.pending_method}()) and it must be offered again first: a refused "
                "item may not be dropped or overtaken"
            )
        if Outbox.offer(self, item, ordinal):
            self.pending = _NOTHING
            self.accepted += 1
            return True
        self.pending = item
        self.pending_targets = self._targets(ordinal)
        self.pending_method = self.current_method
        self.refused_in_call = "offer()"
        return False

    def offer_many(self, items: Iterable[Any], ordinal: int = 0, plain: bool = False) -> Any:
        offer = self.offer  # item by item, as the harness checks each offer
        it = iter(items)
        for item in it:
            if not offer(item, ordinal):
                return _chain_first(item, it)
        return None

    def offer_to_snapshot(self, key: Any, value: Any) -> bool:
        self._check_again(f"offer_to_snapshot({key!r}, ...)")
        pending = self.pending_snapshot
        if pending is not _NOTHING and not _same_item(key, pending):
            raise AssertionError(
                f"{self.current_method}() offered snapshot key {key!r}, but the outbox "
                f"had refused key {pending!r} and it must be offered again first"
            )
        if self._flush_fn is None and len(self.snapshot_bucket) >= self.snapshot_capacity:
            self.pending_snapshot = key
            self.refused_in_call = "offer_to_snapshot()"
            return False
        from slipstream.core.pickling import cloudpickle  # imported when a test snapshots

        try:
            key, value = pickle.loads(cloudpickle.dumps((key, value)))
        except Exception as e:
            raise AssertionError(
                f"snapshot entry with key {key!r} (value of type {type(value).__name__}) "
                f"cannot be pickled: {e!r}; snapshot state must survive serialisation"
            ) from e
        Outbox.offer_to_snapshot(self, key, value)
        self.pending_snapshot = _NOTHING
        self.accepted += 1
        return True

    def is_full(self) -> bool:
        if self._flush_fn is not None:
            return False
        cap = self.capacity
        return any(len(b) >= cap for b in self.buckets)

    def has_unfinished_item(self) -> bool:
        return self.pending is not _NOTHING


def _chain_first(first: Any, rest: Any) -> Any:
    yield first
    yield from rest


# -- the verifier ----------------------------------------------------------------------
class _EdgeDone:
    __slots__ = ("ordinal",)

    def __init__(self, ordinal: int) -> None:
        self.ordinal = ordinal


def _mix_inputs(inputs: Sequence[Sequence[Any]], priorities: Sequence[int]) -> list[Any]:
    """The order the processor sees input in: ``(ordinal, item)`` pairs and ``_EdgeDone``
    markers. Priority groups in ascending order; within a group round robin (item 0 of
    each ordinal, then item 1, ...); an ordinal's end right after its last item."""
    events: list[Any] = []
    for prio in sorted(set(priorities)):
        ordinals = [o for o, p in enumerate(priorities) if p == prio]
        for o in ordinals:
            if not inputs[o]:
                events.append(_EdgeDone(o))
        longest = max(len(inputs[o]) for o in ordinals)
        for i in range(longest):
            for o in ordinals:
                seq = inputs[o]
                if i < len(seq):
                    events.append((o, seq[i]))
                    if i == len(seq) - 1:
                        events.append(_EdgeDone(o))
    return events


def _format_list(items: Sequence[Any]) -> str:
    if not items:
        return "  (nothing)"
    return "\n".join(f"  {item!r}" for item in items)


class ProcessorVerifier:
    """Fluent builder for one processor test; ``expect_output``/``expect_outputs`` run it.

    Every option method returns ``self``. ``services`` is the in-memory store of named
    lists and maps shared by every processor of every run (so list sinks can be
    checked; clear it with :meth:`execute_before_each_run` if a sink appends).
    """

    __test__ = False  # not a pytest test class

    def __init__(self, supplier: Any, *, services: Any = None) -> None:
        self._meta: ProcessorMetaSupplier = to_meta_supplier(supplier)
        self.services: Any = services if services is not None else InMemoryServices()
        self._inputs: list[list[Any]] = []
        self._priorities: list[int] = []
        self._snapshots = True
        self._restore_every_item = True
        self._call_complete = True
        self._assert_progress = True
        self._capacity_one = True
        self._logging = True
        self._cooperative_timeout_ms: float = DEFAULT_COOPERATIVE_TIMEOUT_MS
        self._checker: OutputChecker = EXACT
        self._local_index = 0
        self._global_index = 0
        self._local_parallelism = 1
        self._total_parallelism = 1
        self._guarantee: ProcessingGuarantee | None = None
        self._run_until_timeout_ms: float = -1.0
        self._run_until_extra_ms: float = 0.0
        self._outbox_capacity = DEFAULT_BUCKET_CAPACITY
        self._before_each_run: Callable[[], Any] | None = None
        self._vertex_name = "verify_processor"
        self._made: dict[int, Processor] = {}

    # -- input ---------------------------------------------------------------------
    def input(self, items: Iterable[Any]) -> ProcessorVerifier:
        """Items for inbound ordinal 0 (the only input)."""
        return self.inputs([list(items)])

    def inputs(
        self, inputs: Sequence[Iterable[Any]], priorities: Sequence[int] | None = None
    ) -> ProcessorVerifier:
        """Items per inbound ordinal, with optional edge priorities (lower first)."""
        lists = [list(i) for i in inputs]
        if priorities is None:
            prios = [0] * len(lists)
        else:
            prios = [int(p) for p in priorities]
            if len(prios) != len(lists):
                raise ValueError(
                    f"inputs() got {len(lists)} inputs but {len(prios)} priorities; give "
                    "one priority per input ordinal"
                )
        self._inputs = lists
        self._priorities = prios
        return self

    # -- options -------------------------------------------------------------------
    def disable_snapshots(self) -> ProcessorVerifier:
        """Skip modes 3-5 (for processors that cannot be snapshotted)."""
        self._snapshots = False
        return self

    def disable_restore_after_every_item(self) -> ProcessorVerifier:
        """Skip mode 3 (save and restore at every snapshot point), e.g. when it is too
        slow for a big input."""
        self._restore_every_item = False
        return self

    def disable_complete_call(self) -> ProcessorVerifier:
        """Don't call ``complete()`` (to test the output before completion)."""
        self._call_complete = False
        return self

    def disable_progress_assertion(self) -> ProcessorVerifier:
        """Allow calls that make no progress (e.g. a source waiting for data)."""
        self._assert_progress = False
        return self

    def disable_outbox_capacity_one(self) -> ProcessorVerifier:
        """Skip mode 1 and run the snapshot modes with the normal outbox capacity: for
        processors that need room for more than one item per call."""
        self._capacity_one = False
        return self

    def disable_logging(self) -> ProcessorVerifier:
        """Don't log slow-call warnings."""
        self._logging = False
        return self

    def cooperative_timeout(self, timeout_ms: float) -> ProcessorVerifier:
        """Fail if one call of a cooperative processor takes longer (0 disables)."""
        if timeout_ms < 0:
            raise ValueError(f"cooperative_timeout must be >= 0 ms, got {timeout_ms}")
        self._cooperative_timeout_ms = timeout_ms
        return self

    def output_checker(self, checker: OutputChecker) -> ProcessorVerifier:
        """``checker(expected, actual) -> bool`` per output ordinal; default
        :func:`EXACT`, see also :func:`SAME_ITEMS_ANY_ORDER`."""
        if not callable(checker):
            raise TypeError(f"output_checker needs a callable, got {type(checker).__name__}")
        self._checker = checker
        return self

    def local_processor_index(self, index: int) -> ProcessorVerifier:
        self._local_index = _non_negative("local_processor_index", index)
        return self

    def global_processor_index(self, index: int) -> ProcessorVerifier:
        self._global_index = _non_negative("global_processor_index", index)
        return self

    def local_parallelism(self, n: int) -> ProcessorVerifier:
        self._local_parallelism = _positive("local_parallelism", n)
        return self

    def total_parallelism(self, n: int) -> ProcessorVerifier:
        self._total_parallelism = _positive("total_parallelism", n)
        return self

    def processing_guarantee(self, guarantee: ProcessingGuarantee) -> ProcessorVerifier:
        """The guarantee the context reports in every mode. Default: ``NONE`` in modes
        1-2 and ``EXACTLY_ONCE`` in the snapshot modes."""
        if not isinstance(guarantee, ProcessingGuarantee):
            raise TypeError(f"processing_guarantee needs a ProcessingGuarantee, got {guarantee!r}")
        self._guarantee = guarantee
        return self

    def vertex_name(self, name: str) -> ProcessorVerifier:
        """The vertex name the context reports (and loggers use)."""
        self._vertex_name = str(name)
        return self

    def run_until_output_matches(self, timeout_ms: float, extra_ms: float) -> ProcessorVerifier:
        """For streaming sources whose ``complete()`` never returns ``True``: call
        ``complete()`` until the output matches and has kept matching for ``extra_ms``,
        or until ``timeout_ms`` passed (then the final check fails). Output that matched
        and stops matching fails at once."""
        if timeout_ms <= 0 or extra_ms < 0:
            raise ValueError(
                f"run_until_output_matches needs timeout_ms > 0 and extra_ms >= 0, got "
                f"{timeout_ms} and {extra_ms}"
            )
        self._run_until_timeout_ms = timeout_ms
        self._run_until_extra_ms = extra_ms
        return self

    def outbox_capacity(self, capacity: int) -> ProcessorVerifier:
        """Bucket capacity of the runs that don't use capacity 1 (default 2048)."""
        self._outbox_capacity = _positive("outbox_capacity", capacity)
        return self

    def execute_before_each_run(self, action: Callable[[], Any]) -> ProcessorVerifier:
        """Call ``action()`` before each mode's run (e.g. reset a sink's list)."""
        self._before_each_run = action
        return self

    # -- running -------------------------------------------------------------------
    def expect_output(self, expected: Iterable[Any]) -> None:
        """Run every mode; the processor's single output ordinal must equal
        ``expected`` (per the output checker)."""
        self.expect_outputs([list(expected)])

    def expect_outputs(self, expected: Sequence[Iterable[Any]]) -> None:
        """Run every mode; output ordinal ``i`` must equal ``expected[i]``."""
        lists = [list(e) for e in expected]
        self._check_indices()
        lp, total = self._local_parallelism, self._total_parallelism
        member_count = max(1, total // lp)
        member_index = min(self._global_index // lp, member_count - 1)
        sctx = SupplierContext(
            vertex_name=self._vertex_name,
            job_name="verify_processor",
            local_parallelism=lp,
            total_parallelism=total,
            member_count=member_count,
            member_index=member_index,
        )
        meta = self._meta
        meta.init(sctx._replace(member_index=0))
        by_address = meta.get([_LOCAL_ADDRESS])
        supplier = by_address(_LOCAL_ADDRESS)
        if not isinstance(supplier, ProcessorSupplier):
            if not callable(supplier):
                raise TypeError(
                    f"meta-supplier {meta!r} returned {type(supplier).__name__} for an "
                    "address; expected a ProcessorSupplier"
                )
            supplier = FactorySupplier(supplier)
        supplier.init(sctx)
        error: BaseException | None = None
        self._made = {}
        try:
            for mode in self._modes():
                if self._before_each_run is not None:
                    self._before_each_run()
                _Run(self, mode, supplier, lists, member_index, member_count).execute()
        except BaseException as e:
            error = e
            raise
        finally:
            self._made = {}
            supplier.close(error)
            meta.close(error)

    def _modes(self) -> list[RunMode]:
        has_input = any(self._inputs)
        one = 1 if self._capacity_one else self._outbox_capacity
        modes = []
        if self._capacity_one:
            modes.append(RunMode(1, False, _NEVER, 1, 1))
        if has_input or not self._capacity_one:
            modes.append(RunMode(2, False, _NEVER, DEFAULT_INBOX_LIMIT, self._outbox_capacity))
        if self._snapshots:
            if self._restore_every_item:
                modes.append(RunMode(3, True, 1, 1, one))
            modes.append(RunMode(4, True, 2, 1, one))
            modes.append(RunMode(5, True, _NEVER, 1, one))
        return modes

    def _check_indices(self) -> None:
        lp, total = self._local_parallelism, self._total_parallelism
        if self._local_index >= lp:
            raise ValueError(
                f"local_processor_index {self._local_index} must be < local_parallelism {lp}"
            )
        if self._global_index >= total:
            raise ValueError(
                f"global_processor_index {self._global_index} must be < total_parallelism {total}"
            )
        if lp > total:
            raise ValueError(f"local_parallelism {lp} must be <= total_parallelism {total}")


TestSupport = ProcessorVerifier
"""Jet's name for the harness."""


def verify_processor(supplier: Any, *, services: Any = None) -> ProcessorVerifier:
    """Start a processor test. ``supplier``: anything a vertex accepts (a Processor
    class, a zero-argument callable returning a new Processor, a ProcessorSupplier or a
    ProcessorMetaSupplier); a new processor is made for every run and every restore."""
    return ProcessorVerifier(supplier, services=services)


def _non_negative(name: str, value: int) -> int:
    if not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    return value


def _positive(name: str, value: int) -> int:
    if not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value


# -- one run ---------------------------------------------------------------------------
class _Run:
    """One mode's run: the driving loop, snapshot and restore, assertions."""

    def __init__(
        self,
        verifier: ProcessorVerifier,
        mode: RunMode,
        supplier: ProcessorSupplier,
        expected: list[list[Any]],
        member_index: int,
        member_count: int,
    ) -> None:
        self.v = verifier
        self.mode = mode
        self.supplier = supplier
        self.expected = expected
        self.member_index = member_index
        self.member_count = member_count
        self.actual: list[list[Any]] = [[] for _ in expected]
        self.saving: list[tuple[Any, Any]] | None = None
        self.restore_count = 0
        self.completed: list[int] = []
        self.idle_count = 0
        self.processor: Processor = None  # type: ignore[assignment]
        self.outbox: _HarnessOutbox = None  # type: ignore[assignment]
        self.cooperative = True
        if verifier._guarantee is not None:
            self.guarantee = verifier._guarantee
        elif mode.snapshots:
            self.guarantee = ProcessingGuarantee.EXACTLY_ONCE
        else:
            self.guarantee = ProcessingGuarantee.NONE

    # -- set-up ----------------------------------------------------------------------
    def _new_processor(self) -> None:
        procs = list(self.supplier.get(1))
        if len(procs) != 1 or not isinstance(procs[0], Processor):
            raise TypeError(
                f"supplier {self.supplier!r}.get(1) must return one new Processor, got {procs!r}"
            )
        p = procs[0]
        made = self.v._made
        if id(p) in made:
            raise AssertionError(
                f"supplier {self.supplier!r} returned a processor instance it had returned "
                "before; it must create a new processor on every call"
            )
        made[id(p)] = p  # keeps it alive, so the id stays unique
        self.processor = p
        self.cooperative = bool(p.is_cooperative())
        flush = None if self.cooperative else self._blocking_flush
        self.outbox = _HarnessOutbox(len(self.expected), self.mode.outbox_capacity, flush)
        v = self.v
        context = Context(
            vertex_name=v._vertex_name,
            global_processor_index=v._global_index,
            local_processor_index=v._local_index,
            local_parallelism=v._local_parallelism,
            total_parallelism=v._total_parallelism,
            member_index=self.member_index,
            member_count=self.member_count,
            processing_guarantee=self.guarantee,
            job_name="verify_processor",
            services=v.services,
        )
        p.init(self.outbox, context)

    # -- plumbing --------------------------------------------------------------------
    def _call(self, method: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Call one processor method, timed; returns its result."""
        self.outbox.start_call(method)
        start = time.perf_counter()
        result = fn(*args)
        elapsed_ms = (time.perf_counter() - start) * 1000.0
        if self.cooperative:
            limit = self.v._cooperative_timeout_ms
            if limit > 0 and elapsed_ms > limit:
                raise AssertionError(
                    f"call to {method}() took {elapsed_ms:.1f} ms; a cooperative processor "
                    f"must return within {limit:g} ms (cooperative_timeout)"
                )
            if elapsed_ms > COOPERATIVE_WARN_MS and self.v._logging:
                _log.warning(
                    "%s: call to %s() of %s took %.2f ms, a cooperative call should take "
                    "well under %g ms",
                    self.mode,
                    method,
                    type(self.processor).__name__,
                    elapsed_ms,
                    COOPERATIVE_WARN_MS,
                )
        elif elapsed_ms > NON_COOPERATIVE_WARN_MS and self.v._logging:
            _log.warning(
                "%s: call to %s() of non-cooperative %s took %.0f ms",
                self.mode,
                method,
                type(self.processor).__name__,
                elapsed_ms,
            )
        return result

    def _outbox_progress(self) -> bool:
        ob = self.outbox
        return ob.accepted > 0 or any(ob.buckets) or bool(ob.snapshot_bucket)

    def _assert_progress(self, method: str, progress: bool) -> None:
        if progress:
            self.idle_count = 0
            return
        if self.v._assert_progress:
            raise AssertionError(
                f"{method}() call without progress: it took nothing from the inbox, offered "
                "nothing to the outbox and did not return True (a processor that makes no "
                "progress would spin forever; disable_progress_assertion() if intended)"
            )
        self.idle_count += 1
        time.sleep(min(0.001, 1e-6 * (1 << min(self.idle_count, 10))))

    def _drain(self) -> None:
        ob = self.outbox
        for bucket, out in zip(ob.buckets, self.actual, strict=True):
            if bucket:
                out.extend(bucket)
                bucket.clear()
        sb = ob.snapshot_bucket
        if sb:
            if self.saving is None:
                raise AssertionError(
                    f"{ob.current_method}() offered snapshot entries "
                    f"{sb[:3]!r}; offer_to_snapshot() is only allowed in save_to_snapshot()"
                )
            self.saving.extend(sb)
            sb.clear()

    def _blocking_flush(self) -> None:
        """The flush of a non-cooperative processor's blocking outbox."""
        self._drain()

    def _check_runaway(self) -> None:
        """Fail instead of looping forever when a processor keeps emitting (typically a
        source that forgets its position on restore and starts over)."""
        for ordinal, (e, a) in enumerate(zip(self.expected, self.actual, strict=True)):
            if len(a) > RUNAWAY_FACTOR * len(e) + RUNAWAY_SLACK:
                raise AssertionError(
                    f"output on ordinal {ordinal} grew to {len(a)} items although "
                    f"{len(e)} are expected; the processor seems to never finish (does it "
                    f"lose its state on restore?). First items:\n{_format_list(a[:10])}"
                )

    def _output_matches(self) -> bool:
        check = self.v._checker
        return all(check(e, a) for e, a in zip(self.expected, self.actual, strict=True))

    def _assert_output(self) -> None:
        check = self.v._checker
        for ordinal, (e, a) in enumerate(zip(self.expected, self.actual, strict=True)):
            if not check(e, a):
                raise AssertionError(
                    f"processor output on ordinal {ordinal} doesn't match\n"
                    f"expected ({len(e)} items):\n{_format_list(e)}\n"
                    f"actual ({len(a)} items):\n{_format_list(a)}"
                )

    # -- the run ---------------------------------------------------------------------
    def execute(self) -> None:
        _log.debug("verify_processor: running %s", self.mode)
        try:
            self._execute()
        except AssertionError as e:
            self._close_quietly()
            raise AssertionError(f"{self.mode}: {e}") from e
        except BaseException as e:
            self._close_quietly()
            e.add_note(f"raised in verify_processor {self.mode}")
            raise

    def _close_quietly(self) -> None:
        p = self.processor
        if p is not None:
            try:
                p.close()
            except Exception:  # close() errors are only logged, as in the engine
                _log.debug("close() of %s failed", type(p).__name__, exc_info=True)

    def _execute(self) -> None:
        self._new_processor()
        self._snapshot_point()
        self._process_input()
        self._complete_loop()
        p = self.processor
        self.processor = None  # type: ignore[assignment]
        p.close()
        self._assert_output()

    def _lost_item_error(self, when: str) -> AssertionError:
        ob = self.outbox
        return AssertionError(
            f"{when}, but the outbox had refused {ob.pending!r} (offered in "
            f"{ob.pending_method}()) and it was never offered again: the item is lost"
        )

    def _process_input(self) -> None:
        events = _mix_inputs(self.v._inputs, self.v._priorities)
        n = len(events)
        pos = 0
        limit = self.mode.inbox_limit
        inbox = Inbox()
        ordinal = -1
        while True:
            if not inbox:
                while pos < n and type(events[pos]) is _EdgeDone:
                    self._complete_edge(events[pos].ordinal)
                    pos += 1
                if pos >= n:
                    return
                ordinal = events[pos][0]
                added = 0
                while pos < n and added < limit:
                    ev = events[pos]
                    if type(ev) is _EdgeDone or ev[0] != ordinal:
                        break
                    if added and isinstance(ev[1], Watermark):
                        break
                    inbox.append(ev[1])
                    pos += 1
                    added += 1
            before = len(inbox)
            method = self._process_inbox(inbox, ordinal)
            self._assert_progress(method, len(inbox) < before or self._outbox_progress())
            if inbox and self.outbox.is_full():
                # the outbox is still full: a cooperative processor must cope with being
                # called again (re-offer the refused item, not lose or duplicate anything)
                self._process_inbox(inbox, ordinal)
            self._drain()
            self._check_runaway()
            if not inbox:
                while pos < n and type(events[pos]) is _EdgeDone:
                    self._complete_edge(events[pos].ordinal)
                    pos += 1
                self._snapshot_point()

    def _process_inbox(self, inbox: Inbox, ordinal: int) -> str:
        head = inbox[0]
        p = self.processor
        if isinstance(head, Watermark):
            if self._call("try_process_watermark", p.try_process_watermark, head):
                inbox.popleft()
            return "try_process_watermark"
        self._call("process", p.process, ordinal, inbox)
        return "process"

    def _complete_edge(self, ordinal: int, record: bool = True) -> None:
        while True:
            p = self.processor
            done = bool(self._call("complete_edge", p.complete_edge, ordinal))
            self._assert_progress("complete_edge", done or self._outbox_progress())
            self._drain()
            if done:
                break
        if record:
            self.completed.append(ordinal)

    def _complete_loop(self) -> None:
        """Call complete() until True, or, with run_until_output_matches, until the output
        kept matching for the extra time or the timeout passed (an item may then still be
        pending: the source was cut off, as a cancelled job would be)."""
        v = self.v
        if not v._call_complete:
            return
        run_until = v._run_until_timeout_ms > 0
        start = time.perf_counter()
        matched_at: float | None = None
        while True:
            p = self.processor
            done = bool(self._call("complete", p.complete))
            progress = done or self._outbox_progress()
            self._assert_progress("complete", progress)
            self._drain()
            self._check_runaway()
            if self.outbox.has_unfinished_item():
                if done:
                    raise self._lost_item_error("complete() returned True")
            elif progress and not done:
                self._snapshot_point()
            if done:
                return
            if run_until:
                now = time.perf_counter()
                if self._output_matches():
                    if matched_at is None:
                        matched_at = now
                elif matched_at is not None:
                    try:
                        self._assert_output()
                    except AssertionError as e:
                        raise AssertionError(
                            f"the output already matched, but doesn't match now: {e}"
                        ) from e
                if (now - start) * 1000.0 > v._run_until_timeout_ms:
                    return
                if matched_at is not None and (now - matched_at) * 1000.0 > v._run_until_extra_ms:
                    return

    # -- snapshots -------------------------------------------------------------------
    def _snapshot_point(self) -> None:
        mode = self.mode
        if not mode.snapshots:
            return
        self.restore_count += 1
        restore = (
            mode.restore_interval != _NEVER and self.restore_count % mode.restore_interval == 0
        )
        entries: list[tuple[Any, Any]] = []
        self.saving = entries
        try:
            while True:
                p = self.processor
                done = bool(self._call("save_to_snapshot", p.save_to_snapshot))
                self._assert_progress("save_to_snapshot", done or self._outbox_progress())
                self._drain()
                if done:
                    break
        finally:
            self.saving = None
        ob = self.outbox
        if ob.pending_snapshot is not _NOTHING:
            raise AssertionError(
                f"save_to_snapshot() returned True, but the snapshot entry with key "
                f"{ob.pending_snapshot!r} was refused and never offered again: it is lost"
            )
        if not restore:
            return
        old = self.processor
        self.processor = None  # type: ignore[assignment]
        old.close()
        self._new_processor()
        inbox = Inbox(expand_entries(entries))
        while inbox:
            p = self.processor
            before = len(inbox)
            self._call("restore_from_snapshot", p.restore_from_snapshot, inbox)
            self._assert_progress(
                "restore_from_snapshot", len(inbox) < before or self._outbox_progress()
            )
            self._drain()
        while True:
            p = self.processor
            done = bool(self._call("finish_snapshot_restore", p.finish_snapshot_restore))
            self._assert_progress("finish_snapshot_restore", done or self._outbox_progress())
            self._drain()
            if done:
                break
        for ordinal in self.completed:
            self._complete_edge(ordinal, record=False)
