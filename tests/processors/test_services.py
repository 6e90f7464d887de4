"""Calling services per item: the synchronous and asynchronous variants on the engine,
service lifecycle (per processor, per member), ordering, watermarks, back-pressure,
snapshots waiting for calls in flight, failures."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from typing import Any

import pytest

import slipstream as ss
from slipstream import DAG, Edge, JobConfig, ProcessingGuarantee, sinks, sources
from slipstream import processors as P
from slipstream.core.inbox import Inbox
from slipstream.core.outbox import Outbox
from slipstream.core.processor import Context
from slipstream.core.suppliers import MemberAddress, SupplierContext

# services record their lifecycle here (the embedded engine runs in this process)
EVENTS: list[Any] = []
LOCK = threading.Lock()


class Client:
    def __init__(self, name: Any) -> None:
        self.name = name
        self.closed = False
        self.calls = 0
        self.in_flight = 0
        self.max_in_flight = 0


def create_client(context: Any) -> Client:
    c = Client((context.vertex_name, getattr(context, "global_processor_index", None), context.member_index))
    with LOCK:
        EVENTS.append(("create", c.name))
    return c


def close_client(c: Client) -> None:
    c.closed = True
    with LOCK:
        EVENTS.append(("close", c.name))


def double(c: Client, x: int) -> int | None:
    assert not c.closed
    c.calls += 1
    return None if x % 10 == 3 else 2 * x


def is_even(c: Client, x: int) -> bool:
    return x % 2 == 0


def repeat(c: Client, x: int) -> list[int]:
    return [x] * (x % 3)


async def slow_double(c: Client, x: int) -> int | None:
    c.in_flight += 1
    c.max_in_flight = max(c.max_in_flight, c.in_flight)
    await asyncio.sleep(0.001 * (x % 5))  # varying delays: completion order differs
    c.in_flight -= 1
    return None if x % 10 == 3 else 2 * x


def blocking_double(c: Client, x: int) -> int | None:
    with LOCK:
        c.in_flight += 1
        c.max_in_flight = max(c.max_in_flight, c.in_flight)
    time.sleep(0.001 * (x % 5))
    with LOCK:
        c.in_flight -= 1
    return None if x % 10 == 3 else 2 * x


async def async_is_even(c: Client, x: int) -> bool:
    await asyncio.sleep(0)
    return x % 2 == 0


async def async_repeat(c: Client, x: int) -> list[int]:
    await asyncio.sleep(0.0005 * (x % 2))
    return [x] * (x % 3)


def run(proc: Any, data: list[int], *, lp: int = 2, members: int = 1, cfg: JobConfig | None = None) -> list[Any]:
    dag = DAG()
    src = dag.new_vertex("src", sources.items(data)).local_parallelism(1)
    svc = dag.new_vertex("svc", proc).local_parallelism(lp)
    out = dag.new_vertex("out", sinks.list_sink("out")).local_parallelism(1)
    dag.edge(Edge.between(src, svc).distributed()).edge(Edge.between(svc, out).distributed())
    engine = ss.local(members=members)
    engine.new_job(dag, cfg).join(60)
    return list(engine.get_list("out"))


DATA = list(range(500))
MAPPED = [2 * x for x in DATA if x % 10 != 3]


@pytest.mark.parametrize("per_member", [False, True])
def test_sync_variants_and_service_lifecycle(per_member: bool) -> None:
    factory = P.service_factory(create_client, close_client, per_member=per_member)
    EVENTS.clear()
    assert Counter(run(P.map_using_service(factory, double), DATA, members=2)) == Counter(MAPPED)
    creates = [e for e in EVENTS if e[0] == "create"]
    closes = [e for e in EVENTS if e[0] == "close"]
    # per processor: 2 processors x 2 members; per member: one per member
    assert len(creates) == (2 if per_member else 4)
    assert sorted(c[1] for c in closes) == sorted(c[1] for c in creates)  # every one closed
    assert Counter(run(P.filter_using_service(factory, is_even), DATA)) == Counter(x for x in DATA if x % 2 == 0)
    assert Counter(run(P.flat_map_using_service(factory, repeat), DATA)) == Counter(
        y for x in DATA for y in [x] * (x % 3)
    )


@pytest.mark.parametrize("fn", [slow_double, blocking_double])
@pytest.mark.parametrize("ordered", [True, False])
def test_async_map_ordered_and_unordered(fn: Any, ordered: bool) -> None:
    factory = P.service_factory(create_client, close_client)
    proc = P.map_using_service_async(factory, fn, max_concurrent=8, ordered=ordered)
    got = run(proc, DATA, lp=1)
    if ordered:
        assert got == MAPPED
    else:
        assert Counter(got) == Counter(MAPPED)


def test_async_filter_and_flat_map() -> None:
    factory = P.service_factory(create_client)
    assert run(P.filter_using_service_async(factory, async_is_even), DATA, lp=1) == [x for x in DATA if x % 2 == 0]
    got = run(P.flat_map_using_service_async(factory, async_repeat, ordered=False), DATA, lp=1)
    assert Counter(got) == Counter(y for x in DATA for y in [x] * (x % 3))


# -- driven by hand: in-flight limit, watermarks, snapshots ---------------------------------


class Gate:
    """A service whose calls finish only when the test releases them."""

    def __init__(self) -> None:
        self.started: list[int] = []
        self.events: dict[int, threading.Event] = {}
        self.lock = threading.Lock()

    def call(self, x: int) -> int:
        ev = threading.Event()
        with self.lock:
            self.events[x] = ev
            self.started.append(x)
        assert ev.wait(30)
        return x * 10

    def release(self, x: int) -> None:
        deadline = time.monotonic() + 30
        while x not in self.events:
            assert time.monotonic() < deadline
            time.sleep(0.001)
        self.events[x].set()


GATES: dict[str, Gate] = {}


def gated(g: Gate, x: int) -> int:
    return g.call(x)


def new_gated(ordered: bool, limit: int = 2) -> tuple[Any, Outbox, Gate]:
    gate = Gate()
    factory = P.service_factory(lambda ctx: gate)
    meta = P.map_using_service_async(factory, gated, max_concurrent=limit, ordered=ordered, mode="threads")
    address = MemberAddress("m", 0)
    supplier = meta.get([address])(address)
    supplier.init(SupplierContext("svc", "job", 1, 1, 1, 0))
    p = supplier.get(1)[0]
    outbox = Outbox(1, 100)
    p.init(outbox, Context(vertex_name="svc"))
    return p, outbox, gate


def until(cond: Any, step: Any) -> None:
    deadline = time.monotonic() + 30
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        step()
        time.sleep(0.001)


@pytest.mark.parametrize("ordered", [True, False])
def test_in_flight_limit_back_pressure_watermarks_and_snapshot_wait(ordered: bool) -> None:
    p, outbox, gate = new_gated(ordered)
    out = outbox.buckets[0]
    inbox = Inbox([1, 2, 3])
    p.process(0, inbox)
    assert list(inbox) == [3]  # two in flight: the third item waits (back-pressure)
    until(lambda: len(gate.started) == 2, lambda: None)
    assert p.try_process_watermark(ss.Watermark(5))  # taken, held behind items 1 and 2
    assert out == []
    assert not p.save_to_snapshot()  # waits for the calls in flight
    gate.release(2)
    until(lambda: out != [] or ordered, lambda: p.try_process())
    if not ordered:
        assert out == [20]  # done first, out first; the watermark still waits for 1
    else:
        p.try_process()
        assert out == []  # ordered: 2 waits for 1
    gate.release(1)
    until(lambda: ss.Watermark(5) in out, lambda: p.try_process())
    assert sorted(out[:2]) == [10, 20] and out[2] == ss.Watermark(5)
    if ordered:
        assert out[:2] == [10, 20]
    assert p.save_to_snapshot()  # nothing in flight any more
    p.process(0, inbox)
    assert list(inbox) == []
    gate.release(3)
    until(lambda: p.complete(), lambda: None)
    assert out[-1] == 30
    p.close()


def fail_on_7(c: Any, x: int) -> int:
    if x == 7:
        raise KeyError("no such row")
    return x


def test_failing_call_fails_the_job_naming_the_vertex_and_item() -> None:
    factory = P.service_factory(create_client)
    for proc in (
        P.map_using_service(factory, fail_on_7),
        P.map_using_service_async(factory, fail_on_7, mode="threads"),
    ):
        with pytest.raises(ss.JobFailedError) as ei:
            run(proc, list(range(20)), lp=1)
        assert ei.value.vertex == "svc"
        assert "no such row" in str(ei.value.__cause__) or "no such row" in str(ei.value)


def test_exactly_once_with_async_calls_in_flight(tmp_path: Any) -> None:
    """Snapshots wait for the calls in flight, so a job with frequent snapshots gives
    every result exactly once and in order."""
    factory = P.service_factory(create_client)
    cfg = JobConfig(
        processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE,
        snapshot_interval_ms=5,
        snapshot_store=str(tmp_path),
    )
    got = run(P.map_using_service_async(factory, slow_double, max_concurrent=16), DATA, lp=1, cfg=cfg)
    assert got == MAPPED


def test_argument_validation() -> None:
    factory = P.service_factory(create_client)
    with pytest.raises(TypeError, match="expected a ServiceFactory"):
        P.map_using_service(create_client, double)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_concurrent must be an int >= 1"):
        P.map_using_service_async(factory, slow_double, max_concurrent=0)
    with pytest.raises(ValueError, match="mode must be"):
        P.map_using_service_async(factory, slow_double, mode="fibers")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="create_fn"):
        P.service_factory(42)  # type: ignore[arg-type]
