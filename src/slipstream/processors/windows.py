"""Sliding/tumbling window processors (PLACEHOLDER: being written)."""
from typing import Any


def accumulate_by_frame(**kwargs: Any) -> Any:
    raise NotImplementedError


def combine_to_sliding_window(**kwargs: Any) -> Any:
    raise NotImplementedError


def aggregate_to_sliding_window(**kwargs: Any) -> Any:
    raise NotImplementedError
