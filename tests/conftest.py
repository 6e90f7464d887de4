"""Fixtures shared by every test directory: real servers for the connector tests.

Snapshot signing keys go to a private key directory under the checkout's
``.slipstream`` (inherited by subprocesses), not into the user's home. It persists
like the default snapshot stores under ``.slipstream/snapshots`` that some tests use,
so a later test session can still verify (and take over) those stores."""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator

import pytest

from slipstream.devservers import KafkaBroker, PostgresServer, kafka_broker, postgres_server

os.environ["SLIPSTREAM_KEY_DIR"] = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".slipstream", "test-keys"
)
# Tests that ask for cooperative_threads=2 mean it: real concurrency between worker
# threads (races, a stuck processor next to a working one), which a GIL build otherwise
# clamps to one thread (tests/engine/test_gil_threads.py tests the clamp itself).
os.environ["SLIPSTREAM_ALLOW_GIL_THREADS"] = "1"


#: after a test, a full collection once the suite's process grew this much since the last
GROWTH_KB = 256 * 1024
_after_last_collection = [0]


def _rss_kb() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    """A full collection once the process grew by 256 MB since the last one. Finished
    jobs' state used to stay in reference cycles until a full collection, which a suite
    of small jobs seldom triggers: the process grew to 1.7 GB in a full run, and every
    fork (the forked snapshot writer, compaction children, member processes) then copies
    its page tables, which made the fork-writer tests up to ten times slower than alone.
    An ended execution now lets go of its state (engine/ended.py): tests/engine alone
    peaked at 2,536 MB without this and 562 MB since (216 MB at its end), and this
    collection then hardly ever runs; it stays for what is still freed only by a
    collection (a test's pipeline and the input its sources hold, Spark's objects). A
    collection after every test above a fixed size cost more than it saved (a full
    collection of the suite's heap after each of ~1,900 tests: 1,072 s against 885 s)."""
    rss = _rss_kb()
    if rss > _after_last_collection[0] + GROWTH_KB:
        gc.collect()
        _after_last_collection[0] = _rss_kb()


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """One private PostgreSQL cluster on 127.0.0.1 for the whole test session."""
    with postgres_server() as server:
        yield server


@pytest.fixture(scope="session")
def kafka() -> Iterator[KafkaBroker]:
    """One Kafka-compatible broker (Tansu, memory only) on 127.0.0.1 for the session."""
    with kafka_broker() as broker:
        yield broker
