"""execution/collectors.py: a partitioned edge's split routes every item where
``KeyRouting.owner`` says its key goes, on the bulk path for a chunk of new keys (the
default partitioner, ``str`` or non-negative ``int`` keys: core/partition.py's
``default_partitions``) and off it (mixed keys, lone surrogates, negative ints, a custom
partitioner, chunks too short for it), with ``ss.entry_key`` read at C speed; and a key
function that fails on such a chunk still names itself and the item."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import slipstream as ss
from slipstream.core.errors import KeyFunctionError
from slipstream.core.groups import KeyedGroup
from slipstream.core.partition import (
    default_partitioner,
    default_partitions,
    key_routing,
    stable_hash,
)
from slipstream.execution.collectors import PerTargetCollector
from slipstream.execution.queues import SpscQueue

_keys = st.one_of(
    st.lists(st.integers(0, 2**40), min_size=1, max_size=30),
    st.lists(st.integers(-(2**64), 2**64), min_size=1, max_size=30),
    st.lists(st.text(max_size=4), min_size=1, max_size=30),  # lone surrogates included
    st.lists(st.one_of(st.integers(), st.text(max_size=3), st.booleans()), min_size=1, max_size=20),
)


@settings(max_examples=25, deadline=None)
@given(_keys, st.sampled_from([1, 3, 70]), st.booleans(), st.integers(2, 3))
def test_every_item_goes_to_its_keys_owner(
    keys: list[Any], repeat: int, custom: bool, consumers: int
) -> None:
    routing = key_routing((lambda k, n: len(str(k)) % n) if custom else None, consumers, 1)
    c = PerTargetCollector(
        [SpscQueue(1 << 14) for _ in range(consumers)],
        key_fn=ss.entry_key,
        partitioner=routing.partitioner,
        partition_to_target=routing.table,
    )
    items = [(k, i) for i, k in enumerate(keys * repeat)]  # repeat: chunks of >= 64 too
    c.add_chunk(items)
    c.add_chunk(items[::-1])  # the keys cached now
    for target, backlog in enumerate(c.backlogs):
        got = [item for chunk in backlog for item in chunk]
        expected = [it for it in items + items[::-1] if routing.owner(it[0]) == target]
        assert got == expected
    parts = default_partitions(keys, 271)
    assert parts is None or parts == [stable_hash(k) % 271 for k in keys]
    assert [default_partitioner(k, 271) for k in keys] == [stable_hash(k) % 271 for k in keys]


@pytest.mark.parametrize("entry_key", [True, False])
def test_new_keys_after_known_ones_in_a_chunk_go_to_their_owners_in_order(entry_key: bool) -> None:
    """The split's loop over keys seen before (the cache's subscript) meets a new key
    mid-chunk: that item and the rest go the key-by-key way, each to its owner, in
    order (with ss.entry_key read at C speed and with a Python key function)."""
    routing = key_routing(None, 2, 1)
    c = PerTargetCollector(
        [SpscQueue(1 << 14), SpscQueue(1 << 14)],
        key_fn=ss.entry_key if entry_key else (lambda item: item[0]),
        partition_to_target=routing.table,
    )
    known = [(f"k{i}", i) for i in range(40)]
    c.add_chunk(known)
    mixed = [(f"k{i % 40}", i) for i in range(100)] + [(f"new{i}", i) for i in range(30)]
    mixed += [(f"k{i % 40}", i) for i in range(50)] + [(f"other{i}", i) for i in range(5)]
    c.add_chunk(mixed)
    for target, backlog in enumerate(c.backlogs):
        got = [item for chunk in backlog for item in chunk]
        assert got == [it for it in known + mixed if routing.owner(it[0]) == target]


def test_a_failing_key_function_on_a_chunk_of_new_keys_names_itself() -> None:
    c = PerTargetCollector(
        [SpscQueue(1024), SpscQueue(1024)],
        key_fn=ss.entry_key,
        partition_to_target=key_routing(None, 2, 1).table,
    )
    with pytest.raises(KeyFunctionError) as e:
        c.add_chunk([("a", 1)] * 70 + [7])
    text = str(e.value)
    assert text.startswith("a partitioned edge: key function entry_key (")
    assert text.endswith(" raised TypeError: 'int' object is not subscriptable on item 7")


def test_a_keyed_group_is_split_by_its_keys_as_their_items_would_be() -> None:
    """A KeyedGroup (the Pipeline window's stage-1 frame) goes to each consumer as one
    group of the keys that consumer owns, as rows with those keys would go; a row among
    groups, or a group among rows, is routed by its own key(s); with one consumer a
    group goes on whole; a failing partitioner names the key and the group."""
    routing = key_routing(None, 3, 1)
    queues = [SpscQueue(1024) for _ in range(3)]
    c = PerTargetCollector(queues, key_fn=ss.entry_key, partition_to_target=routing.table)
    entries = {k: k * 10 for k in [*range(40), "x", "yz", -5]}
    c.add_chunk([KeyedGroup((0, 1), entries), ("x", 1)])
    c.add_chunk([("yz", 2), KeyedGroup((1, 2), {"x": 3, 7: 4})])
    for target, backlog in enumerate(c.backlogs):
        got = [item for chunk in backlog for item in chunk]
        mine = {k: v for k, v in entries.items() if routing.owner(k) == target}
        expected: list[Any] = [KeyedGroup((0, 1), mine)] if mine else []
        expected += [("x", 1)] if routing.owner("x") == target else []
        expected += [("yz", 2)] if routing.owner("yz") == target else []
        later = {k: v for k, v in {"x": 3, 7: 4}.items() if routing.owner(k) == target}
        expected += [KeyedGroup((1, 2), later)] if later else []
        assert got == expected
    # a group of keys the edge has not seen (a word count's partial counts at the end
    # of stage 1): their targets computed at once, the same targets, then cached
    words = {f"word{i}": i for i in range(300)}
    c = PerTargetCollector(queues, key_fn=ss.entry_key, partition_to_target=routing.table)
    c.add_chunk([KeyedGroup(None, words)])
    got = [g.entries for b in c.backlogs for chunk in b for g in chunk]
    owned = [{k for k in words if routing.owner(k) == t} for t in range(3)]
    assert [set(e) for e in got] == [keys for keys in owned if keys]
    assert all(e[k] == words[k] for e in got for k in e)
    assert c.key_cache == {k: routing.owner(k) for k in words}
    one = PerTargetCollector([SpscQueue(1024)], key_fn=ss.entry_key, partition_to_target=[0] * 271)
    group = KeyedGroup((0, 1), entries)
    one.add_chunk([group])
    assert one.backlogs[0][0][0] is group

    def broken(key: Any, count: int) -> int:
        raise ValueError("no partition")

    bad = PerTargetCollector(queues, key_fn=ss.entry_key, partitioner=broken,
                             partition_to_target=routing.table)  # fmt: skip
    with pytest.raises(KeyFunctionError) as e:
        bad.add_chunk([KeyedGroup((0, 1), {"k": 1})])
    text = str(e.value)
    assert text.startswith("a partitioned edge: partitioner test_a_keyed_group_is_split_by")
    assert text.endswith(" raised ValueError: no partition on the key 'k' of KeyedGroup((0, 1), {'k': 1})")


@pytest.mark.parametrize("bulk", [True, False])
def test_an_identity_key_routes_each_item_as_its_own_key(bulk: bool) -> None:
    """A key function that returns its item (``lambda k: k``) is not called per item:
    the split looks the items up as keys. They go where the same keys behind a key
    function the split calls go, in order, on the bulk path for a chunk of new keys
    (``bulk``) and on the path of keys seen before with new keys mid-chunk; an
    unhashable item still goes to its owner."""
    routing = key_routing(None, 2, 1)

    def collector(key_fn: Any) -> PerTargetCollector:
        return PerTargetCollector(
            [SpscQueue(1 << 14), SpscQueue(1 << 14)],
            key_fn=key_fn,
            partition_to_target=routing.table,
        )

    same, called = collector(lambda k: k), collector(lambda k: k + "")
    assert same.key_is_item and not called.key_is_item
    first = [f"k{i % 50}" for i in range(100 if bulk else 10)]
    mixed = [f"k{i % 50}" for i in range(60)] + [f"new{i}" for i in range(20)] + first
    for c in (same, called):
        c.add_chunk(first)
        c.add_chunk(mixed)
    for target in range(2):
        got = [k for chunk in same.backlogs[target] for k in chunk]
        assert got == [k for chunk in called.backlogs[target] for k in chunk]
        assert got == [k for k in first + mixed if routing.owner(k) == target]
    odd = ["unhashable"]
    same.add_chunk(["k1"] * 70 + [odd])  # the cache cannot hold it: routed carefully
    assert same.backlogs[routing.owner(odd)][-1][-1] is odd
