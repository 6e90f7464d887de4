"""write_socket: delivery to a TCP server, per-connection order, watermarks swallowed,
refused connections, cancellation against a server that stops reading."""

from __future__ import annotations

import functools
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import slipstream as ss
from slipstream import sinks
from slipstream.core.inbox import Inbox
from slipstream.core.items import Watermark
from slipstream.core.outbox import Outbox
from slipstream.core.processor import AbstractProcessor, Context
from slipstream.sinks.socket import WriteSocketP

HOST = "127.0.0.1"


class Source(AbstractProcessor):
    """Emits its share (by global index) of ``data``; a watermark after every item."""

    def __init__(self, data: list[Any], watermarks: bool = False) -> None:
        self.data = data
        self.watermarks = watermarks

    def init_processor(self, context: Context) -> None:
        mine = self.data[context.global_processor_index :: context.total_parallelism]
        if self.watermarks:
            mine = [y for i, x in enumerate(mine) for y in (x, Watermark(i))]
        self._it = iter(mine)

    def complete(self) -> bool:
        return self.emit_from(self._it)


class Endless(AbstractProcessor):
    def init_processor(self, context: Context) -> None:
        self._n = 0

    def complete(self) -> bool:
        while self.try_emit("x" * 100):
            pass
        return False


class CollectingServer:
    """Accepts up to ``max_conns`` connections on 127.0.0.1 (port 0); each connection's
    bytes are read to EOF (or, with ``read=False``, never read). Bounded, joined by
    ``close()``."""

    def __init__(self, max_conns: int = 16, read: bool = True) -> None:
        self.sock = socket.create_server((HOST, 0))
        self.sock.settimeout(0.05)
        self.port = self.sock.getsockname()[1]
        self.read = read
        self.max_conns = max_conns
        self.received: list[bytes] = []
        self.accepted = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._acceptor = threading.Thread(target=self._accept, daemon=True)
        self._acceptor.start()

    def _accept(self) -> None:
        while not self._stop.is_set() and self.accepted < self.max_conns:
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
        chunks = []
        conn.settimeout(0.05)
        deadline = time.monotonic() + 20
        try:
            while time.monotonic() < deadline and not self._stop.is_set():
                if not self.read:
                    time.sleep(0.01)
                    continue
                try:
                    data = conn.recv(65536)
                except TimeoutError:
                    continue
                if not data:
                    break
                chunks.append(data)
        finally:
            conn.close()
            with self._lock:
                self.received.append(b"".join(chunks))

    def wait_for_connections(self, n: int, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                if len(self.received) >= n:
                    return
            if time.monotonic() > deadline:
                raise AssertionError(f"only {len(self.received)} of {n} connections ended")
            time.sleep(0.005)

    def close(self) -> None:
        self._stop.set()
        self._acceptor.join(5)
        for t in self._threads:
            t.join(5)
        self.sock.close()
        assert not self._acceptor.is_alive()
        assert not any(t.is_alive() for t in self._threads)

    def __enter__(self) -> CollectingServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def run_dag(source: Callable[[], Any], sink: Any, src_par: int, sink_par: int) -> ss.Job:
    dag = ss.DAG()
    s = dag.new_vertex("src", source).local_parallelism(src_par)
    w = dag.new_vertex("sink", sink).local_parallelism(sink_par)
    dag.edge(ss.Edge.between(s, w))
    return ss.local().new_job(dag)


def test_write_socket_delivers_every_item_over_each_processors_connection() -> None:
    data = [f"item {i} — ✓" for i in range(10_000)]
    with CollectingServer() as server:
        job = run_dag(
            functools.partial(Source, data, True), sinks.write_socket(HOST, server.port), 2, 3
        )
        job.join(timeout=20)
        server.wait_for_connections(3)
        assert server.accepted == 3
        lines = []
        for blob in server.received:
            text = blob.decode("utf-8")
            assert text == "" or text.endswith("\n")
            lines += text.splitlines()
    # watermarks are swallowed: only the items arrive, each exactly once
    assert Counter(lines) == Counter(data)


def test_write_socket_keeps_order_on_one_connection() -> None:
    data = list(range(20_000))
    with CollectingServer() as server:
        job = run_dag(functools.partial(Source, data), sinks.write_socket(HOST, server.port), 1, 1)
        job.join(timeout=20)
        server.wait_for_connections(1)
        assert server.received == ["".join(f"{i}\n" for i in data).encode()]


def test_write_socket_refused_connection_names_host_and_port() -> None:
    holder = socket.socket()
    holder.bind((HOST, 0))  # bound, not listening: the connection is refused
    port = holder.getsockname()[1]
    try:
        job = run_dag(functools.partial(Source, [1, 2]), sinks.write_socket(HOST, port), 1, 1)
        with pytest.raises(ss.JobFailedError) as ei:
            job.join(timeout=10)
        assert f"{HOST}:{port}" in str(ei.value)
        assert ei.value.vertex == "sink"
        assert isinstance(ei.value.cause, ConnectionError)
    finally:
        holder.close()


def test_cancel_stops_write_socket_blocked_on_a_server_that_does_not_read() -> None:
    with CollectingServer(read=False) as server:
        job = run_dag(Endless, sinks.write_socket(HOST, server.port), 1, 1)
        # let the socket buffers fill up so the sink blocks in send()
        time.sleep(0.3)
        assert job.status is ss.JobStatus.RUNNING
        job.cancel()
        with pytest.raises(ss.JobCancelledError):
            job.join(timeout=3)


@settings(max_examples=25, deadline=None)
@given(
    items=st.lists(st.one_of(st.integers(), st.text(alphabet="aé€ \t", max_size=5)), max_size=50),
    encoding=st.sampled_from(["utf-8", "utf-16", "utf-8-sig", "latin-1"]),
    batch=st.integers(1, 7),
)
def test_write_socket_processor_writes_str_of_each_item(
    items: list[Any], encoding: str, batch: int
) -> None:
    if encoding == "latin-1":
        items = [x.replace("€", "e") if isinstance(x, str) else x for x in items]
    with CollectingServer(max_conns=1) as server:
        p = sinks.write_socket(HOST, server.port, encoding)()
        assert isinstance(p, WriteSocketP) and not p.is_cooperative()
        p.init(Outbox(0), Context("sink"))
        for start in range(0, len(items), batch):  # several inbox fills
            inbox = Inbox(items[start : start + batch])
            for _ in range(1000):
                if not inbox:
                    break
                p.process(0, inbox)
            assert not inbox
        assert p.try_process_watermark(Watermark(5))
        assert p.complete()
        p.close()
        server.wait_for_connections(1)
        assert server.received[0].decode(encoding) == "".join(f"{x}\n" for x in items)


def test_write_socket_argument_errors() -> None:
    with pytest.raises(ValueError, match="port"):
        sinks.write_socket(HOST, 70000)
    with pytest.raises(ValueError, match="encoding 'nope'"):
        sinks.write_socket(HOST, 80, encoding="nope")
