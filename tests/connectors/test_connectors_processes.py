"""The Kafka and SQL connectors with ``ss.local(processes=2)`` (issue 24): the source is
split over all processors of all members, as in Jet, so each member process reads its
share of the topic's partitions (or of the query's rows); each member's sink processors
write their share. Differential: processes=2, processes=1 and a plain-Python oracle give
the same output, against the private servers the session fixtures start on 127.0.0.1.
Exactly-once into PostgreSQL and into Kafka survives a member process SIGKILLed at a
random moment (slow; SLIPSTREAM_KILL_SEEDS=N runs N seeds of each).
Streaming jobs are read until the expected output arrived (an event), then cancelled.
"""

from __future__ import annotations

import fcntl
import functools
import itertools
import json
import os
import random
import signal
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

import slipstream as ss
from kill_support import kill_point, kill_seeds
from slipstream import DAG, Edge, JobConfig, sinks, sources
from slipstream import processors as P
from slipstream.aggregate import summing
from slipstream.core.errors import JobCancelledError
from slipstream.sinks.kafka import KafkaSinkP
from slipstream.sinks.sql import transaction_prefix
from slipstream.sources.kafka import partition_owner
from slipstream.watermark import with_fixed_lag
from slipstream.window import tumbling_window_def

GUARD_S = 120
PARTITIONS = 4

_names = itertools.count()


def unique(prefix: str) -> str:
    return f"{prefix}{next(_names)}x{time.monotonic_ns() % 10**6}"


def wait_for(cond: Callable[[], bool], what: str) -> None:
    """Wait for an event; the deadline only bounds a hang."""
    deadline = time.monotonic() + GUARD_S / 2
    while not cond():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.02)


def run_until(dag: DAG, processes: int, name: str, done: Callable[[list[Any]], bool]) -> list[Any]:
    """Run a streaming job until ``done(output so far)``, cancel it, return the output
    (nothing more arrives after the cancel)."""
    engine = ss.local(processes=processes)
    job = engine.new_job(dag, JobConfig(name=unique("conn-proc")))
    out = engine.get_list(name)
    wait_for(lambda: done(list(out)), f"the output of {name!r}")
    job.cancel()
    with pytest.raises(JobCancelledError):
        job.join(timeout=GUARD_S)
    return list(out)


# -- Kafka ---------------------------------------------------------------------------


