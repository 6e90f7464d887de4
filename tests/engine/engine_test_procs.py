"""Small processors shared by the engine tests (imported as a plain module)."""

from __future__ import annotations

import threading
import time
from typing import Any

from slipstream.core.items import Watermark
from slipstream.core.processor import AbstractProcessor, Context


class ListSource(AbstractProcessor):
    """Emits its share (by global index) of ``data``; optional watermark after each item."""

    def __init__(self, data: list[Any], wm_fn: Any = None) -> None:
        self.data = data
        self.wm_fn = wm_fn
        self._it: Any = None

    def init_processor(self, context: Context) -> None:
        mine = self.data[context.global_processor_index :: context.total_parallelism]
        if self.wm_fn is None:
            self._it = iter(mine)
        else:
            self._it = iter([y for x in mine for y in (x, Watermark(self.wm_fn(x)))])

    def complete(self) -> bool:
        return self.emit_from(self._it)


class Tagger(AbstractProcessor):
    """Emits (vertex processor index, member, ordinal, item)."""

    def try_process_item(self, ordinal: int, item: Any) -> bool:
        c = self.context
        return self.try_emit((c.global_processor_index, c.member_index, ordinal, item))


class Collect(AbstractProcessor):
    """Appends (global index, ordinal, item) to the named list; records watermarks."""

    def __init__(self, name: str, record_wm: bool = False) -> None:
        self.name = name
        self.record_wm = record_wm

    def init_processor(self, context: Context) -> None:
        self.out = context.get_list(self.name)

    def try_process_item(self, ordinal: int, item: Any) -> bool:
        self.out.append((self.context.global_processor_index, ordinal, item))
        return True

    def try_process_watermark(self, watermark: Watermark) -> bool:
        if self.record_wm:
            self.out.append((self.context.global_processor_index, "wm", watermark.timestamp))
        return True


class Sink(AbstractProcessor):
    """Appends plain items to the named list."""

    def __init__(self, name: str) -> None:
        self.name = name

    def init_processor(self, context: Context) -> None:
        self.out = context.get_list(self.name)

    def process(self, ordinal: int, inbox: Any) -> None:
        self.out.extend(inbox)
        inbox.clear()


class Infinite(AbstractProcessor):
    def complete(self) -> bool:
        while self.try_emit(1):
            pass
        return False


class Boom(AbstractProcessor):
    def __init__(self, after: int = 0) -> None:
        self.after = after
        self.seen = 0

    def try_process_item(self, ordinal: int, item: Any) -> bool:
        self.seen += 1
        if self.seen > self.after:
            raise ValueError(f"boom on {item!r}")
        return self.try_emit(item)


class BlockingMap(AbstractProcessor):
    """A non-cooperative mapper (gets a thread and a blocking outbox)."""

    def is_cooperative(self) -> bool:
        return False

    def try_process_item(self, ordinal: int, item: Any) -> bool:
        time.sleep(0)
        ok = self.try_emit(item * 10)
        assert ok, "a blocking outbox never refuses"
        return True


class CloseRecorder(AbstractProcessor):
    closed: list[str] = []
    lock = threading.Lock()

    def __init__(self, tag: str) -> None:
        self.tag = tag

    def try_process_item(self, ordinal: int, item: Any) -> bool:
        return self.try_emit(item)

    def close(self) -> None:
        with CloseRecorder.lock:
            CloseRecorder.closed.append(self.tag)


class RunningSums(AbstractProcessor):
    """``(key, running sum of the key's values)`` per item through ``try_process_item`` +
    ``try_emit`` (the documented per-item API), the sums saved in snapshots; a subclass
    says how an item splits into ``(key, value)``."""

    def split(self, item: Any) -> tuple[Any, int]:
        raise NotImplementedError

    def init_processor(self, context: Context) -> None:
        self.sums: dict[Any, int] = {}

    def try_process_item(self, ordinal: int, item: Any) -> bool:
        k, v = self.split(item)
        s = self.sums.get(k, 0) + v
        if not self.try_emit((k, s)):
            return False
        self.sums[k] = s
        return True

    def save_to_snapshot(self) -> bool:
        return self.save_state(self.sums.items)

    def restore_from_snapshot_entry(self, key: Any, value: Any) -> None:
        self.sums[key] = value
