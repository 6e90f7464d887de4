"""Network helpers shared by the socket source and sink."""

from __future__ import annotations

import socket


def connect_tcp(
    host: str, port: int, connect_timeout_s: float, io_timeout_s: float, where: str
) -> socket.socket:
    """Connect to the TCP server at ``host:port`` (the socket source and sink).

    A failure raises ``ConnectionError`` naming ``where`` and ``host:port``. Every
    blocking call on the returned socket waits at most ``io_timeout_s``, so that the
    non-cooperative processor using it returns to the engine regularly, which is how it
    notices a cancelled job.
    """
    try:
        sock = socket.create_connection((host, port), timeout=connect_timeout_s)
    except OSError as e:
        raise ConnectionError(f"{where}: cannot connect to {host}:{port}: {e}") from e
    sock.settimeout(io_timeout_s)
    return sock
