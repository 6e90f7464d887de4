"""A sink that writes items as text lines to a TCP server."""

from __future__ import annotations

import codecs
import functools
import socket
from collections.abc import Callable

from slipstream.core.inbox import Inbox
from slipstream.core.items import Watermark
from slipstream.core.net import connect_tcp
from slipstream.core.processor import AbstractProcessor, Context, Processor
from slipstream.core.traits import SINK
from slipstream.core.validation import check_encoding, check_port

__all__ = ["write_socket", "WriteSocketP"]

#: How long one blocking send may wait for the server before the processor returns to
#: the engine (which is how a non-cooperative processor notices cancellation).
SOCKET_WRITE_TIMEOUT_S = 0.05


class WriteSocketP(AbstractProcessor):
    """Writes ``str(item) + "\\n"`` for every item to its own TCP connection.

    Why non-cooperative: sending is blocking I/O (a slow server pushes back through the
    socket buffer); a blocking processor gets a thread of its own so the cooperative
    workers are not held up. Each send waits at most :data:`SOCKET_WRITE_TIMEOUT_S`;
    when the server does not take the data in that time, ``process()`` returns with
    the items still in the inbox and continues where it stopped on the next call, so a
    cancelled job ends promptly even against a stalled server.

    Items leave the inbox only once their bytes were handed to the socket, so nothing is
    buffered in the processor between calls: a snapshot (taken with an empty inbox)
    covers everything sent, and ``complete()`` only has to signal the end of data to
    the server (it shuts the sending side down). Watermarks are swallowed. Delivery is
    at-least-once after a restart (the items since the last snapshot are sent again).
    An item whose ``str`` contains line breaks becomes several lines.
    """

    slipstream_traits = frozenset({SINK})

    def __init__(
        self,
        host: str,
        port: int,
        encoding: str = "utf-8",
        connect_timeout_s: float = 10.0,
    ) -> None:
        self.host = host
        self.port = port
        self.encoding = encoding
        self.connect_timeout_s = connect_timeout_s
        self._sock: socket.socket | None = None
        self._data: memoryview | None = None
        self._sent = 0
        self._count = 0

    def is_cooperative(self) -> bool:
        return False

    def init_processor(self, context: Context) -> None:
        self._sock = connect_tcp(
            self.host,
            self.port,
            self.connect_timeout_s,
            SOCKET_WRITE_TIMEOUT_S,
            f"write_socket (vertex {context.vertex_name!r}, processor "
            f"{context.global_processor_index})",
        )
        # incremental, so an encoding with a byte-order mark writes it once, not per batch
        self._encode = codecs.getincrementalencoder(self.encoding)().encode

    def process(self, ordinal: int, inbox: Inbox) -> None:
        if self._data is None:
            n = len(inbox)
            text = "\n".join([str(item) for item in inbox])
            self._data = memoryview(self._encode(text + "\n"))
            self._sent = 0
            self._count = n
        if not self._send():
            return
        n = self._count
        if n == len(inbox):
            inbox.clear()
        else:
            popleft = inbox.popleft
            for _ in range(n):
                popleft()
        self._data = None

    def _send(self) -> bool:
        """Send the rest of the pending bytes; ``False`` if the server took nothing for
        :data:`SOCKET_WRITE_TIMEOUT_S` (the caller returns and comes back)."""
        data = self._data
        assert data is not None
        sock = self._sock
        if sock is None:
            raise ConnectionError(f"write_socket: connection to {self.host}:{self.port} is closed")
        sent = self._sent
        total = len(data)
        try:
            while sent < total:
                sent += sock.send(data[sent:])
        except TimeoutError:
            return False
        except OSError as e:
            raise ConnectionError(
                f"write_socket: sending to {self.host}:{self.port} failed: {e}"
            ) from e
        finally:
            self._sent = sent
        return True

    def try_process_watermark(self, watermark: Watermark) -> bool:
        return True

    def complete(self) -> bool:
        sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass  # the server went away already; close() cleans up
        return True

    def close(self) -> None:
        sock = self._sock
        self._sock = None
        if sock is not None:
            sock.close()


def write_socket(
    host: str,
    port: int,
    encoding: str = "utf-8",
    *,
    connect_timeout_s: float = 10.0,
) -> Callable[[], Processor]:
    """A sink that connects every processor to the TCP server at ``host:port`` and
    writes each item as ``str(item)`` followed by a line break, encoded with
    ``encoding``. A refused connection fails the job with a ``ConnectionError`` naming
    ``host:port``. See :class:`WriteSocketP`.
    """
    check_port(port, "write_socket")
    check_encoding(encoding, "write_socket")
    return functools.partial(WriteSocketP, host, port, encoding, connect_timeout_s)
