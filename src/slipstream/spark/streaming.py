"""Streaming DAGs on Spark Structured Streaming: one epoch per micro-batch.

A DAG whose source is :func:`~slipstream.spark.io.spark_stream_source` runs as a query
``df.writeStream.foreachBatch(...)``. For every micro-batch (``epoch_id``) the driver

1. reads the manifest of the snapshot committed by the previous epoch (slipstream's
   :class:`~slipstream.state.store.DirectorySnapshotStore` under the checkpoint
   location, format 3) and sends the tasks the refs of its chunks, never the state: at
   the same parallelism each task reads its own processor's chain from the checkpoint
   (:mod:`slipstream.spark.epoch_state`). A vertex whose parallelism changed (or one
   of whose processors saved an entry another one owns) is rerouted by key through a
   Spark shuffle first (:mod:`slipstream.spark.rescale`), as the embedded engine
   restores a snapshot (keyed entries to the owner of the key's partition,
   ``BroadcastKey`` entries to every processor); only a store of an older version is
   read and routed on the driver (:func:`~slipstream.state.restore.restore_plan`);
2. runs the DAG once over the micro-batch's rows, compiled as for a batch job
   (:mod:`slipstream.spark.compile`) but in *epoch mode*: every processor first
   restores its share of the state (``restore_from_snapshot`` /
   ``finish_snapshot_restore``), the source emits the epoch's rows and then a terminal
   snapshot barrier; each processor saves its state (``save_to_snapshot``), its task
   writes it as a signed chunk into the checkpoint (a file name of its own per task
   attempt) and returns the chunk's ref, forwards the barrier and closes. No
   ``complete()`` is called, so open windows stay open (in the saved state) instead of
   being flushed as at the end of a batch;
3. commits the next snapshot's manifest from the tasks' refs (temp file + fsync +
   rename, then ``MANIFEST.json`` and the generation), recording ``epoch_id``, with each
   processor's watermark-coalescing state, so watermarks continue across epochs (a
   window opened in epoch n closes in epoch n+k); chunks no committed manifest names
   (a failed attempt's, an abandoned epoch's) are removed at that commit;
4. hands the sinks' list/map output to the engine.

Event time follows Spark's rule, not Jet's per-split coalescing: the watermark is the
whole micro-batch's (see :class:`SparkStreamingJob` and docs/spark.md, "Event time"),
with a *no-data epoch* where Spark runs a no-data batch.

Spark commits its own offsets for the epoch only after ``foreachBatch`` returns. If the
driver dies in between, Spark replays the epoch with the same id: slipstream sees that
the newest snapshot is of that epoch (or a later one) and skips it, so state is never
applied twice; an epoch that had not committed is recomputed from the previous state (same
input, deterministic processors: same state and output). That is exactly-once for the
processors' state; a sink's side effects are exactly-once when they are idempotent per
epoch (list/map sinks deliver to the driver, which does not survive a driver restart).

The same epoch (:meth:`_EpochJob._run_one_epoch`) also drives DAGs whose sources are
slipstream's own replayable sources (``generator``, ``stream_files``, ...; their
offsets are snapshot state): ``new_job(dag, config, streaming=True, epoch_ms=1000)``
starts a :class:`SparkMicroBatchJob`, a loop on the driver instead of a Spark query.
Epoch ``k`` restores every processor, the sources included, from snapshot ``k``; each
source processor calls ``complete()`` for up to ``epoch_ms`` (or until it returns True)
and then takes the terminal barrier, saving its offset; snapshot ``k + 1`` is committed
and the sinks' output delivered. When every source processor has completed, a final run
restores the last snapshot and completes the DAG as a batch job would (windows flush).
A job started again from the same checkpoint continues after the last committed epoch:
an epoch abandoned by ``cancel()`` or a driver failure is run again from the committed
offsets (with its own time budget, so its split into epochs may differ, but each item is
applied to the state once).

Micro-batch limits: every source is a slipstream processor; a source task that Spark
recomputes after it finished (lost shuffle output) may emit a different amount than its
first attempt (a retried *failed* task is safe); one job per checkpoint location. A
checkpoint whose state was rolled back (a backup restored, the newest snapshot removed,
the directory lost after epochs committed) is refused at the start, as the embedded
engine refuses a rolled-back store (:mod:`slipstream.state.lineage`).

Structured Streaming: any number of ``spark_stream_source`` vertices (one query over
the union of their DataFrames, see :meth:`SparkStreamingJob._streaming_df`) and no other
source vertex (a batch source would run again in every epoch); a
``spark_dataframe_sink`` must write (``path=``/``table=``), once per epoch into its own
partition, before the commit; list sinks keep the newest ``max_list_items`` items on
the driver. Parallelism is fixed when the job starts (keyed state follows a change of
parallelism, watermark state does not).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping
from typing import Any, cast

from slipstream.core.config import JobConfig, JobStatus
from slipstream.core.dag import DAG
from slipstream.core.errors import DagError, SnapshotError
from slipstream.execution.plan import VertexPlan, member_addresses
from slipstream.spark.compile import EpochInput, compile_dag, plan_vertices, validate
from slipstream.spark.epoch_commit import commit_epoch_output
from slipstream.spark.file_splits import micro_batch_plan
from slipstream.spark.io import SparkRowSource, SparkStreamSource
from slipstream.spark.jobs import JobHost, SparkJobBase, ordered_results, quietly, write_all
from slipstream.spark.jvm import jvm_static
from slipstream.spark.rescale import RerouteTarget, reroute
from slipstream.state import compact
from slipstream.state import format as fmt
from slipstream.state.compact import Compactor
from slipstream.state.lineage import check_not_rolled_back, check_same_dag, dag_shape
from slipstream.state.restore import check_no_lost_state, custom_partitioners, restore_plan
from slipstream.state.store import (
    FORMAT,
    ChunkRef,
    DirectorySnapshotStore,
    Manifest,
    SnapshotData,
    VertexManifest,
)

__all__ = [
    "DEFAULT_EPOCH_MS",
    "DEFAULT_MAX_LIST_ITEMS",
    "SparkMicroBatchJob",
    "SparkStreamingJob",
]

log = logging.getLogger("slipstream.spark.streaming")

#: How long a source processor of a micro-batch job emits in one epoch, by default.
DEFAULT_EPOCH_MS = 1000.0
#: How many of the newest items a streaming job keeps per list sink on the driver, by
#: default (a long-running query must not grow the driver's memory without bound).
DEFAULT_MAX_LIST_ITEMS = 1_000_000


# -- the epoch's fields of a snapshot: plain data in SnapshotData.extra ---------------------
# A snapshot committed by an epoch records, besides every processor's saved entries
# (``vertices``, as in the embedded engine's snapshots), under these keys of ``extra``:
#   epoch_id           Spark's epoch id (a micro-batch job's: the snapshot id - 1)
#   watermarks         each processor's watermark-coalescing state (encode_watermarks)
#   finished           written by a micro-batch job's final run: the job has completed
#   no_data            a Structured Streaming job's no-data epoch after Spark's epoch
#                      ``epoch_id``: it only moved the watermarks to the micro-batch's
#   watermark_pending  some processor's output watermark ended below its vertex's
#                      highest (a split of the micro-batch held older events): the next
#                      epoch, or a no-data epoch, moves it
# Older versions pickled these as attributes of an ``EpochSnapshot(SnapshotData)``
# subclass; the store reads those files into the same keys (state.store.upgrade).

#: A committed snapshot as an epoch starts from it: its manifest (format 3), or the whole
#: snapshot of a store an older version wrote (format 2)
Snapshot = Manifest | SnapshotData

#: A processor's watermark state as the tasks use it (capture/restore_watermarks), by
#: (vertex, processor index).
Watermarks = dict[tuple[str, int], dict[str, Any]]


def epoch_extra(
    epoch_id: int,
    watermarks: Watermarks,
    *,
    finished: bool = False,
    no_data: bool = False,
    watermark_pending: bool = False,
) -> dict[str, Any]:
    """The ``extra`` of the snapshot that an epoch commits."""
    return {
        "epoch_id": epoch_id,
        "watermarks": encode_watermarks(watermarks),
        "finished": finished,
        "no_data": no_data,
        "watermark_pending": watermark_pending,
    }


def snapshot_epoch(data: SnapshotData | Manifest, default: int = -1) -> int:
    """Spark's epoch id of the epoch that committed ``data`` (``default`` if it has none:
    a snapshot the embedded engine wrote)."""
    value = data.extra.get("epoch_id")
    return int(value) if isinstance(value, int) else default


def snapshot_finished(data: SnapshotData | Manifest) -> bool:
    """Whether ``data`` was committed by a micro-batch job's final run."""
    return bool(data.extra.get("finished", False))


