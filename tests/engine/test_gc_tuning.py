"""GC settings while jobs run (engine/gc_tuning.py)."""

from __future__ import annotations

import gc

from slipstream.engine import gc_tuning
from slipstream.state.keyed import KeyedState


def _tracked(obj: object) -> bool:
    """Whether a collection would visit ``obj`` (frozen objects are in no generation)."""
    return any(o is obj for o in gc.get_objects())


def test_a_job_started_while_another_runs_has_its_state_frozen_too() -> None:
    """A keyed-state map made while a job runs (the next job's processors' init) is
    frozen when that job starts: a dict subclass is never untracked, and a full
    collection would visit each of its entries (main froze at the first job only)."""
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
