"""Aggregate operations: the five primitives aggregation and window processors run.

Design choice: the primitives are *functional*. Jet's accumulators are mutable holders
and ``accumulate`` returns nothing; here ``accumulate(acc, item)`` returns the
accumulator to keep, which may be the same mutated object (a list) or a new immutable
value (an int, a tuple). In CPython an int or a tuple is far cheaper than a mutable holder
object with a method call, so ``counting`` can be plain ``int`` arithmetic and
``summing()`` can use ``operator.add`` directly; engines simply write the return value
back (``accs[key] = accumulate(accs[key], item)``). The same rule holds for ``combine``
and ``deduct``: they return the resulting left accumulator and leave ``right`` unchanged.

* ``create() -> acc`` a new, empty accumulator;
* ``accumulate(acc, item) -> acc``;
* ``combine(left, right) -> acc`` (optional; needed for two-stage aggregation, sliding
  windows and session merging);
* ``deduct(left, right) -> acc`` (optional) the exact inverse of ``combine``, used by the
  last stage of a sliding window to slide a running accumulator instead of recombining
  all frames. An op with ``deduct`` must have accumulators with value equality: a
  running accumulator equal to ``create()`` means the key left the window;
* ``finish(acc) -> result`` (identity by default).

The primitives are plain attributes because engines read them in hot loops.
"""

from __future__ import annotations

import heapq
import operator
import types
from collections.abc import Callable, Sequence
from enum import Enum
from typing import Any, Generic, TypeVar

__all__ = [
    "AggregateOperation",
    "aggregate_operation2",
    "aggregate_operation3",
    "all_of",
    "averaging",
    "bottom_n",
    "co_aggregate",
    "concatenating",
    "counting",
    "filtering",
    "flat_mapping",
    "grouping_by",
    "identity",
    "linear_trend",
    "mapping",
    "max_by",
    "min_by",
    "pick_any",
    "reducing",
    "sorting",
    "summing",
    "to_dict",
    "to_list",
    "to_map",
    "to_set",
    "top_n",
]

T = TypeVar("T")  # item
A = TypeVar("A")  # accumulator
R = TypeVar("R")  # result
R2 = TypeVar("R2")


def identity(value: Any) -> Any:
    """Return ``value``; the default ``finish`` and ``get_fn``.

    Engines may test ``op.finish is identity`` to skip the call.
    """
    return value


def _return_first(value: Any) -> Any:
    return value


_IDENTITY_CODE = _return_first.__code__
_CO_NESTED = 0x10


def is_identity(fn: Any) -> bool:
    """Whether ``fn`` is :func:`identity` or a plain Python function whose whole body is
    ``return <its one parameter>`` (``lambda w: w``, ``def word(w): return w``): its
    bytecode is then the same as :func:`identity`'s. Engines use this to skip a key
    function call per item (Jet's ``wholeItem()``)."""
    if fn is identity:
        return True
    if type(fn) is not types.FunctionType:
        return False
    code = fn.__code__
    return (
        code.co_code == _IDENTITY_CODE.co_code
        and code.co_argcount == 1
        and code.co_kwonlyargcount == 0
        and (code.co_flags | _CO_NESTED) == (_IDENTITY_CODE.co_flags | _CO_NESTED)
    )


def _check_callable(name: str, fn: Any, *, optional: bool) -> None:
    if fn is None and optional:
        return
    if not callable(fn):
        kind = "a callable or None" if optional else "a callable"
        raise TypeError(f"AggregateOperation.{name} must be {kind}, got {fn!r}")


