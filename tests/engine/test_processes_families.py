"""Every built-in processor family with ``processes=2``: the same job gives the same
output with ``processes=2``, with ``processes=1`` and as a plain-Python oracle (issue 24,
"everything the embedded engine does keeps working").

Families: aggregations (global, keyed, several operations at once, single stage
behind a distributed edge, co-aggregation of two inputs), sliding and session windows (batch, and streaming from a
generator so watermarks flow), ``map_stateful``, ``hash_join``, services (sync
map/filter/flat_map, async map, a per-member service), ``sort``, the Pipeline's
``merge``, and file sources and sinks (each member reads its share of the files and
writes its own part files). Word count, ``rolling_aggregate``, tumbling windows and
list/map sinks are in test_processes.py.

Cheap by design: one engine per process count for the whole module (a member process
starts in tens of milliseconds) and small data; outputs are compared as multisets
(several processors emit in an order that differs between runs) except where a
processor promises an order (``sort``).
"""

from __future__ import annotations

import asyncio
import csv
import json
import os
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import slipstream as ss
from process_support import functions_by_value
from slipstream import DAG, Edge, sinks, sources
from slipstream import processors as P
from slipstream.aggregate import all_of, co_aggregate, counting, max_by, min_by, summing, to_list
from slipstream.window import (
    KeyedWindowResult,
    session_window_def,
    sliding_window_def,
)

GUARD_S = 120

_names = iter(range(10**6))


@pytest.fixture(scope="module")
def engines() -> Iterator[dict[int, Any]]:
    # this module's functions travel by value: a member process then need not import
    # it (and pytest with it) for every job, which cost ~0.4 s a job
    with functions_by_value(sys.modules[__name__]):
        two, one = ss.local(processes=2), ss.local()
        yield {2: two, 1: one}
        two.shutdown()
        one.shutdown()


def run_both(engines: dict[int, Any], build: Callable[[str], Any]) -> tuple[list[Any], list[Any]]:
    """``build(list_name)`` run with processes=2 and with one process: both outputs."""
    out = []
    for n in (2, 1):
        name = f"out{next(_names)}"
        job = engines[n].new_job(build(name))
        job.join(timeout=GUARD_S)
        out.append(list(engines[n].get_list(name)))
    return out[0], out[1]


def same(two: list[Any], one: list[Any], oracle: Any) -> None:
    assert Counter(two) == Counter(one) == Counter(oracle)
    # and of the same classes (window results reach the coordinator packed as rows)
    assert Counter(map(type, two)) == Counter(map(type, one)) == Counter(map(type, oracle))


def ts_of(item: tuple[int, int]) -> int:
    return item[0]


def key_of(item: tuple[int, int]) -> int:
    return item[1]


def value_of(item: tuple[int, int]) -> int:
    return item[0] % 97


#: (timestamp, key): scattered timestamps, 7 keys
DATA = [((i * 7919) % 4000, i % 7) for i in range(2500)]


# -- aggregations ----------------------------------------------------------------------
@pytest.mark.timeout(GUARD_S)
def test_global_and_keyed_aggregations(engines: dict[int, Any]) -> None:
    def build(name: str) -> ss.Pipeline:
        p = ss.Pipeline()
        src = p.read_from(sources.items(DATA))
        src.aggregate(summing(value_of)).map(lambda s: ("sum", s)).write_to(sinks.list_sink(name))
        src.group_by(key_of).aggregate(
            all_of(counting(), summing(value_of), min_by(value_of), max_by(value_of), to_list())
        ).map(lambda kv: (kv[0], kv[1][0], kv[1][1], kv[1][2], kv[1][3], tuple(sorted(kv[1][4])))).write_to(
            sinks.list_sink(name)
        )
        return p

    oracle: list[Any] = [("sum", sum(value_of(x) for x in DATA))]
    for k in range(7):
        mine = [x for x in DATA if key_of(x) == k]
        vals = [value_of(x) for x in mine]
        lo = min(mine, key=value_of)
        hi = max(mine, key=value_of)
        oracle.append((k, len(mine), sum(vals), lo, hi, tuple(sorted(mine))))
    two, one = run_both(engines, build)
    # min_by/max_by keep one of the items with the extreme value: compare the value
    def norm(r: Any) -> Any:
        return r if r[0] == "sum" else (r[0], r[1], r[2], value_of(r[3]), value_of(r[4]), r[5])

    same([norm(r) for r in two], [norm(r) for r in one], [norm(r) for r in oracle])


