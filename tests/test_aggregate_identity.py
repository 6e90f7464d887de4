"""``is_identity``: which key functions the engine may skip calling (their bytecode is
``return <the one parameter>``), and counting by such a key gives the same counts."""

from __future__ import annotations

import functools
from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import slipstream as ss
from slipstream import processors as P
from slipstream import sinks, sources
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


@pytest.mark.parametrize("per_epoch", [False, True])
@pytest.mark.parametrize("guarantee", ["none", "exactly_once"])
def test_a_rolling_count_by_an_identity_key_emits_the_same(per_epoch: bool, guarantee: str) -> None:
    """``rolling_aggregate`` (and its per-epoch partials) take the items as their keys
    when the key function returns its item, not calling it: the same outputs as a key
    function it calls (``functools.partial(identity)``, not recognised), with snapshots
    (the layered state's loops) and without, and an unhashable item is set aside by the
    bad-record policy on both."""
    words = [f"w{i % 37}" for i in range(3000)]
    words[1234] = ["unhashable"]  # type: ignore[call-overload]
    got = []
    for key_fn in (word, functools.partial(identity)):
        p = ss.Pipeline()
        (
            p.read_from(sources.items(words))
            .group_by(key_fn)
            .rolling_aggregate(counting(), per_epoch=per_epoch)
            .on_item_error("skip")
            .write_to(sinks.list_sink("out"))
        )
        engine = ss.local()
        config = ss.JobConfig(
            processing_guarantee=ss.ProcessingGuarantee(guarantee), snapshot_interval_ms=5
        )
        engine.new_job(p, config).join(60)
        got.append(list(engine.get_list("out")))
    by_item, by_call = got
    if per_epoch:  # once per key and epoch, epochs where the snapshots fell: the totals
        by_item, by_call = dict(by_item), dict(by_call)
    assert by_item == by_call
    expected = Counter(w for w in words if isinstance(w, str))
    assert dict(got[0]) == dict(expected)