def snapshot_no_data(data: SnapshotData | Manifest) -> bool:
    """Whether ``data`` was committed by a no-data epoch."""
    return bool(data.extra.get("no_data", False))


def snapshot_watermark_pending(data: SnapshotData | Manifest) -> bool:
    """Whether the epoch that committed ``data`` left a watermark pending."""
    return bool(data.extra.get("watermark_pending", False))


def snapshot_watermarks(data: SnapshotData | Manifest) -> Watermarks:
    """Each processor's watermark-coalescing state saved with ``data`` (empty for a
    snapshot the embedded engine wrote)."""
    return decode_watermarks(data.extra.get("watermarks"))


def encode_watermarks(watermarks: Watermarks) -> list[list[Any]]:
    """``watermarks`` as plain data that also survives JSON (str keys only): a list of
    ``[vertex, index, state]``, each state's int-keyed maps (per-edge coalescers, the
    last watermark sent per edge) as lists of ``[edge, value]`` pairs."""
    out: list[list[Any]] = []
    for (vertex, index), state in watermarks.items():
        plain = dict(state)
        if isinstance(plain.get("edges"), dict):
            plain["edges"] = [[int(k), v] for k, v in plain["edges"].items()]
        if isinstance(plain.get("sent"), dict):
            plain["sent"] = [[int(k), v] for k, v in plain["sent"].items()]
        out.append([vertex, index, plain])
    return out


def decode_watermarks(encoded: Any) -> Watermarks:
    """The inverse of :func:`encode_watermarks`; also reads the dict that older
    versions pickled (already in the tasks' shape)."""
    if not encoded:
        return {}
    if isinstance(encoded, dict):  # an older version's EpochSnapshot.watermarks
        return {(str(v), int(i)): state for (v, i), state in encoded.items()}
    out: Watermarks = {}
    for vertex, index, plain in encoded:
        state = dict(plain)
        if isinstance(state.get("edges"), list):
            state["edges"] = {int(k): v for k, v in state["edges"]}
        if isinstance(state.get("ordinals"), tuple):
            state["ordinals"] = list(state["ordinals"])
        if isinstance(state.get("sent"), list):
            state["sent"] = {int(k): v for k, v in state["sent"]}
        out[(str(vertex), int(index))] = state
    return out


def default_checkpoint_location(job_name: str) -> str:
    return os.path.join(os.getcwd(), ".slipstream", "spark-streaming", job_name)


