"""What member processes print, written to the coordinator's ``sys.stdout`` and
``sys.stderr`` (``ss.local(processes=N)``).

A member process inherits the file descriptors the coordinator had when the forkserver
started, not its Python-level streams: without this module a ``sinks.stdout()`` sink, a
``peek()`` or a user's ``print`` in a member writes straight to descriptor 1, past a
``sys.stdout`` the user's process replaced (``contextlib.redirect_stdout``, pytest's
capture, a Jupyter notebook's cell output). So a member's ``sys.stdout`` and
``sys.stderr`` become :class:`ForwardedStream` objects that send their text over the
control pipe; the coordinator's listener writes it to its own streams of the moment
(:func:`write`). Standard output is sent on ``flush()`` (``print(..., flush=True)``, the
stdout sink after each batch), every report (0.1 s), when 8 KiB are waiting and at the
member's end; standard error at every write that ends a line, so nothing of a crash's
text waits in a buffer.

Only whole lines are sent before the member's end: ``print`` writes its text and its
newline in two calls, and two members printing at once would otherwise interleave
(``"err 1err 0"`` then an empty line). A line longer than 8 KiB is sent as it is.
"""

from __future__ import annotations

import io
import sys
import threading
from collections.abc import Callable
from typing import Any

#: the control message: ("output", "stdout" | "stderr", text)
OUTPUT = "output"

#: standard output is sent once this much text waits
FLUSH_CHARS = 8192


class ForwardedStream(io.TextIOBase):
    """A text stream whose text goes to the coordinator's stream of the same name."""

    def __init__(self, name: str, send: Callable[[tuple[Any, ...]], bool], buffered: bool) -> None:
        super().__init__()
        self.name = name
        self._send = send
        self._buffered = buffered
        self._lock = threading.Lock()
        self._parts: list[str] = []
        self._size = 0

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "utf-8"

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        with self._lock:
            self._parts.append(text)
            self._size += len(text)
            due = self._size >= FLUSH_CHARS or (not self._buffered and "\n" in text)
        if due:
            self.flush()
        return len(text)

    def flush(self, partial: bool = False) -> None:
        """Send the whole lines waiting; with ``partial`` (the member's end, or more
        than 8 KiB waiting) the unfinished last line too."""
        with self._lock:
            text = "".join(self._parts)
            self._parts.clear()
            if not partial and len(text) < FLUSH_CHARS:
                cut = text.rfind("\n") + 1
                if cut < len(text):
                    self._parts.append(text[cut:])
                text = text[:cut]
            self._size = sum(len(p) for p in self._parts)
        if text:
            self._send((OUTPUT, self.name, text))


def install(send: Callable[[tuple[Any, ...]], bool]) -> None:
    """In a member process: its ``sys.stdout`` and ``sys.stderr`` go to the coordinator."""
    sys.stdout = ForwardedStream("stdout", send, buffered=True)
    sys.stderr = ForwardedStream("stderr", send, buffered=False)


def flush(final: bool = False) -> None:
    """Send the whole lines a member's streams hold (each report), and at its end
    (``final``) what is left of an unfinished line too."""
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, ForwardedStream):
            stream.flush(partial=final)


def write(name: str, text: str) -> None:
    """In the coordinator: a member's text, to this process's stream of that name."""
    stream = sys.stderr if name == "stderr" else sys.stdout
    try:
        stream.write(text)
        stream.flush()
    except (OSError, ValueError):  # a closed stream: the text has nowhere to go
        pass
