"""Streaming sources: stream_socket, stream_files, generator (processor-level and on the
embedded engine), including idle marks, cancellation and snapshot/restore."""

from __future__ import annotations

import functools
import os
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import slipstream as ss
from slipstream import sources
from slipstream.core.inbox import Inbox
from slipstream.core.items import IDLE_MESSAGE, Watermark
from slipstream.core.outbox import Outbox
from slipstream.core.partition import stable_hash
from slipstream.core.processor import AbstractProcessor, Context, Processor
from slipstream.sources.streaming import GeneratorP, StreamFilesP, StreamSocketP
from slipstream.state.keys import BroadcastKey

HOST = "127.0.0.1"


# ---------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------


def wait_until(pred: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.005)


class Collect(AbstractProcessor):
    """Test sink: appends ``(ordinal, item)`` and ``("wm", ts)`` to a named list."""

    def __init__(self, name: str, with_ordinal: bool = False) -> None:
        self.name = name
        self.with_ordinal = with_ordinal

    def init_processor(self, context: Context) -> None:
        self.out = context.get_list(self.name)

    def try_process_item(self, ordinal: int, item: Any) -> bool:
        self.out.append((ordinal, item) if self.with_ordinal else item)
        return True

    def try_process_watermark(self, watermark: Watermark) -> bool:
        self.out.append(("wm", watermark.timestamp))
        return True


class WatermarkingSource(AbstractProcessor):
    """Emits two items with watermarks 10 and 20, then "end", then streams nothing."""

    def init_processor(self, context: Context) -> None:
        self._it = iter(["a0", Watermark(10), "a1", Watermark(20), "end"])

    def complete(self) -> bool:
        self.emit_from(self._it)
        return False


class LineServer:
    """A TCP server on 127.0.0.1 (port 0) that runs ``handler(conn)`` per connection in
    its own thread; everything is bounded and joined by ``close()``."""

    def __init__(self, handler: Callable[[socket.socket], None], max_conns: int = 8) -> None:
        self.handler = handler
        self.sock = socket.create_server((HOST, 0))
        self.sock.settimeout(0.05)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._max = max_conns
        self._acceptor = threading.Thread(target=self._accept, daemon=True)
        self._acceptor.start()

    def _accept(self) -> None:
        while not self._stop.is_set() and self.accepted < self._max:
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted += 1
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(t)
            t.start()

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(10)
        try:
            self.handler(conn)
        except BaseException as e:  # noqa: BLE001 - reported by close()
            self.errors.append(e)
        finally:
            conn.close()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def close(self) -> None:
        self._stop.set()
        self._acceptor.join(5)
        for t in self._threads:
            t.join(5)
        self.sock.close()
        assert not self._acceptor.is_alive()
        assert not any(t.is_alive() for t in self._threads)

    def __enter__(self) -> LineServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def sending(chunks: list[bytes], pause: float = 0.0) -> Callable[[socket.socket], None]:
    def handler(conn: socket.socket) -> None:
        for c in chunks:
            conn.sendall(c)
            if pause:
                time.sleep(pause)

    return handler


def init_processor(
    p: Processor, index: int = 0, parallelism: int = 1, capacity: int = 1024
) -> Outbox:
    outbox = Outbox(1, capacity)
    p.init(
        outbox,
        Context(vertex_name="v", global_processor_index=index, local_processor_index=index,
                local_parallelism=parallelism, total_parallelism=parallelism),
    )
    return outbox


def take(outbox: Outbox) -> list[Any]:
    """Move what the processor emitted out of the outbox (the engine's flush)."""
    b = outbox.buckets[0]
    out = list(b)
    b.clear()
    return out


def run_calls(p: Processor, outbox: Outbox, calls: int) -> list[Any]:
    out: list[Any] = []
    for _ in range(calls):
        p.complete()
        out.extend(take(outbox))
    return out


