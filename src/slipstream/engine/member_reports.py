"""A job's warnings about late items and items set aside, when its members run in
processes (``ss.local(processes=N)``): one job-wide report in the coordinator, as with one
process, instead of one per member.

In a member process the reports the processors feed (``late_items_dropped`` increments,
``on_item_error``'s items) are :class:`ForwardedLateItems` and :class:`ForwardedItemErrors`:
they log nothing and send each event over the control pipe; the coordinator hands it to
the job's own :class:`~slipstream.core.late_items.LateItemsReport` and
:class:`~slipstream.core.item_errors.ItemErrorReport` (:func:`apply`), which warn at the
first event, then at most once a minute with the job's running counts, and give the total
at the job's end. The item and the error cross as text (their ``repr`` cut as a warning
cuts it, the error's type name and message): they need not pickle.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from slipstream.core.describe import short_repr
from slipstream.core.item_errors import ItemErrorReport
from slipstream.core.late_items import LateItemsReport

#: the control messages
LATE = "late"
ITEM_ERROR = "item_error"

_log = logging.getLogger("slipstream.member")


class ForwardedLateItems(LateItemsReport):
    """A member's late-item counts, sent to the coordinator's report."""

    def __init__(self, job_name: str, send: Callable[[tuple[Any, ...]], bool]) -> None:
        super().__init__(job_name, _log)
        self._send = send

    def add(self, vertex: str, count: int, warn: bool = True) -> None:
        if count > 0:
            self._send((LATE, vertex, count, warn))

    def finish(self) -> None:
        """The coordinator's report gives the total."""


class ForwardedItemErrors(ItemErrorReport):
    """A member's items set aside, sent to the coordinator's report."""

    def __init__(self, job_name: str, send: Callable[[tuple[Any, ...]], bool]) -> None:
        super().__init__(job_name, _log)
        self._send = send

    def add(
        self,
        vertex: str,
        item: Any,
        error: BaseException,
        source: str | None = None,
        target: str | None = None,
    ) -> None:
        try:
            message = str(error)
        except Exception:  # noqa: BLE001 - a broken __str__ must not hide the failure
            message = "<unprintable>"
        self._send((ITEM_ERROR, vertex, short_repr(item), type(error).__name__, message, source, target))

    def finish(self) -> None:
        """The coordinator's report gives the total."""


class ItemText:
    """An item as its text: ``repr`` gives the member's ``short_repr`` of it."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


_error_types: dict[str, type[Exception]] = {}


def _error(type_name: str, message: str) -> Exception:
    """An exception that a warning quotes as ``"<type name>: <message>"``."""
    cls = _error_types.get(type_name)
    if cls is None:
        cls = _error_types[type_name] = type(type_name, (Exception,), {})
    return cls(message)


def apply(job: Any, msg: tuple[Any, ...]) -> None:
    """In the coordinator: a member's :data:`LATE` or :data:`ITEM_ERROR` message, given
    to ``job``'s own reports."""
    if msg[0] == LATE:
        _, vertex, count, warn = msg
        job.late_items.add(vertex, count, warn)
    else:
        _, vertex, item_text, type_name, message, source, target = msg
        job.item_errors.add(vertex, ItemText(item_text), _error(type_name, message), source, target)
