"""AggregateOperation and the built-in factories (reference A.12)."""

from __future__ import annotations

import functools
import pickle
from collections.abc import Callable, Iterable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slipstream.aggregate import (
    AggregateOperation,
    all_of,
    averaging,
    counting,
    identity,
    max_by,
    min_by,
    summing,
    to_list,
)

Op = AggregateOperation[Any, Any, Any]


def accumulate_all(op: Op, items: Iterable[Any]) -> Any:
    acc = op.create()
    for item in items:
        acc = op.accumulate(acc, item)
    return acc


def aggregate(op: Op, items: Iterable[Any]) -> Any:
    return op.finish(accumulate_all(op, items))


def mod7(x: int) -> int:
    return x % 7


def neg(x: int) -> int:
    return -x


# -- the primitives, one op at a time ----------------------------------------------------


def test_counting() -> None:
    op = counting()
    assert op.create() == 0
    assert aggregate(op, "abcde") == 5
    assert aggregate(op, []) == 0
    assert aggregate(op, [None, None]) == 2
    assert op.combine is not None and op.deduct is not None
    assert op.combine(3, 4) == 7
    assert op.deduct(7, 4) == 3
    assert op.finish is identity


def test_summing() -> None:
    assert aggregate(summing(), [1, 2, 3]) == 6
    assert aggregate(summing(), []) == 0
    assert aggregate(summing(), [0.5, 0.25]) == 0.75
    assert aggregate(summing(len), ["ab", "cde"]) == 5
    op = summing()
    assert op.combine is not None and op.deduct is not None
    assert op.deduct(op.combine(10, 5), 5) == 10


def test_averaging() -> None:
    op = averaging()
    assert op.create() == (0, 0)
    assert aggregate(op, [1, 2, 3, 4]) == 2.5
    assert aggregate(op, []) is None  # documented: None, not NaN
    assert aggregate(averaging(len), ["a", "abc"]) == 2.0
    assert accumulate_all(op, [2, 4]) == (2, 6)
    assert op.combine is not None and op.deduct is not None
    assert op.combine((2, 6), (1, 3)) == (3, 9)
    assert op.deduct((3, 9), (1, 3)) == (2, 6)
    # After deducting everything the accumulator equals a fresh one (emptiness check).
    assert op.deduct((2, 6), (2, 6)) == op.create()
    assert op.finish(op.create()) is None


def test_min_by_and_max_by() -> None:
    assert aggregate(min_by(), [3, 1, 2]) == 1
    assert aggregate(max_by(), [3, 1, 5, 2]) == 5
    assert aggregate(min_by(), []) is None
    assert aggregate(max_by(), []) is None
    words = ["pear", "fig", "kiwi", "plum", "banana"]
    assert aggregate(min_by(len), words) == "fig"
    assert aggregate(max_by(len), words) == "banana"
    # Ties keep the first item seen, like the builtins.
    assert aggregate(min_by(len), ["aa", "bb", "c", "d"]) == "c"
    assert aggregate(max_by(len), ["aa", "bb", "c"]) == "aa"
    assert min_by().deduct is None and max_by().deduct is None


def test_min_by_handles_none_items_and_empty_sides() -> None:
    op = max_by(lambda x: 0 if x is None else x)
    assert aggregate(op, [None]) is None
    assert op.finish(accumulate_all(op, [None, -1])) is None  # None (key 0) beats -1
    assert op.combine is not None
    empty, full = op.create(), accumulate_all(op, [4])
    assert op.combine(empty, full) == 4
    assert op.combine(full, empty) == 4
    assert op.finish(op.combine(op.create(), op.create())) is None


def test_min_by_empty_accumulator_survives_pickling() -> None:
    op = min_by()
    acc = pickle.loads(pickle.dumps(op.create()))
    assert op.finish(acc) is None
    assert op.finish(op.accumulate(acc, 5)) == 5


def test_to_list() -> None:
    op = to_list()
    assert aggregate(op, [3, 1, 2]) == [3, 1, 2]
    assert aggregate(op, []) == []
    assert op.deduct is None
    acc = accumulate_all(op, [1, 2])
    result = op.finish(acc)
    acc = op.accumulate(acc, 3)
    assert result == [1, 2]  # finish returned a copy, not the live accumulator
    right = [4, 5]
    assert op.combine is not None
    assert op.combine(acc, right) == [1, 2, 3, 4, 5]
    assert right == [4, 5]  # right unchanged
    assert op.create() is not op.create()


