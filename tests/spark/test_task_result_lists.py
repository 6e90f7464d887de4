"""A task's list-sink items travel to the driver pickled by the C pickler
(slipstream.spark.task.PickledList), or as they are where it cannot pickle them."""

from __future__ import annotations

import pickle

from pyspark import cloudpickle

from slipstream.spark.task import PickledList
from slipstream.window import KeyedWindowResult


def _through_spark(obj: object) -> object:
    """What the driver gets of a task's result: PySpark pickles it with cloudpickle."""
    return pickle.loads(cloudpickle.dumps(obj, pickle.HIGHEST_PROTOCOL))


def test_window_results_arrive_equal_and_packed() -> None:
    items = [KeyedWindowResult(i * 1000, i * 1000 + 1000, f"k{i % 7}", i) for i in range(500)]
    packed = PickledList.pack(items)
    assert isinstance(packed, PickledList)
    assert packed.rows  # as the class and plain tuples
    got = PickledList.load(_through_spark({"w": packed})["w"])  # type: ignore[index]
    assert got == items
    assert all(type(r) is KeyedWindowResult for r in got)


class Tagged(KeyedWindowResult):  # a subclass whose instances have a __dict__
    pass


def test_named_tuples_with_attributes_or_of_several_classes_travel_whole() -> None:
    tagged = Tagged(0, 1000, "k", 1)
    tagged.note = "kept"  # type: ignore[attr-defined]
    for items in (
        [tagged],
        [KeyedWindowResult(0, 1000, "k", 1), (0, 1000, "k", 1)],
        [(0, 1000, "k", 1)],
    ):
        packed = PickledList.pack(items)  # type: ignore[arg-type]
        assert isinstance(packed, PickledList) and not packed.rows
        got = PickledList.load(_through_spark(packed))  # type: ignore[arg-type]
        assert got == items and [type(r) for r in got] == [type(r) for r in items]
    assert got[0] == (0, 1000, "k", 1)
    assert PickledList.load(_through_spark(PickledList.pack([tagged])))[0].note == "kept"  # type: ignore[arg-type]


def test_items_pickle_cannot_pickle_stay_a_list() -> None:
    class Local:  # a local class: pickle cannot find it by name, cloudpickle pickles it
        def __init__(self, n: int) -> None:
            self.n = n

    items = [1, Local(2)]
    packed = PickledList.pack(items)
    assert packed is items
    got = PickledList.load(_through_spark(packed))  # type: ignore[arg-type]
    assert got[0] == 1 and got[1].n == 2


def test_an_empty_list_round_trips() -> None:
    assert PickledList.load(_through_spark(PickledList.pack([]))) == []  # type: ignore[arg-type]
