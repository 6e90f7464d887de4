"""This process's resident memory, read cheaply enough to be read often.

One reader for the two places that ask: a member's reports (``engine/member.py``'s
``usage``, several a second) and the copy-on-write save's fork decision
(``state/live.py``, what a fork copies the page tables of).
"""

from __future__ import annotations

import os

_PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024 if hasattr(os, "sysconf") else 4

#: ``(pid, descriptor)`` of this process's ``/proc/self/statm``, opened at its first
#: reading and read again with ``os.pread`` at every report: opening the file (the path's
#: walk, Python's file object) cost 60-75 us of a report thread's CPU in a member that
#: wakes every 0.1 s, the ``pread`` of the open descriptor 10-12 us (docs/performance.md,
#: "A member's reports"). The pid tells a forked child (whose inherited descriptor reads
#: its parent's figures: ``/proc/self`` is resolved at the open) to open its own.
_statm: tuple[int, int] | None = None


def resident_kb() -> int:
    """This process's resident set now, in KiB (``/proc/self/statm``; 0 without it)."""
    global _statm
    try:
        pid = os.getpid()
        if _statm is None or _statm[0] != pid:
            _statm = (pid, os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC))
        return int(os.pread(_statm[1], 128, 0).split()[1]) * _PAGE_KB
    except (OSError, ValueError, IndexError, AttributeError):  # no /proc, no pread
        return 0
