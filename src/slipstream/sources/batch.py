"""Batch sources (PLACEHOLDER: being written)."""
from typing import Any


def items(iterable: Any) -> Any:
    raise NotImplementedError


def list_source(name: str) -> Any:
    raise NotImplementedError


def map_source(name: str) -> Any:
    raise NotImplementedError


def read_files(directory: str, glob: str = "*", encoding: str = "utf-8") -> Any:
    raise NotImplementedError
