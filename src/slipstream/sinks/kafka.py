"""Kafka sink (``sinks.kafka``), on confluent-kafka.

Each item becomes one record of ``topic``: the value is ``value_fn(item)`` (default: the
item itself), the key ``key_fn(item)`` (default: none); a ``str`` is sent as UTF-8, bytes
as they are, ``None`` as a null. Anything else fails the job with an error naming the item.

Guarantees:

* no snapshots: records are sent as they come and flushed when the input completes;
* at-least-once: records are sent as they come; before a snapshot completes, every
  record sent so far is flushed and acknowledged. A delivery error fails the job: nothing
  is dropped silently;
* exactly-once: **deferred transactions**. A processor holds the records of one snapshot
  interval and saves them in the snapshot. When that snapshot has committed (it is durable
  in the store), the processor writes them in one Kafka transaction
  (``snapshot_commit_finish``, on its own thread: the sink is non-cooperative, as a
  transaction waits for the broker), together with a
  *marker*: the snapshot id committed as the offset of the consumer group
  ``<prefix>-<lineage>-<index>`` (``send_offsets_to_transaction``), so the marker commits
  if and only if the records do. A restore reads the marker of every processor of the
  restored snapshot: if the snapshot's transaction did not commit (the process died
  between the snapshot's commit and the transaction's), its records are written again
  from the snapshot, under the same ``transactional.id``, whose ``init_transactions``
  first fences off and aborts what the dead producer left open. Nothing reaches the broker
  before its snapshot is durable, so a failure before that leaves nothing to undo.

  The price: one snapshot interval of output is held in memory and stored in the
  snapshot, and output appears one snapshot interval late (as with every transactional
  sink). ``transactional.id`` values are ``<prefix>-<lineage>-<processor index>``: a
  fresh execution picks a new lineage, a restored one keeps its snapshot's lineage. A
  transaction left open by a process killed mid-commit keeps ``read_committed``
  consumers waiting until it is fenced by the restore (same lineage) or until the
  broker's ``transaction.timeout.ms`` aborts it.

On Spark (a streaming job's epochs, ``JobConfig(processing_guarantee=EXACTLY_ONCE)``)
the same transactions are tied to the epoch's commit: no ``snapshot_commit_finish``
comes there, so a processor files its held records under the snapshot the epoch commits
(``Context.epoch_commit_id``) and the run that restores that snapshot writes them
(``finish_snapshot_restore``), the marker telling a replayed epoch what is written
already. The last run of a micro-batch job commits no snapshot: it writes its last
output itself, under :data:`FINAL_MARKER` (docs/spark.md, "Kafka on Spark").
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

try:
    import fcntl
except ImportError:  # not POSIX: a vertex's transactions take turns within a process only
    fcntl = None  # type: ignore[assignment]

from slipstream.core.commit import AT_COMPLETION, PreparedCommits
from slipstream.core.config import ProcessingGuarantee
from slipstream.core.errors import SinkCommitError, SnapshotStoreRolledBackError
from slipstream.core.files import user_temp_dir
from slipstream.core.inbox import Inbox
from slipstream.core.items import Watermark
from slipstream.core.processor import AbstractProcessor, Context
from slipstream.core.retry import CommitRetry, transient_connection_error
from slipstream.core.validation import check_callable
from slipstream.state.keys import BroadcastKey, tagged_broadcast_name

__all__ = ["kafka", "KafkaSinkP", "transactional_prefix", "FINAL_MARKER"]

#: Marker of the transaction a processor writes when its input completes.
FINAL_MARKER = 1 << 62
#: Seconds one transactional call may take (at most what is left of the outage budget).
TXN_TIMEOUT_S = 10.0
#: librdkafka's default ``transaction.timeout.ms``; see :meth:`KafkaSinkP._txn_config`.
DEFAULT_TXN_TIMEOUT_MS = 60_000
#: The brokers' default ``transaction.max.timeout.ms``: a longer transaction timeout is
#: refused by ``init_transactions``.
BROKER_MAX_TXN_TIMEOUT_MS = 900_000

log = logging.getLogger("slipstream.sinks")

_SAFE = re.compile(r"[^A-Za-z0-9_.-]")

# The processors of one sink vertex of a job write their transactions one at a time on
# a machine: threads of a process take a lock, processes (a Spark commit step's tasks,
# each in its own Python worker; member processes) a file lock on top (one of
# TURN_SLOTS, chosen by the vertex's hash).
# Overlapping transactions on one partition are valid Kafka, but the Kafka-compatible
# broker the tests run (Tansu) can keep a committed transaction that overlapped another
# invisible to read_committed consumers until a later transaction comes: for good after
# a job's last one (1 run in 40 here when they overlapped, 0 in 40 without; a Structured
# Streaming job's last epoch, written by two commit tasks at once, 1 in 40).
_TXN_LOCKS: dict[str, threading.Lock] = {}
_TXN_LOCKS_LOCK = threading.Lock()
#: How long a transaction waits for another process's transaction of its vertex before
#: it is written anyway (overlap is valid Kafka: a process stopped while it holds the
#: lock must not stop the others' commits)
MACHINE_TURN_WAIT_S = 30.0
#: How many lock files the machine's sink vertices share (a vertex's is chosen by a hash
#: of its transactional-id prefix): a fixed set, so that the files do not pile up with
#: every job run; two vertices that share one take turns, which costs only a short wait
TURN_SLOTS = 64


@contextlib.contextmanager
def _txn_lock(prefix: str) -> Iterator[None]:
    """The turn of one transaction of sink vertex ``prefix`` (see above)."""
    with _TXN_LOCKS_LOCK:
        lock = _TXN_LOCKS.get(prefix)
        if lock is None:
            lock = _TXN_LOCKS[prefix] = threading.Lock()
    with lock:
        fd = _machine_turn(prefix)
        try:
            yield
        finally:
            if fd is not None:
                os.close(fd)  # releases the file lock


def _machine_turn(prefix: str) -> int | None:
    """The file lock of sink vertex ``prefix`` among this machine's processes (an open
    descriptor holding it), or ``None``: no file lock here, or still held by another
    process after :data:`MACHINE_TURN_WAIT_S` (polled: a blocked ``flock`` cannot be
    given up)."""
    if fcntl is None:
        return None
    slot = int.from_bytes(hashlib.sha256(prefix.encode()).digest()[:4], "big") % TURN_SLOTS
    try:
        directory = user_temp_dir("kafka-txn")  # 0700, owner checked
        fd = os.open(directory / f"{slot}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError:
        log.debug("no file lock for the transactions of %s", prefix, exc_info=True)
        return None
    deadline = time.monotonic() + MACHINE_TURN_WAIT_S
    pause = 0.001
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() > deadline:
                os.close(fd)
                log.warning(
                    "the transactions of %s: another process held their lock for %.0f s; "
                    "writing this one anyway",
                    prefix,
                    MACHINE_TURN_WAIT_S,
                )
                return None
            time.sleep(pause)
            pause = min(pause * 2, 0.01)
        except OSError:
            os.close(fd)
            log.debug("no file lock for the transactions of %s", prefix, exc_info=True)
            return None


def transactional_prefix(job_name: str, vertex_name: str) -> str:
    """Start of the ``transactional.id`` and marker group of one sink vertex of one job."""
    digest = hashlib.sha256(f"{job_name}\0{vertex_name}".encode()).hexdigest()[:10]
    return f"slipstream-{_SAFE.sub('_', job_name)[:40]}-{_SAFE.sub('_', vertex_name)[:40]}-{digest}"


def _encode(value: Any, what: str, item: Any, vertex: str) -> bytes | None:
    if value is None or type(value) is bytes:
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise TypeError(
        f"vertex {vertex!r}: a Kafka record {what} must be bytes, str or None, got "
        f"{type(value).__name__} for item {item!r} (give the sink a {what}_fn)"
    )


class KafkaSinkP(AbstractProcessor):
    """Writes items to ``topic``; see the module doc."""

    snapshot_tag = "kafka-txn"
    metric_names = ("commit_retries",)  # failed attempts to reach the server

    def __init__(
        self,
        topic: str,
        config: dict[str, Any],
        key_fn: Callable[[Any], Any] | None,
        value_fn: Callable[[Any], Any] | None,
    ) -> None:
        self._topic = topic
        self._config = config
        self._key_fn = key_fn
        self._value_fn = value_fn
        self._producer: Any = None
        self._error: str | None = None
        self._exactly_once = False
        self._held: list[tuple[bytes | None, bytes | None]] = []
        self._lineage = ""
        self._txn_producers: dict[int, Any] = {}
        self._restored: list[tuple[int, str, int, list[Any]]] = []
        # (marker, records) of transactions staged but not written yet: every snapshot
        # names all of them (a snapshot whose write failed leaves its transaction to the
        # next one's commit, and a restore from that one must write it too)
        self._prepared: PreparedCommits[tuple[int, list[Any]]] = PreparedCommits()
        self._entries: Any = None  # the snapshot entries being offered (resumable)
        # per processor index: where its transaction stopped after a failed attempt
        # (None: no transaction open; "abort": abort it before writing again; "commit":
        # its commit was asked for, ask again)
        self._txn_step: dict[int, str | None] = {}
        self._retry: CommitRetry | None = None
        self._rollback_checked = False
        self._txn_timeout_ms = DEFAULT_TXN_TIMEOUT_MS

    def is_cooperative(self) -> bool:
        # exactly-once: a transaction (snapshot_commit_finish) waits for the broker
        return False

    def init_processor(self, context: Context) -> None:
        self._exactly_once = context.processing_guarantee is ProcessingGuarantee.EXACTLY_ONCE and (
            context.commits_snapshots or context.epoch_commit_id > 0
        )
        self._prefix = transactional_prefix(context.job_name, context.vertex_name)
        self._lineage = uuid.uuid4().hex[:12]  # replaced by the snapshot's on restore
        self._retry = CommitRetry(
            context, "the Kafka transaction", f"Kafka at {self._config['bootstrap.servers']}",
            _transient_kafka_error,
        )
        if self._exactly_once:
            self._txn_timeout_ms = self._check_txn_timeout()
        else:
            from confluent_kafka import Producer

            # delivery reports only for failures: no Python callback per record
            self._producer = Producer(
                {
                    "delivery.report.only.error": True,
                    **self._config,
                    "on_delivery": self._on_delivery,
                }
            )

    def try_process_watermark(self, watermark: Watermark) -> bool:
        return True

    # -- records -----------------------------------------------------------------------
    def _record(self, item: Any) -> tuple[bytes | None, bytes | None]:
        vertex = self.context.vertex_name
        key_fn, value_fn = self._key_fn, self._value_fn
        key = None if key_fn is None else _encode(key_fn(item), "key", item, vertex)
        return key, _encode(item if value_fn is None else value_fn(item), "value", item, vertex)

    def process(self, ordinal: int, inbox: Inbox) -> None:
        self._check_delivery()
        record = self._record
        if self._exactly_once:
            self._held.extend(map(record, inbox))
            inbox.clear()
            return
        producer = self._producer
        produce, topic = producer.produce, self._topic
        value_fn = self._value_fn
        done = 0
        try:
            if self._key_fn is None and value_fn is None:
                for item in inbox:  # the common case: items that are bytes already
                    produce(topic, item if type(item) is bytes else record(item)[1])
                    done += 1
            elif self._key_fn is None and value_fn is not None:
                # values only (e.g. value_fn=json.dumps): str and bytes here, the rest
                # through _encode (its errors name the item)
                vertex = self.context.vertex_name
                for item in inbox:
                    value = value_fn(item)
                    if type(value) is str:
                        value = value.encode()
                    elif type(value) is not bytes:
                        value = _encode(value, "value", item, vertex)
                    produce(topic, value)
                    done += 1
            else:
                for item in inbox:
                    key, value = record(item)
                    produce(topic, value, key)
                    done += 1
        except BufferError:  # the client's queue is full: the rest waits in the inbox
            for _ in range(done):
                inbox.popleft()
        else:
            inbox.clear()
        producer.poll(0)

    def _produce(
        self, producer: Any, records: list[tuple[bytes | None, bytes | None]], deadline: float
    ) -> None:
        """Produce all ``records`` into the open transaction (waiting while the client's
        queue is full, until ``deadline``: then ``TimeoutError``). A record that cannot
        be delivered fails the transaction's commit."""
        topic = self._topic
        for key, value in records:
            while True:
                try:
                    producer.produce(topic, value=value, key=key)
                    break
                except BufferError:  # the client's queue is full: let it drain
                    if time.monotonic() > deadline:
                        raise TimeoutError(
                            f"the Kafka client's queue stayed full (records to topic "
                            f"{topic!r} not sent to {self._config['bootstrap.servers']})"
                        ) from None
                    producer.poll(0.05)

    def _on_delivery(self, error: Any, message: Any) -> None:
        if error is not None and self._error is None:
            self._error = (
                f"vertex {self.context.vertex_name!r}: a record to Kafka topic "
                f"{self._topic!r} was not delivered: {error}"
            )

    def _check_delivery(self) -> None:
        if self._error is not None:
            raise RuntimeError(self._error)

    def _flushed(self) -> bool:
        """Whether every record sent so far is acknowledged (polled, never blocks)."""
        self._check_delivery()
        if self._producer.flush(0) > 0:
            return False
        self._check_delivery()
        return True

    # -- snapshots and transactions -------------------------------------------------------
    def save_to_snapshot(self) -> bool:
        ctx = self.context
        if not self._exactly_once:
            return self._flushed()  # at-least-once: acknowledged before the snapshot completes
        if self._entries is None:
            records, self._held = self._held, []
            # a Spark epoch's barrier is always 1: its snapshot's id is epoch_commit_id
            sid = ctx.epoch_commit_id or ctx.current_snapshot_id
            if records:
                self._prepared.add(sid, (sid, records))
            self._entries = self._outstanding_entries(sid)
        return self._emit_entries()

    def _outstanding_entries(self, marker: int) -> Any:
        """Snapshot entries, one per transaction not written yet; at least one (an empty
        one under ``marker``), so a restore fences."""
        key = BroadcastKey((self.snapshot_tag, self.context.global_processor_index))
        pending = self._prepared.items() or [(marker, [])]
        return iter([(key, (self._lineage, m, r)) for m, r in pending])

    def _emit_entries(self) -> bool:
        if not self.emit_to_snapshot_from(self._entries):
            return False
        self._entries = None
        return True

    def complete(self) -> bool:
        if not self._exactly_once:
            return self._flushed()
        if self._entries is not None:  # completion state not offered in full yet
            return self._emit_entries()
        if self.context.epoch_final:
            return self._write_final()
        records, self._held = self._held, []
        if records:
            self._prepared.add(AT_COMPLETION, (FINAL_MARKER, records))
        if self._prepared:
            # completion state: a restore from a snapshot recording this processor's
            # completion writes what is not written yet (the markers show what is)
            self._entries = self._outstanding_entries(FINAL_MARKER)
            return self._emit_entries()
        return True

    @property
    def epoch_output_pending(self) -> bool:
        """A Spark epoch's run: whether records wait in this epoch's saved state for
        the driver's commit (:mod:`slipstream.spark.epoch_commit` writes them then)."""
        ctx = getattr(self, "context", None)
        return self._exactly_once and ctx is not None and ctx.epoch_commit_id > 0 and any(
            records for _marker, records in self._prepared.items()
        )

    def _write_final(self) -> bool:
        """The last run of a Spark micro-batch job commits no snapshot that could hold
        this processor's last output: it is written here, in one transaction under
        :data:`FINAL_MARKER`, unless that marker shows it was (the run replayed)."""
        if self._held:
            self._prepared.add(AT_COMPLETION, (FINAL_MARKER, self._held))
            self._held = []
        due = self._prepared.entries()
        if not due:
            return True
        lineage, index = self._lineage, self.context.global_processor_index

        def write() -> None:
            _sid, (marker, records) = due[0]
            if self._committed_marker(lineage, index) < marker:
                self._write_transaction(lineage, index, marker, records)

        if not self._attempt(write, "its last output's transaction"):
            return False
        self._prepared.remove(due[0][1])
        return False  # called again: nothing left then

    def _marker_group(self, lineage: str, index: int) -> str:
        return f"{self._prefix}-{lineage}-{index}"

    def _check_txn_timeout(self) -> int:
        """The producers' ``transaction.timeout.ms``. A transaction is open only while it
        is written, but through an outage it stays open for as long as its commit is
        retried (``sink_outage_timeout``): if the broker aborts it first, the job fails
        (the records come again from the snapshot after a restart) instead of riding the
        outage out. Unset, it is raised to cover the snapshot interval plus the outage
        budget (at most the brokers' default cap); set lower, a WARNING says which
        setting to change."""
        ctx = self.context
        need = int(ctx.snapshot_interval_ms + ctx.sink_outage_timeout * 1000)
        given = self._config.get("transaction.timeout.ms")
        if given is None:
            return max(DEFAULT_TXN_TIMEOUT_MS, min(need, BROKER_MAX_TXN_TIMEOUT_MS))
        value = int(given)
        if value < need:
            log.warning(
                "vertex %r: the Kafka producer's transaction.timeout.ms (%d) is shorter than "
                "snapshot_interval_ms (%d) + sink_outage_timeout (%g s): a transaction whose "
                "commit is retried through an outage that long is aborted by the broker and "
                "the job fails instead of riding it out. Set transaction.timeout.ms >= %d in "
                "the sink's config (brokers cap it at transaction.max.timeout.ms, %d by "
                "default) or lower JobConfig.sink_outage_timeout",
                ctx.vertex_name,
                value,
                ctx.snapshot_interval_ms,
                ctx.sink_outage_timeout,
                need,
                BROKER_MAX_TXN_TIMEOUT_MS,
            )
        return value

    def _call_timeout(self) -> float:
        retry = self._retry
        assert retry is not None
        return min(TXN_TIMEOUT_S, max(2.0, retry.remaining_s()))

    def _attempt(self, fn: Callable[[], Any], what: str) -> bool:
        retry = self._retry
        assert retry is not None
        return retry.attempt(fn, what=what)

    def _txn_producer(self, lineage: str, index: int) -> Any:
        """The transactional producer of processor ``index`` (of this or a restored
        execution); ``init_transactions`` fences off an older one with the same id (and
        aborts what it left open)."""
        producer = self._txn_producers.get(index)
        if producer is None:
            from confluent_kafka import Producer

            producer = Producer(
                {
                    **self._config,
                    "transaction.timeout.ms": self._txn_timeout_ms,
                    "transactional.id": self._marker_group(lineage, index),
                }
            )
            timeout = self._call_timeout()
            _bounded(functools.partial(producer.init_transactions, timeout), timeout, "init_transactions")
            self._txn_producers[index] = producer
        return producer

    def snapshot_commit_finish(self, success: bool) -> bool:
        """Write the transactions whose snapshot committed, one per call (each retried
        through an outage, see :mod:`slipstream.core.retry`)."""
        if not success or not self._exactly_once:
            return True
        due = self._prepared.due(self.context)
        if not due:
            return True
        txn = due[0]
        marker, records = txn
        write = functools.partial(
            self._write_transaction,
            self._lineage,
            self.context.global_processor_index,
            marker,
            records,
        )
        if not self._attempt(write, f"the transaction of {_what(marker)}"):
            return False
        self._prepared.remove(txn)
        return len(due) == 1

    def _write_transaction(self, lineage: str, index: int, marker: int, records: list[Any]) -> None:
        """Write ``records`` and the marker in one transaction (once the snapshot
        committed, or on restore). After a failed attempt it goes on where that one
        stopped: a commit that was asked for is asked for again (never a new
        transaction over one that may have committed), a transaction that failed before
        its commit is aborted and written again whole (never an empty one). A fatal
        error (the producer was fenced, or the broker aborted the transaction when it
        outlived ``transaction.timeout.ms``) fails the job naming what was lost."""
        from confluent_kafka import Consumer, KafkaException, TopicPartition

        timeout = self._call_timeout()
        step = self._txn_step.get(index)
        try:
            if step is not None and index not in self._txn_producers:
                # the producer was dropped mid-transaction (a call that never
                # returned): a new one fences it and aborts what it left open;
                # a commit it may have made shows in the marker
                self._txn_producer(lineage, index)
                if step == "commit" and self._committed_marker(lineage, index) >= marker:
                    self._txn_step[index] = None
                    return
                self._txn_step[index] = step = None
            producer = self._txn_producer(lineage, index)
            # a transaction's turn (see _txn_lock) from its begin (or the abort of an
            # unfinished one) to its commit; the producer's init_transactions needs none
            with _txn_lock(self._prefix):
                if step == "abort":
                    _bounded(functools.partial(producer.abort_transaction, timeout), timeout, "abort_transaction")
                    self._txn_step[index] = step = None
                if step is None:
                    producer.begin_transaction()
                    self._txn_step[index] = "abort"  # until its commit is asked for
                    # the marker first: a broker cut off during this call leaves no record
                    # sent in a transaction that is then written again (the test broker
                    # shows the records of an aborted transaction)
                    group = Consumer({**self._config, "group.id": self._marker_group(lineage, index)})
                    try:
                        offsets = [TopicPartition(self._topic, 0, marker)]
                        metadata = group.consumer_group_metadata()
                        _bounded(
                            functools.partial(
                                producer.send_offsets_to_transaction, offsets, metadata, timeout
                            ),
                            timeout,
                            "send_offsets_to_transaction",
                        )
                    finally:
                        group.close()
                    self._produce(producer, records, time.monotonic() + timeout)
                    self._txn_step[index] = "commit"
                _bounded(functools.partial(producer.commit_transaction, timeout), timeout, "commit_transaction")
                self._txn_step[index] = None
        except CallTimeoutError:
            self._txn_producers.pop(index, None)  # abandoned to the call it is stuck in
            raise
        except KafkaException as e:
            err = e.args[0] if e.args else None
            if err is not None and err.fatal():
                self._txn_producers.pop(index, None)
                self._txn_step[index] = None
                raise self._lost(lineage, index, marker, records, err) from e
            if err is not None and err.txn_requires_abort():
                self._txn_step[index] = "abort"
            raise

    def _lost(self, lineage: str, index: int, marker: int, records: list[Any], err: Any) -> SinkCommitError:
        return SinkCommitError(
            f"the Kafka transaction of processor {index} with "
            f"{'its last output' if marker == FINAL_MARKER else f'the records of snapshot {marker}'}"
            f" ({len(records)} records for topic {self._topic!r}, transactional.id "
            f"{self._marker_group(lineage, index)!r}) was aborted by Kafka at "
            f"{self._config['bootstrap.servers']}: {err.str() if hasattr(err, 'str') else err}. "
            f"The producer was fenced (another producer took its transactional.id over) or "
            f"the transaction outlived transaction.timeout.ms ({self._txn_timeout_ms} ms); "
            f"none of those records is committed, and they are not written in a new "
            f"transaction here: a restart (or resume=True) writes them again from the last "
            f"committed snapshot"
        )

    def _committed_marker(self, lineage: str, index: int) -> int:
        from confluent_kafka import Consumer, TopicPartition

        group = Consumer(
            {
                **self._config,
                "group.id": self._marker_group(lineage, index),
                "isolation.level": "read_committed",
            }
        )
        try:
            (tp,) = group.committed([TopicPartition(self._topic, 0)], timeout=self._call_timeout())
            return int(tp.offset)  # negative when nothing was committed
        finally:
            group.close()

    def restore_from_snapshot_entry(self, key: Any, value: Any) -> None:
        name = tagged_broadcast_name(
            key, self.snapshot_tag, 2, self.context.vertex_name, "the Kafka sink"
        )
        lineage, sid, records = value
        self._restored.append((name[1], lineage, sid, records))

    def finish_snapshot_restore(self) -> bool:
        """Write again the transactions of the restored snapshot that did not commit;
        processor ``i`` handles old processors ``j`` with ``j % parallelism == i``
        (retried through an outage: each step is idempotent)."""
        if not self._exactly_once:
            self._restored = []
            return True
        return self._attempt(self._finish_restore_once, "restoring its transactions")

    def _finish_restore_once(self) -> None:
        ctx = self.context
        if not self._rollback_checked:
            if ctx.allow_rollback is not None:
                self._check_not_rolled_back()
            self._rollback_checked = True
        restored = self._restored
        while restored:
            entry = min(restored, key=lambda r: r[2])
            index, lineage, sid, records = entry
            self._lineage = lineage
            if index % ctx.total_parallelism == ctx.global_processor_index:
                if records and self._committed_marker(lineage, index) < sid:
                    self._write_transaction(lineage, index, sid, records)
                else:
                    self._txn_producer(lineage, index)  # fences what a dead producer left open
            restored.remove(entry)

    def _check_not_rolled_back(self) -> None:
        """A marker newer than every transaction of the restored snapshot means a newer
        snapshot committed its records: the snapshot store was rolled back (restored from
        a backup), and a replay would write those records again. Fails with
        :class:`SnapshotStoreRolledBackError` unless ``JobConfig(allow_rollback=True)``."""
        ctx = self.context
        newest: dict[int, tuple[str, int]] = {}
        for index, lineage, sid, _records in self._restored:
            if index % ctx.total_parallelism == ctx.global_processor_index:
                if sid > newest.get(index, ("", -1))[1]:
                    newest[index] = (lineage, sid)
        for index, (lineage, sid) in sorted(newest.items()):
            marker = self._committed_marker(lineage, index)
            if marker <= sid:
                continue
            what = (
                "the final transaction"
                if marker == FINAL_MARKER
                else f"the transaction of snapshot {marker}"
            )
            text = (
                f"vertex {ctx.vertex_name!r}: the snapshot store was rolled back: Kafka holds "
                f"{what} of processor {index} (committed offset of consumer group "
                f"{self._marker_group(lineage, index)!r}), newer than the snapshot the job "
                f"resumes from ({sid})"
            )
            if ctx.allow_rollback:
                ctx.logger.warning(
                    "%s; allow_rollback=True: the records after it are written to %r again",
                    text,
                    self._topic,
                )
                continue
            raise SnapshotStoreRolledBackError(
                f"{text}: resuming would write the records after it to topic {self._topic!r} "
                f"again. Put the store's newest snapshots back, or pass "
                f"JobConfig(allow_rollback=True) to accept that replay (duplicates downstream)."
            )

    def close(self) -> None:
        producers = list(self._txn_producers.values())
        self._txn_producers = {}
        if self._producer is not None:
            producers.append(self._producer)
            self._producer = None
        for producer in producers:
            producer.flush(5.0)


