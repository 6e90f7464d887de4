"""Calling a service per item: ``map_using_service`` and friends (Jet's
``mapUsingService`` / ``mapUsingServiceAsync`` family).

This is how a stream calls a database, an HTTP API or a model: a *service* (a client,
a connection, a loaded model) is created from a :class:`ServiceFactory` once per
processor (or once per member, shared by its processors), used for every item, and
closed when the processors finish.

**Synchronous variants** (``map_using_service``, ``filter_using_service``,
``flat_map_using_service``) call ``fn(service, item)`` on the processor's thread. A
call that blocks (network, disk) must not hold up the cooperative worker threads, so
these processors are *non-cooperative* (a thread each) unless the factory says
``cooperative=True`` (for services that answer in well under a millisecond, e.g. a
dict lookup).

**Asynchronous variants** (``..._async``) keep up to ``max_concurrent`` calls in
flight per processor, which is what makes a slow remote service fast: with 10 ms calls
one processor does about ``max_concurrent * 100`` items per second. ``fn`` is either an
``async def`` coroutine function (run on one shared asyncio event loop thread) or a
plain blocking function (run on a thread pool of ``max_concurrent`` threads per
processor); ``mode="auto"`` tells them apart with ``inspect.iscoroutinefunction``.
The processors themselves stay cooperative: they only start calls and collect results.

- ``ordered=True`` (default) emits results in input order; ``False`` emits each as
  soon as its call is done (faster when call times vary). Either way a watermark is
  emitted only after every item received before it was emitted (Jet's rule), so
  results are never late because of the reordering.
- **Back-pressure**: with ``max_concurrent`` calls in flight the processor takes no
  more items from its inbox, so the upstream queues fill up and slow the source down.
- **Snapshots** wait for the calls in flight: ``save_to_snapshot`` returns ``False``
  until every started call finished and its results were emitted, so a snapshot never
  holds a call that a restore would lose or repeat. There is no other state.
- A call that raises fails the job with that exception (chained), naming the vertex
  and the item; under ``JobConfig(on_item_error=...)`` the item is skipped or sent to
  the dead letters instead (:mod:`slipstream.core.item_errors`).

As in Jet, ``map`` variants drop ``None`` results (``None`` means "no output for this
item") and ``filter`` variants keep the items whose predicate is truthy.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import heapq
import inspect
import threading
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from typing import Any, Literal

from slipstream.core.inbox import Inbox
from slipstream.core.item_errors import blame
from slipstream.core.items import Watermark
from slipstream.core.processor import AbstractProcessor, Context, Processor
from slipstream.core.suppliers import (
    MemberAddress,
    ProcessorMetaSupplier,
    ProcessorSupplier,
    SupplierContext,
)
from slipstream.core.validation import check_fn

__all__ = [
    "ServiceFactory",
    "filter_using_service",
    "filter_using_service_async",
    "flat_map_using_service",
    "flat_map_using_service_async",
    "map_using_service",
    "map_using_service_async",
    "service_factory",
]

Mode = Literal["auto", "asyncio", "threads"]


class ServiceFactory:
    """How to create and destroy a service (Jet's ``ServiceFactory``).

    ``create_fn(context)`` makes the service: ``context`` is the processor's
    :class:`~slipstream.core.processor.Context`, or with ``per_member=True`` the
    member's :class:`~slipstream.core.suppliers.SupplierContext` (one service shared by
    the member's processors of the vertex; it must then be thread-safe, since
    non-cooperative processors run on threads of their own). ``destroy_fn(service)``
    closes it when the processors (or the member's processors) are done, also after a
    failure. Either may be an ``async def``: it is then run on the shared event loop.
    ``cooperative=True`` lets the synchronous variants run on the cooperative worker
    threads (only for calls that never block).
    """

    __slots__ = ("create_fn", "destroy_fn", "per_member", "cooperative")

    def __init__(
        self,
        create_fn: Callable[[Any], Any],
        destroy_fn: Callable[[Any], Any] | None = None,
        *,
        per_member: bool = False,
        cooperative: bool = False,
    ) -> None:
        check_fn(create_fn, "create_fn", "service_factory")
        if destroy_fn is not None:
            check_fn(destroy_fn, "destroy_fn", "service_factory")
        self.create_fn = create_fn
        self.destroy_fn = destroy_fn
        self.per_member = bool(per_member)
        self.cooperative = bool(cooperative)

    def create(self, context: Any) -> Any:
        return _resolve(self.create_fn(context))

    def destroy(self, service: Any) -> None:
        if self.destroy_fn is not None:
            _resolve(self.destroy_fn(service))

    def __repr__(self) -> str:
        return (
            f"ServiceFactory({self.create_fn!r}, {self.destroy_fn!r}, "
            f"per_member={self.per_member}, cooperative={self.cooperative})"
        )


def service_factory(
    create_fn: Callable[[Any], Any],
    destroy_fn: Callable[[Any], Any] | None = None,
    *,
    per_member: bool = False,
    cooperative: bool = False,
) -> ServiceFactory:
    """A :class:`ServiceFactory`: ``service_factory(lambda ctx: make_client(),
    lambda client: client.close())``."""
    return ServiceFactory(create_fn, destroy_fn, per_member=per_member, cooperative=cooperative)


# -- the shared event loop ---------------------------------------------------------------

_loop_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None


def event_loop() -> asyncio.AbstractEventLoop:
    """The process-wide event loop the async variants run coroutines on (a daemon
    thread, started on first use)."""
    global _loop
    with _loop_lock:
        if _loop is None or _loop.is_closed():
            loop = asyncio.new_event_loop()
            threading.Thread(
                target=loop.run_forever, name="slipstream-asyncio", daemon=True
            ).start()
            _loop = loop
        return _loop


def _resolve(value: Any) -> Any:
    """``value``, or its result if it is awaitable (run on the shared loop)."""
    if inspect.isawaitable(value):
        return asyncio.run_coroutine_threadsafe(_await(value), event_loop()).result()
    return value


async def _await(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


# -- services of a vertex ------------------------------------------------------------------


class _ServiceSupplier(ProcessorSupplier):
    """Makes a member's processors; with a per-member factory it owns the service."""

    def __init__(self, factory: ServiceFactory, make: Callable[[], _UsingServiceP]) -> None:
        self.factory = factory
        self.make = make
        self.service: Any = None
        self.has_service = False

    def init(self, context: SupplierContext) -> None:
        if self.factory.per_member:
            self.service = self.factory.create(context)
            self.has_service = True

    def get(self, count: int) -> list[Processor]:
        procs: list[Processor] = []
        for _ in range(count):
            p = self.make()
            if self.has_service:
                p.shared_service = self.service
            procs.append(p)
        return procs

    def close(self, error: BaseException | None) -> None:
        if self.has_service:
            self.has_service = False
            service, self.service = self.service, None
            self.factory.destroy(service)


class _ServiceMetaSupplier(ProcessorMetaSupplier):
    """A fresh supplier per member, so that each member has its own shared service."""

    handles_item_errors = True

    def __init__(self, factory: ServiceFactory, make: Callable[[], _UsingServiceP]) -> None:
        self.factory = factory
        self.make = make

    def get(
        self, member_addresses: Sequence[MemberAddress]
    ) -> Callable[[MemberAddress], ProcessorSupplier]:
        suppliers = {a: _ServiceSupplier(self.factory, self.make) for a in member_addresses}
        return suppliers.__getitem__

    def __repr__(self) -> str:
        return f"_ServiceMetaSupplier({self.make!r})"


_NO_SERVICE: Any = object()


class _UsingServiceP(AbstractProcessor):
    """What every service processor shares: getting and closing the service."""

    shared_service: Any = _NO_SERVICE
    handles_item_errors = True

    def __init__(self, factory: ServiceFactory, fn: Callable[[Any, Any], Any]) -> None:
        self._factory = factory
        self._fn = fn
        self._service: Any = _NO_SERVICE
        self._owns_service = False

    def init_processor(self, context: Context) -> None:
        if self.shared_service is not _NO_SERVICE:
            self._service = self.shared_service
        else:
            self._service = self._factory.create(context)
            self._owns_service = True

    def close(self) -> None:
        if self._owns_service:
            self._owns_service = False
            service, self._service = self._service, _NO_SERVICE
            self._factory.destroy(service)

    _kind = ""


# -- synchronous ------------------------------------------------------------------------------


def _map_results(result: Any) -> Iterable[Any]:
    return () if result is None else (result,)


class _SyncServiceP(_UsingServiceP):
    """``fn(service, item)`` per item; ``outputs(item, result)`` is what to emit."""

    def __init__(
        self,
        factory: ServiceFactory,
        fn: Callable[[Any, Any], Any],
        kind: str,
    ) -> None:
        super().__init__(factory, fn)
        self._kind = kind
        self._it: Iterator[Any] | None = None

    def is_cooperative(self) -> bool:
        return self._factory.cooperative

    def process(self, ordinal: int, inbox: Inbox) -> None:
        fn = self._fn
        service = self._service
        kind = self._kind
        errors = self.context.item_errors
        while inbox:
            it = self._it
            if it is None:
                item = inbox[0]
                try:
                    result = fn(service, item)
                    if kind == "map_using_service":
                        it = iter(_map_results(result))
                    elif kind == "filter_using_service":
                        it = iter((item,) if result else ())
                    elif errors.fails:
                        it = iter(result)
                    else:  # whole, so that an iterator raising half-way emits nothing
                        it = iter(list(result))
                except Exception as e:
                    if not errors.handle(item, e):
                        raise
                    inbox.popleft()
                    continue
                self._it = it
            try:
                done = self.emit_from(it)
            except Exception as e:  # flat_map's iterator raised (or the job stopped)
                blame(e, inbox[0])
                raise
            if not done:
                return
            self._it = None
            inbox.popleft()


def _sync(kind: str, factory: ServiceFactory, fn: Callable[[Any, Any], Any]) -> ProcessorMetaSupplier:
    _check_factory(kind, factory)
    check_fn(fn, "fn", kind)
    return _ServiceMetaSupplier(factory, functools.partial(_SyncServiceP, factory, fn, kind))


def map_using_service(
    factory: ServiceFactory, fn: Callable[[Any, Any], Any]
) -> ProcessorMetaSupplier:
    """Emits ``fn(service, item)`` for each item (``None`` results are dropped)."""
    return _sync("map_using_service", factory, fn)


def filter_using_service(
    factory: ServiceFactory, predicate: Callable[[Any, Any], Any]
) -> ProcessorMetaSupplier:
    """Emits the items for which ``predicate(service, item)`` is truthy."""
    return _sync("filter_using_service", factory, predicate)


def flat_map_using_service(
    factory: ServiceFactory, fn: Callable[[Any, Any], Iterable[Any]]
) -> ProcessorMetaSupplier:
    """Emits every element of the iterable ``fn(service, item)`` for each item."""
    return _sync("flat_map_using_service", factory, fn)


# -- asynchronous ----------------------------------------------------------------------------


class _Call:
    """One item in flight: its future, and where it stands in the input order."""

    __slots__ = ("item", "future", "seq")

    def __init__(self, item: Any, future: concurrent.futures.Future[Any], seq: int) -> None:
        self.item = item
        self.future = future
        self.seq = seq


class _AsyncServiceP(_UsingServiceP):
    """Keeps up to ``max_concurrent`` calls in flight; see the module docstring.

    State: ``_flight`` (the calls in flight, in input order), for ordered output the
    output queue ``_queue`` holding calls and watermarks in input order; for unordered
    output the sequence numbers still in flight (a heap, lazily cleaned) and the
    watermarks waiting for the calls started before them.
    """

    def __init__(
        self,
        factory: ServiceFactory,
        fn: Callable[[Any, Any], Any],
        kind: str,
        max_concurrent: int,
        ordered: bool,
        use_asyncio: bool,
    ) -> None:
        super().__init__(factory, fn)
        self._kind = kind
        self._max = max_concurrent
        self._ordered = ordered
        self._use_asyncio = use_asyncio
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._in_flight = 0
        self._seq = 0
        # ordered: calls and watermarks in input order
        self._queue: deque[Any] = deque()
        # unordered: finished calls (filled from callbacks), outstanding seqs, waiting wms
        self._done: deque[_Call] = deque()
        self._outstanding: list[int] = []
        self._finished_seqs: set[int] = set()
        self._waiting_wms: deque[tuple[int, Watermark]] = deque()
        self._out: Iterator[Any] | None = None

    def init_processor(self, context: Context) -> None:
        super().init_processor(context)
        if self._use_asyncio:
            self._loop = event_loop()
        else:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                self._max, thread_name_prefix=f"slipstream-{context.vertex_name}"
            )

    def close(self) -> None:
        ex = self._executor
        if ex is not None:
            self._executor = None
            ex.shutdown(wait=False, cancel_futures=True)
        for entry in self._queue:
            if type(entry) is _Call:
                entry.future.cancel()
        try:
            super().close()
        finally:
            self._queue.clear()

    # -- starting calls --------------------------------------------------------------
    def _start(self, item: Any) -> _Call:
        fn = self._fn
        service = self._service
        if self._use_asyncio:
            future = asyncio.run_coroutine_threadsafe(
                _call_coroutine(fn, service, item), self._loop  # type: ignore[arg-type]
            )
        else:
            future = self._executor.submit(fn, service, item)  # type: ignore[union-attr]
        call = _Call(item, future, self._seq)
        self._seq += 1
        self._in_flight += 1
        if self._ordered:
            self._queue.append(call)
        else:
            heapq.heappush(self._outstanding, call.seq)
            future.add_done_callback(functools.partial(_finished, self._done, call))
        return call

    def process(self, ordinal: int, inbox: Inbox) -> None:
        if not self._emit_ready():
            return
        while inbox and self._in_flight < self._max:
            self._start(inbox.popleft())
        # results that are already there go out now (keeps the outbox busy)
        self._emit_ready()

    def try_process(self) -> bool:
        self._emit_ready()
        return True

    def try_process_watermark(self, watermark: Watermark) -> bool:
        if self._ordered:
            if not self._queue and self._out is None:
                return self.try_emit(watermark)
            self._queue.append(watermark)
        else:
            if not self._outstanding and not self._waiting_wms and self._out is None:
                return self.try_emit(watermark)
            self._waiting_wms.append((self._seq, watermark))
        self._emit_ready()
        return True

    def complete(self) -> bool:
        return self._emit_ready() and self._idle()

    def save_to_snapshot(self) -> bool:
        # nothing to save once every call in flight finished and went out
        return self._emit_ready() and self._idle()

    def _idle(self) -> bool:
        return (
            self._in_flight == 0
            and self._out is None
            and not self._queue
            and not self._waiting_wms
        )

    # -- emitting results --------------------------------------------------------------
    def _outputs(self, call: _Call) -> Iterator[Any]:
        try:
            result = call.future.result()
            kind = self._kind
            if kind == "map_using_service_async":
                return iter(_map_results(result))
            if kind == "filter_using_service_async":
                return iter((call.item,) if result else ())
            return iter(result) if self.context.item_errors.fails else iter(list(result))
        except concurrent.futures.CancelledError:
            raise
        except Exception as e:  # the call raised: the job's error names the item
            if self.context.item_errors.handle(call.item, e):
                return iter(())
            raise

    def _emit_ready(self) -> bool:
        """Emit what can go out now; ``False`` if the outbox filled up."""
        if self._out is not None:
            if not self.emit_from(self._out):
                return False
            self._out = None
        if self._ordered:
            queue = self._queue
            while queue:
                head = queue[0]
                if type(head) is _Call:
                    if not head.future.done():
                        return True
                    queue.popleft()
                    self._in_flight -= 1
                    self._out = self._outputs(head)
                    if not self.emit_from(self._out):
                        return False
                    self._out = None
                else:
                    if not self.try_emit(head):
                        return False
                    queue.popleft()
            return True
        done = self._done
        while done:
            call = done.popleft()
            self._in_flight -= 1
            self._finished_seqs.add(call.seq)
            self._out = self._outputs(call)
            if not self.emit_from(self._out):
                return False
            self._out = None
        # watermarks whose earlier calls are all out
        outstanding = self._outstanding
        finished = self._finished_seqs
        while outstanding and outstanding[0] in finished:
            finished.discard(heapq.heappop(outstanding))
        waiting = self._waiting_wms
        while waiting:
            seq, wm = waiting[0]
            if outstanding and outstanding[0] < seq:
                break
            if not self.try_emit(wm):
                return False
            waiting.popleft()
        return True


