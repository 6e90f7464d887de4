"""Rescaling across restores of keyed state spread over several snapshots (issue 22):
a job's state is built by a base step that touches every key and then steps that each
touch a few hot keys (with incremental snapshots: a base and deltas), then it is
restored with another local parallelism, on two members, and back on one; the output is
exact and every restore restores what a full snapshot of the same moment holds (checked
by incremental_support.run_scenario at each stop)."""

from __future__ import annotations

import random
from typing import Any

import incremental_support as inc
import pytest

from slipstream.state.keyed import DELTA, FULL
from slipstream.window import KeyedWindowResult


@pytest.fixture(autouse=True, params=["thread", "fork", "live"])
def writer(request: Any, monkeypatch: Any) -> str:
    """Every scenario with both snapshot writers (``JobConfig.snapshot_writer``), and
    with the thread writer's copy-on-write saves (state/live.py) for every map whose
    values are replaced, however small, produced two entries per step."""
    return inc.use_writer(monkeypatch, str(request.param))


def spread_items(rnd: random.Random, kind: str, n_keys: int) -> tuple[list[inc.Item], list[int]]:
    """A base segment over every key, then ten segments of 15 items over 3 hot keys each
    (different ones each time); returns the items and the segment ends."""
    keys = list(range(n_keys))
    items: list[inc.Item] = []
    ts = 0
    for k in keys:  # the base: every key once
        ts += 1
        items.append((k, rnd.randint(1, 9), ts))
    ends = [len(items)]
    for _ in range(10):
        hot = rnd.sample(keys, 3)
        for _ in range(15):
            ts += rnd.choice((0, 1, 2, 9))
            value = rnd.randint(-2, 9) if kind == "custom" else rnd.randint(0, 9)
            items.append((rnd.choice(hot), value, ts))
        ends.append(len(items))
    return inc.with_tails(items, True), ends


RESCALE_KINDS = ("rolling_sum", "rolling_list", "map_stateful", "tumbling", "sliding", "session", "custom")
#: the kinds the experimental fork writer runs this scenario with. Its path does not
#: depend on the processor: at the barrier a keyed map of any kind is handed over itself
#: (KeyedState._full / the live delta in _new_entry) and the snapshot forks a child that
#: encodes its copy-on-write view (engine/snapshot.py _fork_writer), whatever the values
#: are. A window kind whose closed sessions remove keys, and the Core API processor that
#: deletes keys and checks which saves were deltas. test_incremental_differential.py
#: takes a rolling sum, map_stateful, the aggregate and tumbling windows through every
#: stop with the fork writer, and its random scenarios draw every kind (this scenario
#: cost ~40 s a kind at load 20 with the fork writer, which forks the test process for
#: each processor at each save).
FORK_KINDS = ("session", "custom")


@pytest.mark.parametrize(
    ("writer", "kind"),
    [
        (w, k)
        for w in ("thread", "fork", "live")
        for k in RESCALE_KINDS
        if w != "fork" or k in FORK_KINDS
    ],
    indirect=["writer"],
)
def test_state_over_several_snapshots_restores_at_other_parallelism_and_members(
    tmp_path: Any, writer: str, kind: str
) -> None:
    rnd = random.Random(2200)
    items, ends = spread_items(rnd, kind, 300)
    executions = [
        # base + 3 steps of hot keys, each followed by committed snapshots
        inc.Execution(members=1, keyed_lp=1, gates=ends[0:4], extra=1, stop="cancel"),
        # restored from the store with local parallelism 3; 2 more steps
        inc.Execution(members=1, keyed_lp=3, gates=ends[4:6], stop="export"),
        # a snapshot object restored on two members, 2 threads' worth of processors each
        inc.Execution(members=2, keyed_lp=2, gates=ends[6:8], stop="cancel", new_store=True),
        # back on one member with one processor
        inc.Execution(members=1, keyed_lp=1, gates=ends[8:10], stop="inflight"),
        inc.Execution(members=2, keyed_lp=1, gates=ends[10:]),
    ]
    got = inc.run_scenario(kind, items, executions, str(tmp_path))
    assert got.output == inc.oracle_output(kind, items)
    assert len(got.stops) == 4
    # the stops' snapshots are chains of a base and deltas (the state was spread over
    # several snapshots), so the restores merged them
    assert sum(got.deltas) >= 1, got.deltas
    if kind == "custom":
        # the state spread over several snapshots: with incremental snapshots the saves
        # after the first of each execution are deltas of the hot keys (and the memory
        # state tracks changes exactly then); without, every save is full
        tracked = {t for t, _ in got.saves}
        assert len(tracked) == 1, got.saves
        if tracked == {True}:
            assert got.saves[(True, DELTA)] >= 4, got.saves
        else:
            assert set(got.saves) == {(False, FULL)}, got.saves


def test_window_on_two_members_whose_sources_are_at_other_event_times_suspends_and_resumes(
    tmp_path: Any,
) -> None:
    """The first stage of a window runs on every member behind a local edge, so on two
    members its processors see their own member's watermarks: at a snapshot their
    emission cursors differ whenever the members' sources are at different event times
    (a watermark of 10 on one member, none yet on the other). On main the restore refused
    that as "exactly-once snapshot is inconsistent: processors saved different emission
    cursor values (16 and -9223372036854775808)", so such a job could not be suspended and
    resumed (nor restarted after a failure); stage 1 flushes its frames at every
    snapshot, so the minimum of the cursors is right, as for a fused watermark inserter."""
    items = [("k0", 3, 2), ("k0", 1, 10), ("k1", 1, 2), ("k0", 5, 11), ("k1", 2, 12)]
    executions = [
        # k0's items reach event time 10 on one member while k1's processor waits at 2
        inc.Execution(members=2, keyed_lp=1, gates=[2], stop="suspend"),
        inc.Execution(members=2, keyed_lp=1, gates=[3], stop="cancel"),
        inc.Execution(members=1, keyed_lp=2, gates=[]),
    ]
    got = inc.run_scenario("tumbling", items, executions, str(tmp_path))
    assert got.output == inc.oracle_output("tumbling", items)
    assert sorted(got.output.elements()) == [
        KeyedWindowResult(0, 8, "k0", 3),
        KeyedWindowResult(0, 8, "k1", 1),
        KeyedWindowResult(8, 16, "k0", 6),
        KeyedWindowResult(8, 16, "k1", 2),
    ]
