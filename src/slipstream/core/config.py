"""Job configuration and job states."""

from __future__ import annotations

import enum
import math
import os
import sys
from dataclasses import dataclass, field
from typing import Any

#: where keyed processors keep their state (``JobConfig.state_backend``)
STATE_BACKENDS = ("memory", "sqlite")
#: how a full save of keyed state is encoded and written (``JobConfig.snapshot_writer``)
SNAPSHOT_WRITERS = ("thread", "fork")


def check_state_backend(value: Any, where: str) -> str:
    """``value`` if it names a state backend, else a ValueError naming ``where``."""
    if not isinstance(value, str) or value not in STATE_BACKENDS:
        raise ValueError(
            f"{where}: state_backend must be one of "
            f"{', '.join(map(repr, STATE_BACKENDS))}, got {value!r}"
        )
    return value


def check_idle_spin_ms(value: Any) -> float:
    """``value`` if it is a finite number of milliseconds >= 0 (``JobConfig.idle_spin_ms``),
    else a ValueError that says what it must be."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
    ):
        raise ValueError(
            "JobConfig: idle_spin_ms must be a finite number of milliseconds >= 0 (how long "
            f"an idle worker keeps polling before it sleeps; 0 = never), got {value!r}"
        )
    return float(value)


class ProcessingGuarantee(enum.Enum):
    """What a job promises about its state after a failure.

    ``NONE``: no snapshots, a restarted job starts from scratch. ``AT_LEAST_ONCE``:
    snapshots without barrier alignment (items past a barrier may be replayed).
    ``EXACTLY_ONCE``: aligned snapshots, state reflects every item exactly once.
    """

    NONE = "none"
    AT_LEAST_ONCE = "at_least_once"
    EXACTLY_ONCE = "exactly_once"


class JobStatus(enum.Enum):
    """A job's lifecycle (Jet 0.7+ names). Terminal: COMPLETED, FAILED, CANCELLED."""

    NOT_RUNNING = "not_running"
    STARTING = "starting"
    RUNNING = "running"
    SUSPENDED = "suspended"
    RESTARTING = "restarting"
    COMPLETING = "completing"
    FAILED = "failed"
    CANCELLED = "cancelled"
    COMPLETED = "completed"

    @property
    def is_terminal(self) -> bool:
        return self in (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED)