class _EpochJob(SparkJobBase):
    """What both kinds of streaming job on Spark share: the job API, and
    :meth:`_run_one_epoch`, THE epoch (restore, run the DAG in epoch mode, commit,
    deliver). ``metrics`` sums the per-processor counters over the epochs run by this
    job; ``epochs_committed`` and ``epochs_skipped`` (replays of already committed
    epochs) count epochs. ``cancel()`` stops the job (the epoch in progress is
    abandoned and run again by the next job started from the same checkpoint)."""

    _kind = "stream-job"
    #: whether a task may restore its processor's state from what the previous epoch's
    #: task left in the same Python worker process, when the committed manifest's chain
    #: ends with the chunk that task wrote (:mod:`slipstream.spark.epoch_state`, "Keeping
    #: it between epochs"); ``False``: every task reads its chain
    executor_state_cache: bool = True
    _no_suspend = (
        "is not supported on Spark: cancel() the job and start it again with the same "
        "checkpoint_location"
    )

    def __init__(
        self,
        engine: JobHost,
        dag: DAG,
        config: JobConfig,
        checkpoint_location: str | None,
        max_list_items: int | None = None,
    ) -> None:
        super().__init__(engine, dag, config)
        if max_list_items is not None and (
            not isinstance(max_list_items, int) or max_list_items < 0
        ):
            raise ValueError(f"max_list_items must be an int >= 0 or None, got {max_list_items!r}")
        #: the newest items a list sink keeps on the driver (None: all of them)
        self.max_list_items = max_list_items
        if checkpoint_location is None:
            store = config.snapshot_store
            checkpoint_location = (
                os.fspath(store)
                if isinstance(store, (str, os.PathLike))
                else default_checkpoint_location(self.name)
            )
        self.checkpoint_location = os.path.abspath(checkpoint_location)
        self.store = DirectorySnapshotStore(
            os.path.join(self.checkpoint_location, "slipstream-state")
        )
        self.epochs_committed = 0
        self.epochs_skipped = 0
        #: no-data epochs committed (Structured Streaming jobs, see SparkStreamingJob)
        self.no_data_epochs = 0
        # whether the newest committed epoch left a watermark pending (None: not known yet)
        self._watermark_pending: bool | None = None
        # the newest snapshot, read before the first epoch (see _resumed_epoch)
        self._prefetched: Snapshot | None = None
        #: the id of the snapshot of ``checkpoint_location`` the job started from (0: none)
        self.resumed_from_snapshot = 0
        self.last_epoch_id: int | None = None
        # for watchers (JobHandle.watch): the last committed epoch and its watermarks
        self._last_epoch: dict[str, Any] | None = None
        self._epoch_watermarks: dict[str, int | None] = {}
        self._plans: dict[str, VertexPlan] = {}
        self._members = 1
        self._lp = 1
        self._before_commit: Any = None
        # the driver's lists/maps as of the job start, for processors reading them (e.g.
        # a lookup map): shipped once, not per epoch, so sink output that accumulates
        # on the driver is not shipped back again and again
        self._services: Any = None
        # compaction of the chains (a full chunk and the deltas of processors that
        # continued theirs), in a child process on the driver over the checkpoint path,
        # off the epochs' critical path; made at the first chain to compact
        self._compactor: Compactor | None = None
        #: chains compacted by this job
        self.compactions = 0
        #: vertices whose state this job rerouted by key through Spark (another
        #: parallelism than the snapshot's, :mod:`slipstream.spark.rescale`)
        self.rerouted_vertices = 0
        #: where each of the newest epochs' time went (see :meth:`_record_breakdown`)
        self.epoch_breakdown: list[dict[str, Any]] = []
        # the JVM's status tracker and Arrays.toString (see _jvm_tracker)
        self._jvm_status: tuple[Any, Any] | None = None

    # -- public API --------------------------------------------------------------------
    @property
    def metrics(self) -> dict[str, dict[str, int]]:
        with self._lock:
            out = {k: dict(v) for k, v in self._metrics.items()}
        out["__job__"] = {
            "restarts": 0,
            "snapshots": self.epochs_committed + self.no_data_epochs,
            "resumed_from_snapshot": self.resumed_from_snapshot,
        }
        return out

    def watch(self) -> dict[str, Any]:
        """Per epoch (see :meth:`JobHandle.watch`): the last committed epoch as the
        snapshot, each vertex's watermark at its end. Queue fill has no meaning here."""
        with self._lock:
            out: dict[str, Any] = {
                "parallelism": {n: p.total_parallelism for n, p in self._plans.items()},
                "watermarks": dict(self._epoch_watermarks),
            }
            if self._last_epoch is not None:
                out["snapshot"] = dict(self._last_epoch)
        out["stages"] = self.spark_stages()
        if self._error is not None:
            out["error"] = str(self._error)
        return out

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(id={self.id}, name={self.name!r}, "
            f"status={self._status.value}, epochs={self.epochs_committed})"
        )

    # -- execution ---------------------------------------------------------------------
    def _prepare(self) -> None:
        """Fix the job's shape and validate the DAG (before any epoch runs)."""
        self._members, self._lp = self.engine.shape()
        validate(self.dag, self._lp, self._members)
        self._plans = plan_vertices(self.dag, self._members, self._lp)
        os.makedirs(self.checkpoint_location, exist_ok=True)
        committed = self.store.committed_ids()
        # as on the embedded engine: state rolled back (a backup of the checkpoint restored,
        # its newest snapshot removed, the directory lost) is never resumed silently, and
        # a snapshot is restored only into the same DAG
        owner = self.store.owner() if committed else None
        check_not_rolled_back(
            self.store.directory,
            self.name,
            (committed[-1], owner.job if owner is not None else self.name) if committed else None,
            self.config.allow_rollback,
        )
        self.store.dag_shape = dag_shape(self.dag)
        if committed:
            # a resume must be visible: the output continues an earlier run's
            self.resumed_from_snapshot = committed[-1]
            log.warning(
                "job %r: resuming from snapshot %d (after epoch %d) in checkpoint_location %s",
                self.name,
                committed[-1],
                self._resumed_epoch(committed[-1]),
                self.checkpoint_location,
            )
        self._services = self.engine.services_broadcast()

    def _resumed_epoch(self, snapshot_id: int) -> int:
        """The epoch that committed snapshot ``snapshot_id`` (for the resume warning)."""
        return snapshot_id - 1

    def _latest(self, committed: list[int]) -> Snapshot | None:
        """The newest committed snapshot (``None`` at the start): its manifest (the
        chunks stay where they are), or the whole snapshot of a format-2 store."""
        if not committed:
            return None
        prefetched, self._prefetched = self._prefetched, None
        if prefetched is not None and prefetched.snapshot_id == committed[-1]:
            return prefetched
        return self._read_snapshot(committed[-1])

    def _read_snapshot(self, snapshot_id: int) -> Snapshot:
        """The manifest of snapshot ``snapshot_id`` (an older version's format-2 file:
        the whole snapshot, restored through the driver as before)."""
        if self.store.read_header(snapshot_id).get("format") == FORMAT:
            return self.store.read_manifest(snapshot_id)
        return self.store.read(snapshot_id)

    def _epoch_snapshot_id(
        self, epoch_id: int, committed: list[int], latest: Any, no_data: bool
    ) -> int | None:
        """The id of the snapshot that epoch ``epoch_id`` commits, or ``None`` if it was
        committed already (a replay). Here: snapshot ``epoch_id + 1``."""
        snapshot_id = epoch_id + 1
        return None if snapshot_id in committed else snapshot_id

    def _load_state(self, data: Snapshot | None, write_id: int) -> dict[str, Any]:
        """What the epoch's tasks restore from and write to (module doc of
        :mod:`slipstream.spark.epoch_state`): the checkpoint's store, the chains of the
        latest committed snapshot ``data`` each task reads itself, the chunks a Spark
        job rerouted by key for the vertices whose tasks cannot read their own chains
        (another parallelism, an entry away from its owner: ``rescaled``, written as
        part of snapshot ``write_id``) and the entries the driver routed for a snapshot
        of an older version."""
        state: dict[str, Any] = {
            "store": {"directory": self.store.directory, "key": self.store.key},
            "write_id": write_id,
            "restore": None,
            "chains": None,
            "rescaled": None,
            "watermarks": {},
            "cache": self.executor_state_cache,
        }
        if data is None:
            return state
        check_same_dag(cast(Any, data), dag_shape(self.dag), self.config.allow_job_change)
        same = {
            name
            for name, vs in data.vertices.items()
            if name in self._plans and vs.total_parallelism == self._plans[name].total_parallelism
        }
        state["watermarks"] = {
            k: v for k, v in snapshot_watermarks(data).items() if k[0] in same
        }
        if isinstance(data, SnapshotData):  # format 2: the driver routes it all
            state["restore"] = restore_plan(data, self._plans, custom_partitioners(self.dag))[0]
            return state
        flags = data.extra.get("executor_state")
        spill = {str(v) for v, _i in (flags or {}).get("spill", [])}
        broadcast = {(str(v), int(i)) for v, i in (flags or {}).get("broadcast", [])}
        on_tasks = {n for n in same if flags is not None and n not in spill}
        chains: dict[str, list[list[Any]]] = {}
        for name in on_tasks:
            vm = data.vertices[name]
            chains[name] = [
                [i, [r.as_json() for r in chain], (name, i) in broadcast]
                for i, chain in sorted(vm.chains.items())
            ]
        # a task reads its own chain and the others' that hold broadcast entries
        state["chains"] = chains
        state["restore_id"] = data.snapshot_id
        rest = {n: vm for n, vm in data.vertices.items() if n not in on_tasks and vm.chains}
        if rest:
            # another parallelism (or an entry away from its owner): rerouted by key through
            # a Spark shuffle into chunks the epoch's tasks restore from, never on the driver
            check_no_lost_state(data.snapshot_id, data.job_name, rest, self._plans)
            partitioners = custom_partitioners(self.dag)
            targets = [
                RerouteTarget(
                    name,
                    {i: [r.as_json() for r in chain] for i, chain in vm.chains.items()},
                    self._plans[name].member_count,
                    self._plans[name].local_parallelism,
                    partitioners.get(name),
                )
                for name, vm in sorted(rest.items())
            ]
            state["rescaled"] = reroute(
                self.engine.spark_context,
                state["store"],
                data.snapshot_id,
                write_id,
                targets,
                self.failure_key,
            )
            self.rerouted_vertices += len(targets)
        return state

    def _chain(
        self,
        chains: Mapping[tuple[str, int], list[ChunkRef]],
        vertex: str,
        index: int,
        ref: ChunkRef,
        saved: Mapping[str, Any],
    ) -> list[ChunkRef]:
        """The chain of processor ``vertex#index`` in the manifest being built: its new
        full chunk ``ref``, or the committed chain its delta continues plus ``ref`` (the
        delta must be relative to that chain's last snapshot)."""
        base = saved.get("base")
        if base is None:
            return [ref]
        chain = chains.get((vertex, index))
        last = chain[-1].snapshot_id if chain else None
        if chain is None or last != base:
            raise SnapshotError(
                f"snapshot {ref.snapshot_id}: {vertex}#{index} wrote {ref.file} as a delta "
                f"relative to snapshot {base}, but the committed chain it continues ends "
                + (f"at snapshot {last}" if last is not None else "nowhere (it has none)")
                + " (a bug in the change tracking; the epoch fails and runs again)"
            )
        return [*chain, ref]

    def _take_compactions(self, chains: dict[tuple[str, int], list[ChunkRef]]) -> None:
        """Before a manifest is built: chains the compactor merged replace the prefix
        they stand for in the committed ``chains`` (:meth:`Compactor.take_into`)."""
        if self._compactor is not None:
            self.compactions += self._compactor.take_into(chains)

    def _after_commit(self, manifest: Manifest) -> None:
        """After an epoch's commit: compaction outputs it names are no longer protected
        (the store's GC keeps what a committed manifest names), and chains with more than
        :data:`~slipstream.state.compact.DEFAULT_MAX_DELTAS` deltas, or whose deltas
        outweigh their full chunk, go to the background compaction, so that a task's
        restore reads a bounded chain."""
        if self._compactor is not None:
            chains = [c for vm in manifest.vertices.values() for c in vm.chains.values()]
            self._compactor.settle(manifest.files(), chains)
        limit = compact.DEFAULT_MAX_DELTAS
        for name, vm in manifest.vertices.items():
            for i, chain in vm.chains.items():
                if len(chain) < 2 or chain[-1].mode != fmt.CHUNK_DELTA:
                    continue
                if len(chain) - 1 > limit or sum(r.size for r in chain[1:]) > chain[0].size:
                    if self._compactor is None:
                        self._compactor = Compactor(self.store, True, self.name)
                    if not self._compactor.busy((name, i)):
                        self._compactor.submit((name, i), chain)

    def _finish_reports(self) -> None:
        """At the job's end also stop the compaction and remove its outputs that no
        committed manifest names."""
        compactor, self._compactor = self._compactor, None
        if compactor is not None:
            compactor.stop()
            compactor.drop_unnamed()
        super()._finish_reports()

    def _run_one_epoch(
        self,
        epoch_id: int,
        streams: Mapping[str, Any] | None = None,
        *,
        epoch_ms: float | None = None,
        final: bool = False,
        no_data: bool = False,
        plans: Mapping[str, Any] | None = None,
    ) -> list[dict[str, Any]] | None:
        """Run epoch ``epoch_id`` (module doc, steps 1-4) and return the processors'
        results, or ``None`` if it is already committed (a replay, see
        :meth:`_epoch_snapshot_id`).

        ``streams`` are the micro-batch's rows per ``spark_stream_source`` vertex; without them the
        sources are slipstream processors running for ``epoch_ms``. ``final`` runs the
        last epoch of such a job: processors restore and then complete (windows flush);
        the commit only records that the job finished. ``no_data`` runs a Structured
        Streaming job's no-data epoch after epoch ``epoch_id`` (empty ``streams``).
        ``plans``: per stream source, the physical plan of its micro-batch, where known
        (:func:`slipstream.spark.file_splits.micro_batch_plan`)."""
        engine = self.engine
        sc = engine.spark_context
        started_at = time.time()
        clock = _Phases()
        committed = self.store.committed_ids()
        latest = self._latest(committed)
        snapshot_id = self._epoch_snapshot_id(epoch_id, committed, latest, no_data)
        if no_data and latest is not None:
            epoch_id = snapshot_epoch(latest, epoch_id)  # after that Spark epoch
        if snapshot_id is None:
            if no_data:
                self._watermark_pending = False
            else:
                log.info(
                    "job %s: epoch %d already committed; skipping its replay", self.name, epoch_id
                )
                self.epochs_skipped += 1
            return None
        self.store.ensure_directory()
        # the job group first: cancel() also stops the rerouting job of a rescale
        sc.setJobGroup(
            self.job_group, f"slipstream job {self.name!r} epoch {epoch_id}", interruptOnCancel=True
        )
        clock.lap("read_manifest")
        jobs_before = self._spark_job_ids()  # the rerouting job of a rescale counts too
        state = self._load_state(latest, snapshot_id)
        clock.lap("load_state")
        # the committed chains: a task that continued its own saves a delta appended to it
        chains: dict[tuple[str, int], list[ChunkRef]] = (
            {(n, i): list(c) for n, vm in latest.vertices.items() for i, c in vm.chains.items()}
            if isinstance(latest, Manifest)
            else {}
        )
        del latest
        state_bc = ship_state(sc, state)
        clock.lap("broadcast_state")
        compiled = None
        try:
            compiled = compile_dag(
                sc,
                self.dag,
                self.config,
                job_name=self.name,
                member_count=self._members,
                default_parallelism=self._lp,
                addresses=member_addresses(self._members),
                services=self._services,
                epoch=EpochInput(
                    streams,
                    state_bc,
                    epoch_ms=epoch_ms,
                    final=final,
                    epoch_max_items=getattr(self, "epoch_max_items", None),
                    plans=plans,
                ),
                failure_key=self.failure_key,
            )
            clock.lap("compile")
            closure_bytes = _closure_bytes(compiled) if _measure_closures() else None
            clock.lap("measure_closures")
            records = compiled.result_rdd.collect()
            clock.lap("spark_collect")
            # before the commit: a replay of this epoch overwrites what it wrote (into the
            # partition of the job's epoch number, which counts no-data epochs too)
            write_all(engine.session, compiled, snapshot_id - 1)
            clock.lap("write_dataframes")
        finally:
            for rdd in compiled.persisted if compiled is not None else []:
                quietly(rdd.unpersist)
            if state_bc is not state:
                quietly(state_bc.unpersist)

        results = ordered_results(compiled, [payload for _t, (_tag, payload) in records])
        clock.lap("unpersist_and_order")
        if self._before_commit is not None:
            self._before_commit(epoch_id)  # a test hook: a driver failure before the commit
        # the tasks wrote their processors' chunks; the epoch commits the manifest naming
        # them (the driver never holds the state, see slipstream.spark.epoch_state)
        manifest = Manifest(snapshot_id, self.name)
        self._take_compactions(chains)
        watermarks: Watermarks = {}
        spill: list[list[Any]] = []
        broadcast: list[list[Any]] = []
        chunk_bytes = 0
        for r in results:
            saved = r.get("snapshot")
            if saved is None:
                continue  # the final run takes no snapshot
            vm = manifest.vertices.get(r["vertex"])
            if vm is None:
                total = compiled.total_parallelism[r["vertex"]]
                vm = manifest.vertices[r["vertex"]] = VertexManifest(total)
            if saved["chunk"] is not None:
                ref = ChunkRef.from_json(saved["chunk"])
                vm.chains[r["index"]] = self._chain(chains, r["vertex"], r["index"], ref, saved)
                chunk_bytes += ref.size
            if saved["spill"]:
                spill.append([r["vertex"], r["index"]])
            if saved["broadcast"]:
                broadcast.append([r["vertex"], r["index"]])
            watermarks[(r["vertex"], r["index"])] = r["watermarks"]
        pending = _watermark_pending(results, compiled.tasks)
        manifest.extra = epoch_extra(
            epoch_id, watermarks, finished=final, no_data=no_data, watermark_pending=pending
        )
        manifest.extra["executor_state"] = {"spill": spill, "broadcast": broadcast}
        if self.store.job_name is None:
            self.store.job_name = self.name
        self.store.begin(snapshot_id)
        self.store.commit(manifest, chunk_bytes=chunk_bytes)  # the commit point of the epoch
        clock.lap("commit")
        self._after_commit(manifest)
        clock.lap("schedule_compaction")
        self._watermark_pending = pending
        committed_at = time.time()
        engine.merge_results(results)
        self._report_late(results)
        if self.max_list_items is not None:
            engine.trim_lists({name for r in results for name in r["lists"]}, self.max_list_items)
        with self._lock:
            for r in results:
                m = self._metrics.setdefault(r["vertex"], {"items_in": 0, "items_out": 0})
                for k, v in r["metrics"].items():
                    m[k] = m.get(k, 0) + v
            if no_data:
                self.no_data_epochs += 1
            else:
                self.epochs_committed += 1
            self.last_epoch_id = epoch_id
            self._last_epoch = {
                "id": snapshot_id,
                "epoch": epoch_id,
                "no_data": no_data,
                "duration_ms": round((committed_at - started_at) * 1000.0, 1),
                "bytes": getattr(self.store, "last_write_bytes", None),
                "committed_at": committed_at,
            }
            self._epoch_watermarks = _vertex_watermarks(results)
        clock.lap("deliver")
        # two-phase sinks (Kafka under exactly-once) write what the epoch prepared, now
        # that its snapshot is committed (slipstream.spark.epoch_commit); after the
        # delivery, so a failure or cancel() here leaves a committed epoch delivered and
        # counted (its transactions are written by the next restore)
        commit_epoch_output(sc, compiled.tasks, results, state["store"], snapshot_id)
        clock.lap("commit_output")
        self._record_breakdown(
            epoch_id,
            no_data,
            clock,
            jobs_before,
            state_bc_bytes(state) if closure_bytes is not None else None,
            closure_bytes,
            results,
            compiled.arrow_sources,
        )
        return results

    def _jvm_tracker(self, sc: Any) -> tuple[Any, Any]:
        """The JVM's status tracker and ``Arrays.toString``, found once per job (a
        round trip each, and the class a failed lookup per package name segment:
        slipstream.spark.jvm)."""
        if self._jvm_status is None:
            self._jvm_status = (
                sc._jsc.statusTracker(),
                jvm_static(sc, "java.util.Arrays", "toString"),
            )
        return self._jvm_status

    def _spark_job_ids(self) -> set[int]:
        """The ids of the Spark jobs of this job's group that Spark's status store keeps
        (up to ``spark.ui.retainedJobs``, 1,000 by default: one a data epoch), read in a
        fixed number of py4j calls: the id array as one string. Iterating the JVM array
        fetched its elements one py4j call each, twice an epoch, so the driver's work
        between epochs grew by ~4 round trips per epoch the job had run (168 in
        epoch 40, ~4,000 once 1,000 jobs are retained; docs/performance.md, "count-10k:
        identity keys, and the driver's calls per epoch")."""
        sc = self.engine.spark_context
        try:
            # the JVM tracker's own array (PySpark's StatusTracker makes it a list); the
            # tracker and Arrays.toString found once per job (slipstream.spark.jvm)
            tracker, to_string = self._jvm_tracker(sc)
            text = to_string(tracker.getJobIdsForGroup(self.job_group))
        except Exception:  # noqa: BLE001 - a test double has no JVM tracker
            try:
                return set(sc.statusTracker().getJobIdsForGroup(self.job_group))
            except Exception:  # noqa: BLE001 - nor a status tracker
                return set()
        return {int(x) for x in str(text).strip("[]").split(",") if x.strip()}

    def _record_breakdown(
        self,
        epoch_id: int,
        no_data: bool,
        clock: _Phases,
        jobs_before: set[int],
        state_bytes: int | None,
        closure_bytes: int | None,
        results: list[dict[str, Any]],
        arrow_sources: list[str] | None = None,
    ) -> None:
        """Append where this epoch's time went to :attr:`epoch_breakdown` (docs/
        performance.md, "Where a Spark streaming epoch's time goes")."""
        jobs = sorted(self._spark_job_ids() - jobs_before)
        stages = 0
        sc = self.engine.spark_context
        try:
            tracker = self._jvm_tracker(sc)[0]
            for jid in jobs:
                info = tracker.getJobInfo(jid)
                stages += len(info.stageIds()) if info is not None else 0
        except Exception:  # noqa: BLE001 - a test double has no JVM tracker
            try:
                for jid in jobs:
                    job = sc.statusTracker().getJobInfo(jid)
                    stages += len(job.stageIds) if job is not None else 0
            except Exception:  # noqa: BLE001 - nor a status tracker
                pass
        entry: dict[str, Any] = {
            "epoch": epoch_id,
            "no_data": no_data,
            "driver": dict(clock.phases),
            "total": clock.total(),
            "spark_jobs": len(jobs),
            "spark_stages": stages,
            "tasks": len(results),
            "arrow_sources": list(arrow_sources or []),
            "task": [
                {
                    "vertex": r["vertex"],
                    "index": r["index"],
                    "items_in": r["metrics"].get("items_in", 0),
                    "items_out": r["metrics"].get("items_out", 0),
                    **r["timing"],
                }
                for r in results
                if "timing" in r
            ],
        }
        if closure_bytes is not None:
            entry["closure_bytes"] = closure_bytes
            entry["state_bc_bytes"] = state_bytes
        with self._lock:
            self.epoch_breakdown.append(entry)
            del self.epoch_breakdown[:-_BREAKDOWN_KEEP]


