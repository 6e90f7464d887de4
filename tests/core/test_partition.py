"""core/partition.py: KeyRouting.spills (a copy-on-write save checks every key it saves
with it) says exactly what KeyRouting.owner per key says, on its fast paths (default
partitioner; all non-negative ints, all strs) and off them."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from slipstream.core.partition import key_routing

_keys = st.one_of(
    st.lists(st.integers(0, 2**31 - 1), max_size=40),
    st.lists(st.integers(-(2**64), 2**64), max_size=40),
    st.lists(st.text(max_size=4), max_size=40),  # lone surrogates included
    st.lists(st.one_of(st.integers(), st.text(max_size=3), st.booleans(), st.none()), max_size=20),
)


@settings(max_examples=30, deadline=None)
@given(_keys, st.integers(1, 3), st.integers(1, 2), st.booleans())
def test_spills_is_whether_one_key_has_another_owner(
    keys: list[Any], members: int, parallelism: int, custom: bool
) -> None:
    routing = key_routing(
        (lambda k, n: len(str(k)) % n) if custom else None, members, parallelism
    )
    for index in range(members * parallelism):
        assert routing.spills(keys, index) is any(routing.owner(k) != index for k in keys)
