"""``ss.local(processes=N)``: a job's members in N OS processes (issue 24, first slice).

Differential: the same job with processes=2, with processes=1 and a plain-Python oracle
give the same output (word count as the Core API DAG and as a Pipeline, a rolling
aggregate, tumbling windows in a batch and in a streaming job, random DAG shapes).
Failures: a processor's error names its vertex, processor and member; a SIGKILLed
member fails the job naming it (without a processing guarantee; with one,
tests/engine/test_process_snapshots.py).
Tests wait for events (the sink's list filling, the job ending), never for time;
``GUARD_S`` only bounds a test that hangs.
"""

from __future__ import annotations

import functools
import gc
import os
import re
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from engine_test_procs import ListSource, RunningSums

import slipstream as ss
from process_support import functions_by_value
from slipstream import DAG, Edge, JobConfig, sinks, sources
from slipstream import processors as P
from slipstream.aggregate import counting, summing
from slipstream.core.errors import JobCancelledError, JobFailedError
from slipstream.engine import gc_tuning
from slipstream.window import KeyedWindowResult, tumbling_window_def

GUARD_S = 120

WORDS = ["apple", "pear", "fig", "kiwi", "plum", "lime", "date", "yuzu"]


@pytest.fixture(scope="module", autouse=True)
def by_value() -> Iterator[None]:
    """This module's functions, and those of test_engine_random_dags (the random DAG
    test's shapes), travel by value: pickled by reference, each member process imported
    the test module (and pytest or hypothesis with it) at every job."""
    import test_engine_random_dags

    with functions_by_value(sys.modules[__name__], test_engine_random_dags):
        yield


