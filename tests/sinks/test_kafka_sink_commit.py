"""The Kafka sink's transactions under broker errors, against a scripted client (the
local test broker neither fences producers nor expires transactions): a retriable
commit error is retried on the same transaction, an abortable one aborts and writes the
transaction again whole, a fatal one (fenced producer, expired transaction) fails the
job naming what was lost, and no empty transaction is ever committed in its place. The
producers' transaction.timeout.ms is checked against the outage budget at start."""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
import uuid
from typing import Any

import confluent_kafka
import pytest
from confluent_kafka import KafkaError, KafkaException

import slipstream as ss
from slipstream import DAG, Edge, JobConfig, ProcessingGuarantee, sinks, sources

EO = ProcessingGuarantee.EXACTLY_ONCE


class Script:
    """What the scripted clients do: errors to raise from ``commit_transaction`` (one
    per call, then success), and a log of every call."""

    def __init__(self, commit_errors: list[KafkaError] | None = None) -> None:
        self.commit_errors = list(commit_errors or [])
        self.calls: list[tuple[Any, ...]] = []
        self.configs: list[dict[str, Any]] = []
        self.committed: list[list[bytes]] = []  # the records of each committed transaction
        self.marker = -1001


SCRIPT = Script()


class FakeProducer:
    def __init__(self, config: dict[str, Any]) -> None:
        SCRIPT.configs.append(dict(config))
        self.open: list[bytes] | None = None

    def init_transactions(self, timeout: float) -> None:
        SCRIPT.calls.append(("init",))

    def begin_transaction(self) -> None:
        SCRIPT.calls.append(("begin",))
        self.open = []

    def produce(self, topic: str, value: bytes | None = None, key: bytes | None = None, **kw: Any) -> None:
        assert self.open is not None
        self.open.append(value or b"")

    def poll(self, timeout: float = 0) -> int:
        return 0

    def flush(self, timeout: float = 0) -> int:
        return 0

    def send_offsets_to_transaction(self, offsets: Any, metadata: Any, timeout: float) -> None:
        SCRIPT.calls.append(("offsets", offsets[0].offset))
        self.offset = offsets[0].offset

    def commit_transaction(self, timeout: float) -> None:
        assert self.open is not None
        SCRIPT.calls.append(("commit", len(self.open)))
        if SCRIPT.commit_errors:
            raise KafkaException(SCRIPT.commit_errors.pop(0))
        SCRIPT.committed.append(self.open)
        SCRIPT.marker = self.offset
        self.open = None

    def abort_transaction(self, timeout: float) -> None:
        SCRIPT.calls.append(("abort",))
        self.open = None


class FakeConsumer:
    def __init__(self, config: dict[str, Any]) -> None:
        pass

    def consumer_group_metadata(self) -> Any:
        return object()

    def committed(self, partitions: Any, timeout: float) -> Any:
        tp = partitions[0]
        return [confluent_kafka.TopicPartition(tp.topic, tp.partition, SCRIPT.marker)]

    def close(self) -> None:
        pass


@pytest.fixture
def script(monkeypatch: pytest.MonkeyPatch) -> Any:
    def make(**kw: Any) -> Script:
        global SCRIPT
        SCRIPT = Script(**kw)
        return SCRIPT

    monkeypatch.setattr(confluent_kafka, "Producer", FakeProducer)
    monkeypatch.setattr(confluent_kafka, "Consumer", FakeConsumer)
    return make


def _job(tmp_path: Any, n: int = 50, **kafka_config: Any) -> Any:
    dag = DAG()
    src = dag.new_vertex("items", sources.items([str(i) for i in range(n)]))
    out = dag.new_vertex(
        "out", sinks.kafka("t", {"bootstrap.servers": "127.0.0.1:9", **kafka_config})
    ).local_parallelism(1)
    dag.edge(Edge.between(src, out))
    cfg = JobConfig(
        name="txn", processing_guarantee=EO, snapshot_store=str(tmp_path),
        snapshot_interval_ms=3_600_000, auto_restart=False, sink_outage_timeout=30,
    )
    return ss.local().new_job(dag, cfg)


def _records(s: Script) -> list[int]:
    return sorted(int(v) for txn in s.committed for v in txn)


def test_a_retriable_commit_error_commits_the_same_transaction_again(script: Any, tmp_path: Any) -> None:
    s = script(commit_errors=[KafkaError(KafkaError._TIMED_OUT, "commit timed out", retriable=True)])
    job = _job(tmp_path)
    job.join(60)
    assert _records(s) == list(range(50))
    # one transaction: its commit asked for twice, never begun again
    assert [c[0] for c in s.calls] == ["init", "begin", "offsets", "commit", "commit"]
    assert job.metrics["__job__"]["commit_retries"] == 1


