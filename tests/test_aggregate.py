"""AggregateOperation and the built-in factories (docs/semantics.md §8)."""

from __future__ import annotations

import functools
import operator
import pickle
from collections.abc import Callable, Iterable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slipstream.aggregate import (
    AggregateOperation,
    all_of,
    averaging,
    bottom_n,
    concatenating,
    counting,
    filtering,
    flat_mapping,
    grouping_by,
    identity,
    linear_trend,
    mapping,
    max_by,
    min_by,
    pick_any,
    reducing,
    sorting,
    summing,
    to_dict,
    to_list,
    to_map,
    to_set,
    top_n,
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


def is_even(x: int) -> bool:
    return x % 2 == 0


def none_if_negative(x: int) -> int | None:
    return None if x < 0 else x


def twice(x: int) -> tuple[int, int]:
    return (x, x)


def singleton(x: int) -> tuple[int]:
    return (x,)


def first(a: Any, b: Any) -> Any:
    return a


def slope(xs: list[int], ys: list[int]) -> float | None:
    """Least-squares slope with exact fractions, centred (not the op's formula)."""
    from fractions import Fraction

    if not xs:
        return None
    mx, my = Fraction(sum(xs), len(xs)), Fraction(sum(ys), len(ys))
    var = sum((x - mx) ** 2 for x in xs)
    if not var:
        return None
    return float(sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var)


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
    reducing(0, identity, operator.add, operator.sub),
    reducing((), singleton, operator.add),
    to_set(),
    to_dict(mod7, identity, max),
    to_map(str, neg, first),
    mapping(mod7, summing()),
    mapping(none_if_negative, counting()),
    filtering(is_even, to_list()),
    flat_mapping(twice, summing()),
    mapping(str, concatenating(",", "[", "]")),
    grouping_by(mod7),
    grouping_by(mod7, counting()),
    pick_any(),
    sorting(),
    sorting(mod7, reverse=True),
    top_n(3),
    bottom_n(3),
    linear_trend(identity, mod7),
    all_of(counting(), summing(), to_set(), pick_any(), linear_trend(mod7, identity)),
]

DEDUCT_OPS: list[Op] = [
    counting(),
    summing(),
    summing(neg),
    averaging(),
    averaging(mod7),
    all_of(counting(), summing(), averaging()),
    reducing(0, identity, operator.add, operator.sub),
    mapping(mod7, summing()),
    mapping(none_if_negative, counting()),
    filtering(is_even, summing()),
    flat_mapping(twice, averaging()),
    linear_trend(identity, mod7),
    all_of(counting(), linear_trend(mod7, identity), summing(neg)),
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
        lambda: total,
        lambda: tuple(items),
        lambda: set(items),
        lambda: {k: max(x for x in items if mod7(x) == k) for k in {mod7(x) for x in items}},
        lambda: {str(x): -x for x in reversed(items)},  # the first value of a key stays
        lambda: sum(map(mod7, items)),
        lambda: sum(1 for x in items if x >= 0),
        lambda: [x for x in items if is_even(x)],
        lambda: 2 * total,
        lambda: "[" + ",".join(map(str, items)) + "]",
        lambda: {k: [x for x in items if mod7(x) == k] for k in {mod7(x) for x in items}},
        lambda: {k: sum(1 for x in items if mod7(x) == k) for k in {mod7(x) for x in items}},
        lambda: items[0] if items else None,
        lambda: sorted(items),
        lambda: sorted(items, key=mod7, reverse=True),
        lambda: sorted(items, reverse=True)[:3],
        lambda: sorted(items)[:3],
        lambda: slope(items, [mod7(x) for x in items]),
        lambda: (count, total, set(items), items[0] if items else None, slope([mod7(x) for x in items], items)),
    ]
    assert len(expectations) == len(ALL_OPS)
    return expectations[op_index]()


@pytest.mark.parametrize("op_index", range(len(ALL_OPS)))
@settings(max_examples=40)
@given(items=ints)
def test_aggregate_matches_oracle(op_index: int, items: list[int]) -> None:
    assert aggregate(ALL_OPS[op_index], items) == oracle(op_index, items)


@pytest.mark.parametrize("op", ALL_OPS)
@settings(max_examples=40)
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
@settings(max_examples=40)
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


# -- Jet's aggregate operations beyond the basic ones -------------------------------------


def test_pick_any_deduct_forgets_only_at_zero() -> None:
    """pick_any's deduct (Jet's PickAnyAccumulator) counts items: deducting the combined
    right side restores the left one; emptying it forgets the item."""
    op = pick_any()
    assert op.deduct is not None and op.combine is not None
    a, b = accumulate_all(op, [3, None, 4]), accumulate_all(op, [9])
    assert op.finish(a) == 3 and a == (3, 2)
    assert op.deduct(op.combine(a, b), b) == a
    assert op.deduct(a, a) == op.create()
    assert op.finish(op.deduct(a, a)) is None
    assert aggregate(op, [None, None]) is None


@given(left=ints, right=ints)
def test_pick_any_deduct_keeps_a_value_while_items_remain(left: list[int], right: list[int]) -> None:
    op = pick_any()
    assert op.combine is not None and op.deduct is not None
    a, b = accumulate_all(op, left), accumulate_all(op, right)
    assert op.deduct(op.combine(a, b), b) == a
    rest = op.deduct(op.combine(a, b), a)
    assert rest[1] == len(right) and (rest[0] is None) == (not right)