class AggregateOperation(Generic[T, A, R]):
    """Functional aggregate operation; see the module docstring for the contract.

    ``accumulate`` may also be a sequence of functions, one per input ordinal (Jet's
    ``AggregateOperation2``/``3``/N): a processor with several inbound edges then
    accumulates an item of ordinal ``i`` with ``accumulate_fn(i)``. ``accumulate`` is
    ordinal 0's; ``arity`` is the number of ordinals the op takes.
    """

    __slots__ = (
        "accumulate",
        "accumulate_fns",
        "additive",
        "combine",
        "create",
        "deduct",
        "finish",
    )

    create: Callable[[], A]
    accumulate: Callable[[A, T], A]
    combine: Callable[[A, A], A] | None
    deduct: Callable[[A, A], A] | None
    finish: Callable[[A], R]
    #: ``None``, or a promise that ``create()`` is ``0`` and ``accumulate(acc, item)`` is
    #: ``acc + additive`` (an int) or ``acc + additive(item)`` (a callable): hot loops may
    #: then add inline instead of calling ``accumulate`` per item.
    additive: Any

    def __init__(
        self,
        create: Callable[[], A],
        accumulate: Callable[[A, T], A] | Sequence[Callable[[A, Any], A]],
        combine: Callable[[A, A], A] | None = None,
        deduct: Callable[[A, A], A] | None = None,
        finish: Callable[[A], R] | None = None,
    ) -> None:
        _check_callable("create", create, optional=False)
        if callable(accumulate):
            fns: tuple[Callable[[A, Any], A], ...] = (accumulate,)
        elif isinstance(accumulate, (list, tuple)) and accumulate:
            fns = tuple(accumulate)
            for i, fn in enumerate(fns):
                _check_callable(f"accumulate[{i}]", fn, optional=False)
        else:
            raise TypeError(
                "AggregateOperation.accumulate must be a callable or a non-empty sequence "
                f"of callables (one per input ordinal), got {accumulate!r}"
            )
        _check_callable("combine", combine, optional=True)
        _check_callable("deduct", deduct, optional=True)
        _check_callable("finish", finish, optional=True)
        self.create = create
        self.accumulate = fns[0]
        self.accumulate_fns = fns
        self.combine = combine
        self.deduct = deduct
        self.finish = finish if finish is not None else identity
        self.additive = None

    @property
    def arity(self) -> int:
        """How many input ordinals the op accumulates (one function each)."""
        return len(self.accumulate_fns)

    def accumulate_fn(self, ordinal: int) -> Callable[[A, Any], A]:
        """The accumulate function for items of input ``ordinal``."""
        fns = self.accumulate_fns
        if 0 <= ordinal < len(fns):
            return fns[ordinal]
        raise ValueError(
            f"the AggregateOperation has {len(fns)} accumulate function(s) (arity "
            f"{len(fns)}) but items arrived on input ordinal {ordinal}: give it one "
            "accumulate function per inbound edge (co_aggregate, aggregate_operation2)"
        )

    def _derive(
        self,
        accumulate: Callable[[A, Any], A] | Sequence[Callable[[A, Any], A]],
        finish: Callable[[A], Any],
        additive: Any,
    ) -> AggregateOperation[Any, A, Any]:
        op: AggregateOperation[Any, A, Any] = AggregateOperation(
            self.create, accumulate, self.combine, self.deduct, finish
        )
        op.additive = additive
        return op

    def __repr__(self) -> str:
        parts = [
            f"{name}={getattr(self, name)!r}"
            for name in ("create", "accumulate", "combine", "deduct", "finish")
        ]
        return f"AggregateOperation({', '.join(parts)})"

    def with_finish(self, fn: Callable[[A], R2]) -> AggregateOperation[T, A, R2]:
        """The same op with ``finish`` replaced by ``fn``."""
        return self._derive(self.accumulate_fns, fn, self.additive)

    def with_identity_finish(self) -> AggregateOperation[T, A, A]:
        """The same op returning the accumulator itself: how stage-1 ops are built."""
        return self._derive(self.accumulate_fns, identity, self.additive)

    def and_then(self, fn: Callable[[R], R2]) -> AggregateOperation[T, A, R2]:
        """The same op with ``fn`` applied to the result of ``finish``."""
        finish = self.finish
        if finish is identity:
            composed: Callable[[A], R2] = fn  # type: ignore[assignment]
        else:

            def composed(acc: A) -> R2:
                return fn(finish(acc))

        return self._derive(self.accumulate_fns, composed, self.additive)

    def with_combining_accumulate(
        self, get_fn: Callable[[Any], A] = identity
    ) -> AggregateOperation[Any, A, R]:
        """An op whose items carry accumulators: ``accumulate(acc, item)`` is
        ``combine(acc, get_fn(item))``. Stage-2 (combining) processors use it."""
        combine = self.combine
        if combine is None:
            raise ValueError(
                "with_combining_accumulate needs an AggregateOperation with a combine "
                "primitive, but combine is None"
            )
        if get_fn is identity:
            accumulate: Callable[[A, Any], A] = combine
        else:

            def accumulate(acc: A, item: Any) -> A:
                return combine(acc, get_fn(item))

        # summing accumulators of an additive op is additive too
        additive = get_fn if self.additive is not None and combine is operator.add else None
        return self._derive(accumulate, self.finish, additive)


# -- counting ------------------------------------------------------------------------


def _zero() -> int:
    return 0