class SparkStreamingJob(_EpochJob):
    """A streaming DAG running as a Structured Streaming query (see the module doc).

    ``join(timeout)`` waits for the query to end (``cancel()`` stops it);
    ``process_all_available()`` blocks until every input available now is processed
    (handy in tests); ``query`` is the ``StreamingQuery``.

    Event time follows Spark (docs/spark.md, "Event time"): the watermark of watermark
    inserters is the whole micro-batch's maximum event time minus the lag, set when the
    epoch's input ends (``Context.micro_batch_watermarks``). A processor fed by the
    inserters takes the highest of their end-of-epoch watermarks once all are in
    (:mod:`slipstream.spark.feed`), so each epoch emits the windows its micro-batch
    closes; the next epoch starts from the vertex's highest watermark of the epochs
    before, which emits what a stage behind the inserters still held. Where Spark runs a no-data batch (at the
    end of an ``availableNow`` run, and before ``processAllAvailable`` returns) the job
    runs a *no-data epoch* if the last epoch left a watermark behind: an epoch without
    rows, committed as a snapshot of its own under the same Spark epoch id, so a window
    is emitted once whatever the job does next. Snapshot ids therefore count committed
    epochs (data and no-data), and an epoch id at or below the newest snapshot's is a
    replay.
    """

    def __init__(
        self,
        engine: JobHost,
        dag: DAG,
        config: JobConfig,
        checkpoint_location: str | None,
        trigger: Mapping[str, Any] | None,
        max_list_items: int | None = DEFAULT_MAX_LIST_ITEMS,
    ) -> None:
        super().__init__(engine, dag, config, checkpoint_location, max_list_items)
        self.sources: dict[str, SparkStreamSource] = {
            v.name: v.meta_supplier
            for v in dag.vertices
            if isinstance(v.meta_supplier, SparkStreamSource)
        }
        if not self.sources:
            raise DagError("a streaming job on Spark needs a spark_stream_source vertex")
        self.source = next(iter(self.sources.values()))
        self.trigger = dict(trigger) if trigger else None
        self.query: Any = None
        # epochs run one at a time: Spark's foreachBatch and a no-data epoch (run from
        # process_all_available or at the end of an availableNow run)
        self._epoch_lock = threading.Lock()

    def _resumed_epoch(self, snapshot_id: int) -> int:
        """Spark's epoch id of snapshot ``snapshot_id`` (read once: the first epoch
        restores from it)."""
        self._prefetched = data = self._read_snapshot(snapshot_id)
        return snapshot_epoch(data, snapshot_id - 1)

    def _epoch_snapshot_id(
        self, epoch_id: int, committed: list[int], latest: Any, no_data: bool
    ) -> int | None:
        """The next snapshot id (ids count committed epochs, no-data epochs included),
        or ``None`` for a replay: a data epoch whose id is not above the newest
        snapshot's, or a no-data epoch with no watermark pending."""
        if latest is None:
            return None if no_data else 1
        if no_data:
            if not snapshot_watermark_pending(latest):
                return None
        elif epoch_id <= snapshot_epoch(latest):
            return None
        return committed[-1] + 1

    def _run_no_data_epoch(self) -> bool:
        """Spark's no-data batch: when the last committed epoch left a watermark pending
        (some split of its micro-batch ended below the batch's watermark), run an epoch
        without rows that starts every processor from the vertex's watermark, emitting
        the windows it closes. Returns whether it ran."""
        with self._epoch_lock:
            if self._cancel_requested or self._watermark_pending is False:
                return False
            sc = self.engine.spark_context
            streams = {
                name: sc.parallelize([], self._plans[name].total_parallelism)
                for name in self.sources
            }
            # the epoch id is the newest snapshot's (read there: after a restart this job
            # may have run no epoch yet)
            return self._run_one_epoch(-1, streams, no_data=True) is not None

    def _ends_with_no_data_epoch(self) -> bool:
        """Whether Spark would run its no-data batch before the query ends or
        ``processAllAvailable`` returns: not with ``trigger={"once": True}``, which runs
        exactly one batch."""
        return not (self.trigger and self.trigger.get("once"))

    def _stop(self) -> None:
        if self.query is not None:
            try:
                self.query.stop()
            except Exception:  # noqa: BLE001 - stopping a failed query may raise
                log.debug("query.stop failed", exc_info=True)

    def process_all_available(self, timeout: float | None = None) -> None:
        """Block until the query has processed all input available now. Raises the
        job's ``JobFailedError`` if an epoch failed."""
        if self.query is None:
            raise RuntimeError(f"job {self.name!r} has no running query")
        done = threading.Event()
        problem: list[BaseException] = []

        def wait() -> None:
            try:
                self.query.processAllAvailable()
                if self._ends_with_no_data_epoch():
                    self._run_no_data_epoch()  # as Spark's no-data batch, before returning
            except BaseException as exc:  # noqa: BLE001 - reported below
                problem.append(exc)
            finally:
                done.set()

        threading.Thread(target=wait, daemon=True).start()
        if not done.wait(timeout):
            raise TimeoutError(f"job {self.name!r}: input not processed within {timeout} s")
        if self._error is not None:
            raise self._error
        if problem:
            raise self._failure(problem[0])

    def _start(self) -> None:
        self._status = JobStatus.STARTING
        try:
            self._prepare()
            writer = (
                self._streaming_df()
                .writeStream.foreachBatch(self._epoch)
                .queryName(f"slipstream-{self.name}")
                .option("checkpointLocation", os.path.join(self.checkpoint_location, "spark"))
            )
            if self.trigger:
                writer = writer.trigger(**self.trigger)
            self._status = JobStatus.RUNNING
            self.query = writer.start()
        except BaseException:
            self._status = JobStatus.FAILED
            self._terminal.set()
            raise
        threading.Thread(
            target=self._watch, name=f"slipstream-stream-{self.name}", daemon=True
        ).start()

    def _watch(self) -> None:
        try:
            self._await_query()
        except BaseException as exc:  # noqa: BLE001 - join() must return, whatever failed
            self._thread_died(exc)

    def _await_query(self) -> None:
        error: BaseException | None = None
        try:
            self.query.awaitTermination()
            if (
                self.trigger
                and self.trigger.get("availableNow")
                and self._error is None
                and not self._cancel_requested
            ):
                # all input processed: Spark's no-data batch emits what the last
                # micro-batch's watermark closes, and so does a no-data epoch
                self._run_no_data_epoch()
        except BaseException as exc:  # noqa: BLE001 - reported through join()
            error = exc
        self.completion_time = time.time()
        if self._services is not None:
            quietly(self._services.unpersist)
        if self._error is not None:
            self._status = JobStatus.FAILED
        elif self._cancel_requested:
            self._status = JobStatus.CANCELLED
        elif error is not None:
            self._error = self._failure(error)
            self._status = JobStatus.FAILED
        else:
            self._status = JobStatus.COMPLETED  # e.g. trigger availableNow
        self._finish_reports()
        self._terminal.set()

    def _epoch(self, batch_df: Any, epoch_id: int) -> None:
        """The ``foreachBatch`` function (runs on the driver)."""
        try:
            with self._epoch_lock:
                if self._cancel_requested:
                    # cancel() came while this batch waited for a no-data epoch: it is
                    # not run (Spark runs it again when the query starts again)
                    raise RuntimeError(f"job {self.name!r} was cancelled")
                self._run_epoch(batch_df, int(epoch_id))
        except Exception as exc:
            if self._cancel_requested:
                raise
            error = self._failure(exc)
            if self._error is None:
                self._error = error
            raise error from error.__cause__

    def _streaming_df(self) -> Any:
        """The query's input: the one source's DataFrame, or all sources' rows in one
        union, each row tagged with its source (``_slipstream_source``) and carried as
        a struct column of its own (``_slipstream_rows_<i>``), so the sources' schemas
        need not match."""
        frames = [meta.streaming_df for meta in self.sources.values()]
        if len(frames) == 1:
            return frames[0]
        from pyspark.sql import functions as F  # noqa: N812

        union = None
        for i, df in enumerate(frames):
            fields = [F.col(f"`{c}`") for c in df.columns]
            tagged = df.select(
                F.lit(i).alias(_SOURCE_COLUMN), F.struct(*fields).alias(f"{_ROWS_COLUMN}{i}")
            )
            union = tagged if union is None else union.unionByName(tagged, allowMissingColumns=True)
        return union

    def _run_epoch(self, batch_df: Any, epoch_id: int) -> None:
        names = list(self.sources)
        if len(names) == 1:
            # the DataFrame itself: compile_dag brings it to the source's parallelism on
            # the JVM, before its rows become Python rows (compile._stream_partitions)
            # and, for a source of a column's values, the plan its rows came from, to
            # make its Arrow batches with no copy of each row (file_splits.micro_batch_plan)
            meta = self.sources[names[0]]
            plan = (
                micro_batch_plan(self.query, epoch_id, meta.streaming_df)
                if meta.items()[0] is not None
                else None
            )
            plans = {names[0]: plan} if plan is not None else None
            self._run_one_epoch(epoch_id, {names[0]: batch_df}, plans=plans)
            return
        from pyspark.sql import functions as F  # noqa: N812

        batch_df.persist()  # each source's share is read from the one micro-batch
        try:
            streams = {
                name: batch_df.where(F.col(_SOURCE_COLUMN) == i)
                .select(f"{_ROWS_COLUMN}{i}")
                .rdd.map(_first_field)
                for i, name in enumerate(names)
            }
            self._run_one_epoch(epoch_id, streams)
        finally:
            quietly(batch_df.unpersist)


