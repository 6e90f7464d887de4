"""The state layer: what a snapshot holds and where it lives. Snapshot entry keys and
their routing (:mod:`~slipstream.state.keys`), keyed state that records what changed
(:mod:`~slipstream.state.keyed`) and its copy-on-write saves (:mod:`~slipstream.state.live`), the snapshot file format (:mod:`~slipstream.state.format`),
the store protocol and the durable directory store (:mod:`~slipstream.state.store`), its
signing keys (:mod:`~slipstream.state.signing`), the store's generation and the checks a resume makes (:mod:`~slipstream.state.lineage`),
restore routing (:mod:`~slipstream.state.restore`), and reading a job's state as rows
(:mod:`~slipstream.state.reader`: ``ss.state.read``, ``ss.state.changes``), as Arrow and
with SQL (:mod:`~slipstream.state.query`: ``ss.state.read_arrow``, ``ss.state.sql``) and writing
it (:mod:`~slipstream.state.bootstrap`: ``ss.state.bootstrap``;
:mod:`~slipstream.state.transform`: ``ss.state.transform``;
:mod:`~slipstream.state.backfill`: ``ss.state.backfill``, a batch job's end state as a
snapshot).

Both engines use it; it imports neither (``tests/test_layers.py`` checks it). The
reader's names are imported on first use (``slipstream._lazy``): importing the state
layer does not import the store."""

from slipstream import _lazy

TYPE_CHECKING = False
_EXPORTS = {
    name: f"slipstream.state.reader:{name}"
    for name in ("StateChange", "StateRow", "changes", "read", "to_arrow", "to_pandas")
}
_EXPORTS.update(
    {
        "bootstrap": "slipstream.state.bootstrap:bootstrap",
        "transform": "slipstream.state.transform:transform",
    }
)
_EXPORTS.update({name: f"slipstream.state.query:{name}" for name in ("read_arrow", "sql")})
_EXPORTS.update({name: f"slipstream.state.backfill:{name}" for name in ("Backfill", "backfill")})
_lazy.install(__name__, _EXPORTS)

if TYPE_CHECKING:
    from slipstream.state.backfill import Backfill, backfill
    from slipstream.state.bootstrap import bootstrap
    from slipstream.state.query import read_arrow, sql
    from slipstream.state.reader import (
        StateChange,
        StateRow,
        changes,
        read,
        to_arrow,
        to_pandas,
    )
    from slipstream.state.transform import transform

__all__ = [
    "Backfill",
    "StateChange",
    "StateRow",
    "backfill",
    "bootstrap",
    "changes",
    "read",
    "read_arrow",
    "sql",
    "to_arrow",
    "to_pandas",
    "transform",
]
