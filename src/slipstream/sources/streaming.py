"""Streaming sources (PLACEHOLDER: being written)."""
from typing import Any


def stream_socket(host: str, port: int) -> Any:
    raise NotImplementedError


def stream_files(directory: str) -> Any:
    raise NotImplementedError


def generator(fn: Any, items_per_second: float) -> Any:
    raise NotImplementedError
