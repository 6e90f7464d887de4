"""Moved to :mod:`slipstream.state.store` (issue 22, the state layer); this old path is
an alias of that module: snapshot files written before the move name ``slipstream.engine.snapshot_store.
SnapshotData`` (a pickled class path), and code may import ``DirectorySnapshotStore``
from here."""

import sys

import slipstream.state.store as _moved
from slipstream.state.store import *  # noqa: F403  (for type checkers; the line below is what runs)

sys.modules[__name__] = _moved
