"""The dashboard's key search: ``/api/jobs/ID/state?vertex=V&key=K``.

It answers from the job's last committed snapshot through
:func:`slipstream.state.reader.point_query`, the code behind ``job.state(vertex, key)``,
so the page and a program asking the job see the same rows. A key is typed as text and
read as a JSON literal when it is one (``42`` the int, ``"42"`` the string, ``[1, "a"]``
the tuple ``(1, 'a')``, ``true``, ``null``); any other text is the string as typed
(``alice``). Values go out as JSON where they are plain data, and always as their
``repr`` (what the page shows, as text; cut to :data:`REPR_CHARS` characters).
"""

from __future__ import annotations

import json
import math
from typing import Any

from slipstream.core.errors import SnapshotError


def parse_key(text: str) -> Any:
    """The key ``text`` stands for (see the module doc): JSON arrays become tuples (a
    key must be hashable), objects stay dicts (no key of a snapshot equals one)."""
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return _tuples(value)


def _tuples(value: Any) -> Any:
    if type(value) is list:
        return tuple(_tuples(v) for v in value)
    if type(value) is dict:
        return {k: _tuples(v) for k, v in value.items()}
    return value


def plain(value: Any) -> Any:
    """``value`` as JSON data if it is plain data (None, bool, int, finite float, str,
    and lists, tuples and str-keyed dicts of those; tuples become lists), else its
    ``repr``."""
    try:
        return _plain(value)
    except ValueError:
        return repr(value)


def _plain(value: Any) -> Any:
    t = type(value)
    if value is None or t in (bool, int, str):
        return value
    if t is float:
        if not math.isfinite(value):
            raise ValueError
        return value
    if t in (list, tuple):
        return [_plain(v) for v in value]
    if t is dict and all(type(k) is str for k in value):
        return {k: _plain(v) for k, v in value.items()}
    raise ValueError


#: The longest ``value_repr`` sent (a map_stateful state can be a list of millions).
REPR_CHARS = 10_000


def shown(value: Any) -> str:
    """``repr(value)``, cut to :data:`REPR_CHARS` characters and saying how long it was."""
    r = repr(value)
    if len(r) <= REPR_CHARS:
        return r
    return f"{r[:REPR_CHARS]}\u2026 ({len(r):,} characters in all)"


def answer(job: Any, job_id: str, vertex: str | None, key_text: str | None) -> tuple[int, dict[str, Any]]:
    """The HTTP status and JSON body of a key search (see docs/watching.md, "State")."""
    from slipstream.state.reader import point_query

    if not vertex:
        return 400, {"error": "choose a vertex (?vertex=NAME)"}
    if key_text is None or key_text.strip() == "":
        return 400, {"error": "type a key (?key=TEXT: a JSON literal such as 42 or \"42\", or plain text)"}
    key = parse_key(key_text)
    try:
        sid, rows = point_query(job, vertex, key)
    except SnapshotError as e:
        return 409, {"error": str(e)}
    except ValueError as e:  # a vertex the snapshot does not have
        return 404, {"error": str(e)}
    body: dict[str, Any] = {
        "job": job_id,
        "vertex": vertex,
        "key": plain(key),
        "key_repr": repr(key),
        "snapshot_id": sid,
        "found": bool(rows),
        "rows": [
            {
                "processor": r.processor,
                "kind": r.kind,
                "detail": plain(r.detail),
                "value": plain(r.value),
                "value_repr": shown(r.value),
            }
            for r in rows
        ],
    }
    if not rows:
        body["message"] = f"no such key: {key!r} in vertex {vertex!r} as of snapshot {sid}"
    return 200, body