#: How many epochs' breakdowns a job keeps.
_BREAKDOWN_KEEP = 100


class _Phases:
    """Wall time of the driver's phases of one epoch (s), in the order they ran."""

    def __init__(self) -> None:
        self._start = self._last = time.perf_counter()
        self.phases: dict[str, float] = {}

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.phases[name] = self.phases.get(name, 0.0) + now - self._last
        self._last = now

    def total(self) -> float:
        return self._last - self._start


def _measure_closures() -> bool:
    """``SLIPSTREAM_EPOCH_BREAKDOWN=1``: also pickle each epoch's task functions once
    more to record their size (``closure_bytes``; costs that pickling)."""
    return os.environ.get("SLIPSTREAM_EPOCH_BREAKDOWN", "") not in ("", "0")


def _closure_bytes(compiled: Any) -> int:
    """The pickled size of the epoch's task functions (what Spark ships per stage)."""
    from slipstream.core.pickling import cloudpickle

    total = 0
    for task in getattr(compiled, "tasks", []):
        total += len(cloudpickle.dumps(task))
    return total


#: An epoch's state (chunk refs, watermarks, the store) up to this many pickled bytes
#: travels in the tasks' closures instead of a broadcast of its own.
INLINE_STATE_BYTES = 64 * 1024


def ship_state(sc: Any, state: dict[str, Any]) -> Any:
    """What the epoch's tasks get as their state: ``state`` itself when it pickles to at
    most :data:`INLINE_STATE_BYTES` (at 10k keys it is ~1.5 KB of chunk refs: a
    broadcast's creation and unpersist cost the driver 0.008 s of a 0.7 s epoch, and
    each task a fetch), else a broadcast of it (the entries an old snapshot's restore
    routes on the driver, a rescale's chunk lists at high parallelism). The tasks read
    either (``slipstream.spark.task._value``)."""
    import pickle

    try:
        small = len(pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)) <= INLINE_STATE_BYTES
    except Exception:  # noqa: BLE001 - cloudpickle (the broadcast's) may still pickle it
        small = False
    return state if small else sc.broadcast(state)