def test_to_dict_duplicate_key_is_an_error_naming_key_and_values() -> None:
    op = to_dict(mod7)
    with pytest.raises(ValueError, match=r"duplicate key 1 \(values 1 and 8\)"):
        aggregate(op, [1, 8])
    assert op.combine is not None
    with pytest.raises(ValueError, match="duplicate key 2"):
        op.combine(accumulate_all(op, [2]), accumulate_all(op, [9]))
    assert aggregate(to_dict(mod7, neg), [1, 2]) == {1: -1, 2: -2}
    assert aggregate(to_dict(mod7, identity, operator.add), [1, 8, 2]) == {1: 9, 2: 2}
    assert to_map is to_dict


def test_concatenating_like_jet() -> None:
    assert aggregate(concatenating(), ["a", "b", "c"]) == "abc"
    assert aggregate(concatenating("-"), ["a", "", "b"]) == "a-b"  # empty adds no delimiter
    assert aggregate(concatenating(", ", "<", ">"), []) == "<>"
    op = concatenating("/", "(", ")")
    assert op.combine is not None
    assert op.finish(op.combine(accumulate_all(op, ["x"]), accumulate_all(op, []))) == "(x)"
    assert op.deduct is None
    with pytest.raises(TypeError, match="items must be str"):
        aggregate(op, ["a", 1])


def test_grouping_by_needs_downstream_combine_and_has_no_deduct() -> None:
    assert grouping_by(mod7, counting()).deduct is None
    no_combine = AggregateOperation(int, lambda a, x: a + 1)
    assert grouping_by(mod7, no_combine).combine is None
    assert aggregate(grouping_by(mod7, no_combine), [1, 8, 2]) == {1: 2, 2: 1}


def test_mapping_filtering_flat_mapping_keep_downstream_primitives() -> None:
    down = averaging()
    for op in (mapping(neg, down), filtering(is_even, down), flat_mapping(twice, down)):
        assert op.combine is down.combine and op.deduct is down.deduct
        assert op.finish is down.finish
    assert aggregate(mapping(none_if_negative, to_list()), [1, -2, 3]) == [1, 3]
    assert aggregate(flat_mapping(str.split, to_list()), ["a b", "", "c"]) == ["a", "b", "c"]


def test_top_n_and_bottom_n_with_keys_and_ties() -> None:
    words = ["bb", "a", "ccc", "dd", "e", "fff"]
    assert aggregate(top_n(2, len), words) == ["ccc", "fff"]  # ties: the first kept
    assert aggregate(bottom_n(2, len), words) == ["a", "e"]
    assert aggregate(top_n(10), [2, 1]) == [2, 1]
    # items need not be comparable, only their keys
    dicts = [{"v": 3}, {"v": 1}, {"v": 2}]
    assert aggregate(top_n(1, operator.itemgetter("v")), dicts) == [{"v": 3}]
    op = top_n(2)
    assert op.deduct is None and op.combine is not None
    clone = pickle.loads(pickle.dumps(accumulate_all(op, [5, 7, 6])))
    assert op.finish(op.combine(clone, accumulate_all(op, [8]))) == [8, 7]
    for bad in (0, -1, 1.5):
        with pytest.raises(ValueError, match="n must be an int >= 1"):
            top_n(bad)  # type: ignore[arg-type]


def test_sorting_is_stable_and_complete() -> None:
    assert aggregate(sorting(mod7), [8, 1, 15, 2]) == [8, 1, 15, 2]
    assert aggregate(sorting(), [3, 1, 2]) == [1, 2, 3]
    assert sorting().deduct is None


def test_linear_trend() -> None:
    op = linear_trend(operator.itemgetter(0), operator.itemgetter(1))
    assert aggregate(op, [(0, 1), (1, 3), (2, 5)]) == 2.0
    assert aggregate(op, []) is None  # Jet: NaN
    assert aggregate(op, [(4, 1), (4, 9)]) is None  # vertical: undefined
    big = [(x, 10**18 + 3 * x) for x in range(5)]
    assert aggregate(op, big) == 3.0  # exact ints, no precision loss
    assert op.deduct is not None and op.deduct(accumulate_all(op, big), accumulate_all(op, big)) == op.create()


def test_reducing() -> None:
    op = reducing(1, identity, operator.mul)
    assert aggregate(op, [2, 3, 4]) == 24 and aggregate(op, []) == 1
    assert op.deduct is None
    assert reducing(0, identity, operator.add, operator.sub).deduct is operator.sub


def test_all_of_any_number_of_ops() -> None:
    ops = [counting(), summing(), min_by(), max_by(), to_list(), to_set(), averaging()]
    op = all_of(*ops)
    assert aggregate(op, [3, 1, 2]) == (3, 6, 1, 3, [3, 1, 2], {1, 2, 3}, 2.0)
    assert op.deduct is None  # min_by has none
    assert all_of(*[counting()] * 9).deduct is not None


def test_new_factories_validate_their_functions() -> None:
    with pytest.raises(TypeError, match="mapping: map_fn"):
        mapping(3, counting())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="filtering: downstream must be an AggregateOperation"):
        filtering(is_even, sum)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="to_dict: key_fn"):
        to_dict("k")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="concatenating: delimiter must be a str"):
        concatenating(1)  # type: ignore[arg-type]