@pytest.mark.timeout(GUARD_S)
def test_a_single_stage_keyed_aggregation_behind_a_distributed_edge(engines: dict[int, Any]) -> None:
    def build(name: str) -> DAG:
        dag = DAG()
        src = dag.new_vertex("source", sources.items(DATA))
        agg = dag.new_vertex("aggregate", P.aggregate_by_key(key_of, summing(value_of)))
        out = dag.new_vertex("sink", sinks.list_sink(name))
        dag.edge(Edge.between(src, agg).distributed().partitioned(key_of))
        dag.edge(Edge.between(agg, out))
        return dag

    oracle: Counter[int] = Counter()
    for x in DATA:
        oracle[key_of(x)] += value_of(x)
    two, one = run_both(engines, build)
    same(two, one, oracle.items())


#: clicks (ts, user) and orders (ts, user, amount): two inputs of one co-aggregation
CLICKS = [(i, i % 5) for i in range(400)]
ORDERS = [(i, i % 7, i * 3) for i in range(300)]


def amount_of(order: tuple[int, int, int]) -> int:
    return order[2]


def entry_key(entry: tuple[Any, Any]) -> Any:
    return entry[0]


@pytest.mark.timeout(GUARD_S)
@pytest.mark.parametrize("two_stage", [False, True])
def test_co_aggregation_of_two_inputs_by_key(engines: dict[int, Any], two_stage: bool) -> None:
    """``co_aggregate`` over two inbound edges (one key function each): single stage
    behind two distributed partitioned edges, or accumulate in each member and combine
    the partial results across processes."""
    op = co_aggregate(counting(), summing(amount_of))

    def build(name: str) -> DAG:
        dag = DAG()
        clicks = dag.new_vertex("clicks", sources.items(CLICKS))
        orders = dag.new_vertex("orders", sources.items(ORDERS))
        out = dag.new_vertex("sink", sinks.list_sink(name))
        if two_stage:
            acc = dag.new_vertex("accumulate", P.accumulate_by_key([key_of, key_of], op))
            comb = dag.new_vertex("combine", P.combine_by_key(op))
            dag.edge(Edge.from_(clicks).to(acc, 0).partitioned(key_of))
            dag.edge(Edge.from_(orders).to(acc, 1).partitioned(key_of))
            dag.edge(Edge.between(acc, comb).distributed().partitioned(entry_key))
            dag.edge(Edge.between(comb, out))
        else:
            agg = dag.new_vertex("aggregate", P.aggregate_by_key([key_of, key_of], op))
            dag.edge(Edge.from_(clicks).to(agg, 0).distributed().partitioned(key_of))
            dag.edge(Edge.from_(orders).to(agg, 1).distributed().partitioned(key_of))
            dag.edge(Edge.between(agg, out))
        return dag

    oracle = {
        k: (sum(1 for c in CLICKS if c[1] == k), sum(o[2] for o in ORDERS if o[1] == k))
        for k in range(7)
    }
    two, one = run_both(engines, build)
    assert oracle[6][0] == 0 and oracle[6][1] > 0  # a key of one input only
    same(two, one, oracle.items())


# -- windows ---------------------------------------------------------------------------
def sliding_oracle(data: list[tuple[int, int]], size: int, slide: int) -> list[KeyedWindowResult]:
    counts: Counter[tuple[int, int]] = Counter()
    for ts, k in data:
        start = ts - ts % slide
        while start > ts - size:
            counts[(start, k)] += 1
            start -= slide
    return [KeyedWindowResult(s, s + size, k, n) for (s, k), n in counts.items()]


def session_oracle(data: list[tuple[int, int]], timeout: int) -> list[KeyedWindowResult]:
    """A session is a run of a key's events each less than ``timeout`` after the
    previous one; it spans [first event, last event + timeout)."""
    out = []
    for k in sorted({key for _, key in data}):
        tss = sorted(ts for ts, key in data if key == k)
        start = last = tss[0]
        n = 0
        for ts in tss:
            if ts >= last + timeout:
                out.append(KeyedWindowResult(start, last + timeout, k, n))
                start, n = ts, 0
            last = ts
            n += 1
        out.append(KeyedWindowResult(start, last + timeout, k, n))
    return out


