"""Sinks (PLACEHOLDER: being written)."""
from typing import Any


def list_sink(name: str) -> Any:
    raise NotImplementedError


def map_sink(name: str) -> Any:
    raise NotImplementedError


def write_files(directory: str) -> Any:
    raise NotImplementedError


def logger() -> Any:
    raise NotImplementedError


def noop() -> Any:
    raise NotImplementedError


def write_buffered(create_buffer: Any, add_to_buffer: Any, flush_buffer: Any, destroy_buffer: Any = None) -> Any:
    raise NotImplementedError
