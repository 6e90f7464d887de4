"""What the kernel offers both engines by public name (issue 22, item 0): a coalescer's
state to carry into a new coalescer (the Spark engine's next micro-batch epoch), and the
one function that creates a member's processors."""

from __future__ import annotations

from typing import Any

import pytest

from slipstream.core.items import IDLE_MESSAGE
from slipstream.core.processor import AbstractProcessor
from slipstream.core.suppliers import ProcessorSupplier, SupplierContext
from slipstream.execution.coalescer import NO_NEW_WM, WatermarkCoalescer
from slipstream.execution.plan import member_processors


def _steps(c: WatermarkCoalescer) -> list[Any]:
    """The same inputs for an original coalescer and one restored from its state."""
    return [
        c.observe_wm(0, 25),
        c.observe_wm(1, 30),
        c.observe_wm(2, 40),
        c.observe_wm(0, IDLE_MESSAGE),
        c.observe_wm(1, 50),
    ]


def test_a_restored_coalescer_continues_as_the_original() -> None:
    c = WatermarkCoalescer(3)
    c.observe_wm(0, 10)
    c.observe_wm(1, 20)
    c.observe_wm(2, IDLE_MESSAGE)
    assert c.observe_wm(0, 21) == 20
    state = c.save_state()
    assert state == {
        "wm": [21, 20, c.wm[2]],
        "idle": [False, False, True],
        "last_emitted": 20,
        "top_observed": 21,
        "all_idle": False,
        "idle_pending": False,
    }
    fresh = WatermarkCoalescer(3)
    assert fresh.restore_state(state) is True
    assert _steps(fresh) == _steps(c) == [NO_NEW_WM, 25, NO_NEW_WM, 30, 40]


def test_an_all_idle_state_still_owes_its_idle_mark() -> None:
    c = WatermarkCoalescer(2)
    c.observe_wm(0, 5)
    c.observe_wm(0, IDLE_MESSAGE)
    assert c.observe_wm(1, IDLE_MESSAGE) == 5  # the top watermark once, then the idle mark
    fresh = WatermarkCoalescer(2)
    assert fresh.restore_state(c.save_state())
    assert fresh.check_pending_idle() is IDLE_MESSAGE
    assert fresh.check_pending_idle() is NO_NEW_WM


def test_saved_state_is_a_copy() -> None:
    c = WatermarkCoalescer(2)
    c.observe_wm(0, 10)
    state = c.save_state()
    c.observe_wm(0, 11)
    c.observe_wm(1, IDLE_MESSAGE)
    assert state["wm"][0] == 10 and state["idle"] == [False, False]


def test_state_of_another_number_of_inputs_changes_nothing() -> None:
    c = WatermarkCoalescer(2)
    c.observe_wm(0, 10)
    before = c.save_state()
    other = WatermarkCoalescer(3)
    other.observe_wm(0, 99)
    assert c.restore_state(other.save_state()) is False
    assert c.save_state() == before


class _P(AbstractProcessor):
    pass


class _Supplier(ProcessorSupplier):
    def __init__(self, count: int | None = None, make: Any = _P) -> None:
        self.count = count
        self.make = make
        self.context: SupplierContext | None = None

    def init(self, context: SupplierContext) -> None:
        self.context = context

    def get(self, count: int) -> list[Any]:
        return [self.make() for _ in range(self.count if self.count is not None else count)]


def _context(lp: int = 2, member: int = 1) -> SupplierContext:
    return SupplierContext("v", "job", lp, lp * 3, 3, member)


def test_member_processors_inits_the_supplier_with_the_member_context() -> None:
    s = _Supplier()
    supplier, procs = member_processors(s, _context())
    assert supplier is s and s.context == _context()
    assert len(procs) == 2 and all(type(p) is _P for p in procs)


def test_member_processors_takes_a_callable() -> None:
    supplier, procs = member_processors(_P, _context(lp=3))
    assert isinstance(supplier, ProcessorSupplier)
    assert [type(p) for p in procs] == [_P, _P, _P]


def test_member_processors_checks_the_count_and_the_type() -> None:
    with pytest.raises(ValueError) as info:
        member_processors(_Supplier(count=1), _context())
    assert str(info.value) == (
        "vertex 'v': supplier returned 1 processors, expected local parallelism 2"
    )
    with pytest.raises(TypeError) as terr:
        member_processors(_Supplier(make=object), _context())
    assert str(terr.value) == (
        "vertex 'v': supplier returned object, which is not a slipstream Processor"
    )