def test_an_abortable_error_aborts_and_writes_the_whole_transaction_again(script: Any, tmp_path: Any) -> None:
    s = script(
        commit_errors=[
            KafkaError(KafkaError._MSG_TIMED_OUT, "a record was not delivered", txn_requires_abort=True)
        ]
    )
    _job(tmp_path).join(60)
    assert _records(s) == list(range(50))
    assert [c for c in s.calls if c[0] == "commit"] == [("commit", 50), ("commit", 50)]
    assert [c[0] for c in s.calls] == ["init", "begin", "offsets", "commit", "abort", "begin", "offsets", "commit"]


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (KafkaError._FENCED, "producer fenced by a newer instance"),
        (KafkaError.INVALID_PRODUCER_EPOCH, "transaction timed out on the broker"),
    ],
)
def test_a_fenced_or_expired_transaction_fails_the_job_naming_what_was_lost(
    script: Any, tmp_path: Any, code: int, reason: str
) -> None:
    s = script(commit_errors=[KafkaError(code, reason, fatal=True)])
    job = _job(tmp_path)
    with pytest.raises(ss.JobFailedError) as ei:
        job.join(60)
    text = str(ei.value).split("\n--- processor traceback ---")[0]
    tid = s.configs[0]["transactional.id"]
    assert text == (
        "job 'txn' failed: vertex 'out', processor 0: SinkCommitError: the Kafka transaction "
        "of processor 0 with its last output (50 records for topic 't', "
        f"transactional.id {tid!r}) was aborted by Kafka at 127.0.0.1:9: {reason}. The "
        "producer was fenced (another producer took its transactional.id over) or the "
        "transaction outlived transaction.timeout.ms (900000 ms); none of those records is "
        "committed, and they are not written in a new transaction here: a restart (or "
        "resume=True) writes them again from the last committed snapshot"
    ), text
    assert s.committed == []  # nothing committed, and no empty transaction either
    assert [c[0] for c in s.calls].count("begin") == 1


def test_transaction_timeout_covers_the_outage_budget(script: Any, tmp_path: Any, caplog: Any) -> None:
    s = script()
    _job(tmp_path).join(60)
    # unset: snapshot interval (an hour here) + sink_outage_timeout (30 s), at most the
    # brokers' default transaction.max.timeout.ms
    assert s.configs[0]["transaction.timeout.ms"] == 900_000
    caplog.set_level(logging.WARNING, logger="slipstream.sinks")
    s = script()
    _job(tmp_path / "b", **{"transaction.timeout.ms": 60_000}).join(60)
    assert s.configs[0]["transaction.timeout.ms"] == 60_000
    assert (
        "vertex 'out': the Kafka producer's transaction.timeout.ms (60000) is shorter than "
        "snapshot_interval_ms (3600000) + sink_outage_timeout (30 s): a transaction whose "
        "commit is retried through an outage that long is aborted by the broker and the job "
        "fails instead of riding it out. Set transaction.timeout.ms >= 3630000 in the "
        "sink's config (brokers cap it at transaction.max.timeout.ms, 900000 by default) or "
        "lower JobConfig.sink_outage_timeout"
    ) in caplog.text


def _hold_the_vertex_lock(prefix: str, flag: str, conn: Any) -> None:
    """In a child process: hold ``prefix``'s transaction lock, with ``flag`` present,
    until the parent says so."""
    from slipstream.sinks.kafka import _txn_lock

    with _txn_lock(prefix):
        open(flag, "w").close()
        conn.send("holding")
        conn.recv()
        os.remove(flag)


def test_a_sink_vertex_writes_one_transaction_at_a_time_across_processes(tmp_path: Any) -> None:
    """Two processes that write transactions of one sink vertex take turns, as threads of
    one process do: a Spark commit step runs each processor's transaction in its own
    Python worker, and so do member processes. Overlapping transactions on one partition
    are valid Kafka, but the test broker (Tansu) can keep the later ones invisible to
    read_committed consumers for good (test_structured_streaming_into_kafka_writes_the_
    last_batch lost its last epoch's 200 records 1 time in 40 that way). Here a child
    holds the lock; a thread of this process enters only once the child has left (the
    child's flag gone). With a per-process lock it entered at once, flag present."""
    from slipstream.sinks.kafka import _txn_lock

    prefix = f"test-turns-{uuid.uuid4().hex}"
    flag = str(tmp_path / "child-holds-the-lock")
    # forkserver, not fork: a child forked from this multi-threaded process could
    # inherit a lock another thread held at the fork
    ctx = multiprocessing.get_context("forkserver")
    parent, child_end = ctx.Pipe()
    child = ctx.Process(target=_hold_the_vertex_lock, args=(prefix, flag, child_end), daemon=True)
    child.start()
    try:
        assert parent.poll(120), "the child never took the lock"
        assert parent.recv() == "holding"
        seen: list[bool] = []
        entered = threading.Event()

        def enter() -> None:
            with _txn_lock(prefix):
                seen.append(os.path.exists(flag))
                entered.set()

        t = threading.Thread(target=enter)
        t.start()
        entered.wait(1.0)  # enough for a lock that does not wait to let the thread in
        parent.send("release")
        t.join(30)
        assert seen == [False]
    finally:
        child.join(30)
    assert child.exitcode == 0


def test_the_turn_lock_files_are_a_fixed_private_set(tmp_path: Any, monkeypatch: Any) -> None:
    """The cross-process turn's lock files live in the user's private temp directory
    (0700, owner checked) and are a fixed set shared by hash: the runs of many jobs (a
    prefix each) do not leave a file each behind."""
    import importlib
    import stat
    import tempfile

    kafka_sink = importlib.import_module("slipstream.sinks.kafka")

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    for i in range(300):
        fd = kafka_sink._machine_turn(f"slipstream-job{i}-sink-{i:010x}")
        assert fd is not None
        os.close(fd)
    directory = tmp_path / f"slipstream-{os.geteuid()}" / "kafka-txn"
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    files = sorted(p.name for p in directory.iterdir())
    assert 1 < len(files) <= kafka_sink.TURN_SLOTS
    assert all(name.endswith(".lock") for name in files)