@dataclass
class JobConfig:
    """Settings of one job.

    ``snapshot_store`` is a directory path (or a store object) for snapshots; ``None``
    means a directory under the engine's work dir (``snapshots/<name>`` for a named job).
    A store belongs to one submission of a job: ``resume=True`` continues from the
    store's newest committed snapshot if there is one (and starts fresh otherwise);
    without it a store holding another submission's unfinished snapshots is refused.
    ``snapshot_key`` signs the snapshot files (default: ``$SLIPSTREAM_SNAPSHOT_KEY``, else
    a random key per store kept in a private key directory).

    A resume never publishes again what the store's job already published: resuming
    from an older snapshot than the newest one committed in the store (a store restored
    from a backup, its newest snapshot and manifest removed) raises
    ``SnapshotStoreRolledBackError``; ``allow_rollback=True`` resumes all the same and
    accepts that replay (a warning says so). A store resumed with ``resume=True`` must
    have been written by a job of the same name, and a snapshot is restored only into
    the same DAG (vertex names and edges; parallelism may change);
    ``allow_job_change=True`` takes over another job's store or a changed DAG.

    ``max_restarts`` bounds automatic restarts after a processor failure when
    ``auto_restart`` is on; the n-th restart in a row waits ``restart_delay_ms * 2**(n-1)``
    (at most ``restart_delay_max_ms``; a committed snapshot resets the count). After
    ``max_snapshot_failures`` consecutive snapshots that could not be written the job
    fails (until then sources pause, so held-back output stays bounded); so it does at
    its end, under exactly-once, when its final snapshot cannot be written (its last
    output stays uncommitted: a ``resume`` writes it once).

    ``validate_keys``: a partitioned edge into a single processor does not need its key
    function, so it calls it only on the first item of each chunk (a key function that
    fails on every item fails the job at parallelism 1 too); ``True`` calls it on every
    item, so that a key function failing on some items fails the same way at any
    parallelism. It costs a Python call per item on such edges (docs/performance.md).

    ``batch_watermarks``: in a *batch* job (every source bounded: items, lists, files, SQL
    queries, Spark DataFrames) watermark inserters hold their watermarks back by default
    (``False``), as Spark's and Flink's batch modes ignore watermarks: no item is late, and
    the windows, emitted when the input ends, hold every item, as if the input had been
    sorted by time. Memory then holds every window until the end. ``True`` lets
    watermarks flow as in a stream (windows emitted as the input advances, memory bounded
    by the open windows): items behind the watermark are then dropped, counted
    (``late_items_dropped``) and reported in a warning, as in every streaming job.

    ``on_item_error``: what a vertex does when user code raises on an item. ``"fail"``
    (default): the job fails, naming the vertex and the item. ``"skip"``: the item is
    dropped and the job goes on. A sink (a sink supplier such as
    ``sinks.list_sink("bad")`` or ``sinks.write_jsonl("bad/")``, or a sink vertex of
    the DAG): the item is dropped and a :class:`~slipstream.core.item_errors.DeadLetter`
    (vertex, item, error, source) goes to that sink, through the DAG (snapshots cover
    it: exactly once under an exactly-once job). Skipped items are counted per vertex
    (``items_skipped``) and reported in a rate-limited warning. It applies to the
    vertices whose processors handle item errors (map, filter, flat_map, the Pipeline's
    fused stages, service calls, aggregations' key and accumulate functions,
    ``map_stateful``, ``rolling_aggregate``; docs/fault-tolerance.md); a vertex's own
    setting (``Vertex.on_item_error``, ``Stage.on_item_error``) overrides it.

    ``sink_outage_timeout`` (seconds): how long a sink keeps retrying a commit that its
    server refuses or does not answer (a transient error: connection lost, server
    restarting) before the job fails naming the sink, the server and the cause (or
    restarts under ``auto_restart``). A warning is logged at the first failed attempt.

    The progress watchdog: a snapshot not committed ``stall_warning_s`` seconds after it
    was requested is reported in a WARNING (and ``job.watch()["error"]``, the dashboard,
    ``metrics["__job__"]["snapshot_stalled_s"]``) naming what it waits for: the
    processors that have not saved it, with their state (``COMMIT_FINISH``: a sink
    committing; ``PROCESS_INBOX``: a processor busy with its input), or the store write.
    After ``stall_timeout_s`` the job fails with ``SnapshotStalledError`` (a restart
    under ``auto_restart`` starts again from the last committed snapshot); ``None``
    never fails for that. Output is committed only with snapshots, so a stalled
    snapshot means no output, whatever the sources still read.

    ``state_backend``: where keyed processors (rolling aggregates, ``map_stateful``,
    keyed aggregations) keep their per-key state. ``"memory"`` (default, the fast path):
    a dict. ``"sqlite"``: a SQLite database per processor in a private directory under
    the engine's work dir (``<work_dir>/state``), behind a cache of the hot keys, so a
    job's state may outgrow its memory; the files are removed when the job ends. A
    vertex's own ``Vertex.state_backend(...)`` overrides it (docs/fault-tolerance.md,
    "State backends").

    ``snapshot_writer``: how a processor's *full* save of in-memory keyed state is
    written (exactly-once or at-least-once, incremental store). ``"thread"`` (default):
    the processor copies its maps at the barrier and the coordinator's store thread
    encodes and writes them (the encoding holds the GIL the processors need).
    ``"fork"`` (opt-in, POSIX only): the processor's thread forks at the barrier and the
    child process encodes that processor's state from its copy-on-write view, writes its
    chunk file and exits; the store thread waits for it and commits the manifest. The
    pause is the fork's (no copy), the encoding takes no GIL of the job; the child's
    memory is the pages the job changes while it writes plus those it touches
    (``snapshot_writer_peak_rss_kb`` in ``job.metrics['__job__']``). Deltas are written
    by the store thread either way.

    ``fuse_vertices`` (default ``True``): a ``P.map``, ``P.filter`` or ``P.flat_map``
    vertex whose one member-local edge is the only input of the next vertex (isolated
    between equal local parallelism, or one processor on each side per member; a
    cooperative consumer) runs inside that vertex's tasklet, with
    no queue between the two: word count's ``tokenize`` -> ``accumulate`` hop cost ~20 %
    of its CPU (docs/performance.md). Metrics, errors and snapshots still name both
    vertices as in the DAG. ``False`` (or ``SLIPSTREAM_FUSE_VERTICES=0`` in the
    environment) runs every vertex in tasklets of its own, for an A/B comparison.

    ``idle_spin_ms`` (embedded engine; opt-in, default 0): for this long after its last
    progress a cooperative worker keeps polling its tasklets (and its channels' sockets,
    with member processes) in a tight loop, yielding the CPU between passes, before it
    starts its normal back-off of sleeps; any progress starts the window again. It
    trades CPU for latency, as Jet's low-latency idle strategy settings do: an item that
    arrives within the window, from another member process above all, is taken without
    waiting for a sleeping worker to be woken and scheduled, but a stream that trickles
    keeps a core busy per member process (docs/guide.md, "Low latency: idle_spin_ms";
    the figures in docs/performance.md). The workers' idle passes are counted in
    ``job.metrics["__job__"]``: ``idle_spin_passes`` (polled in the window) and
    ``idle_pauses`` (followed by a sleep).
    """

    name: str | None = None
    processing_guarantee: ProcessingGuarantee = ProcessingGuarantee.NONE
    snapshot_interval_ms: int = 10_000
    auto_restart: bool = True
    snapshot_store: Any = None
    max_restarts: int = 3
    resume: bool = False
    snapshot_key: bytes | str | None = field(default=None, repr=False)
    max_snapshot_failures: int = 3
    restart_delay_ms: float = 100.0
    restart_delay_max_ms: float = 10_000.0
    validate_keys: bool = False
    allow_rollback: bool = False
    allow_job_change: bool = False
    batch_watermarks: bool = False
    on_item_error: Any = "fail"
    sink_outage_timeout: float = 120.0
    stall_warning_s: float = 30.0
    stall_timeout_s: float | None = 600.0
    state_backend: str = "memory"
    snapshot_writer: str = "thread"
    fuse_vertices: bool = True
    idle_spin_ms: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.processing_guarantee, ProcessingGuarantee):
            raise ValueError(
                f"processing_guarantee must be a ProcessingGuarantee, got {self.processing_guarantee!r}"
            )
        if self.snapshot_interval_ms <= 0:
            raise ValueError(f"snapshot_interval_ms must be > 0, got {self.snapshot_interval_ms}")
        if self.max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0, got {self.max_restarts}")
        if self.max_snapshot_failures < 1:
            raise ValueError(f"max_snapshot_failures must be >= 1, got {self.max_snapshot_failures}")
        from slipstream.core.item_errors import check_policy

        check_policy(self.on_item_error, "JobConfig")
        check_state_backend(self.state_backend, "JobConfig")
        if self.snapshot_writer not in SNAPSHOT_WRITERS:
            raise ValueError(
                f"JobConfig: snapshot_writer must be one of "
                f"{', '.join(map(repr, SNAPSHOT_WRITERS))}, got {self.snapshot_writer!r}"
            )
        if self.snapshot_writer == "fork" and not hasattr(os, "fork"):
            raise ValueError(
                "JobConfig: snapshot_writer='fork' needs os.fork, which this platform "
                f"({sys.platform}) does not have; use snapshot_writer='thread'"
            )
        check_idle_spin_ms(self.idle_spin_ms)
        if not self.sink_outage_timeout > 0:
            raise ValueError(
                f"sink_outage_timeout must be > 0 seconds, got {self.sink_outage_timeout!r}"
            )
        if not self.stall_warning_s > 0:
            raise ValueError(f"stall_warning_s must be > 0 seconds, got {self.stall_warning_s!r}")
        if self.stall_timeout_s is not None and not self.stall_timeout_s >= self.stall_warning_s:
            raise ValueError(
                f"stall_timeout_s must be None or >= stall_warning_s ({self.stall_warning_s}), "
                f"got {self.stall_timeout_s!r}"
            )
        if self.restart_delay_ms < 0 or self.restart_delay_max_ms < self.restart_delay_ms:
            raise ValueError(
                "need 0 <= restart_delay_ms <= restart_delay_max_ms, got "
                f"{self.restart_delay_ms} and {self.restart_delay_max_ms}"
            )
