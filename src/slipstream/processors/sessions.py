"""Session window processor (PLACEHOLDER: being written)."""
from typing import Any


def aggregate_to_session_window(**kwargs: Any) -> Any:
    raise NotImplementedError
