"""GC settings while jobs run (engine/gc_tuning.py)."""

from __future__ import annotations

import gc
import time

from slipstream.engine import gc_tuning
from slipstream.state.keyed import KeyedState


def _tracked(obj: object) -> bool:
    """Whether a collection would visit ``obj`` (frozen objects are in no generation)."""
    return any(o is obj for o in gc.get_objects())


def _no_job_running(timeout_s: float = 60.0) -> None:
    """Wait until no job of an earlier test is still between its start and its end (a
    cancelled job's threads can outlive its test): the assertions below count jobs."""
    deadline = time.monotonic() + timeout_s
    while gc_tuning._running and time.monotonic() < deadline:
        time.sleep(0.01)
    assert gc_tuning._running == 0, f"{gc_tuning._running} job(s) of earlier tests still run"


def test_a_job_started_while_another_runs_has_its_state_frozen_too() -> None:
    """A keyed-state map made while a job runs (the next job's processors' init) is
    frozen when that job starts: a dict subclass is never untracked, and a full
    collection would visit each of its entries (main froze at the first job only)."""
    _no_job_running()
    gc_tuning.job_started()
    try:
        state = KeyedState()
        state.update({i: i for i in range(10)})
        assert _tracked(state)
        gc_tuning.job_started()  # a second job, its processors made above
        try:
            assert not _tracked(state)
        finally:
            gc_tuning.job_ended()
        assert not _tracked(state)  # frozen until the last job ends
    finally:
        gc_tuning.job_ended()
    assert _tracked(state)  # unfrozen with the last job

