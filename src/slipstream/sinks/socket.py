"""Socket sink (PLACEHOLDER: being written)."""
from typing import Any


def write_socket(host: str, port: int) -> Any:
    raise NotImplementedError
