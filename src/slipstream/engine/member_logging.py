"""Log records of member processes, handed to the coordinator's logging
(``ss.local(processes=N)``).

A member process starts from the forkserver, not from the user's process: it has none of
the logging set-up the user made (handlers, formats, levels), so what its processors and
the engine log there (a ``logger()`` sink's items, the warnings about late items and
items set aside, a slow call) would reach no handler of the user's, and below WARNING
nowhere at all. So the coordinator ships its loggers' levels with the job
(:func:`levels_here`); the member sets them and puts one handler on its root logger
(:class:`ForwardingHandler`) that sends each record it lets through over the control pipe
as plain fields (the message already formatted, the traceback as text); the coordinator's
listener re-creates the record (:func:`replay`) with ``processName`` ``member<N>`` and
``process`` the member's pid, and hands it to the logger of the same name, whose
handlers and filters then decide as for a record of its own.
"""

from __future__ import annotations

import logging
from typing import Any

#: the control message that carries one record
LOG = "log"

_FIELDS = ("name", "levelno", "levelname", "pathname", "filename", "module", "lineno", "funcName",
           "created", "msecs", "relativeCreated", "thread", "threadName")


def levels_here() -> dict[str, int]:
    """The levels set on this process's loggers: ``""`` for the root, then every named
    logger that has one of its own."""
    levels = {"": logging.getLogger().level}
    for name, logger in list(logging.Logger.manager.loggerDict.items()):
        if isinstance(logger, logging.Logger) and logger.level != logging.NOTSET:
            levels[name] = logger.level
    return levels


class ForwardingHandler(logging.Handler):
    """Sends each record to the coordinator through ``send`` (the member's control)."""

    def __init__(self, send: Any) -> None:
        super().__init__()
        self._send = send
        self._formatter = logging.Formatter()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            fields: dict[str, Any] = {k: getattr(record, k, None) for k in _FIELDS}
            fields["msg"] = record.getMessage()
            exc = record.exc_text
            if exc is None and record.exc_info:
                exc = self._formatter.formatException(record.exc_info)
            fields["exc_text"] = exc
            fields["stack_info"] = record.stack_info
            self._send((LOG, fields))
        except Exception:  # noqa: BLE001 - logging must never fail the caller
            self.handleError(record)


def install(send: Any, levels: dict[str, int]) -> None:
    """In a member process: the coordinator's levels, and the forwarding handler as the
    root logger's only handler."""
    for name, level in levels.items():
        logging.getLogger(name or None).setLevel(level)
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(ForwardingHandler(send))


def replay(fields: dict[str, Any], member: int, pid: int | None) -> None:
    """In the coordinator: log a member's record as if it were logged here."""
    record = logging.makeLogRecord(
        {**fields, "args": None, "exc_info": None, "processName": f"member{member}", "process": pid}
    )
    logger = logging.getLogger(None if record.name == "root" else record.name)
    if logger.isEnabledFor(record.levelno):
        logger.handle(record)