def lines(n: int) -> list[str]:
    return [" ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(i % 5 + 1)) for i in range(n)]


def word_count_oracle(text: list[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for line in text:
        for w in line.split():
            counts[w] = counts.get(w, 0) + 1
    return counts


def identity(x: Any) -> Any:
    return x


def word_count_dag(text: list[str], tokenize: Callable[[str], list[str]] = str.split) -> DAG:
    """The documented Core API word count (DESIGN.md) over ``items``."""
    dag = DAG()
    src = dag.new_vertex("source", sources.items(text))
    tok = dag.new_vertex("tokenize", P.flat_map(tokenize))
    acc = dag.new_vertex("accumulate", P.accumulate_by_key(identity, counting()))
    comb = dag.new_vertex("combine", P.combine_by_key(counting()))
    out = dag.new_vertex("sink", sinks.list_sink("counts")).local_parallelism(1)
    dag.edge(Edge.between(src, tok))
    dag.edge(Edge.between(tok, acc).partitioned(identity))
    dag.edge(Edge.between(acc, comb).distributed().partitioned(ss.entry_key))
    dag.edge(Edge.between(comb, out))
    return dag


def word_count_pipeline(text: list[str]) -> ss.Pipeline:
    p = ss.Pipeline()
    (
        p.read_from(sources.items(text))
        .flat_map(str.split)
        .group_by(identity)
        .aggregate(counting())
        .write_to(sinks.list_sink("counts"))
    )
    return p


def run(job: Any, processes: int, name: str = "counts", **kw: Any) -> list[Any]:
    engine = ss.local(processes=processes, **kw)
    engine.new_job(job).join(timeout=GUARD_S)
    return list(engine.get_list(name))


@pytest.mark.timeout(GUARD_S)
@pytest.mark.parametrize("api", ["dag", "pipeline"])
def test_word_count_with_two_processes_equals_one_process_and_the_oracle(api: str) -> None:
    """The DAG runs its tokenize vertex inside accumulate's tasklets with two processes
    (execution/fusion.py) and in a tasklet of its own with one (fuse_vertices=False):
    the same output and the same figures per vertex, summed over the members."""
    text = lines(1000)
    build: Callable[[list[str]], Any] = word_count_dag if api == "dag" else word_count_pipeline
    jobs = []
    for processes, fuse in ((2, True), (1, False)):
        engine = ss.local(processes=processes)
        job = engine.new_job(build(text), JobConfig(fuse_vertices=fuse))
        job.join(timeout=GUARD_S)
        jobs.append((dict(engine.get_list("counts")), len(engine.get_list("counts")), job))
    (two, n_two, job_two), (one, _, job_one) = jobs
    assert two == one == word_count_oracle(text)
    assert n_two == len(WORDS)  # each word once: combined on one member
    if api == "dag":
        figures = [
            {v: (m["items_in"], m["items_out"]) for v, m in j.metrics.items() if v != "__job__"}
            for j in (job_two, job_one)
        ]
        words = sum(word_count_oracle(text).values())
        assert figures[0]["tokenize"] == figures[1]["tokenize"] == (1000, words)
        assert figures[0]["accumulate"][0] == figures[1]["accumulate"][0] == words


def hold_exit(directory: str) -> None:
    """At a member process's exit: wait until the test writes ``release`` (30 s at
    most, a guard), then note the exit as ``exited-<pid>``."""
    release = os.path.join(directory, "release")
    deadline = time.monotonic() + 30
    while not os.path.exists(release) and time.monotonic() < deadline:
        time.sleep(0.01)
    open(os.path.join(directory, f"exited-{os.getpid()}"), "w").close()


def split_holding_exit(directory: str, line: str) -> list[str]:
    """``str.split``; the first call in a process makes its exit wait (:func:`hold_exit`)."""
    from multiprocessing import util

    if not getattr(util, "_slipstream_test_hold", False):
        util._slipstream_test_hold = True  # type: ignore[attr-defined]
        util.Finalize(None, hold_exit, args=(directory,), exitpriority=0)
    return line.split()


@pytest.mark.timeout(GUARD_S)
def test_join_returns_once_every_members_output_arrived_not_at_their_exit(tmp_path: Any) -> None:
    """A member's ``done`` (its last report, with the last list sink items and its
    metrics) ends its part of the job: ``join()`` does not wait for its process's exit
    (held here until the test releases it; on 54ed7d0 join waited for it, so both
    members had exited, after the 30 s guard, when it returned). The output is complete
    and the metrics are summed over the members all the same."""
    text = lines(1000)
    engine = ss.local(processes=2)
    job = engine.new_job(word_count_dag(text, functools.partial(split_holding_exit, str(tmp_path))))
    try:
        job.join(timeout=GUARD_S)
        assert sorted(os.listdir(tmp_path)) == []  # both members still in their exit
        assert job.status is ss.JobStatus.COMPLETED
        assert dict(engine.get_list("counts")) == word_count_oracle(text)
        m = job.metrics
        assert m["source"]["items_out"] == len(text)
        assert m["tokenize"]["items_in"] == len(text)
        assert m["tokenize"]["items_out"] == sum(len(t.split()) for t in text)
        assert m["sink"]["items_in"] == len(WORDS)
        job_figures = m["__job__"]
        assert job_figures["restarts"] == 0 and job_figures["processes"] == 2
        assert 0 < job_figures["member_cpu_ms_max"] <= job_figures["member_cpu_ms_total"]
        assert job_figures["member_peak_rss_kb_total"] > 0
    finally:
        open(tmp_path / "release", "w").close()
    procs = job._execution._procs
    # each member's listener thread joins its process: wait for those threads, and do
    # not join the processes here as well. A forkserver child's exit status is read
    # once from its sentinel; a second thread reading at the same time gets EOF, and
    # multiprocessing then records exit code 255 (seen once on a loaded machine)
    for t in threading.enumerate():
        if t.name.startswith(f"slipstream-{job.name}-member") and t.name.endswith("-listener"):
            t.join(GUARD_S)
    assert [p.exitcode for p in procs] == [0, 0]
    assert sorted(os.listdir(tmp_path)) == sorted(["release"] + [f"exited-{p.pid}" for p in procs])


def group(x: int) -> int:
    return x % 13


@pytest.mark.timeout(GUARD_S)
def test_a_rolling_aggregate_matches_one_process_and_the_oracle() -> None:
    data = [(i * 37) % 101 for i in range(2000)]

    def pipeline() -> ss.Pipeline:
        p = ss.Pipeline()
        (
            p.read_from(sources.items(data))
            .group_by(group)
            .rolling_aggregate(summing(identity))
            .write_to(sinks.list_sink("rolling"))
        )
        return p

    # per key the running sums depend on the order the key's items arrive in, which
    # differs between runs with several source processors: the last (the total) per key
    # and the count of results do not
    expected: dict[int, int] = {}
    for x in data:
        expected[group(x)] = expected.get(group(x), 0) + x
    for processes in (2, 1):
        out = run(pipeline(), processes, "rolling")
        assert len(out) == len(data)
        final: dict[int, int] = {}
        for k, v in out:
            final[k] = max(final.get(k, 0), v)
        assert final == expected, processes


class CsvSum(RunningSums):
    """bench/wordcount.py's running sum of ``key,value`` lines: ``(key, running sum)``
    per line."""

    def split(self, line: Any) -> tuple[str, int]:
        k, v = line.split(",", 1)
        return k, int(v)


def csv_key(line: str) -> str:
    return line.split(",", 1)[0]


@pytest.mark.timeout(GUARD_S)
@pytest.mark.parametrize("guarantee", ["none", "exactly_once"])
def test_a_running_sum_into_a_map_sink_matches_one_process_and_the_oracle(guarantee: str) -> None:
    """The CSV running sum of bench/processes.py (a user's processor -> map sink, whose
    puts a member marks per key for the coordinator: TrackedDict.put_pairs): each key's
    last put, its total, is what the coordinator's map holds with processes=2, as with
    processes=1 and in the oracle; under exactly-once the staged batches are published
    the same way (a snapshot every 10 ms while the job runs, the rest at completion)."""
    data = [f"k{i * 7919 % 300},{i % 100}" for i in range(30_000)]
    expected: dict[str, int] = {"kept": -1}
    for line in data:
        k, v = line.split(",")
        expected[k] = expected.get(k, 0) + int(v)
    config = JobConfig(name="running-sum")
    if guarantee == "exactly_once":
        config = JobConfig(
            name="running-sum",
            processing_guarantee=ss.ProcessingGuarantee.EXACTLY_ONCE,
            snapshot_interval_ms=10,
        )
    for processes in (2, 1):
        dag = DAG()
        src = dag.new_vertex("read", sources.items(data))
        rs = dag.new_vertex("running-sum", CsvSum)
        out = dag.new_vertex("sink", sinks.map_sink("sums"))
        dag.edge(Edge.between(src, rs).distributed().partitioned(csv_key))
        dag.edge(Edge.between(rs, out).partitioned(ss.entry_key))
        engine = ss.local(processes=processes)
        engine.get_map("sums")["kept"] = -1
        engine.new_job(dag, config).join(timeout=GUARD_S)
        assert dict(engine.get_map("sums")) == expected, processes


def test_a_bad_pair_into_a_members_map_sink_fails_the_job_naming_it() -> None:
    """A map sink's inbox of tuples takes a member's fast path (TrackedDict.put_pairs):
    a tuple that is not a pair still fails the job naming the vertex and the item."""
    p = ss.Pipeline()
    p.read_from(sources.items([("a", 1), ("b", 2, 3), ("c", 4)])).write_to(sinks.map_sink("m"))
    job = ss.local(processes=2).new_job(p, JobConfig(name="pairs"))
    bad = r"map_sink\('m'\) needs \(key, value\) tuples, got \('b', 2, 3\)"
    with pytest.raises(JobFailedError, match=bad):
        job.join(timeout=GUARD_S)


def event_time(item: tuple[int, int]) -> int:
    return item[0]


def key_of(item: tuple[int, int]) -> int:
    return item[1]


def windows_oracle(data: list[tuple[int, int]], size: int) -> Counter[Any]:
    out: Counter[tuple[int, int, int]] = Counter()
    for ts, k in data:
        start = ts - ts % size
        out[(start, start + size, k)] += 1
    return Counter({KeyedWindowResult(s, e, k, n): 1 for (s, e, k), n in out.items()})


def windowed(source: Any, size: int) -> ss.Pipeline:
    p = ss.Pipeline()
    (
        p.read_from(source)
        .with_timestamps(event_time, 0)
        .group_by(key_of)
        .window(tumbling_window_def(size))
        .aggregate(counting())
        .write_to(sinks.list_sink("windows"))
    )
    return p


@pytest.mark.timeout(GUARD_S)
def test_tumbling_windows_of_a_batch_job_match_one_process_and_the_oracle() -> None:
    data = [(i * 3, i % 5) for i in range(2000)]
    two = run(windowed(sources.items(data), 100), 2, "windows")
    one = run(windowed(sources.items(data), 100), 1, "windows")
    assert Counter(two) == Counter(one) == windows_oracle(data, 100)


def ts_item(seq: int) -> tuple[int, int]:
    return (seq, seq % 5)


@pytest.mark.timeout(GUARD_S)
def test_tumbling_windows_of_a_streaming_job_match_the_oracle() -> None:
    """A generator (a streaming source: watermarks flow while it runs) of a bounded
    number of items: every window closes on a watermark or at the end."""
    n = 3000
    data = [ts_item(i) for i in range(n)]
    two = run(windowed(sources.generator(ts_item, None, max_items=n), 50), 2, "windows")
    one = run(windowed(sources.generator(ts_item, None, max_items=n), 50), 1, "windows")
    assert Counter(two) == Counter(one) == windows_oracle(data, 50)


def wait_for(cond: Callable[[], bool], what: str) -> None:
    """Wait for an event (``cond`` true); the deadline only bounds a hang."""
    deadline = time.monotonic() + GUARD_S / 2
    while not cond():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.01)


def endless() -> ss.Pipeline:
    p = ss.Pipeline()
    (
        p.read_from(sources.generator(identity, 2000))
        .group_by(group)
        .rolling_aggregate(counting())
        .write_to(sinks.list_sink("live"))
    )
    return p


@pytest.mark.timeout(GUARD_S)
def test_a_streaming_jobs_output_reaches_the_coordinator_while_it_runs_and_cancel_stops_members() -> None:
    engine = ss.local(processes=2)
    job = engine.new_job(endless(), JobConfig(name="live"))
    out = engine.get_list("live")
    # both members' rolling counts arrive while the job runs (keys 0..12 are split
    # over the two members' processors)
    wait_for(lambda: len({k for k, _ in list(out)}) == 13, "every key's count")
    assert job.status is ss.JobStatus.RUNNING
    watched = job.watch()  # what the dashboard reads
    assert watched["parallelism"] == {
        "source": 2,
        "rolling_aggregate": 2,
        "sink": 2,
    }, watched["parallelism"]
    assert "error" not in watched
    # the coordinator gathers the members' output with the job's collector settings, as
    # a one-process job runs (engine/gc_tuning.py), and gives them back at the end
    assert gc.get_threshold() == gc_tuning.JOB_THRESHOLD
    ex = job._execution
    assert ex._gc_tuned
    job.cancel()
    with pytest.raises(JobCancelledError):
        job.join(timeout=GUARD_S)
    assert all(p.exitcode is not None for p in ex._procs)
    assert job.status is ss.JobStatus.CANCELLED
    assert not ex._gc_tuned


def square_pair(x: int) -> tuple[int, int]:
    return (x, x * x)


class Rated(ss.AbstractProcessor):
    """``(x, x * rate)`` with ``rate`` read from the engine's named map ``rates`` when the
    processor starts (a user processor that reads a named structure)."""

    def init_processor(self, context: ss.Context) -> None:
        self.rate = context.get_map("rates")["x"]

    def try_process_item(self, ordinal: int, item: Any) -> bool:
        return self.try_emit((item, item * self.rate))


@pytest.mark.timeout(GUARD_S)
def test_a_list_source_and_a_map_sink_use_the_coordinators_structures() -> None:
    """A list_source reads the coordinator's list, a map sink and a list sink add to the
    coordinator's map and list (what they held stays), a processor reads a named map.
    Nothing of the engine's named lists and maps travels with the job: a member gets its
    list_source processors' shares, the map its processor reads, nothing of the lists
    and maps its sinks write or of the 200,000-item list no processor reads (on main
    every member got all of them with the job: its setup held the big list)."""
    import pickle

    engine = ss.local(processes=2)
    engine.get_list("input").extend(range(1000))
    big = list(range(200_000))
    engine.get_list("big").extend(big)
    engine.get_map("sums").update({"kept": -1})
    engine.get_list("rated").extend(["kept"] * 5000)
    engine.get_map("rates")["x"] = 3
    dag = DAG()
    src = dag.new_vertex("input", sources.list_source("input"))
    rate = dag.new_vertex("rate", Rated)
    rated = dag.new_vertex("rated", sinks.list_sink("rated"))
    sq = dag.new_vertex("square", P.map(square_pair))
    sums = dag.new_vertex("sums", sinks.map_sink("sums"))
    dag.edge(Edge.between(src, rate)).edge(Edge.between(rate, rated))
    dag.edge(Edge.from_(src, 1).to(sq).distributed()).edge(Edge.between(sq, sums))
    job = engine.new_job(dag)
    job.join(timeout=GUARD_S)
    assert dict(engine.get_map("sums")) == {"kept": -1, **{x: x * x for x in range(1000)}}
    rated = engine.get_list("rated")
    assert rated[:5000] == ["kept"] * 5000
    assert sorted(rated[5000:]) == [(x, 3 * x) for x in range(1000)]
    assert engine.get_list("big") == big
    ex = job._execution
    shipped = len(ex._payload)
    assert shipped * 20 < len(pickle.dumps(big)), shipped  # the job, not the list
    # each member got the shares of its two list_source processors and the one map
    whole = len(pickle.dumps(list(range(1000))))
    assert sorted(ex.named_bytes) == [0, 1]
    for m, sent in ex.named_bytes.items():
        assert whole * 0.4 < sent < whole * 0.75, (m, sent, whole)


class FailOnMember(ss.AbstractProcessor):
    """Passes items on; on member 1 it raises at its first item."""

    def try_process_item(self, ordinal: int, item: Any) -> bool:
        if self.context.member_index == 1:
            raise ValueError(f"bad item {item!r}")
        return self.try_emit(item)


def seven_is_bad(x: int) -> int:
    if x == 7:
        raise ValueError(f"bad item {x!r}")
    return x


@pytest.mark.timeout(GUARD_S)
@pytest.mark.parametrize("raiser", ["consumer", "producer"])
def test_a_processor_error_names_the_vertex_the_processor_and_the_member(raiser: str) -> None:
    """Also when the vertex runs fused with another in one tasklet (execution/fusion.py):
    ``boom`` has a ``P.map`` fused in front of it (``consumer``), or is a ``P.map`` fused
    into the sink (``producer``: member 1's source processor has the 7s)."""
    dag = DAG()
    if raiser == "consumer":
        src = dag.new_vertex("source", functools.partial(ListSource, [7] * 10))
        pre = dag.new_vertex("pre", P.map(identity)).local_parallelism(1)
        boom = dag.new_vertex("boom", FailOnMember).local_parallelism(1)
        dag.edge(Edge.between(src.local_parallelism(1), pre).distributed())
        dag.edge(Edge.between(pre, boom))
        where, frame = "ValueError: bad item 7", "in try_process_item"
    else:
        src = dag.new_vertex("source", functools.partial(ListSource, [0, 7] * 5))
        boom = dag.new_vertex("boom", P.map(seven_is_bad)).local_parallelism(1)
        dag.edge(Edge.between(src.local_parallelism(1), boom))
        where, frame = "on item 7: ValueError: bad item 7", "in seven_is_bad"
    dag.edge(Edge.between(boom, dag.new_vertex("sink", sinks.noop())))
    engine = ss.local(processes=2)
    job = engine.new_job(dag, JobConfig(name="fails"))
    with pytest.raises(JobFailedError) as e:
        job.join(timeout=GUARD_S)
    assert str(e.value).split("\n")[0] == (
        f"job 'fails' failed: vertex 'boom', processor 1, member 1, {where}"
        if raiser == "producer"
        else f"job 'fails' failed: vertex 'boom', processor 1, member 1: {where}"
    )
    assert e.value.vertex == "boom" and e.value.processor_index == 1
    assert isinstance(e.value.cause, ValueError)
    assert frame in (e.value.remote_traceback or "")


@pytest.mark.slow
@pytest.mark.timeout(GUARD_S)
def test_a_member_killed_with_sigkill_fails_the_job_naming_it() -> None:
    engine = ss.local(processes=2)
    job = engine.new_job(endless(), JobConfig(name="killed"))
    out = engine.get_list("live")
    wait_for(lambda: len(out) > 100, "the job's output")
    pid = job._execution._procs[1].pid
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(JobFailedError) as e:
        job.join(timeout=GUARD_S)
    assert str(e.value).split("\n")[0] == (
        f"job 'killed' failed: MemberFailedError: member 1 (pid {pid}) died (killed by "
        "SIGKILL) before the job ended; its processors' work is lost: a job without a "
        "processing guarantee has no snapshot to restart from, so the job fails"
    )
    assert job.status is ss.JobStatus.FAILED
    assert all(p.exitcode is not None for p in job._execution._procs)


def test_processes_auto_is_the_usable_cores_and_bad_values_are_refused() -> None:
    assert ss.local(processes="auto").process_count == len(os.sched_getaffinity(0))
    assert ss.local(processes=3).member_count == 3
    with pytest.raises(ValueError, match=r'processes must be an int >= 1 or "auto", got 0'):
        ss.local(processes=0)
    with pytest.raises(ValueError, match="members=3 and processes=2"):
        ss.local(members=3, processes=2)


@pytest.mark.timeout(GUARD_S)
def test_code_a_member_cannot_import_is_named(tmp_path: Any) -> None:
    """A function from a module loaded from its path (not importable by name) travels by
    reference: the member cannot load it, and the error says what to do."""
    import importlib.util
    import sys

    path = tmp_path / "job_code.py"
    path.write_text("def double(x):\n    return 2 * x\n")
    spec = importlib.util.spec_from_file_location("slipstream_test_job_code", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["slipstream_test_job_code"] = module
    spec.loader.exec_module(module)
    try:
        p = ss.Pipeline()
        p.read_from(sources.items([1, 2])).map(module.double).write_to(sinks.list_sink("x"))
        job = ss.local(processes=2).new_job(p, JobConfig(name="unloadable"))
        with pytest.raises(JobFailedError) as e:
            job.join(timeout=GUARD_S)
    finally:
        del sys.modules["slipstream_test_job_code"]
    first = str(e.value).split("\n")[0]
    assert first.startswith("job 'unloadable' failed: MemberFailedError: member ")
    assert first.endswith(
        ": ModuleNotFoundError: the job's code cannot be loaded in member process "
        f"{first.split('member ')[1][0]}: No module named 'slipstream_test_job_code'. A module "
        "the DAG's functions come from must be importable there by name (on the sys.path "
        "the coordinator has when the job starts, which each member takes), or registered with "
        "cloudpickle.register_pickle_by_value(module) to travel by value (as __main__'s "
        "functions do)"
    )


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_random_dags_with_two_processes_match_the_oracle() -> None:
    """tests/engine/test_engine_random_dags.py's shapes (map/filter/flat_map vertices,
    cooperative or not, fan-in, every routing, local and distributed edges, queue sizes,
    outbox capacity 1) on two member processes: each sink's items equal the oracle's
    (and so processes=1's, which that test checks against the same oracle)."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
    from test_engine_random_dags import build, dags, oracle

    @settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(spec=dags(), capacity=st.sampled_from([1, 2048]))
    def check(spec: dict[str, Any], capacity: int) -> None:
        spec["members"] = 2
        dag, sink_names = build(spec)
        engine = ss.local(processes=2, outbox_capacity=capacity)
        engine.new_job(dag).join(timeout=60)
        expected = oracle(spec)
        for name in sink_names:
            assert Counter(engine.get_list(f"out-{name}")) == expected[name], name

    check()


def test_members_that_cannot_be_started_fail_the_job(monkeypatch: pytest.MonkeyPatch) -> None:
    import slipstream.engine.processes as processes

    def refuse(process: Any) -> None:
        raise OSError("no more processes")

    monkeypatch.setattr(processes, "_start_without_main", refuse)
    job = ss.local(processes=2).new_job(word_count_dag(["a b"]), JobConfig(name="unstarted"))
    with pytest.raises(JobFailedError) as e:
        job.join(timeout=GUARD_S)
    assert str(e.value).split("\n")[0] == "job 'unstarted' failed: OSError: no more processes"
    assert job.status is ss.JobStatus.FAILED


@pytest.mark.slow
@pytest.mark.timeout(GUARD_S)
def test_ctrl_c_in_a_member_leaves_the_decision_to_the_coordinator() -> None:
    """SIGINT (Ctrl-C reaches the members too) does not kill a member: both keep
    producing (every key's count grows past what it was at the signal), and cancel()
    then ends the job cancelled, not failed."""
    engine = ss.local(processes=2)
    job = engine.new_job(endless(), JobConfig(name="interrupted"))
    out = engine.get_list("live")
    wait_for(lambda: len({k for k, _ in list(out)}) == 13, "every key's count")
    for p in job._execution._procs:
        os.kill(p.pid, signal.SIGINT)
    at_signal: dict[int, int] = {}
    for k, n in list(out):
        at_signal[k] = max(at_signal.get(k, 0), n)

    def all_grew() -> bool:
        now: dict[int, int] = {}
        for k, n in list(out):
            now[k] = max(now.get(k, 0), n)
        return all(now[k] > at_signal[k] + 5 for k in at_signal)

    wait_for(all_grew, "every key's count to grow after the signal")
    job.cancel()
    with pytest.raises(JobCancelledError):
        job.join(timeout=GUARD_S)


def make_lock(x: Any) -> Any:
    import threading

    return threading.Lock()


@pytest.mark.timeout(GUARD_S)
def test_sink_output_that_cannot_reach_the_coordinator_fails_the_job_naming_the_sink() -> None:
    p = ss.Pipeline()
    p.read_from(sources.items(range(4))).map(make_lock).write_to(sinks.list_sink("locks"))
    job = ss.local(processes=2).new_job(p, JobConfig(name="locks"))
    with pytest.raises(JobFailedError) as e:
        job.join(timeout=GUARD_S)
    first = str(e.value).split("\n")[0]
    assert re.fullmatch(
        r"job 'locks' failed: MemberFailedError: member (0|1) \(pid \d+\): TypeError: member "
        r"\1: the output of the list/map sink\(s\) 'locks' cannot be pickled to reach the "
        r"coordinator process \(TypeError: cannot pickle '_thread.lock' object\)",
        first,
    ), first


def test_a_members_state_dir_is_one_path_part_under_the_work_dir(tmp_path: Any) -> None:
    """A member's disk-state directory is named like the local job's (engine/workers.
    execution_state_dir): a job name with a path separator stays one directory under
    ``<work_dir>/state`` (a member used the raw name: 'a/b' made 'state/a/b-member1-...',
    and removing the leaf left 'state/a' behind)."""
    from slipstream.engine.workers import execution_state_dir

    local = execution_state_dir(str(tmp_path), "a/b ../c")
    member = execution_state_dir(str(tmp_path), "a/b ../c", 1)
    for path, prefix in ((local, "a_b_.._c-"), (member, "a_b_.._c-member1-")):
        assert os.path.dirname(path) == os.path.join(str(tmp_path), "state")
        assert os.path.basename(path).startswith(prefix)


def environ_value(x: int) -> tuple[int, str | None, int, str | None, str]:
    """``x``, the variable the test sets, this process's id, the mark a job with another
    value of it left in this process (``None``: none) and its working directory."""
    from multiprocessing import util

    value = os.environ.get("SLIPSTREAM_TEST_LATER")
    mark = f"a job with {value!r} ran here"
    before = getattr(util, "_slipstream_test_mark", mark)
    util._slipstream_test_mark = mark  # type: ignore[attr-defined]
    return x, value, os.getpid(), None if before == mark else before, os.getcwd()


@pytest.mark.slow
@pytest.mark.timeout(GUARD_S)
def test_a_later_job_takes_fresh_spare_members_that_see_the_environment_of_its_start(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """After a job, the engine forks the next job's members ahead (spares,
    engine/member_spares.py): the next job takes them, each a process no job ran in
    before (nothing of the first job is there), with the coordinator's environment
    variables and working directory of the job's start, not of the fork; a spare killed
    while it waits is replaced; ``shutdown()`` stops the spares."""
    engine = ss.local(processes=2)
    p = ss.Pipeline()
    p.read_from(sources.items(range(4))).map(environ_value).write_to(sinks.list_sink("env"))
    first = engine.new_job(p)
    first.join(timeout=GUARD_S)  # the forkserver runs now, whatever ran before
    assert sorted(r[:2] for r in engine.get_list("env")) == [(i, None) for i in range(4)]
    spares = engine._member_spares  # type: ignore[attr-defined]
    wait_for(lambda: len(spares) == 2, "two spare members")
    waiting = [proc for proc, _ in spares._spares]
    assert not {proc.pid for proc in waiting} & {proc.pid for proc in first._execution._procs}
    os.kill(waiting[0].pid, signal.SIGKILL)
    waiting[0].join(timeout=GUARD_S)
    engine.get_list("env").clear()
    monkeypatch.setenv("SLIPSTREAM_TEST_LATER", "set later")
    monkeypatch.chdir(tmp_path)
    second = engine.new_job(p)
    second.join(timeout=GUARD_S)
    rows = engine.get_list("env")
    assert sorted(r[:2] for r in rows) == [(i, "set later") for i in range(4)]
    assert {r[3:] for r in rows} == {(None, str(tmp_path))}
    members = {proc.pid for proc in second._execution._procs}
    assert waiting[1].pid in members and waiting[0].pid not in members and len(members) == 2
    wait_for(lambda: len(spares) == 2, "two spare members again")
    waiting = [proc for proc, _ in spares._spares]
    engine.shutdown()
    assert len(spares) == 0 and all(proc.exitcode is not None for proc in waiting)


FORKSERVER_PID = """
import threading
from multiprocessing import forkserver
import slipstream as ss
engine = ss.local(processes=2)
for t in threading.enumerate():
    if t.name == "slipstream-forkserver-start":
        t.join()
print(forkserver._forkserver._forkserver_pid is not None)
"""


@pytest.mark.slow
def test_the_forkserver_starts_with_the_engine_not_the_first_job() -> None:
    """``ss.local(processes=2)`` starts the members' forkserver on a thread of its own, so
    its preload runs beside the script's work up to the first job (docs/performance.md).
    A fresh interpreter: this one's server may be running."""
    import subprocess

    r = subprocess.run(
        [sys.executable, "-c", FORKSERVER_PID],
        capture_output=True,
        text=True,
        timeout=GUARD_S,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "True"


def exit_with(code: int) -> None:
    sys.exit(code)


@pytest.mark.timeout(GUARD_S)
def test_threads_that_reap_one_member_at_once_all_see_its_exit_status() -> None:
    """A forkserver child's exit status is read once from its sentinel: two threads that
    polled it at the same moment (a member's listener and the spares' refill joining the
    same process) made the second see end of file, recorded as status 255, and
    test_join_returns_once_every_members_output_arrived_not_at_their_exit failed with
    ``[0, 255]`` about once in six runs. processes.reap serializes the read."""
    from slipstream.engine.processes import _start_without_main, member_context, reap

    ctx = member_context()
    for round_ in range(8):
        p = ctx.Process(target=exit_with, args=(3,), daemon=True)
        _start_without_main(p)
        go = threading.Barrier(6)
        seen: list[int | None] = []

        def reaper(proc: Any, go: threading.Barrier, seen: list[int | None]) -> None:
            go.wait()
            seen.append(reap(proc, GUARD_S))

        threads = [threading.Thread(target=reaper, args=(p, go, seen)) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(GUARD_S)
        assert seen == [3] * 6, round_
