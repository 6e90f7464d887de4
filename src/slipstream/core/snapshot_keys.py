"""Moved to :mod:`slipstream.state.keys` (issue 22, the state layer); this old path is
an alias of that module: custom processors import ``BroadcastKey`` and ``KeyedStateKey`` from here, and
snapshot files written before the move name these classes by this path (pickle).
The one import of ``slipstream.state`` in ``slipstream.core`` (tests/test_layers.py
allows it by name); nothing in slipstream imports this module."""

import sys

import slipstream.state.keys as _moved
from slipstream.state.keys import *  # noqa: F403  (for type checkers; the line below is what runs)

sys.modules[__name__] = _moved