def windowed(source: Any, name: str, window_def: Any, lag: int = 0) -> ss.Pipeline:
    p = ss.Pipeline()
    (
        p.read_from(source)
        .with_timestamps(ts_of, lag)
        .group_by(key_of)
        .window(window_def)
        .aggregate(counting())
        .write_to(sinks.list_sink(name))
    )
    return p


@pytest.mark.timeout(GUARD_S)
def test_sliding_windows_batch(engines: dict[int, Any]) -> None:
    two, one = run_both(engines, lambda n: windowed(sources.items(DATA), n, sliding_window_def(200, 50)))
    same(two, one, sliding_oracle(DATA, 200, 50))


@pytest.mark.timeout(GUARD_S)
def test_session_windows_batch(engines: dict[int, Any]) -> None:
    # ~357 events per key over 4000 time units: gaps of 0..~40, sessions of a few events
    two, one = run_both(engines, lambda n: windowed(sources.items(DATA), n, session_window_def(12)))
    oracle = session_oracle(DATA, 12)
    assert 50 < len(oracle) < len(DATA)  # real sessions, not one per event nor one per key
    same(two, one, oracle)


def stream_event(seq: int) -> tuple[int, int]:
    """In order per generator processor; every 9th event of a key after a gap."""
    return (seq * 2 + (seq // 45) * 30, seq % 5)


N_STREAM = 2700
STREAM = [stream_event(i) for i in range(N_STREAM)]


@pytest.mark.timeout(GUARD_S)
def test_sliding_and_session_windows_streaming(engines: dict[int, Any]) -> None:
    """A generator: watermarks flow while it runs, windows close on them (and at its end)."""

    def gen() -> Any:
        return sources.generator(stream_event, None, max_items=N_STREAM)

    two, one = run_both(engines, lambda n: windowed(gen(), n, sliding_window_def(100, 20)))
    same(two, one, sliding_oracle(STREAM, 100, 20))
    two, one = run_both(engines, lambda n: windowed(gen(), n, session_window_def(25)))
    oracle = session_oracle(STREAM, 25)
    assert 20 < len(oracle) < len(STREAM)
    same(two, one, oracle)


# -- map_stateful, hash_join -----------------------------------------------------------
def count_so_far(state: list[int], key: int, item: tuple[int, int]) -> tuple[int, int]:
    state[0] += 1
    return (key, state[0])


def zero() -> list[int]:
    return [0]


@pytest.mark.timeout(GUARD_S)
def test_map_stateful(engines: dict[int, Any]) -> None:
    """Per key the emitted counts are 1..n whatever order the key's items arrive in."""

    def build(name: str) -> ss.Pipeline:
        p = ss.Pipeline()
        p.read_from(sources.items(DATA)).group_by(key_of).map_stateful(zero, count_so_far).write_to(
            sinks.list_sink(name)
        )
        return p

    per_key = Counter(key_of(x) for x in DATA)
    two, one = run_both(engines, build)
    same(two, one, [(k, i) for k, n in per_key.items() for i in range(1, n + 1)])


NAMES = [(k, f"name{k}") for k in range(5)]  # keys 5 and 6 have no match


@pytest.mark.timeout(GUARD_S)
@pytest.mark.parametrize("inner", [False, True])
def test_hash_join(engines: dict[int, Any], inner: bool) -> None:
    def build(name: str) -> ss.Pipeline:
        p = ss.Pipeline()
        names = p.read_from(sources.items(NAMES))
        p.read_from(sources.items(DATA)).hash_join(names, key_of, ss.entry_key, inner=inner).write_to(
            sinks.list_sink(name)
        )
        return p

    by_key = dict(NAMES)
    oracle = [
        (x, (key_of(x), by_key[key_of(x)]) if key_of(x) in by_key else None)
        for x in DATA
        if not inner or key_of(x) in by_key
    ]
    two, one = run_both(engines, build)
    same(two, one, oracle)


# -- services --------------------------------------------------------------------------
def make_table(_ctx: Any) -> dict[int, str]:
    return dict(NAMES)


@pytest.mark.timeout(GUARD_S)
def test_map_filter_flat_map_using_a_service(engines: dict[int, Any]) -> None:
    def build(name: str) -> ss.Pipeline:
        p = ss.Pipeline()
        factory = P.service_factory(make_table)
        src = p.read_from(sources.items(DATA))
        (
            src.filter_using_service(factory, lambda t, x: key_of(x) in t)
            .map_using_service(factory, lambda t, x: (t[key_of(x)], value_of(x)))
            .flat_map_using_service(factory, lambda t, x: [x] * (x[1] % 3))
            .write_to(sinks.list_sink(name))
        )
        return p

    table = dict(NAMES)
    mapped = [(table[key_of(x)], value_of(x)) for x in DATA if key_of(x) in table]
    two, one = run_both(engines, build)
    same(two, one, [m for m in mapped for _ in range(m[1] % 3)])


async def double_later(_service: Any, x: int) -> int:
    await asyncio.sleep(0)
    return x * 2


async def not_a_multiple_of_three_later(_service: Any, x: int) -> bool:
    await asyncio.sleep(0)
    return x % 3 != 0


async def and_next_later(_service: Any, x: int) -> list[int]:
    await asyncio.sleep(0)
    return [x, x + 1]


def async_dag(name: str) -> DAG:
    """map, filter and flat_map using a service, async, each behind a distributed edge."""
    dag = DAG()
    factory = P.service_factory(lambda ctx: None)
    src = dag.new_vertex("source", sources.items(list(range(1500))))
    call = dag.new_vertex("call", P.map_using_service_async(factory, double_later, max_concurrent=8))
    keep = dag.new_vertex("keep", P.filter_using_service_async(factory, not_a_multiple_of_three_later))
    spread = dag.new_vertex("spread", P.flat_map_using_service_async(factory, and_next_later))
    out = dag.new_vertex("sink", sinks.list_sink(name))
    dag.edge(Edge.between(src, call).distributed())
    dag.edge(Edge.between(call, keep).distributed())
    dag.edge(Edge.between(keep, spread).distributed())
    dag.edge(Edge.between(spread, out))
    return dag


@pytest.mark.timeout(GUARD_S)
def test_async_map_filter_flat_map_using_a_service(engines: dict[int, Any]) -> None:
    two, one = run_both(engines, async_dag)
    kept = [x * 2 for x in range(1500) if (x * 2) % 3 != 0]
    same(two, one, [y for x in kept for y in (x, x + 1)])


def pid_service(_ctx: Any) -> int:
    return os.getpid()


@pytest.mark.timeout(GUARD_S)
def test_a_per_member_service_is_created_in_each_member_process(engines: dict[int, Any]) -> None:
    def build(name: str) -> DAG:
        dag = DAG()
        src = dag.new_vertex("source", sources.items(list(range(400)))).local_parallelism(1)
        call = dag.new_vertex(
            "call", P.map_using_service(P.service_factory(pid_service, per_member=True), lambda pid, x: (x, pid))
        )
        out = dag.new_vertex("sink", sinks.list_sink(name))
        dag.edge(Edge.between(src, call).distributed())  # round robin over both members
        dag.edge(Edge.between(call, out))
        return dag

    two, one = run_both(engines, build)
    assert sorted(x for x, _ in two) == sorted(x for x, _ in one) == list(range(400))
    assert {pid for _, pid in one} == {os.getpid()}
    pids = {pid for _, pid in two}
    assert len(pids) == 2 and os.getpid() not in pids


# -- sort, merge ------------------------------------------------------------------------
@pytest.mark.timeout(GUARD_S)
def test_sort_keeps_its_order_across_processes(engines: dict[int, Any]) -> None:
    data = [(i * 7919) % 3001 for i in range(3001)]

    def build(name: str) -> DAG:
        dag = DAG()
        src = dag.new_vertex("source", sources.items(data))
        srt = dag.new_vertex("sort", P.sort()).local_parallelism(1)
        out = dag.new_vertex("sink", sinks.list_sink(name)).local_parallelism(1)
        dag.edge(Edge.between(src, srt).distributed().all_to_one())
        dag.edge(Edge.between(srt, out))
        return dag

    two, one = run_both(engines, build)
    assert two == one == sorted(data)


@pytest.mark.timeout(GUARD_S)
def test_pipeline_merge_of_two_sources(engines: dict[int, Any]) -> None:
    def build(name: str) -> ss.Pipeline:
        p = ss.Pipeline()
        a = p.read_from(sources.items(list(range(1000))))
        b = p.read_from(sources.items(list(range(1000, 1500)))).map(lambda x: -x)
        a.merge(b).group_by(lambda x: x % 3).aggregate(counting()).write_to(sinks.list_sink(name))
        return p

    two, one = run_both(engines, build)
    same(two, one, Counter(x % 3 for x in [*range(1000), *(-x for x in range(1000, 1500))]).items())


# -- bad records -----------------------------------------------------------------------
def parse_pair(line: str) -> tuple[str, int]:
    key, value = line.split(",")
    return key, int(value)


@pytest.mark.timeout(GUARD_S)
def test_dead_letters_into_a_list_sink_come_back_to_the_coordinator(engines: dict[int, Any]) -> None:
    """``on_item_error=sinks.list_sink(...)``: the items a stage sets aside in the member
    processes reach the coordinator's list as ``DeadLetter`` records, as with one
    process."""
    lines = [f"k{i % 7},{i}" for i in range(600)]
    for i in range(0, 600, 50):
        lines[i] = f"bad{i}" if i % 100 else f"k{i},x{i}"
    out = []
    for n in (2, 1):
        rows, bad = f"rows{next(_names)}", f"bad{next(_names)}"
        p = ss.Pipeline()
        p.read_from(sources.items(lines)).map(parse_pair).write_to(sinks.list_sink(rows))
        job = engines[n].new_job(p, ss.JobConfig(on_item_error=sinks.list_sink(bad)))
        job.join(timeout=GUARD_S)
        letters = engines[n].get_list(bad)
        assert {type(d).__name__ for d in letters} == {"DeadLetter"}
        out.append((Counter(engines[n].get_list(rows)), Counter((d.item, d.error) for d in letters)))
        assert job.metrics["map"]["items_skipped"] == 12
    good = Counter(parse_pair(line) for i, line in enumerate(lines) if i % 50)
    assert out[0][0] == out[1][0] == good
    assert out[0][1] == out[1][1]
    assert sorted(item for item, _ in out[0][1]) == sorted(lines[i] for i in range(0, 600, 50))
    assert out[0][1][("bad50", "ValueError: not enough values to unpack (expected 2, got 1)")] == 1


# -- files -----------------------------------------------------------------------------
def write_inputs(directory: Path) -> list[str]:
    directory.mkdir()
    lines = []
    for f in range(6):
        mine = [f"file{f} line{i} {'x' * (i % 4)}" for i in range(150 + 10 * f)]
        (directory / f"part{f}.txt").write_text("".join(line + "\n" for line in mine))
        lines += mine
    with open(directory / "rows.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["id", "amount"])
        w.writerows([i, i * 3] for i in range(300))
    return lines


def part_files(directory: Path) -> dict[str, list[str]]:
    return {
        p.name: p.read_text().splitlines()
        for p in sorted(directory.iterdir())
        if p.is_file() and not p.name.startswith(".")
    }


@pytest.mark.timeout(GUARD_S)
def test_file_sources_and_sinks(engines: dict[int, Any], tmp_path: Path) -> None:
    """Each member reads its share of the input files (both read some, none twice) and
    writes its own part files; the lines are those of one process and of the oracle."""
    lines = write_inputs(tmp_path / "in")
    outputs = {}
    for n in (2, 1):
        p = ss.Pipeline()
        p.read_from(sources.read_files(tmp_path / "in", "*.txt")).set_name("read").map(str.upper).write_to(
            sinks.write_files(tmp_path / f"text{n}")
        )
        rows = p.read_from(sources.read_csv(tmp_path / "in", "*.csv")).set_name("read-csv")
        rows.write_to(sinks.write_jsonl(tmp_path / f"jsonl{n}"))
        rows.write_to(sinks.write_csv(tmp_path / f"csv{n}"))
        job = engines[n].new_job(p)
        job.join(timeout=GUARD_S)
        if n == 2:
            per_member = [m["read"]["items_out"] for m in job._execution.member_metrics.values()]
            assert len(per_member) == 2 and all(per_member) and sum(per_member) == len(lines)
        outputs[n] = {kind: part_files(tmp_path / f"{kind}{n}") for kind in ("text", "jsonl", "csv")}

    two, one = outputs[2], outputs[1]
    # sinks get one processor per member: a part file each
    assert sorted(two["text"]) == ["part-00000", "part-00001"] and sorted(one["text"]) == ["part-00000"]
    assert sorted(two["jsonl"]) == ["part-00000.jsonl", "part-00001.jsonl"]
    for kind in ("text", "jsonl"):
        got2 = Counter(line for part in two[kind].values() for line in part)
        got1 = Counter(line for part in one[kind].values() for line in part)
        assert got2 == got1, kind
    assert Counter(line for part in two["text"].values() for line in part) == Counter(
        line.upper() for line in lines
    )
    rows2 = Counter(json.dumps(json.loads(line), sort_keys=True) for part in two["jsonl"].values() for line in part)
    assert rows2 == Counter(json.dumps({"id": str(i), "amount": str(i * 3)}, sort_keys=True) for i in range(300))
    # every CSV part has the header once, then its rows
    for parts in (two["csv"], one["csv"]):
        assert all(part[0] == "id,amount" for part in parts.values() if part)
    csv2 = Counter(line for part in two["csv"].values() for line in part[1:])
    assert csv2 == Counter(f"{i},{i * 3}" for i in range(300))


@pytest.mark.timeout(GUARD_S)
def test_read_jsonl_and_a_map_source(engines: dict[int, Any], tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    for f in range(3):
        (tmp_path / "in" / f"r{f}.jsonl").write_text("".join(json.dumps({"f": f, "i": i}) + "\n" for i in range(40)))
    for n in (2, 1):
        engines[n].get_map("prices").update({f"k{i}": i for i in range(50)})

    def build(name: str) -> ss.Pipeline:
        p = ss.Pipeline()
        p.read_from(sources.read_jsonl(tmp_path / "in")).map(lambda r: ("row", r["f"], r["i"])).write_to(
            sinks.list_sink(name)
        )
        p.read_from(sources.map_source("prices")).map(lambda kv: ("price", kv[0], kv[1])).write_to(
            sinks.list_sink(name)
        )
        return p

    two, one = run_both(engines, build)
    oracle = [("row", f, i) for f in range(3) for i in range(40)] + [("price", f"k{i}", i) for i in range(50)]
    same(two, one, oracle)


@pytest.mark.timeout(GUARD_S)
def test_stream_files_reads_each_file_once(engines: dict[int, Any], tmp_path: Path) -> None:
    """A directory watched by a streaming job: the files there at its start and one
    written while it runs, each line once (the job runs until they all arrived)."""
    directory = tmp_path / "watched"
    directory.mkdir()
    for f in range(4):
        (directory / f"f{f}.txt").write_text("".join(f"{f}-{i}\n" for i in range(25)))
    p = ss.Pipeline()
    p.read_from(sources.stream_files(directory, "*.txt")).write_to(sinks.list_sink("streamed"))
    engine = engines[2]
    job = engine.new_job(p)
    out = engine.get_list("streamed")
    wait_until(lambda: len(out) >= 100, "the first files' lines")
    (directory / ".new.tmp").write_text("".join(f"new-{i}\n" for i in range(30)))
    os.rename(directory / ".new.tmp", directory / "new.txt")
    wait_until(lambda: len(out) >= 130, "the new file's lines")
    job.cancel()
    with pytest.raises(ss.JobCancelledError):
        job.join(timeout=GUARD_S)
    expected = [f"{f}-{i}" for f in range(4) for i in range(25)] + [f"new-{i}" for i in range(30)]
    assert Counter(out) == Counter(expected)


def wait_until(cond: Callable[[], bool], what: str) -> None:
    import time

    deadline = time.monotonic() + GUARD_S / 2
    while not cond():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.01)


@pytest.mark.slow
@pytest.mark.timeout(GUARD_S)
def test_parquet_written_and_read_by_member_processes(engines: dict[int, Any], tmp_path: Path) -> None:
    """Slow: each member process imports pyarrow (not preloaded by the forkserver)."""
    rows = [{"id": i, "name": f"n{i}"} for i in range(500)]
    for n in (2, 1):
        p = ss.Pipeline()
        p.read_from(sources.items(rows)).write_to(sinks.write_parquet(tmp_path / f"pq{n}"))
        engines[n].new_job(p).join(timeout=GUARD_S)
    assert sorted(os.listdir(tmp_path / "pq2")) == ["part-00000.parquet", "part-00001.parquet"]

    def build(name: str) -> ss.Pipeline:
        p = ss.Pipeline()
        p.read_from(sources.read_parquet(tmp_path / "pq2")).map(lambda r: (r["id"], r["name"])).write_to(
            sinks.list_sink(name)
        )
        return p

    two, one = run_both(engines, build)
    same(two, one, [(r["id"], r["name"]) for r in rows])
