"""map / filter / flat_map (PLACEHOLDER: being written)."""
from typing import Any


def map(fn: Any) -> Any:  # noqa: A001
    raise NotImplementedError


def filter(fn: Any) -> Any:  # noqa: A001
    raise NotImplementedError


def flat_map(fn: Any) -> Any:
    raise NotImplementedError


def no_op() -> Any:
    raise NotImplementedError