def _count_one(acc: int, item: object) -> int:
    return acc + 1


def counting() -> AggregateOperation[object, int, int]:
    """Counts items. The accumulator is an int; supports ``deduct``."""
    op: AggregateOperation[object, int, int] = AggregateOperation(
        _zero, _count_one, operator.add, operator.sub
    )
    op.additive = 1
    return op


# -- summing -------------------------------------------------------------------------


def summing(get_fn: Callable[[Any], Any] = identity) -> AggregateOperation[Any, Any, Any]:
    """Sums ``get_fn(item)`` (ints or floats). Supports ``deduct``.

    The accumulator is the running sum itself, starting at int 0. With floats, deducting
    may leave a rounding residue, so a window whose items all left may still compare
    unequal to the empty accumulator.
    """
    if get_fn is identity:
        accumulate: Callable[[Any, Any], Any] = operator.add
    else:

        def accumulate(acc: Any, item: Any) -> Any:
            return acc + get_fn(item)

    op: AggregateOperation[Any, Any, Any] = AggregateOperation(
        _zero, accumulate, operator.add, operator.sub
    )
    op.additive = get_fn
    return op


# -- averaging -----------------------------------------------------------------------


def _zero_pair() -> tuple[int, Any]:
    return (0, 0)


def _pair_add(left: tuple[int, Any], right: tuple[int, Any]) -> tuple[int, Any]:
    return (left[0] + right[0], left[1] + right[1])


def _pair_sub(left: tuple[int, Any], right: tuple[int, Any]) -> tuple[int, Any]:
    return (left[0] - right[0], left[1] - right[1])


def _pair_mean(acc: tuple[int, Any]) -> float | None:
    count = acc[0]
    return acc[1] / count if count else None


def averaging(
    get_fn: Callable[[Any], Any] = identity,
) -> AggregateOperation[Any, tuple[int, Any], float | None]:
    """Arithmetic mean of ``get_fn(item)``. Supports ``deduct``.

    The accumulator is the immutable tuple ``(count, total)``. With no items the result
    is ``None`` (Jet returns NaN; ``None`` is the clearer Python "no value", and it is
    not silently absorbed by further arithmetic).
    """
    if get_fn is identity:

        def accumulate(acc: tuple[int, Any], item: Any) -> tuple[int, Any]:
            return (acc[0] + 1, acc[1] + item)
    else:

        def accumulate(acc: tuple[int, Any], item: Any) -> tuple[int, Any]:
            return (acc[0] + 1, acc[1] + get_fn(item))

    return AggregateOperation(_zero_pair, accumulate, _pair_add, _pair_sub, _pair_mean)


# -- min_by / max_by -----------------------------------------------------------------


class _Empty(Enum):
    """Accumulator of ``min_by``/``max_by`` before any item.

    An enum member, so that it keeps its identity through pickling (snapshots, Spark).
    """

    EMPTY = "EMPTY"


_EMPTY = _Empty.EMPTY


def _empty() -> _Empty:
    return _EMPTY


def _none_if_empty(acc: Any) -> Any:
    return None if acc is _EMPTY else acc


def min_by(key_fn: Callable[[Any], Any] = identity) -> AggregateOperation[Any, Any, Any]:
    """The item with the smallest ``key_fn(item)``; the first one seen on ties.

    The result is ``None`` when there were no items. No ``deduct`` (a minimum cannot be
    un-combined).
    """

    def accumulate(acc: Any, item: Any) -> Any:
        if acc is _EMPTY or key_fn(item) < key_fn(acc):
            return item
        return acc

    def combine(left: Any, right: Any) -> Any:
        if right is _EMPTY:
            return left
        if left is _EMPTY or key_fn(right) < key_fn(left):
            return right
        return left

    return AggregateOperation(_empty, accumulate, combine, None, _none_if_empty)


def max_by(key_fn: Callable[[Any], Any] = identity) -> AggregateOperation[Any, Any, Any]:
    """The item with the largest ``key_fn(item)``; the first one seen on ties.

    The result is ``None`` when there were no items. No ``deduct``.
    """

    def accumulate(acc: Any, item: Any) -> Any:
        if acc is _EMPTY or key_fn(item) > key_fn(acc):
            return item
        return acc

    def combine(left: Any, right: Any) -> Any:
        if right is _EMPTY:
            return left
        if left is _EMPTY or key_fn(right) > key_fn(left):
            return right
        return left

    return AggregateOperation(_empty, accumulate, combine, None, _none_if_empty)


# -- to_list -------------------------------------------------------------------------


