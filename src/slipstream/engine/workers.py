"""Threads that run tasklets: cooperative workers take turns over many tasklets, each
non-cooperative tasklet gets a thread of its own.

Idle strategy: a pass over a worker's tasklets in which none made progress is followed
by a pause that doubles from ~20 µs up to 1 ms; any progress resets it. The pause always
sleeps (never spins) so an idle worker releases the GIL to busy ones.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable, Sequence

from slipstream.engine.tasklet import DONE, MADE_PROGRESS, ProcessorTasklet, _Cancelled

MIN_IDLE_S = 0.00002
MAX_IDLE_S = 0.001


class TaskletFailure:
    """Why an execution failed: a processor's exception (``tasklet`` set) or a
    job-level error such as an unwritable snapshot store (``tasklet`` is ``None``;
    ``restartable`` is ``False`` when a restart cannot help)."""

    def __init__(
        self, tasklet: ProcessorTasklet | None, error: BaseException, restartable: bool = True
    ) -> None:
        self.tasklet = tasklet
        self.error = error
        self.restartable = restartable
        self.traceback = "".join(traceback.format_exception(error))


class WorkerPool:
    """Runs one execution's tasklets until all are done or ``stop()`` is called."""

    def __init__(
        self,
        tasklets: Sequence[ProcessorTasklet],
        cooperative_threads: int,
        on_failure: Callable[[TaskletFailure], None],
        on_finished: Callable[[], None],
        name: str = "job",
    ) -> None:
        self.stopping = False
        self._on_failure = on_failure
        self._on_finished = on_finished
        coop = [t for t in tasklets if t.cooperative]
        noncoop = [t for t in tasklets if not t.cooperative]
        n = max(1, min(cooperative_threads, len(coop))) if coop else 0
        groups: list[list[ProcessorTasklet]] = [[] for _ in range(n)]
        for i, t in enumerate(coop):
            groups[i % n].append(t)
        groups.extend([t] for t in noncoop)
        self._threads = [
            threading.Thread(
                target=self._run, args=(g,), name=f"slipstream-{name}-worker-{i}", daemon=True
            )
            for i, g in enumerate(groups)
        ]
        self._live = len(self._threads)
        self._lock = threading.Lock()

    def start(self) -> None:
        if not self._threads:
            self._on_finished()
            return
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self.stopping = True

    def join(self, timeout: float | None = None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        for t in self._threads:
            if t is threading.current_thread():
                continue
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))

    def _run(self, tasklets: list[ProcessorTasklet]) -> None:
        try:
            idle = 0
            live = list(tasklets)
            sleep = time.sleep
            while live and not self.stopping:
                progress = False
                for t in live:
                    try:
                        r = t.call()
                    except _Cancelled:
                        return
                    except BaseException as e:  # noqa: BLE001 - reported to the job
                        self._on_failure(TaskletFailure(t, e))
                        return
                    if r == MADE_PROGRESS:
                        progress = True
                    elif r == DONE:
                        progress = True
                        live = [x for x in live if x is not t]
                        break
                if progress:
                    idle = 0
                else:
                    idle += 1
                    sleep(min(MAX_IDLE_S, MIN_IDLE_S * (1 << min(idle, 7))))
        finally:
            with self._lock:
                self._live -= 1
                last = self._live == 0
            if last:
                self._on_finished()
