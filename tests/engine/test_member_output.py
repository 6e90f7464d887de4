"""A member process's forwarded ``sys.stdout``/``sys.stderr`` send whole lines only
until the member's end: two members printing at once must not interleave inside a line
(CI once saw ``"err 1err 0"`` and an empty line from two members' ``print`` to stderr,
which writes the text and the newline in two calls)."""

from __future__ import annotations

from typing import Any

from slipstream.engine.member_output import FLUSH_CHARS, OUTPUT, ForwardedStream


def stream(buffered: bool) -> tuple[ForwardedStream, list[str]]:
    sent: list[str] = []

    def send(message: tuple[Any, ...]) -> bool:
        assert message[0] == OUTPUT
        sent.append(message[2])
        return True

    return ForwardedStream("stderr", send, buffered=buffered), sent


def test_stderr_sends_a_line_when_it_ends_not_its_halves() -> None:
    err, sent = stream(buffered=False)
    print("err 1", file=err)
    assert sent == ["err 1\n"]
    err.write("no newline yet")
    err.flush()  # a report's flush: whole lines only
    assert sent == ["err 1\n"]
    err.write(" and the rest\nnext")
    assert sent == ["err 1\n", "no newline yet and the rest\n"]
    err.flush(partial=True)  # the member's end: the unfinished line too
    assert sent[-1] == "next"


def test_stdout_waits_for_a_flush_and_keeps_the_unfinished_line() -> None:
    out, sent = stream(buffered=True)
    out.write("a\nb\nc")
    assert sent == []
    out.flush()
    assert sent == ["a\nb\n"]
    out.flush(partial=True)
    assert sent == ["a\nb\n", "c"]
    out.flush(partial=True)
    assert sent == ["a\nb\n", "c"]


def test_a_line_longer_than_the_buffer_is_sent_as_it_is() -> None:
    out, sent = stream(buffered=True)
    out.write("x" * FLUSH_CHARS)
    assert sent == ["x" * FLUSH_CHARS]