class CallTimeoutError(TimeoutError):
    """A Kafka client call did not return within its timeout (plus a grace)."""


#: What a Kafka client call may take beyond its own timeout before it is abandoned.
CALL_GRACE_S = 2.0


def _bounded(fn: Callable[[], Any], timeout: float, what: str) -> Any:
    """``fn()`` on a helper thread, abandoned with :class:`CallTimeoutError` if it has not
    returned ``CALL_GRACE_S`` after ``timeout``: some librdkafka calls
    (``send_offsets_to_transaction`` with the broker cut off, seen here) do not honour
    their timeout, and a sink must not hang its job."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            box["error"] = e

    t = threading.Thread(target=run, name="slipstream-kafka-call", daemon=True)
    t.start()
    t.join(timeout + CALL_GRACE_S)
    if t.is_alive():
        raise CallTimeoutError(f"{what} did not return within {timeout + CALL_GRACE_S:.0f} s")
    if "error" in box:
        raise box["error"]
    return box.get("result")


def _what(marker: int) -> str:
    return "the processor's last output" if marker == FINAL_MARKER else f"snapshot {marker}"


def _transient_kafka_error(error: BaseException) -> bool:
    """Whether a Kafka client error is worth a retry: a timeout, a lost broker, or an
    error librdkafka calls retriable or abortable (never a fatal one: a fenced producer,
    an expired transaction)."""
    if isinstance(error, (TimeoutError, BufferError)):
        return True
    err: Any = error.args[0] if error.args else None
    if hasattr(err, "fatal") and hasattr(err, "retriable"):
        if err.fatal():
            return False
        if err.retriable() or err.txn_requires_abort():
            return True
        from confluent_kafka import KafkaError

        return err.code() in (
            KafkaError._TIMED_OUT,
            KafkaError._TRANSPORT,
            KafkaError._ALL_BROKERS_DOWN,
            KafkaError._MSG_TIMED_OUT,
            KafkaError._RESOLVE,
            KafkaError.REQUEST_TIMED_OUT,
            KafkaError.COORDINATOR_NOT_AVAILABLE,
            KafkaError.NOT_COORDINATOR,
            KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        )
    return transient_connection_error(error)


def kafka(
    topic: str,
    config: dict[str, Any],
    *,
    key_fn: Callable[[Any], Any] | None = None,
    value_fn: Callable[[Any], Any] | None = None,
) -> functools.partial[KafkaSinkP]:
    """Writes each item as a record of ``topic`` with a confluent-kafka producer
    configured by ``config`` (at least ``bootstrap.servers``); transactional under
    exactly-once. See the module doc."""
    if not isinstance(topic, str) or not topic:
        raise TypeError(f"kafka(): 'topic' must be a non-empty str, got {topic!r}")
    if not isinstance(config, dict) or "bootstrap.servers" not in config:
        raise TypeError("kafka(): 'config' must be a dict with at least 'bootstrap.servers'")
    check_callable(key_fn, "key_fn", "kafka", optional=True)
    check_callable(value_fn, "value_fn", "kafka", optional=True)
    return functools.partial(KafkaSinkP, topic, dict(config), key_fn, value_fn)