def test_all_of() -> None:
    op = all_of(counting(), summing(), max_by(), to_list())
    assert aggregate(op, [2, 7, 1]) == (3, 10, 7, [2, 7, 1])
    assert aggregate(op, []) == (0, 0, None, [])
    assert op.combine is not None
    assert op.deduct is None  # max_by and to_list cannot deduct
    with_deduct = all_of(counting(), summing(), averaging())
    assert with_deduct.deduct is not None
    a = accumulate_all(with_deduct, [1, 2, 3])
    b = accumulate_all(with_deduct, [10])
    assert with_deduct.deduct(with_deduct.combine(a, b), b) == a  # type: ignore[misc]
    assert aggregate(all_of(averaging()), [1, 3]) == (2.0,)


def test_all_of_without_combine_has_no_combine() -> None:
    no_combine: Op = AggregateOperation(list, lambda acc, item: acc + [item])
    op = all_of(counting(), no_combine)
    assert op.combine is None and op.deduct is None
    assert aggregate(op, "ab") == (2, ["a", "b"])


def test_all_of_validation() -> None:
    with pytest.raises(ValueError, match="at least one"):
        all_of()
    with pytest.raises(TypeError, match="argument 1"):
        all_of(counting(), sum)  # type: ignore[arg-type]


# -- AggregateOperation itself ---------------------------------------------------------


def test_constructor_defaults_and_validation() -> None:
    op: AggregateOperation[int, int, int] = AggregateOperation(lambda: 0, lambda a, x: a + x)
    assert op.combine is None and op.deduct is None
    assert op.finish is identity
    with pytest.raises(TypeError, match="create"):
        AggregateOperation(0, lambda a, x: a)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="accumulate"):
        AggregateOperation(lambda: 0, None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="combine"):
        AggregateOperation(lambda: 0, lambda a, x: a, combine=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="deduct"):
        AggregateOperation(lambda: 0, lambda a, x: a, deduct="x")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="finish"):
        AggregateOperation(lambda: 0, lambda a, x: a, finish=[])  # type: ignore[arg-type]


def test_uses_slots() -> None:
    op = counting()
    assert not hasattr(op, "__dict__")
    with pytest.raises(AttributeError):
        op.other = 1  # type: ignore[attr-defined]
    assert "AggregateOperation(" in repr(op)


def test_with_finish_and_identity_finish() -> None:
    op = averaging()
    raw = op.with_identity_finish()
    assert aggregate(raw, [1, 2]) == (2, 3)
    assert raw.finish is identity
    assert (raw.create, raw.accumulate, raw.combine, raw.deduct) == (
        op.create,
        op.accumulate,
        op.combine,
        op.deduct,
    )
    assert aggregate(op.with_finish(lambda acc: acc[1]), [1, 2]) == 3
    assert aggregate(op, [1, 2]) == 1.5  # the original is unchanged


def test_and_then_composes_after_finish() -> None:
    assert aggregate(counting().and_then(str), "abc") == "3"
    assert aggregate(averaging().and_then(lambda m: None if m is None else m * 10), [1, 2]) == 15.0
    assert aggregate(to_list().and_then(len).and_then(neg), "abcd") == -4
    # Composing onto an identity finish just uses the function.
    assert counting().and_then(str).finish is str


def test_with_combining_accumulate() -> None:
    op = counting()
    stage2 = op.with_combining_accumulate()
    partials = [accumulate_all(op, "ab"), accumulate_all(op, "cde"), op.create()]
    assert aggregate(stage2, partials) == 5
    assert stage2.combine is op.combine and stage2.deduct is op.deduct

    entries = [("k", 2), ("k", 5)]
    keyed = summing().with_combining_accumulate(lambda entry: entry[1])
    assert aggregate(keyed, entries) == 7

    avg2 = averaging().with_combining_accumulate()
    assert aggregate(avg2, [(2, 3), (1, 6)]) == 3.0


def test_with_combining_accumulate_needs_combine() -> None:
    op: Op = AggregateOperation(list, lambda acc, item: acc + [item])
    with pytest.raises(ValueError, match="combine"):
        op.with_combining_accumulate()


def test_module_level_ops_pickle_with_standard_pickle() -> None:
    for op in (counting(), summing(), to_list()):
        clone = pickle.loads(pickle.dumps(op))
        assert aggregate(clone, [1, 2, 3]) == aggregate(op, [1, 2, 3])


