"""The state layer: what a snapshot holds and where it lives. Snapshot entry keys and
their routing (:mod:`~slipstream.state.keys`), keyed state that records what changed
(:mod:`~slipstream.state.keyed`), the snapshot file format (:mod:`~slipstream.state.format`),
the store protocol and the durable directory store (:mod:`~slipstream.state.store`), its
signing keys (:mod:`~slipstream.state.signing`), the store's generation and the checks a resume makes (:mod:`~slipstream.state.lineage`), and
restore routing (:mod:`~slipstream.state.restore`).

Both engines use it; it imports neither (``tests/test_layers.py`` checks it)."""
