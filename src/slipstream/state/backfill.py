"""Backfill: compute a streaming job's state over history as a batch job on any engine
(``ss.spark()`` for a year of files, ``ss.local()`` for a day), then start the streaming
job from it (``ss.state.backfill``).

The batch job is the streaming job's own Pipeline (or DAG) built over a history source
(same stages, same stage names, so the same vertices), run as it is, with one change:
each vertex between its sources and its sinks, when its input ends, *saves its state
instead of completing*. A window then keeps the frames of the windows it has not
emitted, a rolling aggregate its accumulators, an async stage its items in flight,
exactly what the processor itself would put into a snapshot taken at that moment. Each
processor hands its entries to a named list of the engine's services (on Spark they come
back to the driver with the task's results), and they are written as one signed
format-3 snapshot stamped with the *live* DAG's shape, every entry under the processor
that saved it (a restore at any parallelism routes keyed entries by key, as for a job's
own snapshot). Source offsets where the history ends are set as with
:func:`~slipstream.state.bootstrap.bootstrap` (``offsets=``).

Items the batch job emits (a rolling aggregate's running values over history, windows it
emitted) reach its sinks as usual: they are the history's part of the output, and the
live job emits the rest. A batch job sees no watermark (``JobConfig.batch_watermarks``
off), so its windows emit nothing over history and the live job emits them all once its
watermark passes them, unless the batch job runs with ``batch_watermarks=True``.

The state travels to the driver in memory: a backfill of millions of keys needs that
much driver memory (a Spark streaming job's executors write their own chunks; a batch
backfill does not yet)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from slipstream.core.suppliers import (
    FactorySupplier,
    MemberAddress,
    ProcessorMetaSupplier,
    ProcessorSupplier,
    SupplierContext,
)
from slipstream.state.keyed import FULL, StateMapSave

__all__ = ["Backfill", "backfill"]

#: modules whose processors keep keyed state a live job needs from the history
_STATEFUL_MODULES = (
    "slipstream.processors.windows",
    "slipstream.processors.sessions",
    "slipstream.processors.aggregation",
    "slipstream.pipeline.keyed",
)


class Backfill(NamedTuple):
    """What :func:`backfill` did: the id of the snapshot it committed, the batch job
    (its metrics; its output is in its sinks), and per vertex the number of entries
    saved (a window's frames count one entry per frame and key)."""

    snapshot_id: int
    job: Any
    entries: dict[str, int]


class _Holder:
    """What a wrapped processor's ``init`` handed it (its outbox and context), and the
    entries its saves gave so far."""

    __slots__ = ("outbox", "context", "entries")

    def __init__(self) -> None:
        self.outbox: Any = None
        self.context: Any = None
        self.entries: list[tuple[Any, Any]] = []


def _detached(entry: tuple[Any, Any], where: str) -> tuple[Any, Any]:
    """``entry`` with a saved map copied (the processor is done; its map is not
    changed again, but a backend may close it)."""
    k, v = entry
    if type(v) is StateMapSave:
        if v.mode != FULL:
            raise ValueError(f"{where}: saved {v.mode} keyed state in a backfill (expected full)")
        return k, StateMapSave(FULL, dict(v.upserts))
    return k, v


def _wrap(processor: Any, list_name: str) -> Any:
    """Make ``processor`` save its state, instead of completing, when its input ends, and
    append ``(vertex, global index, total parallelism, entries)`` to ``list_name``."""
    holder = _Holder()
    init, save = processor.init, processor.save_to_snapshot

    def wrapped_init(outbox: Any, context: Any) -> None:
        holder.outbox, holder.context = outbox, context
        init(outbox, context)

    def complete() -> bool:
        ctx, outbox = holder.context, holder.outbox
        ctx.current_snapshot_id = 1
        done = save()  # may emit first (a window's first stage flushes its frames)
        bucket = outbox.snapshot_bucket
        where = f"vertex {ctx.vertex_name!r}, processor {ctx.global_processor_index}"
        holder.entries.extend(_detached(e, where) for e in bucket)
        bucket.clear()
        if not done:
            return False  # called again once the outbox has room
        ctx.services.get_list(list_name).append(
            (ctx.vertex_name, ctx.global_processor_index, ctx.total_parallelism, holder.entries)
        )
        return True

    try:
        processor.init = wrapped_init
        processor.complete = complete
    except AttributeError:
        raise TypeError(
            f"{type(processor).__name__} cannot be run by a backfill (its instances take no "
            f"attributes: __slots__ without __dict__)"
        ) from None
    return processor


class _DumpSupplier(ProcessorSupplier):
    """One member's supplier of a backfilled vertex: the original's processors, each
    wrapped by :func:`_wrap`."""

    def __init__(self, inner: ProcessorSupplier, list_name: str) -> None:
        self.inner = inner
        self.list_name = list_name

    def init(self, context: SupplierContext) -> None:
        self.inner.init(context)

    def get(self, count: int) -> list[Any]:
        return [_wrap(p, self.list_name) for p in self.inner.get(count)]

    def close(self, error: BaseException | None) -> None:
        self.inner.close(error)


class _DumpMetaSupplier(ProcessorMetaSupplier):
    """A vertex's meta-supplier whose members' suppliers are :class:`_DumpSupplier` s."""

    def __init__(self, inner: ProcessorMetaSupplier, list_name: str) -> None:
        self.inner = inner
        self.list_name = list_name

    def preferred_local_parallelism(self) -> int:
        return self.inner.preferred_local_parallelism()

    def init(self, context: SupplierContext) -> None:
        self.inner.init(context)

    def get(
        self, addresses: Sequence[MemberAddress]
    ) -> Callable[[MemberAddress], ProcessorSupplier]:
        by_address = self.inner.get(addresses)
        name = self.list_name

        def supplier(address: MemberAddress) -> ProcessorSupplier:
            s: Any = by_address(address)
            if not isinstance(s, ProcessorSupplier):
                s = FactorySupplier(s)
            return _DumpSupplier(s, name)

        return supplier

    def close(self, error: BaseException | None) -> None:
        self.inner.close(error)


def _class_name(v: Any) -> tuple[str, str]:
    from slipstream.state.bootstrap import _class_id, _processor_class

    return _class_id(_processor_class(v.supplier))


def _middle(dag: Any) -> list[Any]:
    """The vertices with inbound and outbound edges (neither a source nor a sink)."""
    return [v for v in dag.vertices if dag.inbound_edges(v) and dag.outbound_edges(v)]


def _check_same_vertices(ran: Any, live: Any, saved: Mapping[str, Any]) -> None:
    """Refuse a backfill whose state cannot carry over: a vertex that saved state and
    that the live DAG lacks or runs with another processor, or a stateful vertex of the
    live DAG that the batch job does not have."""
    live_names = {v.name for v in live.vertices}
    ran_names = {v.name for v in ran.vertices}
    advice = (
        "build both jobs with the same Pipeline code (same stages, stage names and "
        "set_local_parallelism calls; only the source and sink differ) so that they "
        "compile to the same vertices (a stage with a parallelism of its own is not fused "
        "into the next one)"
    )
    for name in sorted(saved):
        if name not in live_names:
            raise ValueError(
                f"vertex {name!r} of the backfill job holds state but the live job has no "
                f"vertex {name!r} (its vertices: {', '.join(sorted(map(repr, live_names)))}); "
                f"{advice}"
            )
        a, b = _class_name(ran.vertex(name)), _class_name(live.vertex(name))
        if a != ("", "") and b != ("", "") and a != b:
            raise ValueError(
                f"vertex {name!r} runs {a[0]}.{a[1]} in the backfill job but {b[0]}.{b[1]} "
                f"in the live job; its state cannot carry over: {advice}"
            )
    for v in _middle(live):
        module = _class_name(v)[0]
        if module in _STATEFUL_MODULES and v.name not in ran_names:
            raise ValueError(
                f"vertex {v.name!r} of the live job keeps state ({_class_name(v)[1]}) but "
                f"the backfill job has no vertex {v.name!r} (its vertices: "
                f"{', '.join(sorted(map(repr, ran_names)))}); {advice}"
            )


def backfill(
    history: Any,
    live: Any,
    store: Any,
    *,
    engine: Any,
    offsets: Mapping[str, Any] | None = None,
    config: Any = None,
    job_name: str = "backfill",
    parallelism: int | None = None,
    timeout: float | None = None,
) -> Backfill:
    """Run ``history`` (the streaming job's Pipeline or DAG built over a history source:
    same stages and names as ``live``) as a batch job on ``engine`` (``ss.spark()``,
    ``ss.local()``), then commit the state its stateful vertices hold at the end of the
    history as the first snapshot of ``store`` (a directory or a
    ``DirectorySnapshotStore`` holding no snapshot), for ``live``. Start ``live`` with
    ``restore_from=store`` to continue: it emits what one uninterrupted run over history
    and live data would have emitted after the history (see the module doc).

    ``offsets``: ``{live source vertex: position}`` where the history ends, as for
    :func:`~slipstream.state.bootstrap.bootstrap` (a Kafka source's ``{(topic,
    partition): next offset to read}``). ``config``: the batch job's ``JobConfig``.
    ``parallelism``: the local parallelism recorded for ``live``'s vertices that set
    none and saved nothing (``None``: 1; a restore at another one is routed).
    ``timeout``: seconds to wait for the batch job (``None``: no limit).

    Before anything runs, a store holding snapshots and offsets that do not fit ``live``
    are refused; after the batch job, a vertex whose state cannot carry over (``live``
    has no vertex of its name, or runs another processor there; or a stateful vertex of
    ``live`` missing from the batch job) is refused with a ``ValueError`` naming it, and
    nothing is committed."""
    from slipstream.core.dag import as_dag
    from slipstream.core.errors import SnapshotError
    from slipstream.state.bootstrap import _as_store, _parallelism, _source_offsets, _write
    from slipstream.state.lineage import dag_shape

    live_dag = as_dag(live)
    default = 1 if parallelism is None else int(parallelism)
    if default < 1:
        raise ValueError(f"parallelism must be >= 1, got {parallelism!r}")
    totals = {v.name: _parallelism(v, default) for v in live_dag.vertices}
    entries: dict[tuple[str, int], list[Any]] = {}
    for source, spec in (offsets or {}).items():
        for i, es in _source_offsets(live_dag, source, spec, totals.get(source, 0)).items():
            entries.setdefault((source, i), []).extend(es)
    s = _as_store(store)
    if s.file_ids() or s.committed_ids():
        raise SnapshotError(
            f"snapshot store {s.directory} already holds snapshots; a backfill writes the "
            f"first snapshot of an empty store"
        )
    dag = as_dag(history)
    list_name = f"__slipstream_backfill_{os.urandom(8).hex()}"
    originals = [(v, v.meta_supplier) for v in _middle(dag)]
    try:
        for v, meta in originals:
            v.meta_supplier = _DumpMetaSupplier(meta, list_name)
        job = engine.new_job(dag, config) if config is not None else engine.new_job(dag)
        job.join(timeout)
    finally:
        for v, meta in originals:  # a DAG given by the caller is left as it was
            v.meta_supplier = meta
    out = engine.get_list(list_name)
    dumped = list(out)
    out.clear()
    saved: dict[str, int] = {}
    for name, _index, total, es in dumped:
        if es:
            saved[name] = total
    _check_same_vertices(getattr(job, "dag", dag), live_dag, saved)
    counts: dict[str, int] = {}
    for name, index, total, es in dumped:
        if name not in saved:
            continue
        totals[name] = total
        entries[(name, index)] = es
        counts[name] = counts.get(name, 0) + _entry_count(es)
    sid = _write(s, job_name, dag_shape(live_dag), {}, totals, entries)
    return Backfill(sid, job, counts)


def _entry_count(entries: list[tuple[Any, Any]]) -> int:
    from slipstream.state.keys import BroadcastKey

    n = 0
    for k, v in entries:
        if type(v) is StateMapSave:
            n += len(v.upserts)
        elif type(k) is not BroadcastKey:
            n += 1
    return n
