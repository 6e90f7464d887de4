"""Job configuration and job states."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any


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
    means a directory under the engine's work dir. ``max_restarts`` bounds automatic
    restarts after a processor failure when ``auto_restart`` is on.
    """

    name: str | None = None
    processing_guarantee: ProcessingGuarantee = ProcessingGuarantee.NONE
    snapshot_interval_ms: int = 10_000
    auto_restart: bool = True
    snapshot_store: Any = None
    max_restarts: int = 3

    def __post_init__(self) -> None:
        if not isinstance(self.processing_guarantee, ProcessingGuarantee):
            raise ValueError(
                f"processing_guarantee must be a ProcessingGuarantee, got {self.processing_guarantee!r}"
            )
        if self.snapshot_interval_ms <= 0:
            raise ValueError(f"snapshot_interval_ms must be > 0, got {self.snapshot_interval_ms}")
        if self.max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0, got {self.max_restarts}")
