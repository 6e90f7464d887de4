"""A key function's name as a person recognises it, for edge labels.

An edge labelled ``partitioned by attrgetter`` or ``partitioned by lambda`` does not say
which key it partitions by. This module names the function by what it does:
``itemgetter(0)`` and ``attrgetter('symbol')`` with their arguments, a short lambda by
its source text (``lambda t: t.symbol``), a long one by where it is defined
(``<lambda> at trades.py:42``), a function by its qualified name.
"""

from __future__ import annotations

import ast
import functools
import linecache
import operator
import os
from types import CodeType

#: A lambda's source text longer than this is shown as ``<lambda> at file:line``.
LAMBDA_TEXT_MAX = 32

_OPERATOR_TYPES = (operator.itemgetter, operator.attrgetter, operator.methodcaller)


def callable_name(fn: object) -> str:
    """``fn`` named for an edge label (``""`` for ``None``)."""
    if fn is None:
        return ""
    if isinstance(fn, _OPERATOR_TYPES):
        return repr(fn).removeprefix("operator.")
    if isinstance(fn, functools.partial):
        return f"partial({callable_name(fn.func)})"
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    if not isinstance(name, str) or not name:
        return type(fn).__qualname__  # a callable object: its class
    code = getattr(fn, "__code__", None)
    if name.endswith("<lambda>") and isinstance(code, CodeType):
        return lambda_text(code)
    return name.rsplit("<locals>.", 1)[-1]  # a nested function: from its own scope on


def lambda_text(code: CodeType) -> str:
    """The lambda's source (whitespace collapsed) when it is short and can be read,
    else ``<lambda> at FILE:LINE``."""
    where = f"<lambda> at {os.path.basename(code.co_filename)}:{code.co_firstlineno}"
    source = "".join(linecache.getlines(code.co_filename))
    if not source:
        return where
    node = _find_lambda(_parse(source), code)
    segment = ast.get_source_segment(source, node) if node is not None else None
    if not segment:
        return where
    text = " ".join(segment.split())
    return text if len(text) <= LAMBDA_TEXT_MAX else where


@functools.lru_cache(maxsize=16)
def _parse(source: str) -> ast.Module | None:
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError):
        return None


def _find_lambda(tree: ast.Module | None, code: CodeType) -> ast.Lambda | None:
    """The ``lambda`` expression ``code`` was compiled from: among the lambdas that start
    on its first line, the narrowest whose body holds every position of its code (two
    lambdas on one line, or one nested in another, are told apart that way)."""
    if tree is None:
        return None
    candidates = [
        n for n in ast.walk(tree) if isinstance(n, ast.Lambda) and n.lineno == code.co_firstlineno
    ]
    if len(candidates) <= 1:
        return candidates[0] if candidates else None
    positions = [
        (line, col, end_line, end_col)
        for line, end_line, col, end_col in code.co_positions()
        if line is not None and col is not None and end_line is not None and end_col is not None
        and (line, col) != (end_line, end_col)  # RESUME and RETURN carry an empty span
    ]

    def holds(n: ast.Lambda) -> bool:
        b = n.body
        if b.end_lineno is None or b.end_col_offset is None:
            return False
        start, end = (b.lineno, b.col_offset), (b.end_lineno, b.end_col_offset)
        return all(start <= (p[0], p[1]) and (p[2], p[3]) <= end for p in positions)

    fits = [n for n in candidates if holds(n)]
    if not fits:
        return None

    def span(n: ast.Lambda) -> tuple[int, int]:
        return ((n.end_lineno or n.lineno) - n.lineno, (n.end_col_offset or 0) - n.col_offset)

    return min(fits, key=span)