def _list_append(acc: list[Any], item: Any) -> list[Any]:
    acc.append(item)
    return acc


def _list_extend(left: list[Any], right: list[Any]) -> list[Any]:
    left.extend(right)
    return left


def _list_copy(acc: list[Any]) -> list[Any]:
    return list(acc)


def to_list() -> AggregateOperation[Any, list[Any], list[Any]]:
    """Collects the items into a list, in accumulation order.

    The accumulator is a mutable list; ``finish`` returns a copy so that a result never
    aliases live state. No ``deduct``.
    """
    return AggregateOperation(list, _list_append, _list_extend, None, _list_copy)


# -- all_of --------------------------------------------------------------------------


def all_of(
    *ops: AggregateOperation[Any, Any, Any],
) -> AggregateOperation[Any, tuple[Any, ...], tuple[Any, ...]]:
    """Runs several ops over the same items at once; the result is the tuple of their
    results, in argument order.

    The accumulator is the tuple of the component accumulators. ``combine`` exists if
    every component has one, ``deduct`` likewise.
    """
    if not ops:
        raise ValueError("all_of needs at least one AggregateOperation")
    for index, op in enumerate(ops):
        if not isinstance(op, AggregateOperation):
            raise TypeError(f"all_of argument {index} is not an AggregateOperation: {op!r}")
        if op.arity != 1:
            raise ValueError(
                f"all_of argument {index} takes {op.arity} inputs; all_of runs ops of one "
                "input over the same items (co_aggregate combines ops of different inputs)"
            )
    creates = tuple(op.create for op in ops)
    accumulates = tuple(op.accumulate for op in ops)
    finishes = tuple(op.finish for op in ops)

    def create() -> tuple[Any, ...]:
        return tuple([fn() for fn in creates])

    def accumulate(acc: tuple[Any, ...], item: Any) -> tuple[Any, ...]:
        return tuple([fn(a, item) for fn, a in zip(accumulates, acc, strict=True)])

    def finish(acc: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple([fn(a) for fn, a in zip(finishes, acc, strict=True)])

    combine = _pairwise([op.combine for op in ops])
    deduct = _pairwise([op.deduct for op in ops])
    return AggregateOperation(create, accumulate, combine, deduct, finish)


def _pairwise(
    fns: list[Callable[[Any, Any], Any] | None],
) -> Callable[[tuple[Any, ...], tuple[Any, ...]], tuple[Any, ...]] | None:
    """Lift per-component binary primitives to tuples, or None if any is missing."""
    present: list[Callable[[Any, Any], Any]] = [fn for fn in fns if fn is not None]
    if len(present) != len(fns):
        return None
    components = tuple(present)

    def apply(left: tuple[Any, ...], right: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple([fn(lv, rv) for fn, lv, rv in zip(components, left, right, strict=True)])

    return apply


# -- reducing ------------------------------------------------------------------------


def reducing(
    empty: Any,
    get_fn: Callable[[Any], Any],
    combine_fn: Callable[[Any, Any], Any],
    deduct_fn: Callable[[Any, Any], Any] | None = None,
) -> AggregateOperation[Any, Any, Any]:
    """Reduces ``get_fn(item)`` with ``combine_fn``, starting from ``empty`` (Jet's
    ``reducing``): the result is ``combine_fn(...combine_fn(empty, get_fn(i1))...,
    get_fn(in))``. ``combine_fn`` must be associative with ``empty`` as its identity
    (stage-2 and window combining rely on it); ``deduct_fn``, when given, must undo it
    (``deduct_fn(combine_fn(a, b), b) == a``) and gives the op a ``deduct``.

    The accumulator is the reduced value itself; ``empty`` is shared, not copied, so use
    an immutable value (an int, a tuple, a frozenset).
    """
    for name, fn in (("get_fn", get_fn), ("combine_fn", combine_fn)):
        _check_fn("reducing", name, fn)
    if deduct_fn is not None:
        _check_fn("reducing", "deduct_fn", deduct_fn)

    def create() -> Any:
        return empty

    def accumulate(acc: Any, item: Any) -> Any:
        return combine_fn(acc, get_fn(item))

    return AggregateOperation(create, accumulate, combine_fn, deduct_fn)


# -- to_set / to_dict ----------------------------------------------------------------


def _set_add(acc: set[Any], item: Any) -> set[Any]:
    acc.add(item)
    return acc


def _set_update(left: set[Any], right: set[Any]) -> set[Any]:
    left |= right
    return left


def _set_copy(acc: set[Any]) -> set[Any]:
    return set(acc)


def to_set() -> AggregateOperation[Any, set[Any], set[Any]]:
    """Collects the distinct items into a set (items must be hashable). ``finish``
    returns a copy. No ``deduct`` (a set forgets how often it saw an item)."""
    return AggregateOperation(set, _set_add, _set_update, None, _set_copy)


def _dict_copy(acc: dict[Any, Any]) -> dict[Any, Any]:
    return dict(acc)


def to_dict(
    key_fn: Callable[[Any], Any],
    value_fn: Callable[[Any], Any] = identity,
    merge_fn: Callable[[Any, Any], Any] | None = None,
) -> AggregateOperation[Any, dict[Any, Any], dict[Any, Any]]:
    """Collects ``{key_fn(item): value_fn(item)}`` (Jet's ``toMap``). Two items with the
    same key are an error (``ValueError`` naming the key and both values) unless
    ``merge_fn(old_value, new_value)`` says which value to keep; it is used when
    accumulating and when combining, so it should be associative. ``finish`` returns a
    copy. No ``deduct``."""
    _check_fn("to_dict", "key_fn", key_fn)
    _check_fn("to_dict", "value_fn", value_fn)
    if merge_fn is not None:
        _check_fn("to_dict", "merge_fn", merge_fn)

    def put(acc: dict[Any, Any], k: Any, v: Any) -> None:
        old = acc.get(k, _MISSING)
        if old is _MISSING:
            acc[k] = v
        elif merge_fn is None:
            raise ValueError(
                f"to_dict: duplicate key {k!r} (values {old!r} and {v!r}); pass merge_fn to "
                "decide which value to keep"
            )
        else:
            acc[k] = merge_fn(old, v)

    def accumulate(acc: dict[Any, Any], item: Any) -> dict[Any, Any]:
        put(acc, key_fn(item), value_fn(item))
        return acc

    def combine(left: dict[Any, Any], right: dict[Any, Any]) -> dict[Any, Any]:
        for k, v in right.items():
            put(left, k, v)
        return left

    return AggregateOperation(dict, accumulate, combine, None, _dict_copy)


to_map = to_dict
"""Jet's name for :func:`to_dict`."""


# -- mapping / filtering / flat_mapping ----------------------------------------------


def _adapted(
    downstream: AggregateOperation[Any, Any, Any], accumulate: Callable[[Any, Any], Any]
) -> AggregateOperation[Any, Any, Any]:
    return AggregateOperation(
        downstream.create, accumulate, downstream.combine, downstream.deduct, downstream.finish
    )


def mapping(
    map_fn: Callable[[Any], Any], downstream: AggregateOperation[Any, Any, Any]
) -> AggregateOperation[Any, Any, Any]:
    """Accumulates ``map_fn(item)`` into ``downstream``; an item that maps to ``None``
    is skipped (as in Jet). ``combine``, ``deduct`` and ``finish`` are the
    downstream's."""
    _check_fn("mapping", "map_fn", map_fn)
    _check_op("mapping", downstream)
    down = downstream.accumulate

    def accumulate(acc: Any, item: Any) -> Any:
        mapped = map_fn(item)
        return acc if mapped is None else down(acc, mapped)

    return _adapted(downstream, accumulate)


def filtering(
    predicate: Callable[[Any], Any], downstream: AggregateOperation[Any, Any, Any]
) -> AggregateOperation[Any, Any, Any]:
    """Accumulates into ``downstream`` only the items for which ``predicate(item)`` is
    truthy. ``combine``, ``deduct`` and ``finish`` are the downstream's."""
    _check_fn("filtering", "predicate", predicate)
    _check_op("filtering", downstream)
    down = downstream.accumulate

    def accumulate(acc: Any, item: Any) -> Any:
        return down(acc, item) if predicate(item) else acc

    return _adapted(downstream, accumulate)


def flat_mapping(
    flat_map_fn: Callable[[Any], Any], downstream: AggregateOperation[Any, Any, Any]
) -> AggregateOperation[Any, Any, Any]:
    """Accumulates every element of the iterable ``flat_map_fn(item)`` into
    ``downstream``. ``combine``, ``deduct`` and ``finish`` are the downstream's."""
    _check_fn("flat_mapping", "flat_map_fn", flat_map_fn)
    _check_op("flat_mapping", downstream)
    down = downstream.accumulate

    def accumulate(acc: Any, item: Any) -> Any:
        for x in flat_map_fn(item):
            acc = down(acc, x)
        return acc

    return _adapted(downstream, accumulate)


# -- concatenating -------------------------------------------------------------------


def concatenating(
    delimiter: str = "", prefix: str = "", suffix: str = ""
) -> AggregateOperation[str, list[str], str]:
    """Concatenates string items in accumulation order: ``prefix + delimiter.join(items)
    + suffix``, where empty strings are left out (so they add no delimiter, as in Jet).

    The accumulator is the list of the non-empty strings (joined once in ``finish``:
    repeated string concatenation would be quadratic). No ``deduct``.
    """
    for name, value in (("delimiter", delimiter), ("prefix", prefix), ("suffix", suffix)):
        if type(value) is not str:
            raise TypeError(f"concatenating: {name} must be a str, got {value!r}")

    def accumulate(acc: list[str], item: str) -> list[str]:
        if type(item) is not str:
            raise TypeError(f"concatenating: items must be str, got {item!r}")
        if item:
            acc.append(item)
        return acc

    def finish(acc: list[str]) -> str:
        return prefix + delimiter.join(acc) + suffix

    return AggregateOperation(list, accumulate, _list_extend, None, finish)


# -- grouping_by ---------------------------------------------------------------------


def grouping_by(
    key_fn: Callable[[Any], Any], downstream: AggregateOperation[Any, Any, Any] | None = None
) -> AggregateOperation[Any, dict[Any, Any], dict[Any, Any]]:
    """Groups the items by ``key_fn(item)`` and aggregates each group with
    ``downstream`` (default :func:`to_list`): the result is ``{key: result}``.
    ``combine`` exists if the downstream has one. No ``deduct`` (as in Jet)."""
    _check_fn("grouping_by", "key_fn", key_fn)
    down = to_list() if downstream is None else downstream
    _check_op("grouping_by", down)
    create = down.create
    down_acc = down.accumulate
    down_combine = down.combine
    down_finish = down.finish

    def accumulate(acc: dict[Any, Any], item: Any) -> dict[Any, Any]:
        k = key_fn(item)
        a = acc.get(k, _MISSING)
        acc[k] = down_acc(create() if a is _MISSING else a, item)
        return acc

    combine: Callable[[dict[Any, Any], dict[Any, Any]], dict[Any, Any]] | None = None
    if down_combine is not None:
        dc = down_combine

        def combine(left: dict[Any, Any], right: dict[Any, Any]) -> dict[Any, Any]:
            for k, b in right.items():
                a = left.get(k, _MISSING)
                left[k] = b if a is _MISSING else dc(a, b)
            return left

    def finish(acc: dict[Any, Any]) -> dict[Any, Any]:
        return {k: down_finish(a) for k, a in acc.items()}

    return AggregateOperation(dict, accumulate, combine, None, finish)


# -- pick_any ------------------------------------------------------------------------


def _pick_empty() -> tuple[Any, int]:
    return (None, 0)


def _pick_accumulate(acc: tuple[Any, int], item: Any) -> tuple[Any, int]:
    if item is None:
        return acc
    value, count = acc
    return (item if count == 0 else value, count + 1)


def _pick_combine(left: tuple[Any, int], right: tuple[Any, int]) -> tuple[Any, int]:
    return (right[0] if left[1] == 0 else left[0], left[1] + right[1])


def _pick_deduct(left: tuple[Any, int], right: tuple[Any, int]) -> tuple[Any, int]:
    count = left[1] - right[1]
    return (left[0] if count else None, count)


def _pick_value(acc: tuple[Any, int]) -> Any:
    return acc[0]


def pick_any() -> AggregateOperation[Any, tuple[Any, int], Any]:
    """Some item (``None`` items are skipped; ``None`` when there is none). Supports
    ``deduct``: the accumulator counts the items, and forgets its item when the count
    returns to 0 (Jet's ``PickAnyAccumulator``); after a deduct it may hold an item that
    left the window, as in Jet, since any item will do."""
    return AggregateOperation(_pick_empty, _pick_accumulate, _pick_combine, _pick_deduct, _pick_value)


# -- sorting / top_n / bottom_n ------------------------------------------------------


def sorting(
    key_fn: Callable[[Any], Any] | None = None, *, reverse: bool = False
) -> AggregateOperation[Any, list[Any], list[Any]]:
    """All items as a list sorted by ``key_fn`` (the items themselves by default;
    ``reverse=True`` for descending), like Python's ``sorted``; items with equal keys
    keep their accumulation order. No ``deduct``."""
    if key_fn is not None:
        _check_fn("sorting", "key_fn", key_fn)

    def finish(acc: list[Any]) -> list[Any]:
        return sorted(acc, key=key_fn, reverse=reverse)

    return AggregateOperation(list, _list_append, _list_extend, None, finish)


class _Ranked:
    """A heap entry ordered by ``key`` alone (items need not be comparable)."""

    __slots__ = ("key", "item")

    def __init__(self, key: Any, item: Any) -> None:
        self.key = key
        self.item = item

    def __lt__(self, other: _Ranked) -> bool:
        return self.key < other.key  # type: ignore[no-any-return]

    def __getstate__(self) -> tuple[Any, Any]:
        return (self.key, self.item)

    def __setstate__(self, state: tuple[Any, Any]) -> None:
        self.key, self.item = state

    def __repr__(self) -> str:
        return f"_Ranked({self.key!r}, {self.item!r})"


class _RankedLow(_Ranked):
    """Ordered by ``key`` reversed: a min-heap of them keeps the smallest keys."""

    __slots__ = ()

    def __lt__(self, other: _Ranked) -> bool:
        return other.key < self.key  # type: ignore[no-any-return]


def _top(
    name: str, n: int, key_fn: Callable[[Any], Any], entry: type[_Ranked], descending: bool
) -> AggregateOperation[Any, list[_Ranked], list[Any]]:
    if type(n) is not int or n < 1:
        raise ValueError(f"{name}: n must be an int >= 1, got {n!r}")
    _check_fn(name, "key_fn", key_fn)

    def add(heap: list[_Ranked], e: _Ranked) -> None:
        if len(heap) < n:
            heapq.heappush(heap, e)
        else:
            # an entry not above the lowest kept one is dropped (Jet keeps the first
            # of equal items)
            heapq.heappushpop(heap, e)

    def accumulate(heap: list[_Ranked], item: Any) -> list[_Ranked]:
        add(heap, entry(key_fn(item), item))
        return heap

    def combine(left: list[_Ranked], right: list[_Ranked]) -> list[_Ranked]:
        for e in right:
            add(left, e)
        return left

    def finish(heap: list[_Ranked]) -> list[Any]:
        return [e.item for e in sorted(heap, key=_rank_key, reverse=descending)]

    return AggregateOperation(list, accumulate, combine, None, finish)


def _rank_key(e: _Ranked) -> Any:
    return e.key


def top_n(n: int, key_fn: Callable[[Any], Any] = identity) -> AggregateOperation[Any, Any, list[Any]]:
    """The ``n`` items with the largest ``key_fn(item)``, largest first (Jet's
    ``topN``). Among equal keys the first accumulated stays. No ``deduct``."""
    return _top("top_n", n, key_fn, _Ranked, True)


def bottom_n(n: int, key_fn: Callable[[Any], Any] = identity) -> AggregateOperation[Any, Any, list[Any]]:
    """The ``n`` items with the smallest ``key_fn(item)``, smallest first (Jet's
    ``bottomN``). No ``deduct``."""
    return _top("bottom_n", n, key_fn, _RankedLow, False)


# -- linear_trend --------------------------------------------------------------------

_LinAcc = tuple[int, Any, Any, Any, Any]  # (n, sum x, sum y, sum xy, sum x^2)


def _lin_empty() -> _LinAcc:
    return (0, 0, 0, 0, 0)


def _lin_add(left: _LinAcc, right: _LinAcc) -> _LinAcc:
    return (
        left[0] + right[0],
        left[1] + right[1],
        left[2] + right[2],
        left[3] + right[3],
        left[4] + right[4],
    )


def _lin_sub(left: _LinAcc, right: _LinAcc) -> _LinAcc:
    return (
        left[0] - right[0],
        left[1] - right[1],
        left[2] - right[2],
        left[3] - right[3],
        left[4] - right[4],
    )


def _lin_slope(acc: _LinAcc) -> float | None:
    n, sx, sy, sxy, sx2 = acc
    denominator = n * sx2 - sx * sx
    if not denominator:
        return None
    return (n * sxy - sx * sy) / denominator


def linear_trend(
    x_fn: Callable[[Any], Any], y_fn: Callable[[Any], Any]
) -> AggregateOperation[Any, _LinAcc, float | None]:
    """The slope of the least-squares line through the points ``(x_fn(item),
    y_fn(item))`` (Jet's ``linearTrend``). Supports ``deduct``.

    The accumulator is the tuple ``(n, Σx, Σy, Σxy, Σx²)``; with int coordinates the sums
    are exact Python ints (Jet uses BigInteger), so deducting is exact. The result is
    ``None`` when the slope is undefined (no points, or all at one ``x``; Jet gives NaN
    or an infinity), like :func:`averaging` of nothing.
    """
    _check_fn("linear_trend", "x_fn", x_fn)
    _check_fn("linear_trend", "y_fn", y_fn)

    def accumulate(acc: _LinAcc, item: Any) -> _LinAcc:
        x = x_fn(item)
        y = y_fn(item)
        return (acc[0] + 1, acc[1] + x, acc[2] + y, acc[3] + x * y, acc[4] + x * x)

    return AggregateOperation(_lin_empty, accumulate, _lin_add, _lin_sub, _lin_slope)


# -- helpers ---------------------------------------------------------------------------

_MISSING: Any = object()


def _check_fn(factory: str, name: str, fn: Any) -> None:
    if not callable(fn):
        raise TypeError(f"{factory}: {name} must be callable, got {fn!r}")


def _check_op(factory: str, op: Any) -> None:
    if not isinstance(op, AggregateOperation):
        raise TypeError(f"{factory}: downstream must be an AggregateOperation, got {op!r}")


# -- co-aggregation: one op per input ordinal ------------------------------------------


def co_aggregate(
    *ops: AggregateOperation[Any, Any, Any],
    finish_fn: Callable[..., Any] | None = None,
) -> AggregateOperation[Any, tuple[Any, ...], Any]:
    """An op of arity ``len(ops)``: items of input ordinal ``i`` go to ``ops[i]``
    (Jet's ``AggregateOperations.aggregateOperation2/3`` and co-aggregation builder).

    The result is the tuple of the ops' results, or ``finish_fn(*results)``. The
    accumulator is the tuple of the component accumulators; ``combine`` and ``deduct``
    exist if every component has them. Use it with a processor that has one inbound
    edge per op (``aggregate``, ``aggregate_by_key`` with one key function per edge,
    the window processors with one key and timestamp function per edge)::

        co_aggregate(counting(), summing(lambda o: o.amount))   # (clicks, revenue)
    """
    if not ops:
        raise ValueError("co_aggregate needs at least one AggregateOperation")
    for index, op in enumerate(ops):
        if not isinstance(op, AggregateOperation):
            raise TypeError(f"co_aggregate argument {index} is not an AggregateOperation: {op!r}")
        if op.arity != 1:
            raise ValueError(f"co_aggregate argument {index} takes {op.arity} inputs, not 1")
    if finish_fn is not None:
        _check_fn("co_aggregate", "finish_fn", finish_fn)
    creates = tuple(op.create for op in ops)
    finishes = tuple(op.finish for op in ops)

    def create() -> tuple[Any, ...]:
        return tuple([fn() for fn in creates])

    def finish(acc: tuple[Any, ...]) -> Any:
        results = [fn(a) for fn, a in zip(finishes, acc, strict=True)]
        return tuple(results) if finish_fn is None else finish_fn(*results)

    accumulates = [_component_accumulate(i, op.accumulate) for i, op in enumerate(ops)]
    combine = _pairwise([op.combine for op in ops])
    deduct = _pairwise([op.deduct for op in ops])
    return AggregateOperation(create, accumulates, combine, deduct, finish)


def _component_accumulate(i: int, fn: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    def accumulate(acc: tuple[Any, ...], item: Any) -> tuple[Any, ...]:
        parts = list(acc)
        parts[i] = fn(parts[i], item)
        return tuple(parts)

    return accumulate


def aggregate_operation2(
    op0: AggregateOperation[Any, Any, Any],
    op1: AggregateOperation[Any, Any, Any],
    finish_fn: Callable[[Any, Any], Any] | None = None,
) -> AggregateOperation[Any, tuple[Any, ...], Any]:
    """Jet's ``aggregateOperation2``: :func:`co_aggregate` of two ops."""
    return co_aggregate(op0, op1, finish_fn=finish_fn)


def aggregate_operation3(
    op0: AggregateOperation[Any, Any, Any],
    op1: AggregateOperation[Any, Any, Any],
    op2: AggregateOperation[Any, Any, Any],
    finish_fn: Callable[[Any, Any, Any], Any] | None = None,
) -> AggregateOperation[Any, tuple[Any, ...], Any]:
    """Jet's ``aggregateOperation3``: :func:`co_aggregate` of three ops."""
    return co_aggregate(op0, op1, op2, finish_fn=finish_fn)
