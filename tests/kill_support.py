"""How many seeds the member-kill tests run (issue 24 asks for >= 20 per sink once, not
at every suite run).

``SLIPSTREAM_KILL_SEEDS=N`` runs seeds ``0 .. N-1``; ``SLIPSTREAM_KILL_SEEDS=3,7,12``
runs those seeds; unset, each test runs its few default seeds so the suite stays cheap.
Run one sink at a time, e.g.
``SLIPSTREAM_KILL_SEEDS=20 pytest -m slow -k 'killed and files' tests/engine/test_process_snapshots.py``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from slipstream import JobStatus

ENV = "SLIPSTREAM_KILL_SEEDS"


def kill_seeds(default: list[int]) -> list[int]:
    """The seeds a kill test runs: ``default`` unless ``SLIPSTREAM_KILL_SEEDS`` names
    a count or a comma-separated list (a bad value fails naming the variable)."""
    given = os.environ.get(ENV, "").strip()
    if not given:
        return list(default)
    try:
        if "," in given:
            return [int(s) for s in given.split(",") if s.strip()]
        return list(range(int(given)))
    except ValueError:
        raise ValueError(f"{ENV}={given!r}: expected a count (20) or seeds (3,7,12)") from None


def kill_point(job: Any, committed: int, source: str, n: int) -> Callable[[], bool]:
    """Whether a kill test's job reached its kill point: ``committed`` snapshots taken,
    or (a loaded machine takes fewer snapshots in the job's run) its source ``source``
    emitted two thirds of its ``n`` items, so the job still runs when the test kills."""

    def reached() -> bool:
        m = job.metrics
        return bool(
            m["__job__"]["snapshots"] >= committed
            or m.get(source, {}).get("items_out", 0) >= 2 * n // 3
            or job.status is not JobStatus.RUNNING
        )

    return reached
