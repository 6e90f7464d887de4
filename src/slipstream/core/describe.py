"""Naming a user's items and functions in error messages.

An error about bad input names the item at fault, but an item can be a megabyte string
or an object whose ``__repr__`` raises: :func:`short_repr` bounds the text and never
fails. A lambda's name alone (``<lambda>``) does not say which of a script's lambdas
failed: :func:`describe_fn` adds the file and line where it was defined.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["REPR_LIMIT", "describe_fn", "short_repr"]

REPR_LIMIT = 200
"""The longest item repr an error message quotes (in characters, before the note of
how long it was)."""


def short_repr(value: Any, limit: int = REPR_LIMIT) -> str:
    """``repr(value)``, cut to ``limit`` characters (saying how long it was), or a
    placeholder when ``__repr__`` itself raises."""
    try:
        text = repr(value)
    except Exception as e:  # noqa: BLE001 - describing an item must not fail
        return f"<{type(value).__name__} object; its repr() raised {type(e).__name__}>"
    if len(text) > limit:
        return f"{text[:limit]}... ({len(text)} characters)"
    return text


def describe_fn(fn: Any) -> str:
    """A function's qualified name, with ``(file.py:line)`` of its definition when it is
    Python code (so that one lambda among many is found); the bounded repr of any other
    callable (``operator.itemgetter(0)``, a ``functools.partial``)."""
    name = getattr(fn, "__qualname__", None)
    if not isinstance(name, str):
        return short_repr(fn)
    code = getattr(fn, "__code__", None)
    if code is None:
        return name
    return f"{name} ({os.path.basename(code.co_filename)}:{code.co_firstlineno})"