def _finished(done: deque[_Call], call: _Call, future: Any) -> None:
    """Done callback (any thread): queue the call for the processor's thread."""
    done.append(call)


async def _call_coroutine(fn: Callable[[Any, Any], Any], service: Any, item: Any) -> Any:
    return await fn(service, item)


def _async(
    kind: str,
    factory: ServiceFactory,
    fn: Callable[[Any, Any], Any],
    max_concurrent: int,
    ordered: bool,
    mode: Mode,
) -> ProcessorMetaSupplier:
    _check_factory(kind, factory)
    check_fn(fn, "fn", kind)
    if type(max_concurrent) is not int or max_concurrent < 1:
        raise ValueError(f"{kind}: max_concurrent must be an int >= 1, got {max_concurrent!r}")
    if mode not in ("auto", "asyncio", "threads"):
        raise ValueError(f"{kind}: mode must be 'auto', 'asyncio' or 'threads', got {mode!r}")
    use_asyncio = inspect.iscoroutinefunction(fn) if mode == "auto" else mode == "asyncio"
    make = functools.partial(
        _AsyncServiceP, factory, fn, kind, max_concurrent, bool(ordered), use_asyncio
    )
    return _ServiceMetaSupplier(factory, make)


def map_using_service_async(
    factory: ServiceFactory,
    fn: Callable[[Any, Any], Any],
    *,
    max_concurrent: int = 4,
    ordered: bool = True,
    mode: Mode = "auto",
) -> ProcessorMetaSupplier:
    """Emits the result of ``fn(service, item)`` (an ``async def``, or a blocking
    function run on a thread pool) for each item, with up to ``max_concurrent`` calls
    in flight per processor; ``None`` results are dropped."""
    return _async("map_using_service_async", factory, fn, max_concurrent, ordered, mode)


def filter_using_service_async(
    factory: ServiceFactory,
    predicate: Callable[[Any, Any], Any],
    *,
    max_concurrent: int = 4,
    ordered: bool = True,
    mode: Mode = "auto",
) -> ProcessorMetaSupplier:
    """Emits the items for which ``predicate(service, item)`` resolves truthy."""
    return _async("filter_using_service_async", factory, predicate, max_concurrent, ordered, mode)


def flat_map_using_service_async(
    factory: ServiceFactory,
    fn: Callable[[Any, Any], Any],
    *,
    max_concurrent: int = 4,
    ordered: bool = True,
    mode: Mode = "auto",
) -> ProcessorMetaSupplier:
    """Emits every element of the iterable ``fn(service, item)`` resolves to."""
    return _async("flat_map_using_service_async", factory, fn, max_concurrent, ordered, mode)


def _check_factory(kind: str, factory: Any) -> None:
    if not isinstance(factory, ServiceFactory):
        raise TypeError(
            f"{kind}: expected a ServiceFactory (from service_factory(create_fn, destroy_fn)), "
            f"got {factory!r}"
        )
