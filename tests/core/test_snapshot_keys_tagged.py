"""A source's or sink's own broadcast entries are recognised by their tag, and a foreign
entry fails naming the vertex, the key and what restores it."""

from __future__ import annotations

import pytest

from slipstream.state.keys import BroadcastKey, KeyedStateKey, tagged_broadcast_name


def test_tagged_name_is_returned() -> None:
    assert tagged_broadcast_name(BroadcastKey(("t", 3)), "t", 2, "v", "the x sink") == ("t", 3)


@pytest.mark.parametrize(
    "key",
    [
        BroadcastKey(("other", 3)),
        BroadcastKey(("t", 1, 2)),
        BroadcastKey("t"),
        KeyedStateKey(("t", 3)),
    ],
)
def test_foreign_key_names_vertex_key_and_owner(key: object) -> None:
    with pytest.raises(ValueError) as e:
        tagged_broadcast_name(key, "t", 2, "v", "the x sink")
    assert str(e.value) == f"vertex 'v': unexpected snapshot entry key {key!r} for the x sink"
