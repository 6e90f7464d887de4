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
