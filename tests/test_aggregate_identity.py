"""``is_identity``: which key functions the engine may skip calling (their bytecode is
``return <the one parameter>``), and counting by such a key gives the same counts."""

from __future__ import annotations

import functools
from collections import Counter
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from slipstream import processors as P
from slipstream.aggregate import counting, identity, is_identity
from slipstream.core.inbox import Inbox
from slipstream.core.outbox import Outbox
from slipstream.core.processor import Context


def word(w: str) -> str:
    return w


def test_identity_functions_are_recognised() -> None:
    assert is_identity(identity)
    assert is_identity(lambda w: w)
    assert is_identity(word)


def test_other_functions_are_not() -> None:
    def with_default(x: Any, y: int = 1) -> Any:
        return x

    def kw_only(x: Any, *, k: int) -> Any:
        return x

    def gen(x: Any) -> Any:
        yield x

    async def coro(x: Any) -> Any:
        return x

    for fn in (
        lambda w: w.lower(),
        lambda *a: a,
        lambda x, y: x,
        lambda x, y: y,
        with_default,
        kw_only,
        gen,
        coro,
        str,
        functools.partial(identity),
        len,
        None,
        "not callable",
    ):
        assert not is_identity(fn), fn


@settings(max_examples=100, deadline=None)
@given(words=st.lists(st.sampled_from(["a", "b", "c", "dd"]), max_size=40))
def test_counting_by_an_identity_key_counts_the_same(words: list[str]) -> None:
    counts = {}
    for key_fn in (lambda w: w, word, str.lower):
        p = P.accumulate_by_key(key_fn, counting())()
        ob = Outbox(1)
        p.init(ob, Context())
        for i in range(0, len(words), 7):
            p.process(0, Inbox(words[i : i + 7]))
        while not p.complete():
            pass
        counts[key_fn] = dict(ob.buckets[0])
    for got in counts.values():
        assert got == dict(Counter(words))
