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

import operator
from collections.abc import Callable
from enum import Enum
from typing import Any, Generic, TypeVar

__all__ = [
    "AggregateOperation",
    "all_of",
    "averaging",
    "counting",
    "identity",
    "max_by",
    "min_by",
    "summing",
    "to_list",
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


def _check_callable(name: str, fn: Any, *, optional: bool) -> None:
    if fn is None and optional:
        return
    if not callable(fn):
        kind = "a callable or None" if optional else "a callable"
        raise TypeError(f"AggregateOperation.{name} must be {kind}, got {fn!r}")


class AggregateOperation(Generic[T, A, R]):
    """Functional aggregate operation; see the module docstring for the contract."""

    __slots__ = ("accumulate", "additive", "combine", "create", "deduct", "finish")

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
        accumulate: Callable[[A, T], A],
        combine: Callable[[A, A], A] | None = None,
        deduct: Callable[[A, A], A] | None = None,
        finish: Callable[[A], R] | None = None,
    ) -> None:
        _check_callable("create", create, optional=False)
        _check_callable("accumulate", accumulate, optional=False)
        _check_callable("combine", combine, optional=True)
        _check_callable("deduct", deduct, optional=True)
        _check_callable("finish", finish, optional=True)
        self.create = create
        self.accumulate = accumulate
        self.combine = combine
        self.deduct = deduct
        self.finish = finish if finish is not None else identity
        self.additive = None

    def _derive(
        self,
        accumulate: Callable[[A, Any], A],
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
        return self._derive(self.accumulate, fn, self.additive)

    def with_identity_finish(self) -> AggregateOperation[T, A, A]:
        """The same op returning the accumulator itself: how stage-1 ops are built."""
        return self._derive(self.accumulate, identity, self.additive)

    def and_then(self, fn: Callable[[R], R2]) -> AggregateOperation[T, A, R2]:
        """The same op with ``fn`` applied to the result of ``finish``."""
        finish = self.finish
        if finish is identity:
            composed: Callable[[A], R2] = fn  # type: ignore[assignment]
        else:

            def composed(acc: A) -> R2:
                return fn(finish(acc))

        return self._derive(self.accumulate, composed, self.additive)

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
