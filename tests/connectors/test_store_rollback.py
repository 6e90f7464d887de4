"""A rolled-back snapshot store never replays into PostgreSQL, Kafka or files silently
(issue 20, item 3: 200 duplicates in PostgreSQL and 200 in Kafka, no error).

Each scenario runs the job in its own processes, as a service would: a first run
publishes the first 100 items and stops (cancelled: its store is unfinished), the store
directory is copied (the backup), a resumed run publishes up to item 250 and stops, and
then the store is rolled back: the backup restored, or the newest snapshot file deleted
together with ``MANIFEST.json``. ``resume=True`` must then fail with
``SnapshotStoreRolledBackError`` naming the store and both snapshots, writing nothing;
with ``allow_rollback=True`` it resumes from the older snapshot and publishes the items
after it again, as documented (items 100-249 twice after the backup is restored).

With the store's generation file lost too (a whole machine restored), the Kafka and file
sinks still see the rollback in their own records (the committed marker, the published
part files) and fail the job the same way.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from collections import Counter
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from test_completion_commit import _discard, _rows_files, _rows_sql, _target

from slipstream.sinks.kafka import transactional_prefix
from slipstream.state import lineage as snapshot_lineage
from slipstream.state.store import MANIFEST, DirectorySnapshotStore

N = 400

SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    import slipstream as ss
    from slipstream import DAG, Edge, JobConfig, ProcessingGuarantee, sinks
    from slipstream.core.processor import AbstractProcessor
    from slipstream.state.keys import BroadcastKey
    from slipstream.state.store import DirectorySnapshotStore

    kind, target, store, stop, allow = sys.argv[1:6]
    stop = int(stop)

    class Numbers(AbstractProcessor):
        # (i, i*i) for i < stop; then idle (snapshots go on) until cancelled
        def init_processor(self, context):
            self.i = 0
        def complete(self):
            while self.i < stop:
                if not self.outbox.offer((self.i, self.i * self.i)):
                    return False
                self.i += 1
            return stop >= N_ITEMS
        def save_to_snapshot(self):
            return self.outbox.offer_to_snapshot(BroadcastKey("i"), self.i)
        def restore_from_snapshot_entry(self, key, value):
            self.i = value

    if kind == "sql":
        import psycopg
        sink = sinks.sql(lambda: psycopg.connect(target), "INSERT INTO t (k, v) VALUES (%s, %s)")
    elif kind == "files":
        sink = sinks.write_files(target, lambda kv: f"{kv[0]},{kv[1]}", roll_interval_ms=0)
    else:
        bootstrap, topic = target.split("/")
        sink = sinks.kafka(topic, {"bootstrap.servers": bootstrap},
                           value_fn=lambda kv: f"{kv[0]},{kv[1]}")

    dag = DAG()
    src = dag.new_vertex("numbers", Numbers).local_parallelism(1)
    out = dag.new_vertex("out", sink).local_parallelism(2)
    dag.edge(Edge.between(src, out).partitioned(lambda kv: kv[0]))
    cfg = JobConfig(name="rollback-" + kind, snapshot_interval_ms=30, snapshot_store=store,
                    processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE, resume=True,
                    allow_rollback=allow == "allow")
    job = ss.local().new_job(dag, cfg)
    if stop >= N_ITEMS:
        job.join(60)
        sys.exit(0)

    def offset(data):
        return data.vertices["numbers"].entries[0][0][1]

    # stop once two snapshots in a row hold offset `stop`: the first one's commit (which
    # published everything up to `stop`) ran before the second one was written
    reader = DirectorySnapshotStore(store)
    deadline = time.monotonic() + 60
    while True:
        ids = reader.committed_ids()
        if len(ids) >= 2 and all(offset(reader.read(i)) == stop for i in ids[-2:]):
            break
        assert time.monotonic() < deadline, "no two snapshots at the stop offset"
        time.sleep(0.02)
    job.cancel()
    try:
        job.join(60)
    except ss.JobCancelledError:
        pass
    """
).replace("N_ITEMS", str(N))