def state_bc_bytes(state: Any) -> int:
    """The pickled size of the epoch's state broadcast."""
    import pickle

    try:
        return len(pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL))
    except Exception:  # noqa: BLE001 - only a figure
        return -1


def _vertex_watermarks(results: list[dict[str, Any]]) -> dict[str, int | None]:
    """Each vertex's watermark at the end of an epoch: its slowest processor's."""
    from slipstream.core.items import MAX_TIMESTAMP, NO_WATERMARK

    per: dict[str, list[int]] = {}
    for r in results:
        lst = per.setdefault(r["vertex"], [])
        wm = (r.get("watermarks") or {}).get("tasklet", {}).get("last_emitted")
        if isinstance(wm, int) and NO_WATERMARK < wm < MAX_TIMESTAMP:
            lst.append(wm)
    return {v: (min(w) if w else None) for v, w in per.items()}


def _watermark_pending(results: list[dict[str, Any]], tasks: list[Any]) -> bool:
    """Whether a no-data epoch would move some processor's watermark: in a Structured
    Streaming job the next epoch starts every watermark inserter from the highest
    watermark of its vertex, and that reaches a consumer whose input on an edge ended
    the epoch below the highest watermark any producer sent on that edge (an isolated
    edge from one split, or a stage whose producers coalesce to the minimum). An edge
    whose consumers took the micro-batch's watermark (slipstream.spark.feed) ends at
    that highest value: nothing is pending there. ``tasks``: the compiled vertices,
    which tell each edge's consumer."""
    top: dict[int, int] = {}  # per edge, the highest watermark any producer sent on it
    for r in results:
        wm = r.get("watermarks")
        if wm is not None:
            for e, v in (wm.get("sent") or {}).items():
                if e not in top or v > top[e]:
                    top[e] = v
    ordinal_of = {
        (t.vertex, spec.edge_id): spec.ordinal for t in tasks for spec in t.inbound
    }
    for r in results:
        wm = r.get("watermarks")
        if wm is None:
            continue
        coalescers = wm.get("edges") or {}
        for e, highest in top.items():
            ordinal = ordinal_of.get((r["vertex"], e))
            if ordinal is None or ordinal not in coalescers:
                continue  # not a consumer of e, or no producer of e feeds it
            if coalescers[ordinal]["last_emitted"] < highest:
                return True
    return False


