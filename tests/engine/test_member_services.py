"""The named maps a member process's processors write (engine/member.py's TrackedDict):
only the keys that changed travel to the coordinator, so every way of changing a key
must mark it."""

from __future__ import annotations

from collections import deque
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


def test_a_named_list_or_map_is_fetched_once_and_a_sinks_writes_stay_its_own() -> None:
    """A member's named structures (MemberServices): a sink's list or map starts empty
    (nothing fetched); a processor reading the same name later gets the coordinator's
    content before the sink's unreported items (which alone are reported) and, in a map,
    under the sink's newer puts; a share is fetched as such; each name once."""
    from slipstream.engine.member import MemberServices

    asked: list[tuple[str, str, int, int]] = []
    held: dict[str, Any] = {"list": ["c1", "c2"], "map": {"k": "old", "j": 1}}

    def fetch(kind: str, name: str, index: int, count: int) -> Any:
        asked.append((kind, name, index, count))
        content = held[kind]
        if count:
            pairs = content if kind == "list" else list(content.items())
            return pairs[index::count]
        return list(content) if kind == "list" else dict(content)

    s = MemberServices(fetch)
    s.sink_list("a").extend([1, 2])
    s.sink_map("m").update([("k", "new")])
    assert asked == []
    assert s.get_list("a") == ["c1", "c2", 1, 2]
    assert s.get_map("m") == {"k": "new", "j": 1}
    s.get_list("a").append(3)
    assert s.get_list("a") is s.sink_list("a")
    assert s.list_share("a", 1, 2) == ["c2"] and s.map_share("m", 0, 2) == [("k", "old")]
    assert asked == [("list", "a", 0, 0), ("map", "m", 0, 0), ("list", "a", 1, 2), ("map", "m", 0, 2)]
    lists, maps = s.take_changes()
    assert lists == {"a": [1, 2, 3]} and maps == {"m": ({"k": "new"}, [])}
    assert s.get_list("a") == ["c1", "c2"]


class SwitchingKey:
    """A key whose ``__hash__`` runs Python code: at its second hash (the mark, after the
    value was stored) it lets the member's report thread take the marks, as a thread
    switch at that point would."""

    def __init__(self, on_mark: Any) -> None:
        self.hashes = 0
        self.on_mark = on_mark

    def __hash__(self) -> int:
        self.hashes += 1
        if self.hashes == 2:
            self.on_mark()
        return 7

    def __eq__(self, other: object) -> bool:
        return other is self


def test_a_key_marked_while_the_report_takes_the_marks_is_reported() -> None:
    """Before, the report thread could take (and read) the set of marks between a
    value's store and its mark: the key went into the set already reported and its new
    value never reached the coordinator."""
    import threading

    m = TrackedDict()
    reported: list[list[Any]] = []
    threads: list[threading.Thread] = []

    def report() -> None:
        reported.append(list(m.take_dirty()))

    def on_mark() -> None:
        t = threading.Thread(target=report)
        threads.append(t)
        t.start()
        t.join(0.5)  # with the lock the report waits for the mark: it cannot end here

    key = SwitchingKey(on_mark)
    m[key] = 1
    threads[0].join(10)
    report()
    assert [k for batch in reported for k in batch] == [key]


def test_has_output_says_whether_take_changes_would_hand_over_something() -> None:
    """What a member's worker asks when it goes idle (flush on idle: the report loop
    then sends the sinks' new output at once, not at its next tick)."""
    from slipstream.engine.member import MemberServices

    s = MemberServices()
    lst, m = s.sink_list("a"), s.sink_map("m")
    assert not s.has_output()
    lst.append(1)
    assert s.has_output()
    assert s.take_changes() == ({"a": [1]}, {})
    assert not s.has_output()
    m["k"] = 2
    assert s.has_output()
    s.take_changes()
    assert not s.has_output()




def test_a_buffered_map_holds_the_puts_not_reported_and_unbuffers_into_the_whole_map() -> None:
    """A map sink's map in a member (buffered): a report takes the newest value of each
    key put since the last one, and the map then holds nothing; read by a processor of
    the member, it becomes the whole map (what was reported under the newer puts), and
    marks keys from then on."""
    d = TrackedDict(buffered=True)
    d.put_pairs(deque([("a", 1), ("b", 2), ("a", 3)]))
    assert d.changed()
    assert d.take_changes() == ({"a": 3, "b": 2}, [])
    assert not d.changed() and dict(d) == {}
    d.put_pairs([("b", 4), ("c", 5)])
    with pytest.raises(ValueError) as e:
        d.put_pairs([("d", 1), ("e", 2, 3), ("f", 4)])
    assert str(e.value) == "dictionary update sequence element #1 has length 3; 2 is required"
    d.unbuffer()
    assert not d.buffered
    assert d == {"a": 3, "b": 4, "c": 5, "d": 1}
    assert d.take_changes() == ({"b": 4, "c": 5, "d": 1}, [])
    d.put_pairs([("a", 6)])
    del d["b"]
    assert d.take_changes() == ({"a": 6}, ["b"])


def test_removing_a_key_of_a_buffered_map_unbuffers_it_first() -> None:
    d = TrackedDict(buffered=True)
    d.put_pairs([("a", 1), ("b", 2)])
    d.take_changes()
    d.put_pairs([("c", 3)])
    assert d.pop("a") == 1
    assert d == {"b": 2, "c": 3}
    assert d.take_changes() == ({"c": 3}, ["a"])


ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("put"),
            st.lists(
                st.one_of(
                    st.tuples(st.sampled_from("abcdef"), st.integers(0, 3)),
                    st.tuples(st.sampled_from("abc"), st.integers(0, 3), st.integers(0, 3)),
                ),
                max_size=8,
            ),
        ),
        st.tuples(st.just("report"), st.none()),
        st.tuples(st.just("read"), st.none()),
    ),
    max_size=12,
)


@settings(max_examples=60, deadline=None)
@given(ops=ops, buffered=st.booleans())
def test_what_reports_carry_makes_the_coordinators_map_the_members(
    ops: list[Any], buffered: bool
) -> None:
    """Differential against a plain dict (the map as one process holds it): batches of
    puts (a bad pair raises dict.update's error, the pairs before it applied), reports
    applied to the coordinator's map, and a processor reading the map (unbuffer) at any
    point; after the last report the coordinator's map equals the dict, and a read gives
    the dict."""
    d, oracle, coordinator = TrackedDict(buffered=buffered), {}, {}

    def report() -> None:
        updates, deleted = d.take_changes()
        coordinator.update(updates)
        for k in deleted:
            coordinator.pop(k, None)

    for op, batch in ops:
        if op == "put":
            expected: BaseException | None = None
            try:
                oracle.update(batch)
            except ValueError as e:
                expected = e
            try:
                d.put_pairs(batch)
            except ValueError as e:
                assert expected is not None and str(e) == str(expected)
            else:
                assert expected is None
        elif op == "report":
            report()
        else:
            d.unbuffer()
            assert d == oracle
    report()
    assert coordinator == oracle
    d.unbuffer()
    assert d == oracle
