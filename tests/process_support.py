"""What tests of member processes share (``ss.local(processes=N)``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import ModuleType

from slipstream.core.pickling import cloudpickle


@contextlib.contextmanager
def functions_by_value(*modules: ModuleType) -> Iterator[None]:
    """The functions and classes of ``modules`` (a test module) travel to member processes
    by value while this is open. Pickled by reference, each member would import the test
    module, and pytest or hypothesis with it, at every job (~0.4 s a job)."""
    for module in modules:
        cloudpickle.register_pickle_by_value(module)
    try:
        yield
    finally:
        for module in modules:
            cloudpickle.unregister_pickle_by_value(module)
