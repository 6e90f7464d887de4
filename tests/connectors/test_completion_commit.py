"""Exactly-once at the two points where a sink processor's *last* transaction becomes
final, across SIGKILLs, for the PostgreSQL, file and Kafka sinks.

* ``final``: a sink processor completed, a snapshot recording its completion committed,
  and the process dies before the completion's commit ran (COMMIT PREPARED, rename,
  Kafka transaction). A restore does not run a completed processor again, so the commit
  must be completed from the snapshot (the processor's completion state).
* ``failed``: a snapshot could not be written (disk full) and the next one commits, with
  what the failed one staged; the process dies before those commits ran. The committed
  snapshot must name everything still to commit, not only its own transaction.
* ``end``: the job completed and committed its sinks' output; the process dies before
  the store is marked completed. A ``resume=True`` then must neither replay (duplicates)
  nor lose anything.
* ``unwritable``: the store breaks at the job's end: the final snapshot (recording every
  processor as completed) cannot be written, nor the completed mark (the process dies
  there). The job must fail with its last transactions uncommitted, not commit them
  without a durable record (a resume would replay them: duplicates).

Each scenario kills the job process at the exact point (fault injection in the job
script, no timing), runs it again with ``resume=True`` and checks the output is exact.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from typing import Any

import psycopg
import pytest

N = 400

SCRIPT = textwrap.dedent(
    """
    import os, sys
    import slipstream as ss
    from slipstream import DAG, Edge, JobConfig, ProcessingGuarantee, sinks
    from slipstream.core.commit import AT_COMPLETION
    from slipstream.core.processor import AbstractProcessor
    from slipstream.state.keys import BroadcastKey
    from slipstream.state.store import DirectorySnapshotStore

    kind, target, store, point = sys.argv[1:5]
    N = N_ITEMS
    manifest = os.path.join(store, "MANIFEST.json")

    def die(*args):
        os.kill(os.getpid(), 9)

    staged_final, sinks_completed, failed = [], [], []
    if point == "end":
        # die after the job committed its output, before the store is marked completed
        DirectorySnapshotStore.mark_completed = die
    elif point == "unwritable":
        # from the snapshot recording every processor as completed on, the store cannot
        # be written (a full disk); die where the store would be marked completed
        commit, broken = DirectorySnapshotStore.commit, []
        def unwritable(self, manifest):
            if broken or all(len(vm.completed) == vm.total_parallelism
                             for vm in manifest.vertices.values()):
                broken.append(manifest.snapshot_id)
                raise OSError(28, "injected: No space left on device")
            return commit(self, manifest)
        DirectorySnapshotStore.commit = unwritable
        DirectorySnapshotStore.mark_completed = die
    elif point == "failed":
        # the second snapshot cannot be written; die before the first commit that runs
        # after it (the third snapshot's commit, which also commits what the second staged)
        commit, writes = DirectorySnapshotStore.commit, []
        def failing_write(self, manifest):
            writes.append(manifest.snapshot_id)
            if len(writes) == 2:
                failed.append(manifest.snapshot_id)
                raise OSError("injected: the disk is full")
            return commit(self, manifest)
        DirectorySnapshotStore.commit = failing_write

    class Numbers(AbstractProcessor):
        # (i, i*i) for i < N; with point "end", "unwritable" or "failed" the second half
        # waits for a committed snapshot, so the last snapshot has the sink still running
        # (and with "failed" the sink prepares the second half for the snapshot that fails)
        def init_processor(self, context):
            self.i = 0
        def complete(self):
            while self.i < N:
                if point in ("end", "unwritable", "failed") and self.i >= N // 2 and not os.path.exists(manifest):
                    return False
                if not self.outbox.offer((self.i, self.i * self.i)):
                    return False
                self.i += 1
            return point != "failed"  # "failed": snapshots go on until the kill
        def save_to_snapshot(self):
            return self.outbox.offer_to_snapshot(BroadcastKey("i"), self.i)
        def restore_from_snapshot_entry(self, key, value):
            self.i = value

    class Hold(AbstractProcessor):
        # keeps the job running after the sink completed (point "final"): snapshots go
        # on, one records the sink's completion, and its commit kills the process. If
        # a snapshot took all of the sink's input, nothing is left to commit at its
        # completion: exit 3, the test tries again
        def complete(self):
            if point == "final" and len(sinks_completed) == 2 and not staged_final:
                os._exit(3)
            return point != "final"

    if kind == "sql":
        import psycopg
        sink = sinks.sql(lambda: psycopg.connect(target), "INSERT INTO t (k, v) VALUES (%s, %s)")
    elif kind == "files":
        # a part file published at every snapshot: every snapshot stages a commit
        sink = sinks.write_files(target, lambda kv: f"{kv[0]},{kv[1]}", roll_interval_ms=0)
    else:
        bootstrap, topic = target.split("/")
        sink = sinks.kafka(topic, {"bootstrap.servers": bootstrap},
                           value_fn=lambda kv: f"{kv[0]},{kv[1]}")

    sink_class = sink.func
    sink_complete, sink_finish = sink_class.complete, sink_class.snapshot_commit_finish
    def has_final(self):  # complete() prepared a last transaction
        return any(sid == AT_COMPLETION for sid, _ in self._prepared.entries())
    def complete(self):
        done = sink_complete(self)
        if done:
            sinks_completed.append(self.context.global_processor_index)
            if has_final(self):
                staged_final.append(self.context.global_processor_index)
        return done
    def finish(self, success):
        if point == "final" and success and self.context.completion_committed and has_final(self):
            die()  # in place of the commit of the processor's last (completion) transaction
        if point == "failed" and failed and success and self._prepared.due(self.context):
            die()  # before the first commit after the failed snapshot (it covers that one's)
        return sink_finish(self, success)
    sink_class.complete = complete
    sink_class.snapshot_commit_finish = finish

    dag = DAG()
    src = dag.new_vertex("numbers", Numbers).local_parallelism(1)
    out = dag.new_vertex("out", sink).local_parallelism(2)
    dag.edge(Edge.between(src, out).partitioned(lambda kv: kv[0]))
    hold = dag.new_vertex("hold", Hold).local_parallelism(1)
    dag.edge(Edge.between(hold, dag.new_vertex("nothing", sinks.noop())))
    cfg = JobConfig(name="completion-" + kind, snapshot_interval_ms=30, snapshot_store=store,
                    processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE, resume=True)
    ss.local().new_job(dag, cfg).join(30)
    """
).replace("N_ITEMS", str(N))


def _run(script: str, args: list[str], point: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, script, *args, point], capture_output=True, text=True, timeout=60
    )


def _rows_sql(dsn: str) -> tuple[list[tuple[int, int]], list[Any]]:
    with psycopg.connect(dsn) as c:
        rows = c.execute("SELECT k, v FROM t").fetchall()
        prepared = c.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()"
        ).fetchall()
    return [(int(k), int(v)) for k, v in rows], prepared


def _discard(kind: str, target: str) -> None:
    """Roll back what an abandoned attempt left prepared in its database: the attempt
    is never resumed, and prepared transactions are visible to the whole cluster (the
    other SQL tests check that none is left)."""
    if kind != "sql":
        return
    with psycopg.connect(target, autocommit=True) as c:
        prepared = c.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()"
        ).fetchall()
        for (gid,) in prepared:
            c.execute(psycopg.sql.SQL("ROLLBACK PREPARED {}").format(psycopg.sql.Literal(gid)))


def _rows_files(directory: str) -> list[tuple[int, int]]:
    rows = []
    for name in os.listdir(directory):
        if name.startswith("."):
            continue
        with open(os.path.join(directory, name)) as fh:
            for line in fh:
                k, v = line.split(",")
                rows.append((int(k), int(v)))
    return rows


def _target(kind: str, label: str, tmp_path: Any, request: pytest.FixtureRequest) -> str:
    """A fresh, empty output: a database, a directory or a topic."""
    if kind == "sql":
        server = request.getfixturevalue("postgres")
        dbname = f"completion_{label}"
        with psycopg.connect(server.dsn, autocommit=True) as c:
            c.execute(f"DROP DATABASE IF EXISTS {dbname}")
            c.execute(f"CREATE DATABASE {dbname}")
        target: str = server.dsn.replace("dbname=postgres", f"dbname={dbname}")
        assert target != server.dsn, server.dsn
        with psycopg.connect(target, autocommit=True) as c:
            c.execute("CREATE TABLE t (k bigint, v bigint)")
        return target
    if kind == "files":
        return str(tmp_path / f"out-{label}")
    from test_kafka import topic_name

    broker = request.getfixturevalue("kafka")
    topic = topic_name(f"completion-{label}")
    broker.create_topic(topic, 1)
    return f"{broker.bootstrap}/{topic}"


@pytest.mark.slow
@pytest.mark.parametrize("point", ["final", "end", "failed"])
@pytest.mark.parametrize("kind", ["sql", "files", "kafka"])
def test_kill_at_the_last_commit_then_resume_is_exact(
    kind: str, point: str, tmp_path: Any, request: pytest.FixtureRequest
) -> None:
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    for attempt in range(10):  # exit 3: the sink had nothing left at its completion
        store = str(tmp_path / f"store{attempt}")
        args = [kind, _target(kind, f"{point}{attempt}", tmp_path, request), store]
        first = _run(str(script), args, point)
        if first.returncode != 3:
            break
        _discard(kind, args[1])
    assert first.returncode == -signal.SIGKILL, (first.returncode, first.stderr[-3000:])
    second = _run(str(script), args, "none")
    assert second.returncode == 0, second.stderr[-3000:]
    _assert_exact(kind, args[1])


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sql", "files", "kafka"])
def test_final_snapshot_that_cannot_be_written_then_resume_is_exact(
    kind: str, tmp_path: Any, request: pytest.FixtureRequest
) -> None:
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    args = [kind, _target(kind, "unwritable", tmp_path, request), str(tmp_path / "store")]
    first = _run(str(script), args, "unwritable")
    second = _run(str(script), args, "none")
    assert second.returncode == 0, second.stderr[-3000:]
    _assert_exact(kind, args[1])
    # the first run failed at its end with nothing of its last transactions committed
    assert first.returncode == 1, (first.returncode, first.stderr[-3000:])
    assert "JobFailedError" in first.stderr and "final snapshot" in first.stderr, first.stderr[-3000:]
    assert args[2] in first.stderr and "No space left on device" in first.stderr


def _assert_exact(kind: str, target: str) -> None:
    """The output holds every (i, i*i) exactly once (and no transaction is left
    prepared)."""
    if kind == "sql":
        rows, prepared = _rows_sql(target)
        assert prepared == []
    elif kind == "files":
        rows = _rows_files(target)
    else:
        from test_kafka import read_topic

        bootstrap, topic = target.split("/")
        # called once every run's subprocess exited: every transaction is committed
        # already, so a short quiet time after the N rows (read_topic's default is 1 s)
        rows = [
            (int(k), int(v))
            for k, v in (
                r.decode().split(",") for r in read_topic(bootstrap, topic, 1, N, quiet_s=0.3)
            )
        ]
    expected = [(i, i * i) for i in range(N)]
    assert len(rows) - len(set(rows)) == 0, f"{len(rows) - len(set(rows))} rows written twice"
    assert sorted(rows) == expected, f"{len(set(expected) - set(rows))} rows lost"
