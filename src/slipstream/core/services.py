"""Named in-memory structures (Jet's IList/IMap role) that list/map sources and sinks use.

The embedded engine keeps one store per engine; the Spark engine gives each task a local
store whose contents are collected back into the driver's store.
"""

from __future__ import annotations

import threading
from typing import Any


class InMemoryServices:
    """Thread-safe registry of named lists and dicts."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.lists: dict[str, list[Any]] = {}
        self.maps: dict[str, dict[Any, Any]] = {}

    def get_list(self, name: str) -> list[Any]:
        with self._lock:
            lst = self.lists.get(name)
            if lst is None:
                lst = self.lists[name] = []
            return lst

    def get_map(self, name: str) -> dict[Any, Any]:
        with self._lock:
            m = self.maps.get(name)
            if m is None:
                m = self.maps[name] = {}
            return m

    def sink_list(self, name: str) -> list[Any]:
        """The list a sink appends to (``sinks.list_sink``): here the list itself; a
        member process (``ss.local(processes=N)``) hands out one without the
        coordinator's content, which a sink never reads."""
        return self.get_list(name)

    def sink_map(self, name: str) -> dict[Any, Any]:
        """The map a sink puts into (``sinks.map_sink``), as :meth:`sink_list`."""
        return self.get_map(name)

    def list_share(self, name: str, index: int, count: int) -> list[Any]:
        """The items of list ``name`` at positions ``index, index + count, ...`` (one
        processor's share, ``sources.list_source``): the list itself when ``count`` is 1
        (no copy of what may be millions of items). A member process gets just its share
        from the coordinator."""
        lst = self.get_list(name)
        return lst if count == 1 else lst[index::count]

    def map_share(self, name: str, index: int, count: int) -> list[tuple[Any, Any]]:
        """The ``(key, value)`` pairs of map ``name`` at positions ``index, index +
        count, ...`` of its iteration order (``sources.map_source``), as
        :meth:`list_share`."""
        items = list(self.get_map(name).items())
        return items if count == 1 else items[index::count]