_SOURCE_COLUMN = "_slipstream_source"
_ROWS_COLUMN = "_slipstream_rows_"


def _first_field(row: Any) -> Any:
    return row[0]


class SparkMicroBatchJob(_EpochJob):
    """A streaming DAG over slipstream's own replayable sources, run as a micro-batch
    loop on the driver (``new_job(dag, config, streaming=True)``; see the module doc).

    Epoch ``k`` restores every processor, sources included, from snapshot ``k`` and runs
    the DAG with each source processor emitting for up to ``epoch_ms`` (or until it
    completes); the sources then save their offsets and every other processor its
    state, and snapshot ``k + 1`` is committed before the sinks' output is delivered.
    Once every source processor has completed, a final run restores the last snapshot
    and completes the DAG as a batch job would (windows flush), and the job completes.
    ``cancel()`` abandons the epoch in progress; a new job started from the same
    ``checkpoint_location`` continues from the last committed epoch (a job whose final
    run committed completes at once).
    """

    _kind = "microbatch-job"

    def __init__(
        self,
        engine: JobHost,
        dag: DAG,
        config: JobConfig,
        checkpoint_location: str | None,
        epoch_ms: float = DEFAULT_EPOCH_MS,
        max_list_items: int | None = DEFAULT_MAX_LIST_ITEMS,
        epoch_max_items: int | None = None,
    ) -> None:
        if epoch_max_items is not None and (
            isinstance(epoch_max_items, bool)
            or not isinstance(epoch_max_items, int)
            or epoch_max_items < 1
        ):
            raise ValueError(
                f"epoch_max_items must be an int >= 1 or None, got {epoch_max_items!r}"
            )
        #: at most about this many items per source processor and epoch (None: epoch_ms only)
        self.epoch_max_items = epoch_max_items
        if (
            isinstance(epoch_ms, bool)
            or not isinstance(epoch_ms, (int, float))
            or not (epoch_ms > 0 and epoch_ms != float("inf"))
        ):
            raise ValueError(f"epoch_ms must be a finite number > 0, got {epoch_ms!r}")
        super().__init__(engine, dag, config, checkpoint_location, max_list_items)
        self.epoch_ms = float(epoch_ms)
        sources = [v for v in dag.vertices if not dag.inbound_edges(v)]
        spark = [
            v.name
            for v in sources
            if isinstance(v.meta_supplier, (SparkStreamSource, SparkRowSource))
        ]
        if spark:
            raise DagError(
                f"source vertices {spark}: a micro-batch job (streaming=True) reads "
                "slipstream's own replayable sources only (for a Spark streaming DataFrame "
                "use spark_stream_source without streaming=True)"
            )
        self._source_names = {v.name for v in sources}
        self._thread: threading.Thread | None = None
        self._finished = False

    def _start(self) -> None:
        from pyspark import InheritableThread

        self._status = JobStatus.STARTING
        try:
            self._prepare()
        except BaseException:
            self._status = JobStatus.FAILED
            self._terminal.set()
            raise
        self._thread = InheritableThread(
            target=self._loop, name=f"slipstream-microbatch-{self.name}"
        )
        self._thread.daemon = True
        self._thread.start()

    def _sources_done(self, results: list[dict[str, Any]]) -> bool:
        return all(
            r.get("source_done", False) for r in results if r["vertex"] in self._source_names
        )

    def _loop(self) -> None:
        error: BaseException | None = None
        try:
            with self._lock:
                if self._cancel_requested:
                    return
                self._status = JobStatus.RUNNING
            committed = self.store.committed_ids()
            latest = committed[-1] if committed else 0
            if latest and snapshot_finished(self._read_snapshot(latest)):
                log.info("job %s: already finished at snapshot %d", self.name, latest)
                self._finished = True
                return
            while not self._cancel_requested:
                results = self._run_one_epoch(latest, epoch_ms=self.epoch_ms)
                latest += 1
                if results is not None and self._sources_done(results):
                    if not self._cancel_requested:
                        self._run_one_epoch(latest, final=True)
                        self._finished = True
                    return
        except BaseException as exc:  # noqa: BLE001 - reported through join()
            error = exc
        finally:
            self._finish_or_die(error)

    def _finish(self, error: BaseException | None) -> None:
        self.completion_time = time.time()
        if self._services is not None:
            quietly(self._services.unpersist)
        if self._finished:
            self._status = JobStatus.COMPLETED
        elif self._cancel_requested:
            self._status = JobStatus.CANCELLED
        else:
            assert error is not None
            self._error = self._failure(error)
            self._status = JobStatus.FAILED
        self._finish_reports()
        self._terminal.set()
