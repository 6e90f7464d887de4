"""engine/member_spares.py: handing a member process its channel sockets over its control
pipe. The spares' life with jobs (taken, replaced, closed) is tested with real processes
in test_processes.py (test_a_later_job_takes_fresh_spare_members_...)."""

from __future__ import annotations

import socket
import threading
from multiprocessing import Pipe, reduction
from typing import Any

from slipstream.engine import member_spares


def receive(conn: Any, got: list[Any]) -> None:
    """What :func:`member_spares.standby_main` reads before it runs the member."""
    member, keys = conn.recv()
    fds: list[int] = []
    with socket.fromfd(conn.fileno(), socket.AF_UNIX, socket.SOCK_STREAM) as s:
        for i in range(0, len(keys), member_spares.FDS_PER_MESSAGE):
            fds += reduction.recvfds(s, len(keys[i : i + member_spares.FDS_PER_MESSAGE]))
    got.append((member, dict(zip(keys, (socket.socket(fileno=fd) for fd in fds), strict=True))))


def test_more_channel_sockets_than_one_message_carries_each_reach_their_key() -> None:
    """Linux passes at most 253 descriptors in one SCM_RIGHTS message: a member of many
    processes and distributed edges holds more, sent in several."""
    pairs = [socket.socketpair() for _ in range(2 * member_spares.FDS_PER_MESSAGE + 50)]
    coordinator, member = Pipe()
    got: list[Any] = []
    reader = threading.Thread(target=receive, args=(member, got))
    reader.start()
    try:
        member_spares.hand_over(coordinator, 1, {(i, 1, 0): a for i, (a, _) in enumerate(pairs)})
        reader.join(timeout=60)
        index, sockets = got[0]
        assert index == 1 and len(sockets) == len(pairs)
        for (i, _, _), s in sockets.items():
            s.sendall(f"{i}\n".encode())
        assert [b.recv(16) for _, b in pairs] == [f"{i}\n".encode() for i in range(len(pairs))]
    finally:
        for s in [*(x for p in pairs for x in p), *(got[0][1].values() if got else ())]:
            s.close()
        coordinator.close()
        member.close()
