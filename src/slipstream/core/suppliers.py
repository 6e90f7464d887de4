"""How a vertex gets its processors (Jet's meta-supplier → supplier → processor chain).

At job start the engine asks the vertex's :class:`ProcessorMetaSupplier` (once, on the
coordinator) for a function ``address -> ProcessorSupplier`` given every member's address;
each member's supplier then creates ``local_parallelism`` processors. Custom sources use
this to split their data by member. Plain callables and ``Processor`` classes are accepted
wherever a supplier is expected and wrapped by :func:`to_meta_supplier`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from slipstream.core.processor import Processor


class MemberAddress(NamedTuple):
    """Identifies a member (a simulated member of the embedded engine, or a Spark
    executor slot)."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


class SupplierContext(NamedTuple):
    """What suppliers know at job start."""

    vertex_name: str
    job_name: str
    local_parallelism: int
    total_parallelism: int
    member_count: int
    member_index: int = 0


class ProcessorSupplier:
    """Creates the processors of one vertex on one member."""

    def init(self, context: SupplierContext) -> None:
        """Called once on the member before ``get``."""

    def get(self, count: int) -> list[Processor]:
        """Return exactly ``count`` new processors."""
        raise NotImplementedError

    def close(self, error: BaseException | None) -> None:
        """Called after all of this member's processors are done."""


class ProcessorMetaSupplier:
    """Runs once per job on the coordinator and hands out one supplier per member."""

    def preferred_local_parallelism(self) -> int:
        """-1: no preference; otherwise an upper bound for the default parallelism."""
        return -1

    def init(self, context: SupplierContext) -> None:
        """Called once before ``get`` (``member_index`` is 0 here)."""

    def get(
        self, addresses: Sequence[MemberAddress]
    ) -> Callable[[MemberAddress], ProcessorSupplier]:
        raise NotImplementedError

    def close(self, error: BaseException | None) -> None:
        """Called after the job ends."""


class FactorySupplier(ProcessorSupplier):
    """A supplier calling a zero-argument factory once per processor."""

    def __init__(self, factory: Callable[[], Processor]) -> None:
        self.factory = factory

    def get(self, count: int) -> list[Processor]:
        return [self.factory() for _ in range(count)]

    def __repr__(self) -> str:
        return f"FactorySupplier({_describe(self.factory)})"


class SameSupplierMetaSupplier(ProcessorMetaSupplier):
    """A meta-supplier giving every member the same supplier."""

    def __init__(self, supplier: ProcessorSupplier, preferred_local_parallelism: int = -1) -> None:
        self.supplier = supplier
        self._preferred = preferred_local_parallelism

    def preferred_local_parallelism(self) -> int:
        return self._preferred

    def get(
        self, addresses: Sequence[MemberAddress]
    ) -> Callable[[MemberAddress], ProcessorSupplier]:
        supplier = self.supplier
        return lambda _address: supplier

    def __repr__(self) -> str:
        return f"MetaSupplier({self.supplier!r})"


def _describe(obj: Any) -> str:
    return getattr(obj, "__qualname__", None) or type(obj).__name__


def to_meta_supplier(supplier: Any, preferred_local_parallelism: int = -1) -> ProcessorMetaSupplier:
    """Wrap whatever the user gave as a vertex's supplier into a meta-supplier.

    Accepts a :class:`ProcessorMetaSupplier`, a :class:`ProcessorSupplier`, a
    :class:`Processor` subclass, or a zero-argument callable returning a ``Processor``.
    """
    if isinstance(supplier, ProcessorMetaSupplier):
        return supplier
    if isinstance(supplier, ProcessorSupplier):
        return SameSupplierMetaSupplier(supplier, preferred_local_parallelism)
    if isinstance(supplier, Processor):
        raise TypeError(
            f"got a Processor instance ({type(supplier).__name__}); a vertex needs a supplier "
            "that makes a new processor each time: pass the class or a zero-argument function"
        )
    if callable(supplier):
        return SameSupplierMetaSupplier(FactorySupplier(supplier), preferred_local_parallelism)
    raise TypeError(
        f"expected a ProcessorMetaSupplier, ProcessorSupplier, Processor class or a "
        f"zero-argument callable, got {type(supplier).__name__}"
    )
