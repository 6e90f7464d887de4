"""Batch aggregation processors (PLACEHOLDER: being written)."""
from typing import Any


def aggregate(op: Any) -> Any:
    raise NotImplementedError


def accumulate(op: Any) -> Any:
    raise NotImplementedError


def combine(op: Any) -> Any:
    raise NotImplementedError


def aggregate_by_key(key_fn: Any, op: Any) -> Any:
    raise NotImplementedError


def accumulate_by_key(key_fn: Any, op: Any) -> Any:
    raise NotImplementedError


def combine_by_key(op: Any) -> Any:
    raise NotImplementedError