def produce(bootstrap: str, topic: str, records: list[tuple[int, bytes, bytes | None]]) -> None:
    """(partition, value, key) records, flushed."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for partition, value, key in records:
        p.produce(topic, value=value, key=key, partition=partition)
    assert p.flush(30) == 0


def read_topic(bootstrap: str, topic: str, expect: int) -> list[bytes]:
    """The values of ``topic`` once ``expect`` arrived and nothing more came for 0.5 s."""
    c = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": unique("reader"), "enable.auto.commit": False}
    )
    c.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    out: list[bytes] = []
    deadline = time.monotonic() + GUARD_S / 2
    last = time.monotonic()
    try:
        while time.monotonic() < deadline:
            msgs = c.consume(1000, 0.1)
            out.extend(m.value() for m in msgs if m.error() is None)
            if msgs:
                last = time.monotonic()
            elif len(out) >= expect and time.monotonic() - last > 0.5:
                break
    finally:
        c.close()
    return out


def tagged(message: Any) -> tuple[int, int, int]:
    """(partition, value, pid of the process that read it)."""
    return message.partition(), int(message.value()), os.getpid()


def test_each_member_reads_its_share_of_the_partitions(kafka: Any) -> None:
    topic = unique("procsrc")
    kafka.create_topic(topic, PARTITIONS)
    n = 4000
    produce(kafka.bootstrap, topic, [(i % PARTITIONS, str(i).encode(), None) for i in range(n)])

    def dag() -> DAG:
        d = DAG()
        src = d.new_vertex(
            "kafka", sources.kafka(topic, {"bootstrap.servers": kafka.bootstrap}, projection=tagged)
        ).local_parallelism(2)
        out = d.new_vertex("out", sinks.list_sink("got")).local_parallelism(1)
        d.edge(Edge.between(src, out))
        return d

    two = run_until(dag(), 2, "got", lambda out: len(out) >= n)
    one = run_until(dag(), 1, "got", lambda out: len(out) >= n)
    oracle = sorted((i % PARTITIONS, i) for i in range(n))
    assert sorted((p, v) for p, v, _ in two) == sorted((p, v) for p, v, _ in one) == oracle
    # the source's 4 processors are split over the two members (2 each, global indexes
    # 0-1 on member 0 and 2-3 on member 1): each member read exactly its processors'
    # partitions, and neither is the coordinator
    read_by: dict[int, set[int]] = {}
    for p, _, pid in two:
        read_by.setdefault(pid, set()).add(p)
    assert os.getpid() not in read_by and len(read_by) == 2
    shares = sorted(sorted(ps) for ps in read_by.values())
    expected = sorted(
        sorted(p for p in range(PARTITIONS) if partition_owner(topic, p, 4) // 2 == m)
        for m in (0, 1)
    )
    assert shares == expected


def parse(message: Any) -> dict[str, Any]:
    return json.loads(message.value())


def user_of(r: dict[str, Any]) -> str:
    return str(r["user"])


def ts_of(r: dict[str, Any]) -> int:
    return int(r["ts"])


def amount_of(r: dict[str, Any]) -> int:
    return int(r["amount"])


def lag() -> Any:
    return with_fixed_lag(0)


def test_windows_over_partitions_read_by_two_members_match_the_oracle(kafka: Any) -> None:
    """Event time per partition, partitions on different members: the window vertex
    sees the minimum over both members' watermarks (they cross the distributed edge
    in-band). A last record far ahead on every partition closes every window."""
    topic = unique("procwin")
    kafka.create_topic(topic, PARTITIONS)
    records = [
        (i % PARTITIONS, {"user": f"u{i % 7}", "amount": i % 10, "ts": i * 5}) for i in range(3000)
    ]
    end = 3000 * 5 + 10_000
    records += [(p, {"user": "end", "amount": 0, "ts": end}) for p in range(PARTITIONS)]
    produce(kafka.bootstrap, topic, [(p, json.dumps(r).encode(), None) for p, r in records])
    oracle: Counter[tuple[str, int, int]] = Counter()
    for _, r in records:
        if r["user"] != "end":
            start = r["ts"] - r["ts"] % 1000
            oracle[(r["user"], start, 0)] += r["amount"]
    expected = Counter({(u, s, total): 1 for (u, s, _), total in oracle.items()})

    def dag() -> DAG:
        d = DAG()
        src = d.new_vertex(
            "kafka",
            sources.kafka(
                topic,
                {"bootstrap.servers": kafka.bootstrap},
                projection=parse,
                timestamp_fn=ts_of,
                policy=lag,
            ),
        ).local_parallelism(2)
        real = d.new_vertex("real", P.filter(lambda r: r["user"] != "end"))
        win = d.new_vertex(
            "window",
            P.aggregate_to_sliding_window(
                key_fn=user_of,
                timestamp_fn=ts_of,
                window_def=tumbling_window_def(1000),
                agg_op=summing(amount_of),
            ),
        )
        out = d.new_vertex("out", sinks.list_sink("windows")).local_parallelism(1)
        d.edge(Edge.between(src, real))
        d.edge(Edge.between(real, win).distributed().partitioned(user_of))
        d.edge(Edge.between(win, out).distributed())
        return d

    want = sum(expected.values())
    results: list[Counter[tuple[str, int, int]]] = []
    for processes in (2, 1):
        out = run_until(dag(), processes, "windows", lambda o: len(o) >= want)
        results.append(Counter((w.key, w.start, w.value) for w in out))
    assert results[0] == results[1] == expected


def test_a_kafka_sink_on_two_members_writes_every_item_once(kafka: Any) -> None:
    items = list(range(6000))
    got = []
    for processes in (2, 1):
        topic = unique("procsink")
        kafka.create_topic(topic, PARTITIONS)
        d = DAG()
        src = d.new_vertex("items", sources.items(items))
        out = d.new_vertex(
            "kafka", sinks.kafka(topic, {"bootstrap.servers": kafka.bootstrap}, value_fn=str)
        ).local_parallelism(2)
        d.edge(Edge.between(src, out))
        ss.local(processes=processes).new_job(d, JobConfig(name=unique("ksink"))).join(GUARD_S)
        got.append(sorted(int(v) for v in read_topic(kafka.bootstrap, topic, len(items))))
    assert got[0] == got[1] == items


# -- SQL -------------------------------------------------------------------------------


def table(dsn: str, columns: str = "k int, v text") -> str:
    name = unique("proct")
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(f"CREATE TABLE {name} ({columns})")
    return name


def rows(dsn: str, sql: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as c:
        return [tuple(r) for r in c.execute(sql).fetchall()]


def connect(dsn: str) -> Callable[[], Any]:
    return lambda: psycopg.connect(dsn)


def with_pid(row: tuple[Any, ...]) -> tuple[Any, ...]:
    return (*row, os.getpid())


@pytest.mark.parametrize("split_by", ["k", None])
def test_a_sql_source_on_two_members_reads_every_row_once(
    postgres: Any, split_by: str | None
) -> None:
    """With ``split_by`` the 4 processors of both members each read their hash share of
    the rows; without it processor 0 (on member 0) reads them all. Each row is tagged
    with the pid of the process that read it (a map behind a member-local edge)."""
    t = table(postgres.dsn)
    with psycopg.connect(postgres.dsn, autocommit=True) as c:
        c.execute(f"INSERT INTO {t} SELECT i, 'v' || i FROM generate_series(1, 8000) i")

    def dag() -> DAG:
        d = DAG()
        src = d.new_vertex(
            "rows",
            sources.sql(
                connect(postgres.dsn), f"SELECT k, v FROM {t} WHERE k > %s", (5,), split_by=split_by
            ),
        ).local_parallelism(2)
        tag = d.new_vertex("tag", P.map(with_pid))
        out = d.new_vertex("out", sinks.list_sink("rows")).local_parallelism(1)
        d.edge(Edge.between(src, tag))
        d.edge(Edge.between(tag, out).distributed())
        return d

    outputs = []
    readers = []
    for processes in (2, 1):
        engine = ss.local(processes=processes)
        engine.new_job(dag(), JobConfig(name=unique("sqlsrc"))).join(GUARD_S)
        got = engine.get_list("rows")
        outputs.append(sorted((k, v) for k, v, _ in got))
        readers.append(Counter(pid for _, _, pid in got))
    assert outputs[0] == outputs[1] == [(i, f"v{i}") for i in range(6, 8001)]
    # processes=2: both members read a share with split_by, member 0 alone without;
    # never the coordinator
    assert os.getpid() not in readers[0]
    assert len(readers[0]) == (2 if split_by else 1)


def test_a_sql_sink_on_two_members_writes_every_row_once(postgres: Any) -> None:
    items = [(i, f"x{i}") for i in range(6000)]
    written = []
    for processes in (2, 1):
        t = table(postgres.dsn)
        d = DAG()
        src = d.new_vertex("items", sources.items(items))
        out = d.new_vertex(
            "db", sinks.sql(connect(postgres.dsn), f"INSERT INTO {t} (k, v) VALUES (%s, %s)")
        ).local_parallelism(2)
        d.edge(Edge.between(src, out).distributed())
        ss.local(processes=processes).new_job(d, JobConfig(name=unique("sqlsink"))).join(GUARD_S)
        written.append(rows(postgres.dsn, f"SELECT k, v FROM {t} ORDER BY k"))
    assert written[0] == written[1] == items


def as_row(message: Any) -> tuple[int, str]:
    v = int(message.value())
    return v, f"p{message.partition()}"


def test_a_pipeline_from_kafka_into_postgresql_on_two_members(kafka: Any, postgres: Any) -> None:
    """Both connectors in one Pipeline job: each member reads its partitions, maps, and
    its sink processors write their rows; the table ends as with one process and as the
    oracle says (read until every row is there, then cancelled)."""
    topic = unique("procpipe")
    kafka.create_topic(topic, PARTITIONS)
    n = 3000
    produce(kafka.bootstrap, topic, [(i % PARTITIONS, str(i).encode(), None) for i in range(n)])
    oracle = sorted((i * 3, f"p{i % PARTITIONS}") for i in range(n))
    written = []
    for processes in (2, 1):
        t = table(postgres.dsn)
        p = ss.Pipeline()
        (
            p.read_from(
                sources.kafka(topic, {"bootstrap.servers": kafka.bootstrap}, projection=as_row)
            )
            .map(lambda r: (r[0] * 3, r[1]))
            .write_to(sinks.sql(connect(postgres.dsn), f"INSERT INTO {t} (k, v) VALUES (%s, %s)"))
        )
        job = ss.local(processes=processes).new_job(p, JobConfig(name=unique("pipe")))
        count = f"SELECT count(*) FROM {t}"
        wait_for(lambda: rows(postgres.dsn, count)[0][0] >= n, f"{n} rows in {t}")  # noqa: B023
        job.cancel()
        with pytest.raises(JobCancelledError):
            job.join(timeout=GUARD_S)
        written.append(rows(postgres.dsn, f"SELECT k, v FROM {t} ORDER BY k"))
    assert written[0] == written[1] == oracle


def kill_a_member(job: Any, seed: int, n: int, guard: str | None = None) -> None:
    """SIGKILL a random member after a random number (1-4) of committed snapshots (or
    two thirds of the ``n`` items emitted) and a random moment within the next few (the
    job must still run). With ``guard`` (a file
    the sink processors lock while they write a transaction) the kill waits until no
    transaction is being written."""
    rnd = random.Random(seed)
    committed = rnd.randint(1, 4)
    wait_for(kill_point(job, committed, "gen", n), f"{committed} snapshots")
    time.sleep(rnd.random() * 0.2)
    assert job.status is ss.JobStatus.RUNNING, "the job ended before the kill"
    victim = job._execution._procs[rnd.randrange(2)].pid
    if guard is None:
        os.kill(victim, signal.SIGKILL)
        return
    with open(guard, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        os.kill(victim, signal.SIGKILL)  # its lock, if it waited for one, dies with it


def generated(n: int, sink: Any) -> DAG:
    """``n`` items ``(s, "x<s>")`` at 3,000 a second into ``sink`` (2 processors per
    member), partitioned by ``s`` across the members."""
    d = DAG()
    src = d.new_vertex("gen", sources.generator(pair, 3000, max_items=n))
    src.local_parallelism(1)
    out = d.new_vertex("out", sink).local_parallelism(2)
    d.edge(Edge.between(src, out).distributed().partitioned(first))
    return d


def pair(s: int) -> tuple[int, str]:
    return s, f"x{s}"


def first(kv: tuple[int, str]) -> int:
    return kv[0]


def eo_config(name: str) -> JobConfig:
    return JobConfig(
        name=name,
        processing_guarantee=ss.ProcessingGuarantee.EXACTLY_ONCE,
        snapshot_interval_ms=30,
        restart_delay_ms=10,
    )


@pytest.mark.slow
@pytest.mark.timeout(GUARD_S * 2)
@pytest.mark.parametrize("seed", kill_seeds([1]))
def test_an_exactly_once_sql_sink_on_two_members_survives_a_member_killed(
    postgres: Any, seed: int
) -> None:
    """Exactly-once into PostgreSQL with processes=2: each member's sink processors
    prepare a transaction per snapshot and commit it when the coordinator says the
    snapshot committed; a member SIGKILLed at a random moment (after snapshots
    committed) restarts the job from its last snapshot with fresh members, and the table
    holds every row once (prepared transactions of the dead member committed or rolled
    back by the restore, none left behind)."""
    n = 6000
    t = table(postgres.dsn)
    sink = sinks.sql(connect(postgres.dsn), f"INSERT INTO {t} (k, v) VALUES (%s, %s)")
    cfg = eo_config(unique("sqleo"))
    job = ss.local(processes=2).new_job(generated(n, sink), cfg)
    kill_a_member(job, seed, n)
    job.join(timeout=GUARD_S)
    assert job.restarts == 1
    assert rows(postgres.dsn, f"SELECT k, v FROM {t} ORDER BY k") == [(i, f"x{i}") for i in range(n)]
    prefix = transaction_prefix(cfg.name or "", "out")
    with psycopg.connect(postgres.dsn) as c:
        left = c.execute("SELECT gid FROM pg_prepared_xacts WHERE gid LIKE %s", (prefix + "%",))
        assert left.fetchall() == []


def as_text(kv: tuple[int, str]) -> str:
    return str(kv[0])


class GuardedKafkaSinkP(KafkaSinkP):
    """The Kafka sink, holding an exclusive lock on the file ``guard`` while it writes
    a transaction (in the member processes): the test's kill takes the lock first."""

    def __init__(self, guard: str, *args: Any) -> None:
        super().__init__(*args)
        self._guard = guard

    def _write_transaction(self, *args: Any) -> None:
        with open(self._guard, "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            super()._write_transaction(*args)


@pytest.mark.slow
@pytest.mark.timeout(GUARD_S * 2)
@pytest.mark.parametrize("seed", kill_seeds([2]))
def test_an_exactly_once_kafka_sink_on_two_members_survives_a_member_killed(
    kafka: Any, tmp_path: Any, seed: int
) -> None:
    """Exactly-once into Kafka with processes=2: each member's sink processors hold a
    snapshot's records and write them in one transaction when the coordinator says the
    snapshot committed; a member SIGKILLed at a random moment restarts the job from its
    last snapshot with fresh members, which write again the transactions whose commit
    the dead member's marker does not show. The topic holds every record once.

    The local broker (Tansu) shows the records of a transaction that never committed
    and does not fence the dead producer (see test_kafka_exactly_once): a kill in the
    middle of a transaction (its records flushed, its commit not) shows them twice
    after the restore writes them again (1 of 20 seeds here without the guard). So the
    kill waits while a member writes a transaction (``GuardedKafkaSinkP``); the case of
    a kill mid-transaction is test_kafka_exactly_once's, on an Apache Kafka."""
    n = 6000
    topic = unique("prockill")
    kafka.create_topic(topic, PARTITIONS)
    guard = str(tmp_path / "transaction.lock")
    conf = {"bootstrap.servers": kafka.bootstrap}
    sink = functools.partial(GuardedKafkaSinkP, guard, topic, conf, None, as_text)
    job = ss.local(processes=2).new_job(generated(n, sink), eo_config(unique("kafkaeo")))
    kill_a_member(job, seed, n, guard)
    job.join(timeout=GUARD_S)
    assert job.restarts == 1
    values = sorted(int(v) for v in read_topic(kafka.bootstrap, topic, n))
    dups = sorted(v for v, c in Counter(values).items() if c > 1)
    assert not dups, f"{len(values) - len(set(values))} duplicates: {runs(dups)}"
    assert values == list(range(n)), f"{n - len(set(values))} records lost"


def runs(values: list[int]) -> str:
    """``values`` (sorted) as ranges ``a-b``, for a failure's message."""
    out: list[list[int]] = []
    for v in values:
        if out and v == out[-1][1] + 1:
            out[-1][1] = v
        else:
            out.append([v, v])
    return ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in out)
