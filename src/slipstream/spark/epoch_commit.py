"""After an epoch's commit: two-phase sinks write the output their epoch prepared.

On the embedded engine a two-phase sink (the Kafka sink under exactly-once) holds a
snapshot interval's output in the snapshot and writes it in
``snapshot_commit_finish(True)``, once the coordinator has committed that snapshot. A
Spark epoch's processors are gone when the driver commits the epoch's manifest, so the
second phase runs here: right after the commit, for every sink processor whose task
reported held output (``commit_pending`` in its result), a small Spark job (one task per
such processor) makes the processor again, restores it from the chunk its epoch task
wrote (the committed snapshot's) and calls ``finish_snapshot_restore``: the same restore
path that writes a restored snapshot's transactions on the embedded engine, which checks
the sink's marker first, so nothing is written twice.

If the driver dies between the manifest's commit and this job (or the job fails), no
output is lost: the next epoch (or the next job on the checkpoint) restores the same
entries and writes what the markers say is missing. The driver never holds the records:
each task reads its own chunk from the checkpoint.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from typing import Any

from slipstream.core.config import ProcessingGuarantee
from slipstream.core.inbox import Inbox
from slipstream.core.outbox import Outbox
from slipstream.spark.failures import encode_failure
from slipstream.spark.task import TaskServices, VertexTask
from slipstream.state.keys import expand_entries
from slipstream.state.store import ChunkRef, read_chain_files

__all__ = ["commit_epoch_output", "pending_commits"]


def pending_commits(results: list[dict[str, Any]]) -> dict[str, dict[int, dict[str, Any]]]:
    """Per vertex, the chunk refs (JSON) of the processors whose epoch output waits for
    the commit (a full chunk each: the sink saves plain entries, never a delta)."""
    out: dict[str, dict[int, dict[str, Any]]] = {}
    for r in results:
        saved = r.get("snapshot")
        if r.get("commit_pending") and saved and saved.get("chunk") and saved.get("base") is None:
            out.setdefault(r["vertex"], {})[r["index"]] = saved["chunk"]
    return out


def commit_epoch_output(
    sc: Any,
    tasks: list[VertexTask],
    results: list[dict[str, Any]],
    store: dict[str, Any],
    snapshot_id: int,
) -> int:
    """Run the second phase of snapshot ``snapshot_id`` (just committed) for the
    processors that hold output (see the module doc); returns how many ran. Raises the
    first task's failure (the epoch stays committed; its output is written by the next
    restore)."""
    pending = pending_commits(results)
    if not pending:
        return 0
    by_vertex = {t.vertex: t for t in tasks}
    work: list[tuple[VertexTask, int, dict[str, Any]]] = []
    for vertex, refs in sorted(pending.items()):
        # the vertex's task without what only an epoch's run needs (its state broadcast
        # is gone already, its edges are not used)
        task = dataclasses.replace(by_vertex[vertex], epoch_state=None, inbound=[], outbound=[])
        work.extend((task, i, ref) for i, ref in sorted(refs.items()))
    commit = _CommitTask(work, store, snapshot_id)
    sc.parallelize(range(len(work)), len(work)).mapPartitionsWithIndex(commit).collect()
    return len(work)


@dataclasses.dataclass
class _CommitTask:
    """The ``mapPartitionsWithIndex`` function of the commit job: split ``n`` commits
    ``work[n]``."""

    work: list[tuple[VertexTask, int, dict[str, Any]]]
    store: dict[str, Any]
    snapshot_id: int

    def __call__(self, split: int, _rows: Iterator[Any]) -> Iterator[int]:
        task, index, ref = self.work[split]
        try:
            _commit_one(task, index, ref, self.store, self.snapshot_id)
        except Exception as exc:
            raise encode_failure(task.vertex, index, exc, task.failure_key) from exc
        yield index


def _commit_one(
    task: VertexTask, index: int, ref: dict[str, Any], store: dict[str, Any], snapshot_id: int
) -> None:
    """Make processor ``task.vertex#index``, restore it from its chunk ``ref`` of
    snapshot ``snapshot_id`` and finish the restore (which writes what the chunk holds
    and the sink's markers do not show as written), then close it."""
    member, local = divmod(index, task.local_parallelism)
    supplier, processor = task._make_processor(member, local)
    guarantee = ProcessingGuarantee.EXACTLY_ONCE
    context = task._context(index, member, local, guarantee, TaskServices(task.services))
    context.epoch_commit_id = snapshot_id
    error: BaseException | None = None
    try:
        processor.init(Outbox(0), context)  # a sink: nothing goes out
        entries = read_chain_files(
            store["directory"],
            store["key"],
            [ChunkRef.from_json(ref)],
            task.vertex,
            index,
            snapshot_id,
        )
        inbox = Inbox(expand_entries(entries))
        while inbox:
            processor.restore_from_snapshot(inbox)
        while not processor.finish_snapshot_restore():
            time.sleep(0.01)  # retried through an outage (the sink's own back-off)
    except BaseException as exc:
        error = exc
        raise
    finally:
        try:
            processor.close()
        finally:
            if supplier is not None:
                supplier.close(error)
