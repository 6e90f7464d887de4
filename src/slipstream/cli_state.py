"""``slipstream state STORE [--vertex V] [--key K] [--snapshot ID] [--format F]``: print a
job's state as of a committed snapshot of its store (:func:`slipstream.state.read`: the
store's signatures are checked before anything is unpickled).

Formats: ``table`` (aligned columns, cells cut at :data:`CELL` characters), ``csv`` (the
same cells, whole) and ``jsonl`` (one JSON object per row; tuples as lists, dicts with
keys that are not strings as ``[[key, value], ...]``, anything JSON has no form for as
its ``repr``). In ``table`` and ``csv`` a key and a value are shown as their ``repr``
(``'a'`` is a string, ``1`` an int), a detail dict as ``name=value`` pairs.
``--key K`` keeps the rows whose key's ``repr`` or ``str`` is ``K``.

Exit status: 0 with the rows printed; 1 when the store cannot be read (no store, no
committed snapshot, a snapshot not retained, a damaged store: the store's message) or
``--key`` matches nothing; 2 for a usage error (an unknown ``--vertex``: the message
lists the vertices)."""

from __future__ import annotations

import argparse
import csv
import json
import sys
from typing import Any

from slipstream.core.errors import SlipstreamError

#: longest cell of the ``table`` format (longer ones end in "...")
CELL = 60
COLUMNS = ("vertex", "processor", "kind", "key", "detail", "value")


def add_parser(sub: Any) -> None:
    """Register the ``state`` subcommand on ``sub`` (the CLI's subparsers)."""
    p = sub.add_parser(
        "state",
        help="print a job's state from its snapshot store (the last committed snapshot)",
        description="Print the entries of a committed snapshot of a snapshot store.",
    )
    p.add_argument("store", metavar="STORE", help="the snapshot store directory")
    p.add_argument("--vertex", metavar="V", help="only this vertex's state")
    p.add_argument("--key", metavar="K", help="only the entries whose key's repr or str is K")
    p.add_argument(
        "--snapshot", type=int, metavar="ID", help="a retained snapshot (default: the newest)"
    )
    p.add_argument("--format", choices=["table", "csv", "jsonl"], default="table")
    p.set_defaults(fn=cmd_state)


def _detail(d: Any) -> str:
    if d is None:
        return ""
    if type(d) is dict:
        return ", ".join(f"{k}={v!r}" for k, v in d.items())
    return repr(d)


def _cells(r: Any) -> list[str]:
    return [r.vertex, str(r.processor), r.kind, repr(r.key), _detail(r.detail), repr(r.value)]


def _cut(s: str) -> str:
    return s if len(s) <= CELL else s[: CELL - 3] + "..."


def _jsonable(x: Any) -> Any:
    if x is None or type(x) in (str, int, float, bool):
        return x
    if type(x) in (list, tuple):
        return [_jsonable(v) for v in x]
    if type(x) is dict:
        if all(type(k) is str for k in x):
            return {k: _jsonable(v) for k, v in x.items()}
        return [[_jsonable(k), _jsonable(v)] for k, v in x.items()]
    return repr(x)


def cmd_state(a: argparse.Namespace) -> int:
    from slipstream.state.reader import read_with_id

    try:
        sid, rows = read_with_id(a.store, a.vertex, a.snapshot)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except SlipstreamError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    where = f"snapshot {sid} of {a.store}" + (f", vertex {a.vertex!r}" if a.vertex else "")
    if a.key is not None:
        rows = [r for r in rows if a.key in (repr(r.key), str(r.key))]
        if not rows:
            print(f"error: no entry with key {a.key!r} in {where}", file=sys.stderr)
            return 1
    out = sys.stdout
    if a.format == "jsonl":
        for r in rows:
            obj = dict(zip(COLUMNS, (r.vertex, r.processor, r.kind), strict=False))
            obj.update(key=_jsonable(r.key), detail=_jsonable(r.detail), value=_jsonable(r.value))
            out.write(json.dumps(obj) + "\n")
    elif a.format == "csv":
        w = csv.writer(out, lineterminator="\n")
        w.writerow(COLUMNS)
        w.writerows(_cells(r) for r in rows)
    else:
        table = [list(COLUMNS)] + [[_cut(c) for c in _cells(r)] for r in rows]
        widths = [max(len(row[i]) for row in table) for i in range(len(COLUMNS))]
        for row in table:
            out.write("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() + "\n")
    print(f"{where}: {len(rows)} row{'s' if len(rows) != 1 else ''}", file=sys.stderr)
    return 0
