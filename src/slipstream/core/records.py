"""Items with named fields: named tuples (``KeyedWindowResult``, ``WindowResult``, your
own ``typing.NamedTuple`` or ``collections.namedtuple``) and dataclass instances.

The file sinks (CSV, JSON lines, Parquet) and the Spark DataFrame sink write such an
item as a record whose columns are its field names, in their declared order, exactly as
they write a dict: a ``KeyedWindowResult`` becomes the columns ``start, end, key,
value``, not ``f0 .. f3``. Only the item's own fields count (a field holding another
record stays one value). The field names of a type are looked up once per type.
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["as_record", "record_fields"]

_FIELDS: dict[type, tuple[str, ...] | None] = {}
_CACHE_LIMIT = 4096  # types defined in a loop must not grow the cache without bound


def record_fields(cls: type) -> tuple[str, ...] | None:
    """The field names of named-tuple or dataclass type ``cls`` in declared order, or
    ``None`` for any other type (plain tuples, lists, dicts, scalars)."""
    try:
        return _FIELDS[cls]
    except KeyError:
        pass
    names: tuple[str, ...] | None = None
    if issubclass(cls, tuple):
        fields = getattr(cls, "_fields", None)
        if isinstance(fields, tuple) and all(type(n) is str for n in fields):
            names = fields
    elif dataclasses.is_dataclass(cls):
        names = tuple(f.name for f in dataclasses.fields(cls))
    if len(_FIELDS) >= _CACHE_LIMIT:
        _FIELDS.clear()
    _FIELDS[cls] = names
    return names


def as_record(item: Any) -> dict[str, Any] | None:
    """``item``'s fields as a dict (field name -> value, declared order) if it is a named
    tuple or a dataclass instance, else ``None``."""
    names = record_fields(type(item))
    if names is None:
        return None
    if isinstance(item, tuple):
        return dict(zip(names, item, strict=True))
    return {n: getattr(item, n) for n in names}