def run_to_completion(p: Processor, outbox: Outbox, max_calls: int) -> list[Any]:
    """Call complete() until it returns True (failing after ``max_calls`` calls); returns
    what the processor emitted."""
    out: list[Any] = []
    calls = 0
    while not p.complete():
        out += take(outbox)
        calls += 1
        assert calls < max_calls
    out += take(outbox)
    return out


def lines_oracle(text: str) -> list[str]:
    """What a line reader yields for ``text``: split on \\n, a final unterminated line
    counts, a trailing \\r is dropped."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [ln[:-1] if ln.endswith("\r") else ln for ln in lines]


def split_bytes(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in zip(points, points[1:], strict=False) if b > a]


# ---------------------------------------------------------------------------------------
# stream_socket
# ---------------------------------------------------------------------------------------


line_text = st.lists(
    st.text(alphabet=st.sampled_from("ab é€\r\U0001f600"), max_size=6), max_size=12
).map("\n".join)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=line_text, trailing_newline=st.booleans(), cuts=st.lists(st.integers(0, 200)))
def test_stream_socket_processor_emits_lines_across_any_chunking(
    text: str, trailing_newline: bool, cuts: list[int]
) -> None:
    if trailing_newline:
        text += "\n"
    data = text.encode("utf-8")
    with LineServer(sending(split_bytes(data, cuts), pause=0.001)) as server:
        p = StreamSocketP(HOST, server.port, idle_timeout_ms=None)
        outbox = init_processor(p, capacity=2)
        out: list[Any] = []
        deadline = time.monotonic() + 10
        try:
            while not p.complete():
                out.extend(take(outbox))
                assert time.monotonic() < deadline, "stream_socket did not complete"
            out.extend(take(outbox))
        finally:
            p.close()
    assert out == lines_oracle(text)


def test_stream_socket_on_engine_keeps_order_and_completes_when_server_closes() -> None:
    lines = [f"line {i} ünï" for i in range(5000)]
    data = "".join(ln + "\n" for ln in lines).encode()
    with LineServer(sending(split_bytes(data, list(range(0, len(data), 777))))) as server:
        dag = ss.DAG()
        src = dag.new_vertex("src", sources.stream_socket(HOST, server.port))
        sink = dag.new_vertex("sink", functools.partial(Collect, "sock-lines")).local_parallelism(1)
        dag.edge(ss.Edge.between(src, sink))
        engine = ss.local()
        job = engine.new_job(dag)
        job.join(timeout=10)
        assert job.status is ss.JobStatus.COMPLETED
        assert engine.get_list("sock-lines") == lines
        assert server.accepted == 1


def test_stream_socket_reads_with_one_processor_whatever_the_parallelism() -> None:
    lines = [str(i) for i in range(300)]
    with LineServer(sending(["\n".join(lines).encode()])) as server:
        dag = ss.DAG()
        src = dag.new_vertex("src", sources.stream_socket(HOST, server.port)).local_parallelism(3)
        sink = dag.new_vertex("sink", functools.partial(Collect, "one-reader")).local_parallelism(1)
        dag.edge(ss.Edge.between(src, sink))
        engine = ss.local(members=2)
        job = engine.new_job(dag)
        job.join(timeout=10)
        assert sorted(engine.get_list("one-reader"), key=int) == lines
        assert server.accepted == 1


def test_stream_socket_defaults_to_local_parallelism_one() -> None:
    meta = sources.stream_socket(HOST, 9)
    assert meta.preferred_local_parallelism() == 1


def test_cancel_stops_stream_socket_blocked_on_a_silent_server() -> None:
    closed = threading.Event()

    def silent(conn: socket.socket) -> None:
        # never sends; returns when the client closes its end
        conn.settimeout(0.05)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if conn.recv(1) == b"":
                    closed.set()
                    return
            except TimeoutError:
                continue

    with LineServer(silent) as server:
        dag = ss.DAG()
        src = dag.new_vertex("src", sources.stream_socket(HOST, server.port))
        sink = dag.new_vertex("sink", functools.partial(Collect, "silent")).local_parallelism(1)
        dag.edge(ss.Edge.between(src, sink))
        job = ss.local().new_job(dag)
        wait_until(lambda: server.accepted == 1, what="the source to connect")
        time.sleep(0.1)
        assert job.status is ss.JobStatus.RUNNING
        job.cancel()
        with pytest.raises(ss.JobCancelledError):
            job.join(timeout=3)
        assert closed.wait(5), "close() did not close the source's socket"


def test_stream_socket_refused_connection_names_host_and_port() -> None:
    holder = socket.socket()
    holder.bind((HOST, 0))  # bound but not listening: connecting is refused
    port = holder.getsockname()[1]
    try:
        dag = ss.DAG()
        src = dag.new_vertex("src", sources.stream_socket(HOST, port))
        sink = dag.new_vertex("sink", functools.partial(Collect, "refused")).local_parallelism(1)
        dag.edge(ss.Edge.between(src, sink))
        job = ss.local().new_job(dag)
        with pytest.raises(ss.JobFailedError) as ei:
            job.join(timeout=10)
        assert f"{HOST}:{port}" in str(ei.value)
        assert isinstance(ei.value.cause, ConnectionError)
    finally:
        holder.close()


def test_stream_socket_marks_itself_idle_once_and_resumes_on_data() -> None:
    go = threading.Event()
    finish = threading.Event()

    def late(conn: socket.socket) -> None:
        go.wait(10)
        conn.sendall(b"hello\n")
        finish.wait(10)

    with LineServer(late) as server:
        p = StreamSocketP(HOST, server.port, idle_timeout_ms=0)
        outbox = init_processor(p)
        try:
            out = run_calls(p, outbox, 3)  # each call waits <= 50 ms for data
            assert out == [IDLE_MESSAGE]
            go.set()
            deadline = time.monotonic() + 10
            while "hello" not in out:
                p.complete()
                out.extend(take(outbox))
                assert time.monotonic() < deadline
            out.extend(run_calls(p, outbox, 3))
            assert out == [IDLE_MESSAGE, "hello", IDLE_MESSAGE]
        finally:
            finish.set()
            p.close()


def test_stream_socket_argument_errors() -> None:
    with pytest.raises(ValueError, match="port"):
        sources.stream_socket(HOST, 0)
    with pytest.raises(ValueError, match="encoding 'nope'"):
        sources.stream_socket(HOST, 80, encoding="nope")
    with pytest.raises(ValueError, match="idle_timeout_ms"):
        sources.stream_socket(HOST, 80, idle_timeout_ms=-1)


# ---------------------------------------------------------------------------------------
# stream_files
# ---------------------------------------------------------------------------------------


def files_processor(directory: Any, index: int = 0, parallelism: int = 1, capacity: int = 1024,
                    idle_timeout_ms: float | None = None) -> tuple[StreamFilesP, Outbox]:
    p = sources.stream_files(str(directory), poll_interval_ms=0, idle_timeout_ms=idle_timeout_ms)()
    assert isinstance(p, StreamFilesP)
    return p, init_processor(p, index, parallelism, capacity)


def drain(p: Processor, outbox: Outbox, quiet_calls: int = 5) -> list[Any]:
    """Call complete() until it emitted nothing for ``quiet_calls`` calls in a row."""
    out: list[Any] = []
    quiet = 0
    for _ in range(100_000):
        p.complete()
        got = take(outbox)
        out.extend(got)
        quiet = 0 if got else quiet + 1
        if quiet >= quiet_calls:
            return out
    raise AssertionError("the source never went quiet")


def append(path: Any, data: str | bytes) -> None:
    with open(path, "ab") as f:
        f.write(data.encode() if isinstance(data, str) else data)


def test_stream_files_reads_existing_then_new_files_and_appended_lines(tmp_path: Any) -> None:
    append(tmp_path / "a.txt", "a1\na2\n")
    append(tmp_path / "skip.log", "not matched\n")
    p = sources.stream_files(str(tmp_path), "*.txt", poll_interval_ms=0, idle_timeout_ms=None)()
    outbox = init_processor(p)
    assert drain(p, outbox) == ["a1", "a2"]
    append(tmp_path / "a.txt", "a3\npart")
    assert drain(p, outbox) == ["a3"]  # the partial line is held back
    append(tmp_path / "a.txt", "ial\r\n")
    append(tmp_path / "b.txt", "b1\n\nb3\n")
    assert sorted(drain(p, outbox)) == sorted(["partial", "b1", "", "b3"])
    assert drain(p, outbox) == []
    p.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    text=line_text,
    cuts=st.lists(st.integers(0, 300), max_size=8),
    capacity=st.integers(1, 4),
)
def test_stream_files_emits_complete_lines_however_the_file_grows(
    tmp_path_factory: Any, text: str, cuts: list[int], capacity: int
) -> None:
    d = tmp_path_factory.mktemp("grow")
    path = d / "f.txt"
    path.write_bytes(b"")
    p, outbox = files_processor(d, capacity=capacity)
    out: list[Any] = []
    written = b""
    for chunk in split_bytes(text.encode(), cuts):
        append(path, chunk)
        written += chunk
        out.extend(drain(p, outbox, quiet_calls=3))
        # exactly the complete lines written so far, never a partial one
        complete_text = written[: written.rfind(b"\n") + 1].decode()
        assert out == lines_oracle(complete_text)
    p.close()


def test_stream_files_with_long_lines_and_a_shrinking_file(tmp_path: Any) -> None:
    long_line = "x" * 100_000
    append(tmp_path / "f", long_line + "\nshort\n")
    p, outbox = files_processor(tmp_path)
    assert drain(p, outbox) == [long_line, "short"]
    (tmp_path / "f").write_bytes(b"new\n")  # replaced by a shorter file
    assert drain(p, outbox) == ["new"]


def test_stream_files_splits_files_over_processors_by_identity_hash(tmp_path: Any) -> None:
    names = [f"file{i}.txt" for i in range(20)]
    expected = []
    for n in names:
        lines = [f"{n}:{j}" for j in range(5)]
        expected += lines
        append(tmp_path / n, "".join(ln + "\n" for ln in lines))
    outs = []
    for i in range(2):
        p, outbox = files_processor(tmp_path, index=i, parallelism=2)
        out = drain(p, outbox)
        for line in out:
            st = os.stat(tmp_path / line.split(":")[0])
            assert stable_hash((st.st_dev, st.st_ino)) % 2 == i
        outs += out
    assert sorted(outs) == sorted(expected)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    files=st.lists(st.lists(st.text(alphabet="xyz", max_size=4), max_size=30), min_size=1, max_size=5),
    before=st.integers(1, 4),
    after=st.integers(1, 4),
    capacity=st.integers(1, 7),
    calls=st.integers(0, 40),
)
def test_stream_files_restore_with_other_parallelism_emits_every_line_once(
    tmp_path_factory: Any, files: list[list[str]], before: int, after: int, capacity: int,
    calls: int,
) -> None:
    d = tmp_path_factory.mktemp("snap")
    expected = []
    for k, lines in enumerate(files):
        tagged = [f"{k}|{ln}" for ln in lines]
        expected += tagged
        append(d / f"f{k}", "".join(t + "\n" for t in tagged))
    # first run: a few calls each, then a snapshot (possibly in the middle of a batch)
    emitted: list[Any] = []
    entries: list[tuple[Any, Any]] = []
    for i in range(before):
        p, outbox = files_processor(d, i, before, capacity)
        emitted += run_calls(p, outbox, calls)
        while not p.save_to_snapshot():
            entries += outbox.snapshot_bucket
            outbox.snapshot_bucket.clear()
        entries += outbox.snapshot_bucket
        p.close()
    assert all(type(k) is BroadcastKey for k, _ in entries)
    # second run with another parallelism: every processor gets every (broadcast) entry
    for i in range(after):
        p, outbox = files_processor(d, i, after, capacity)
        inbox = Inbox(entries)
        p.restore_from_snapshot(inbox)
        assert not inbox
        assert p.finish_snapshot_restore()
        emitted += drain(p, outbox)
        p.close()
    assert Counter(emitted) == Counter(expected)


def test_stream_files_idle_mark_once_then_data_then_idle_again(tmp_path: Any) -> None:
    p, outbox = files_processor(tmp_path, idle_timeout_ms=0)
    assert run_calls(p, outbox, 5) == [IDLE_MESSAGE]
    append(tmp_path / "f", "x\n")
    assert run_calls(p, outbox, 5) == ["x", IDLE_MESSAGE]


def test_stream_files_on_engine_parallelism_two_each_line_exactly_once(tmp_path: Any) -> None:
    append(tmp_path / "early.txt", "e1\ne2\n")
    dag = ss.DAG()
    src = dag.new_vertex("src", sources.stream_files(str(tmp_path), poll_interval_ms=5))
    src.local_parallelism(2)
    sink = dag.new_vertex("sink", functools.partial(Collect, "files2")).local_parallelism(1)
    dag.edge(ss.Edge.between(src, sink))
    engine = ss.local()
    job = engine.new_job(dag)
    got = engine.get_list("files2")
    try:
        wait_until(lambda: len(got) >= 2, what="the lines of the existing file")
        expected = ["e1", "e2"]
        for i in range(10):
            lines = [f"n{i}-{j}" for j in range(50)]
            expected += lines
            append(tmp_path / f"new{i}.txt", "".join(ln + "\n" for ln in lines[:25]) + "hal")
        append(tmp_path / "early.txt", "e3\n")
        expected.append("e3")
        for i in range(10):
            rest = [f"n{i}-{j}" for j in range(50)][25:]
            append(tmp_path / f"new{i}.txt", "f\n" + "".join(ln + "\n" for ln in rest))
            expected.append("half")
        wait_until(lambda: len(got) >= len(expected), what="all lines")
        time.sleep(0.05)  # a duplicate, if any, would show up now
    finally:
        job.cancel()
        with pytest.raises(ss.JobCancelledError):
            job.join(timeout=5)
    assert Counter(got) == Counter(expected)


def test_stream_files_argument_errors(tmp_path: Any) -> None:
    with pytest.raises(ValueError, match="utf-16"):
        sources.stream_files(str(tmp_path), encoding="utf-16")
    with pytest.raises(ValueError, match="poll_interval_ms"):
        sources.stream_files(str(tmp_path), poll_interval_ms=-5)
    p = sources.stream_files(str(tmp_path / "missing"))()
    with pytest.raises(FileNotFoundError, match="missing"):
        init_processor(p)


def test_stream_files_undecodable_line_names_the_file(tmp_path: Any) -> None:
    append(tmp_path / "bad.txt", b"ok\n\xff\xfe\n")
    p, outbox = files_processor(tmp_path)
    with pytest.raises(ValueError, match="bad.txt"):
        drain(p, outbox)


# ---------------------------------------------------------------------------------------
# idle marks on the engine: an idle source does not hold the watermark back
# ---------------------------------------------------------------------------------------


def _two_source_dag(tmp_path: Any, name: str, idle_timeout_ms: float | None) -> ss.DAG:
    dag = ss.DAG()
    wm = dag.new_vertex("wm", WatermarkingSource).local_parallelism(1)
    quiet = dag.new_vertex(
        "quiet",
        sources.stream_files(str(tmp_path), poll_interval_ms=5, idle_timeout_ms=idle_timeout_ms),
    ).local_parallelism(1)
    rec = dag.new_vertex("rec", functools.partial(Collect, name, True)).local_parallelism(1)
    dag.edge(ss.Edge.from_(wm).to(rec, 0)).edge(ss.Edge.from_(quiet).to(rec, 1))
    return dag


def test_idle_source_does_not_hold_back_the_watermark(tmp_path: Any) -> None:
    engine = ss.local()
    job = engine.new_job(_two_source_dag(tmp_path, "idle-yes", idle_timeout_ms=20))
    got = engine.get_list("idle-yes")
    try:
        wait_until(lambda: ("wm", 20) in got, what="watermark 20 to pass the idle input")
        # 10 may be skipped (the input went idle after both were seen), never repeated
        assert [x for x in got if x[0] == "wm"] in ([("wm", 10), ("wm", 20)], [("wm", 20)])
        append(tmp_path / "late.txt", "hello\n")  # the idle source resumes with data
        wait_until(lambda: (1, "hello") in got, what="the resumed source's line")
    finally:
        job.cancel()
        with pytest.raises(ss.JobCancelledError):
            job.join(timeout=5)


def test_without_idle_marks_a_silent_source_holds_the_watermark_back(tmp_path: Any) -> None:
    engine = ss.local()
    job = engine.new_job(_two_source_dag(tmp_path, "idle-no", idle_timeout_ms=None))
    got = engine.get_list("idle-no")
    try:
        # "end" follows both watermarks on the same queue, so once it was processed
        # the tasklet has seen them: they must have been held back
        wait_until(lambda: (0, "end") in got, what="the watermarking source's items")
        assert [x for x in got if x[0] == "wm"] == []
    finally:
        job.cancel()
        with pytest.raises(ss.JobCancelledError):
            job.join(timeout=5)


# ---------------------------------------------------------------------------------------
# generator
# ---------------------------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_generator_emits_what_is_due_on_its_clock() -> None:
    clock = FakeClock()
    p = sources.generator(lambda s: s * 10, 100, clock=clock)()
    outbox = init_processor(p, capacity=5000)
    assert run_calls(p, outbox, 3) == [0]  # the first item is due at once
    clock.now += 0.5
    assert run_calls(p, outbox, 3) == [10 * s for s in range(1, 51)]
    clock.now += 0.005  # half an item's interval: nothing new
    assert run_calls(p, outbox, 1) == []
    clock.now += 1000  # far behind: catches up at most 1024 per call
    first = run_calls(p, outbox, 1)
    assert len(first) == 1024
    rest = run_calls(p, outbox, 200)
    assert len(first) + len(rest) == 100_000
    assert first + rest == [10 * s for s in range(51, 100_051)]


def test_generator_splits_rate_and_sequence_over_processors() -> None:
    clock = FakeClock()
    outs = []
    procs = []
    for i in range(3):
        p = sources.generator(lambda s: s, 300, clock=clock)()
        procs.append((p, init_processor(p, i, 3, capacity=10_000)))
    for p, ob in procs:
        run_calls(p, ob, 1)  # starts the clock: one item each
    clock.now += 2.0
    for i, (p, ob) in enumerate(procs):
        out = run_calls(p, ob, 2)
        assert len(out) == 200  # 100/s each for 2 s (plus the first, taken above)
        assert out == list(range(i + 3, i + 3 * 201, 3))
        outs += out
    assert sorted(outs) == list(range(3, 603))


@settings(max_examples=50, deadline=None)
@given(
    max_items=st.integers(0, 3000),
    parallelism=st.integers(1, 5),
    capacity=st.integers(1, 50),
)
def test_generator_max_items_emits_each_sequence_number_once(
    max_items: int, parallelism: int, capacity: int
) -> None:
    out: list[Any] = []
    for i in range(parallelism):
        p = sources.generator(lambda s: s, None, max_items=max_items)()
        ob = init_processor(p, i, parallelism, capacity)
        out += run_to_completion(p, ob, 100_000)
    assert sorted(out) == list(range(max_items))


@settings(max_examples=50, deadline=None)
@given(
    max_items=st.integers(0, 500),
    before=st.integers(1, 4),
    after=st.integers(1, 4),
    capacity=st.integers(1, 20),
    calls=st.integers(0, 30),
)
def test_generator_snapshot_restore(
    max_items: int, before: int, after: int, capacity: int, calls: int
) -> None:
    first: list[Any] = []
    entries: list[Any] = []
    for i in range(before):
        p = sources.generator(lambda s: s, None, max_items=max_items)()
        ob = init_processor(p, i, before, capacity)
        done = False
        for _ in range(calls):
            done = p.complete()
            first += take(ob)
            if done:
                break
        if not done:  # a finished processor takes part in no more snapshots
            assert p.save_to_snapshot()
            entries += ob.snapshot_bucket
    if not entries:  # every processor finished: the job completed, nothing to restore
        assert sorted(first) == list(range(max_items))
        return
    second: list[Any] = []
    for i in range(after):
        p = sources.generator(lambda s: s, None, max_items=max_items)()
        ob = init_processor(p, i, after, capacity)
        p.restore_from_snapshot(Inbox(entries))
        assert p.finish_snapshot_restore()
        second += run_to_completion(p, ob, 10_000)
    assert set(first) | set(second) == set(range(max_items))
    if before == after:
        assert sorted(first + second) == list(range(max_items))  # exactly once


def test_generator_on_engine_max_items_completes_with_each_seq_once() -> None:
    dag = ss.DAG()
    src = dag.new_vertex("gen", sources.generator(lambda s: ("k", s), None, max_items=20_000))
    src.local_parallelism(3)
    sink = dag.new_vertex("sink", functools.partial(Collect, "gen-all")).local_parallelism(2)
    dag.edge(ss.Edge.between(src, sink))
    engine = ss.local(members=2)
    job = engine.new_job(dag)
    job.join(timeout=20)
    got = engine.get_list("gen-all")
    assert sorted(s for _, s in got) == list(range(20_000))


def test_generator_on_engine_roughly_honours_the_rate() -> None:
    rate = 2000
    dag = ss.DAG()
    src = dag.new_vertex("gen", sources.generator(lambda s: s, rate)).local_parallelism(2)
    sink = dag.new_vertex("sink", functools.partial(Collect, "gen-rate")).local_parallelism(1)
    dag.edge(ss.Edge.between(src, sink))
    engine = ss.local()
    t0 = time.monotonic()
    job = engine.new_job(dag)
    time.sleep(0.5)
    job.cancel()
    with pytest.raises(ss.JobCancelledError):
        job.join(timeout=5)
    elapsed = time.monotonic() - t0
    got = engine.get_list("gen-rate")
    # loose bounds only: at least 10% of what is due, never more than is due
    assert len(got) >= 0.1 * rate * 0.5
    assert len(got) <= rate * elapsed + 2
    assert len(set(got)) == len(got)


def test_generator_argument_errors() -> None:
    with pytest.raises(ValueError, match="items_per_second"):
        sources.generator(lambda s: s, 0)
    with pytest.raises(ValueError, match="max_items"):
        sources.generator(lambda s: s, 10, max_items=-1)
    with pytest.raises(TypeError, match="callable"):
        sources.generator(42, 10)  # type: ignore[arg-type]


def test_generator_infinite_rate_is_unlimited() -> None:
    p = sources.generator(lambda s: s, float("inf"))()
    outbox = init_processor(p, capacity=100)
    assert run_calls(p, outbox, 3) == list(range(300))
    assert isinstance(p, GeneratorP)
