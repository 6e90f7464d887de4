"""The named maps a member process's processors write (engine/member.py's TrackedDict):
only the keys that changed travel to the coordinator, so every way of changing a key
must mark it."""

from __future__ import annotations

from collections import deque

import pytest

from slipstream.engine.member import TrackedDict


def test_update_with_pairs_marks_their_keys() -> None:
    d = TrackedDict({"a": 0})
    d.update(deque([("a", 1), ["b", 2], "cd", ("a", 3)]), e=5)
    assert d == {"a": 3, "b": 2, "c": "d", "e": 5}
    assert d.take_dirty() == {"a", "b", "c", "e"}
    d.update(iter([("f", 6)]))
    d.update({"g": 7})
    assert d.take_dirty() == {"f", "g"}


def test_update_with_a_bad_pair_applies_and_marks_those_before_it() -> None:
    d = TrackedDict()
    with pytest.raises(ValueError) as e:
        d.update([("a", 1), ("b", 2, 3), ("c", 4)])
    assert str(e.value) == "dictionary update sequence element #1 has length 3; 2 is required"
    assert d == {"a": 1}
    assert d.take_dirty() == {"a"}
    with pytest.raises(TypeError) as t:
        d.update(iter([("x", 1), 5]))
    assert str(t.value) == "cannot convert dictionary update sequence element #1 to a sequence"
    assert d == {"a": 1, "x": 1}
    assert d.take_dirty() == {"x"}
