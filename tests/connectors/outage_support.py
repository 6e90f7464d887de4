"""A TCP proxy on 127.0.0.1 that can cut or hang the connections through it, for tests
of a server that goes away (a Kafka broker or PostgreSQL behind it).

``cut()`` closes every connection at once and resets new ones (the server is down or
unreachable: clients see the error immediately); ``hang()`` keeps every connection open
but forwards nothing (a network that drops packets: calls block until a timeout);
``heal()`` forwards again. One thread moves the bytes with a selector; the test's own
thread only flips the mode, so every change is seen by the next loop turn.
"""

from __future__ import annotations

import selectors
import socket
import threading
from typing import Any

from slipstream.devservers import free_port

OK, CUT, HANG = "ok", "cut", "hang"


class TcpProxy:
    """Forwards 127.0.0.1:``port`` to 127.0.0.1:``target_port`` (set it before the
    first connection if the server starts after the proxy: ``target_port = ...``)."""

    def __init__(self, target_port: int | None = None, port: int | None = None) -> None:
        self.port = port or free_port()
        self.target_port = target_port
        self.mode = OK
        self.connections_seen = 0
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._listener.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._peers: dict[socket.socket, socket.socket] = {}
        self._held: list[socket.socket] = []  # accepted while hung: no upstream yet
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tcp-proxy", daemon=True)
        self._thread.start()

    # -- the test's side -----------------------------------------------------------------
    def cut(self) -> None:
        """Close every connection now and reset new ones until :meth:`heal`."""
        with self._lock:
            self.mode = CUT
            self._close_all()

    def hang(self) -> None:
        """Forward nothing (connections stay open, new ones are accepted and held)."""
        with self._lock:
            self.mode = HANG
            for s in list(self._peers):
                self._unwatch(s)

    def heal(self) -> None:
        """Forward again (held connections are connected upstream)."""
        with self._lock:
            self.mode = OK
            for s in list(self._peers):
                self._watch(s)
            held, self._held = self._held, []
            for client in held:
                self._connect(client)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        with self._lock:
            self._close_all()
        self._selector.close()
        self._listener.close()

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- the proxy thread ---------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            for key, _ in self._selector.select(0.05):
                with self._lock:
                    sock = key.fileobj
                    if sock is self._listener:
                        self._accept()
                    elif sock in self._peers and self.mode == OK:
                        self._pump(sock)  # type: ignore[arg-type]

    def _accept(self) -> None:
        try:
            client, _ = self._listener.accept()
        except BlockingIOError:
            return
        self.connections_seen += 1
        if self.mode == CUT:
            _reset(client)
        elif self.mode == HANG:
            self._held.append(client)
        else:
            self._connect(client)

    def _connect(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(("127.0.0.1", self.target_port or 0), timeout=5)
        except OSError:
            _reset(client)
            return
        for s in (client, upstream):
            s.setblocking(True)
        self._peers[client] = upstream
        self._peers[upstream] = client
        self._watch(client)
        self._watch(upstream)

    def _pump(self, sock: socket.socket) -> None:
        peer = self._peers[sock]
        try:
            data = sock.recv(65536)
            if data:
                peer.sendall(data)
                return
        except OSError:
            pass
        self._drop(sock)

    def _watch(self, s: socket.socket) -> None:
        try:
            self._selector.register(s, selectors.EVENT_READ)
        except (KeyError, ValueError):
            pass

    def _unwatch(self, s: socket.socket) -> None:
        try:
            self._selector.unregister(s)
        except (KeyError, ValueError):
            pass

    def _drop(self, sock: socket.socket) -> None:
        peer = self._peers.pop(sock, None)
        if peer is not None:
            self._peers.pop(peer, None)
        for s in (sock, peer):
            if s is not None:
                self._unwatch(s)
                _reset(s)

    def _close_all(self) -> None:
        for s in list(self._peers):
            self._drop(s)
        held, self._held = self._held, []
        for s in held:
            _reset(s)


def _reset(s: socket.socket) -> None:
    """Close with RST (SO_LINGER 0): the peer sees a reset, not a clean end."""
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    except OSError:
        pass
    try:
        s.close()
    except OSError:
        pass


# -- a connection that stops its server at the worst moment ------------------------------

#: trap name -> what a trapped connection does at a ``COMMIT PREPARED`` (module level: a
#: sink's connect callable names its trap and so pickles by reference)
TRAPS: dict[str, Any] = {}


def set_trap(name: str, action: Any, once: bool = True) -> None:
    """Run ``action`` at the next ``COMMIT PREPARED`` of connections trapped under
    ``name`` (at every one with ``once=False``, until :func:`clear_trap`)."""
    TRAPS[name] = (action, once)


def clear_trap(name: str) -> None:
    TRAPS.pop(name, None)


def sprung(name: str) -> bool:
    """Whether a one-shot trap has fired."""
    return name not in TRAPS


class TrappedConnection:
    """A psycopg connection whose ``COMMIT PREPARED`` (statement or ``tpc_commit``) first
    runs its trap's action: the server can be stopped, or an error raised, exactly inside
    a sink's commit."""

    def __init__(self, conn: Any, trap: str) -> None:
        object.__setattr__(self, "_conn", conn)
        object.__setattr__(self, "_trap", trap)

    def _spring(self) -> None:
        entry = TRAPS.get(self._trap)
        if entry is None:
            return
        action, once = entry
        # a one-shot trap fires once: two processors' commits may find it at the same
        # time, and only the one whose pop took it runs the action (dict.pop is atomic);
        # both ran it once in a full run at load ~10, the second pg_ctl stop failing on
        # the stopped server and the sink with it
        if once and TRAPS.pop(self._trap, None) is None:
            return
        action()

    def execute(self, query: Any, *args: Any, **kwargs: Any) -> Any:
        if str(query).lstrip().upper().startswith("COMMIT PREPARED"):
            self._spring()
        return self._conn.execute(query, *args, **kwargs)

    def tpc_commit(self, *args: Any, **kwargs: Any) -> Any:
        self._spring()
        return self._conn.tpc_commit(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._conn, name, value)

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: Any) -> None:
        self._conn.close()


def trapped_connect(dsn: str, trap: str, connect_timeout: int = 5) -> Any:
    """``connect`` for ``sinks.sql``: a new connection trapped under ``trap``."""
    import psycopg

    return TrappedConnection(psycopg.connect(dsn, connect_timeout=connect_timeout), trap)