def test_every_op_round_trips_through_cloudpickle() -> None:
    cloudpickle = pytest.importorskip("cloudpickle")
    for op in ALL_OPS:
        clone = cloudpickle.loads(cloudpickle.dumps(op))
        assert aggregate(clone, [5, 3, 9]) == aggregate(op, [5, 3, 9])


# -- properties ----------------------------------------------------------------------

ALL_OPS: list[Op] = [
    counting(),
    summing(),
    summing(neg),
    averaging(),
    averaging(mod7),
    min_by(),
    max_by(),
    min_by(mod7),  # many ties: the first-seen rule must survive splitting
    max_by(mod7),
    to_list(),
    all_of(counting(), to_list(), max_by(mod7)),
    all_of(summing(), averaging()),
    counting().and_then(str),
]

DEDUCT_OPS: list[Op] = [
    counting(),
    summing(),
    summing(neg),
    averaging(),
    averaging(mod7),
    all_of(counting(), summing(), averaging()),
]

ints = st.lists(st.integers(min_value=-(10**9), max_value=10**9), max_size=40)


def oracle(op_index: int, items: list[int]) -> Any:
    """Independent expectations for ALL_OPS, in the same order."""
    count, total = len(items), sum(items)
    mean = total / count if count else None
    expectations: list[Callable[[], Any]] = [
        lambda: count,
        lambda: total,
        lambda: -total,
        lambda: mean,
        lambda: (sum(mod7(x) for x in items) / count) if count else None,
        lambda: min(items, default=None),
        lambda: max(items, default=None),
        lambda: min(items, key=mod7, default=None),
        lambda: max(items, key=mod7, default=None),
        lambda: list(items),
        lambda: (count, list(items), max(items, key=mod7, default=None)),
        lambda: (total, mean),
        lambda: str(count),
    ]
    assert len(expectations) == len(ALL_OPS)
    return expectations[op_index]()


@pytest.mark.parametrize("op_index", range(len(ALL_OPS)))
@given(items=ints)
def test_aggregate_matches_oracle(op_index: int, items: list[int]) -> None:
    assert aggregate(ALL_OPS[op_index], items) == oracle(op_index, items)


@pytest.mark.parametrize("op", ALL_OPS)
@given(items=ints, cuts=st.lists(st.integers(min_value=0, max_value=40), max_size=5))
def test_split_then_combine_equals_whole(op: Op, items: list[int], cuts: list[int]) -> None:
    bounds = sorted({0, len(items), *(min(c, len(items)) for c in cuts)})
    chunks = [items[a:b] for a, b in zip(bounds, bounds[1:], strict=False)] or [[]]
    assert op.combine is not None
    whole = aggregate(op, items)
    # Fold the partial accumulators left to right with combine ...
    partials = [accumulate_all(op, chunk) for chunk in chunks]
    folded = functools.reduce(op.combine, partials)
    assert op.finish(folded) == whole
    # ... and the way a stage-2 processor does it: combining accumulate onto create().
    stage2 = op.with_combining_accumulate()
    assert aggregate(stage2, [accumulate_all(op, chunk) for chunk in chunks]) == whole


@pytest.mark.parametrize("op", DEDUCT_OPS)
@given(left=ints, right=ints)
def test_deduct_is_inverse_of_combine(op: Op, left: list[int], right: list[int]) -> None:
    assert op.combine is not None and op.deduct is not None
    a = accumulate_all(op, left)
    b = accumulate_all(op, right)
    assert op.deduct(op.combine(a, b), b) == a
    assert op.deduct(op.combine(a, b), a) == b
    # The sliding-window use: the whole minus its oldest part is the rest ...
    assert op.deduct(accumulate_all(op, left + right), a) == b
    # ... and a window whose items all left equals a fresh accumulator.
    assert op.deduct(a, a) == op.create()


def test_additive_promise_matches_accumulate() -> None:
    """Hot loops inline ``acc + additive(item)``: it must equal what accumulate does."""
    import operator

    from slipstream.aggregate import counting, summing, to_list

    get = operator.itemgetter(1)
    for op in (counting(), summing(get)):
        assert op.create() == 0
        for item in [(0, 5), (1, -2)]:
            inc = op.additive(item) if callable(op.additive) else op.additive
            assert op.accumulate(op.create(), item) == inc
        assert op.with_finish(str).additive is op.additive
        assert op.with_identity_finish().additive is op.additive
    assert summing().additive is not None and summing().accumulate(3, 4) == 7
    stage2 = summing(get).with_combining_accumulate(operator.itemgetter(0))
    assert stage2.additive is not None and stage2.accumulate(3, (4, "x")) == 7
    assert to_list().additive is None
