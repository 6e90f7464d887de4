"""Garbage-collector settings while embedded jobs run.

CPython's cyclic collector runs a collection every 700 net container allocations and,
every so often, a full one that walks every tracked object. A dataflow job allocates
chunks and results at a high rate while the input data, the plan and the processors
stay alive throughout, so full collections keep re-walking millions of objects that
cannot be garbage. Measured on the windowing benchmark: about a third of the run time.

While at least one job runs (with ``tune_gc`` on, the default) the engine therefore
(1) freezes the objects alive at each job's start, after its processors' ``init``
(``gc.freeze``: they are left out of collections; they are unfrozen when the last job
ends), and (2) raises the first collection threshold so young collections are fewer and
larger. Both are undone when the last running job of the process ends. Reference cycles
created before a job started are collected only after the last running job ends.

Freezing at *every* job's start, not only the first one's, matters for keyed state: a
processor's :class:`~slipstream.state.keyed.KeyedState` is a ``dict`` subclass, which
the collector never untracks (it does so only for exact dicts of atomic values), so a
full collection visits every entry of it: about 0.16 s for 10M keys, holding the GIL,
wherever it falls (a snapshot's pause among others). Made in ``init``, the map is frozen
with its job, whether another job was running already or not.
"""

from __future__ import annotations

import gc
import threading

_lock = threading.Lock()
_running = 0
_saved: tuple[int, ...] | None = None

JOB_THRESHOLD = (10_000, 20, 20)


def job_started() -> None:
    global _running, _saved
    with _lock:
        _running += 1
        if _running == 1:
            _saved = gc.get_threshold()
            gc.set_threshold(*JOB_THRESHOLD)
        gc.freeze()  # this job's plan, processors and keyed-state maps (see above)


def job_ended() -> None:
    global _running, _saved
    with _lock:
        if _running == 0:
            return
        _running -= 1
        if _running == 0:
            gc.unfreeze()
            if _saved is not None:
                gc.set_threshold(*_saved)
            _saved = None
