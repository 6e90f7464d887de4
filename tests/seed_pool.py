"""Run a SIGKILL test's seeds two at a time, each seed still its own test.

A kill test's seed spends most of its wall time waiting, not computing: its job's
generator emits at a fixed rate and the test waits for snapshots or a kill point, so a
seed's processes use well under one core (a kill-compaction seed's first run: 2.2 s of
CPU in 5 s of wall time, load 11). Run one after the other, 20 seeds are 20 times that
wait; run in pairs, half of it, and a 2-core machine still has a core per seed.

``SeedRuns`` starts the scenarios of the module's collected seed tests (only those
selected: ``-k``/``-m``/``-x`` work as before) on two background threads when the first
of them runs; each seed's test then waits for its own scenario and re-raises what it
raised, so every seed keeps its test id, its pass or fail and its traceback. A scenario
must keep to its own directory, processes and (for a shared server) its own table."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest

#: scenarios run at once: a pair (two cores; each seed uses well under one)
WORKERS = 2


class SeedRuns:
    """The background runs of one test function's parametrised scenarios."""

    def __init__(
        self,
        request: pytest.FixtureRequest,
        scenario: Callable[..., None],
        workers: int = WORKERS,
    ) -> None:
        self._scenario = scenario
        self._factory: pytest.TempPathFactory = request.getfixturevalue("tmp_path_factory")
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix=request.fixturename)
        self._futures: dict[tuple[tuple[str, Any], ...], Future[None]] = {}
        self._lock = threading.Lock()
        for item in request.session.items:  # the tests selected, in the order they run
            if getattr(item, "module", None) is request.module and request.fixturename in getattr(
                item, "fixturenames", ()
            ):
                self._submit(dict(item.callspec.params))  # type: ignore[attr-defined]

    def _submit(self, params: dict[str, Any]) -> Future[None]:
        key = tuple(sorted(params.items()))
        with self._lock:
            if key not in self._futures:
                name = "-".join(f"{k}{v}" for k, v in key)
                tmp = self._factory.mktemp(name, numbered=True)
                self._futures[key] = self._pool.submit(self._scenario, tmp, **params)
            return self._futures[key]

    def result(self, **params: Any) -> None:
        """Wait for the scenario of these parameters (started now if it was not
        collected, as when a test is called by hand) and raise what it raised."""
        self._submit(params).result()

    def close(self) -> None:
        """Drop the scenarios not started (a session stopped early) and wait for the
        running ones, whose processes their own ``finally`` kills."""
        self._pool.shutdown(wait=True, cancel_futures=True)


def seed_runs(request: pytest.FixtureRequest, scenario: Callable[..., None]) -> Iterator[SeedRuns]:
    """Body of a module-scoped fixture used by ONE parametrised test function:
    ``yield from seed_runs(request, fn)``; ``fn(tmp_path, **params)`` is one of its
    cases' whole scenario, run for each selected test that uses the fixture."""
    runs = SeedRuns(request, scenario)
    try:
        yield runs
    finally:
        runs.close()