def _run(script: str, kind: str, target: str, store: str, stop: int, allow: bool = False) -> Any:
    return subprocess.run(
        [sys.executable, script, kind, target, store, str(stop), "allow" if allow else "-"],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _rows(kind: str, target: str, expect: int) -> list[tuple[int, int]]:
    if kind == "sql":
        rows, prepared = _rows_sql(target)
        assert prepared == []
        return rows
    if kind == "files":
        return _rows_files(target)
    from test_kafka import read_topic

    bootstrap, topic = target.split("/")
    # every writer has exited (each run is a finished subprocess), so every transaction
    # is committed before the read: a short quiet time after ``expect`` (1 s by default:
    # 3 s of each Kafka case)
    return [
        (int(k), int(v))
        for k, v in (
            r.decode().split(",") for r in read_topic(bootstrap, topic, 1, expect, quiet_s=0.3)
        )
    ]


def _squares(lo: int, hi: int) -> Counter[tuple[int, int]]:
    return Counter((i, i * i) for i in range(lo, hi))


CASES = [
    (kind, how)
    for kind in ("sql", "kafka", "files")
    for how in ("backup", "newest-deleted", "backup-generation-lost")
    # PostgreSQL keeps no record of the prepared transactions it committed: with the
    # generation file gone as well, nothing shows the rollback (docs/fault-tolerance.md)
    if (kind, how) != ("sql", "backup-generation-lost")
]


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "how"), CASES)
def test_rolled_back_store_fails_loudly_then_allow_rollback_replays(
    kind: str, how: str, tmp_path: Any, request: pytest.FixtureRequest
) -> None:
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    store, backup = str(tmp_path / "store"), str(tmp_path / "backup")
    target = _target(kind, f"rollback_{how.replace('-', '_')}", tmp_path, request)
    for stop in (100, 250):
        run = _run(str(script), kind, target, store, stop)
        assert run.returncode == 0, run.stderr[-3000:]
        if stop == 100:
            shutil.copytree(store, backup)
    assert Counter(_rows(kind, target, 250)) == _squares(0, 250)
    newest = DirectorySnapshotStore(store).committed_ids()[-1]

    if how == "newest-deleted":
        os.remove(DirectorySnapshotStore(store)._path(newest))
        os.remove(os.path.join(store, MANIFEST))
    else:
        shutil.rmtree(store)
        shutil.copytree(backup, store)
    if how == "backup-generation-lost":  # e.g. the whole machine restored from a backup
        os.remove(snapshot_lineage.generation_path(store))
    older = DirectorySnapshotStore(store).committed_ids()[-1]
    assert older < newest

    refused = _run(str(script), kind, target, store, N)
    assert refused.returncode == 1, refused.stderr[-3000:]
    if how == "backup-generation-lost":
        error, message = _sink_message(kind, target, store, refused.stderr)
    else:
        error, message = "SnapshotStoreRolledBackError", _store_message(kind, store, newest, older)
    assert f"{error}: {message}" in refused.stderr, refused.stderr[-3000:]
    assert Counter(_rows(kind, target, 250)) == _squares(0, 250)  # nothing written

    replayed = _run(str(script), kind, target, store, N, allow=True)
    assert replayed.returncode == 0, replayed.stderr[-3000:]
    warning = (
        "is published again"
        if how != "backup-generation-lost"
        else "allow_rollback=True: the records after it are written to"
        if kind == "kafka"
        else "allow_rollback=True: the items after it are written again, into new part files"
    )
    assert warning in replayed.stderr, replayed.stderr[-3000:]
    # the backup cases replay 100-249; after "newest-deleted" the replay starts at some
    # snapshot of the second run, so only N distinct rows are certain (waiting for N + 150
    # there waited out read_topic's whole deadline: 240 s)
    rows = Counter(_rows(kind, target, N + 150 if how != "newest-deleted" else N))
    if how == "newest-deleted":  # some snapshot of the second run: nothing lost or tripled
        assert set(rows) == set(_squares(0, N)) and max(rows.values()) <= 2
    else:  # the backup's snapshots hold offset 100: 100-249 come twice
        assert rows == _squares(0, N) + _squares(100, 250)
    _discard(kind, target)


def _store_message(kind: str, store: str, newest: int, older: int) -> str:
    path = snapshot_lineage.generation_path(store)
    return (
        f"snapshot store {store} was rolled back: snapshot {newest} of job 'rollback-{kind}' "
        f"was committed in it (recorded outside the store in {path}), but the job would "
        f"resume from snapshot {older}. The sinks may have published the output of every "
        f"snapshot up to {newest}: resuming from snapshot {older} would publish what came "
        f"after it again. (The store directory was restored from a backup or lost, or its "
        f"newest snapshot files and MANIFEST.json were removed.) Put the newest snapshots "
        f"back; or pass JobConfig(allow_rollback=True) to resume from snapshot {older} and "
        f"accept that replay (duplicates downstream); or start from scratch with another "
        f"snapshot_store."
    )


def _sink_message(kind: str, target: str, store: str, stderr: str) -> tuple[str, str]:
    """The error a sink raises when its own records show the rollback, for the processor
    that failed first (both do), from the restored snapshot and the sink's output."""
    match = re.search(r"failed: vertex 'out', processor (\d+): ", stderr)
    assert match is not None, stderr[-3000:]
    index = int(match.group(1))
    ((_key, saved),) = DirectorySnapshotStore(store).latest().vertices["out"].entries[index]
    head = f"job 'rollback-{kind}' failed: vertex 'out', processor {index}: "
    if kind == "kafka":
        lineage, sid, _records = saved
        bootstrap, topic = target.split("/")
        group = f"{transactional_prefix('rollback-kafka', 'out')}-{lineage}-{index}"
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
        try:
            (tp,) = consumer.committed([TopicPartition(topic, 0)], timeout=30)
        finally:
            consumer.close()
        return "JobFailedError", (
            f"{head}SnapshotStoreRolledBackError: vertex 'out': the snapshot store was rolled "
            f"back: Kafka holds the transaction of snapshot {tp.offset} of processor {index} "
            f"(committed offset of consumer group {group!r}), newer than the snapshot the job "
            f"resumes from ({sid}): resuming would write the records after it to topic "
            f"{topic!r} again. Put the store's newest snapshots back, or pass "
            f"JobConfig(allow_rollback=True) to accept that replay (duplicates downstream)."
        )
    sequence = saved[0]
    prefix = f"part-{index:05d}-"
    published = max(n for n in os.listdir(target) if n.startswith(prefix))
    return "JobFailedError", (
        f"{head}SnapshotStoreRolledBackError: write_files (vertex 'out'): the snapshot store "
        f"was rolled back: {target} holds the published part file {published} of processor "
        f"{index}, newer than the snapshot the job resumes from (which continues at part "
        f"{sequence:06d}): resuming would write the items after it again. Put the store's "
        f"newest snapshots back, or pass JobConfig(allow_rollback=True) to accept that "
        f"replay (into new part files: duplicates downstream)."
    )
