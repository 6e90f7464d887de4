"""The Pipeline API: chain operators on stages; the compiler (``compiler.py``) turns
the stages into a Core API DAG.

    p = ss.Pipeline()
    (p.read_from(sources.read_files("data/"))
      .flat_map(str.split)
      .group_by(lambda w: w).aggregate(counting())
      .write_to(sinks.list_sink("counts")))
    engine.new_job(p).join()

A stage is a node of the pipeline's graph. Methods that transform a stage return a new
stage and leave the old one as it is, so a stage can feed several downstream stages
(every one of them sees every item). ``group_by(key_fn)`` and ``window(window_def)``
return builders, not stages: they say how the next ``aggregate`` groups its input.

Misuse fails where it happens, with a :class:`PipelineError` (a ``DagError``) that
names the stage: a keyed operation without ``group_by``, ``window`` without
``with_timestamps``, a stage of another pipeline, a stage that leads to no sink.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from slipstream.core.dag import DAG
from slipstream.core.errors import DagError

if TYPE_CHECKING:
    from slipstream.aggregate import AggregateOperation
    from slipstream.window import (
        KeyedWindowResult,
        SessionWindowDef,
        SlidingWindowDef,
        WindowResult,
    )

# slipstream.aggregate and slipstream.window are imported where a stage needs them: a
# pipeline of maps and filters does not pay for their import (start-up time).

__all__ = ["GroupedStage", "Pipeline", "PipelineError", "SinkStage", "Stage", "WindowedStage"]


# stage kinds whose processors apply JobConfig.on_item_error (Stage.on_item_error)
_POLICY_KINDS = (
    "map",
    "filter",
    "flat_map",
    "peek",
    "service",
    "timestamps",
    "aggregate",
    "rolling_aggregate",
    "map_stateful",
    "hash_join",
)


class PipelineError(DagError):
    """A pipeline that cannot be compiled, or an operation used where it does not apply."""


def unit_key(_item: Any) -> None:
    """The grouping key of an unkeyed aggregation: one group for everything."""
    return None


def pair(item: Any, match: Any) -> tuple[Any, Any]:
    """The default output of ``hash_join``: ``(item, match)``."""
    return (item, match)


def to_window_result(r: KeyedWindowResult) -> WindowResult:
    """An unkeyed window's result: the keyed result without its (unit) key."""
    from slipstream.window import WindowResult

    return WindowResult(r.start, r.end, r.value)


_entry_value = operator.itemgetter(1)


def _check_callable(fn: Any, what: str, where: str) -> None:
    if not callable(fn):
        raise TypeError(f"{where}(): {what} must be callable, got {fn!r}")


def _check_op(op: Any, where: str) -> None:
    from slipstream.aggregate import AggregateOperation

    if not isinstance(op, AggregateOperation):
        raise TypeError(
            f"{where}(): op must be an AggregateOperation (see slipstream.aggregate), got {op!r}"
        )


class _Timestamps:
    """Event time of a stage's items: ``ts_fn`` applies to them; ``origin`` is the
    ``with_timestamps`` stage that inserts the watermarks."""

    __slots__ = ("ts_fn", "origin")

    def __init__(self, ts_fn: Callable[[Any], int], origin: Stage) -> None:
        self.ts_fn = ts_fn
        self.origin = origin


class Stage:
    """One step of a pipeline; its methods add the next step and return it."""

    def __init__(
        self,
        pipeline: Pipeline,
        kind: str,
        upstream: Iterable[Stage],
        params: dict[str, Any],
    ) -> None:
        self.pipeline = pipeline
        self.kind = kind
        self.upstream: list[Stage] = list(upstream)
        self.params = params
        self.downstream: list[Stage] = []
        self.name: str | None = None
        self.local_parallelism = -1
        # event time of this stage's items; `ts_lost` names the stage that changed the
        # items after with_timestamps (so ts_fn no longer applies to them)
        self.timestamps: _Timestamps | None = None
        self.ts_lost: str | None = None
        # the stage whose name and parallelism set_name/set_local_parallelism change
        # (an unkeyed aggregate returns a hidden projection of the keyed one)
        self._owner: Stage = self
        # on_item_error of this stage (None: the job's)
        self.item_error: Any = None
        for u in self.upstream:
            u.downstream.append(self)
        pipeline._stages.append(self)

    # -- naming and parallelism ----------------------------------------------------------
    def set_name(self, name: str) -> Stage:
        """Name this stage (vertex names, metrics); returns the stage."""
        if not isinstance(name, str) or not name:
            raise PipelineError(f"set_name(): name must be a non-empty str, got {name!r}")
        self._owner.name = name
        return self

    def set_local_parallelism(self, n: int) -> Stage:
        """Processors per member for this stage (default: the engine's choice, or 1 for
        sinks); returns the stage."""
        if not isinstance(n, int) or isinstance(n, bool) or (n < 1 and n != -1):
            raise PipelineError(f"set_local_parallelism(): expected an int >= 1, got {n!r}")
        self._owner.local_parallelism = n
        return self

    def on_item_error(self, policy: Any) -> Stage:
        """What this stage does when its function raises on an item, overriding
        ``JobConfig.on_item_error``: ``"fail"``, ``"skip"``, or a sink supplier (e.g.
        ``sinks.list_sink("bad")``) to send a ``DeadLetter`` record to (vertex, item,
        error, source). For ``map``, ``filter``, ``flat_map``, ``peek``, the service
        stages, ``read_from(read_csv / read_jsonl)`` (malformed records),
        ``with_timestamps`` (a timestamp function that raises or gives no int),
        ``aggregate``, ``rolling_aggregate``, ``map_stateful`` and ``hash_join`` stages;
        stages with different policies are not fused into one processor. Returns the
        stage."""
        from slipstream.core.item_errors import check_policy, handles_item_errors

        owner = self._owner
        reads_records = owner.kind == "source" and handles_item_errors(owner.params["supplier"])
        if owner.kind not in _POLICY_KINDS and not reads_records:
            raise PipelineError(
                f"on_item_error(): stage {self.describe()!r} ({owner.kind}) runs no function "
                f"that a bad-record policy applies to; it applies to map, filter, flat_map, "
                f"peek, the *_using_service, with_timestamps, aggregate, rolling_aggregate, "
                f"map_stateful and hash_join stages"
            )
        try:
            owner.item_error = check_policy(policy, f"stage {self.describe()!r}")
        except (TypeError, ValueError) as e:
            raise PipelineError(str(e)) from None
        return self

    def describe(self) -> str:
        return self._owner.name or self._owner.kind

    def __repr__(self) -> str:
        return f"Stage({self.kind}, {self.describe()!r})"

    # -- helpers ---------------------------------------------------------------------------
    def _check_open(self, what: str) -> None:
        if self.kind == "sink":
            raise PipelineError(f"{what}(): {self.describe()!r} is a sink; it has no output")

    def _own(self, other: Any, what: str) -> Stage:
        if isinstance(other, (GroupedStage, WindowedStage)):
            other = other._stage
        if not isinstance(other, Stage):
            raise TypeError(f"{what}(): expected a stage, got {type(other).__name__}")
        if other.pipeline is not self.pipeline:
            raise PipelineError(
                f"{what}(): stage {other.describe()!r} belongs to another pipeline; a stage "
                "can only be combined with stages of its own pipeline"
            )
        other._check_open(what)
        return other

    def _stateless(self, kind: str, fn: Any) -> Stage:
        self._check_open(kind)
        _check_callable(fn, "fn", kind)
        s = Stage(self.pipeline, kind, [self], {"fn": fn})
        if kind in ("filter", "peek"):
            # the items stay what they were: their timestamps still apply
            s.timestamps, s.ts_lost = self.timestamps, self.ts_lost
        elif self.timestamps is not None or self.ts_lost is not None:
            s.ts_lost = self.ts_lost or f"{kind} stage (after with_timestamps)"
        return s

    # -- stateless -------------------------------------------------------------------------
    def map(self, fn: Callable[[Any], Any]) -> Stage:
        """``fn(item)`` for each item; a ``None`` result emits nothing (as in Jet)."""
        return self._stateless("map", fn)

    def filter(self, predicate: Callable[[Any], Any]) -> Stage:
        """The items for which ``predicate(item)`` is truthy."""
        return self._stateless("filter", predicate)

    def flat_map(self, fn: Callable[[Any], Iterable[Any]]) -> Stage:
        """Every element of the iterable ``fn(item)``, for each item."""
        return self._stateless("flat_map", fn)

    def peek(self, fn: Callable[[Any], Any] = print) -> Stage:
        """Calls ``fn(item)`` (default ``print``) for each item and passes it on."""
        return self._stateless("peek", fn)

    # -- service calls ---------------------------------------------------------------------
    def map_using_service(self, factory: Any, fn: Callable[[Any, Any], Any]) -> Stage:
        """``fn(service, item)`` for each item (``None``: nothing), with a service made by
        ``factory`` (``P.service_factory(create_fn, destroy_fn)``) once per processor:
        a client, a connection, a model. The stage runs in a vertex of its own on a
        thread of its own (unless the factory says ``cooperative=True``), so a call that
        blocks (network, disk) does not hold up the other stages: where a Core API
        processor would be made non-cooperative, a Pipeline calls its service here."""
        return self._service("map_using_service", factory, fn)

    def filter_using_service(self, factory: Any, predicate: Callable[[Any, Any], Any]) -> Stage:
        """The items for which ``predicate(service, item)`` is truthy (see
        :meth:`map_using_service`)."""
        return self._service("filter_using_service", factory, predicate)

    def flat_map_using_service(
        self, factory: Any, fn: Callable[[Any, Any], Iterable[Any]]
    ) -> Stage:
        """Every element of ``fn(service, item)`` (see :meth:`map_using_service`)."""
        return self._service("flat_map_using_service", factory, fn)

    def _service(self, kind: str, factory: Any, fn: Any) -> Stage:
        from slipstream import processors as P

        self._check_open(kind)
        supplier = getattr(P, kind)(factory, fn)  # checks the factory and the function
        s = Stage(self.pipeline, "service", [self], {"kind": kind, "supplier": supplier})
        if kind == "filter_using_service":
            s.timestamps, s.ts_lost = self.timestamps, self.ts_lost
        elif self.timestamps is not None or self.ts_lost is not None:
            s.ts_lost = self.ts_lost or f"{kind} stage (after with_timestamps)"
        return s

    def merge(self, *others: Stage) -> Stage:
        """The items of this stage and of ``others``, interleaved."""
        self._check_open("merge")
        if not others:
            raise PipelineError("merge(): give at least one other stage")
        stages = [self] + [self._own(o, "merge") for o in others]
        s = Stage(self.pipeline, "merge", stages, {})
        timed = [u.timestamps for u in stages]
        if all(t is not None for t in timed):
            fns = {t.ts_fn for t in timed if t is not None}
            if len(fns) == 1:
                s.timestamps = timed[0]
            else:
                s.ts_lost = "merge of stages with different timestamp functions"
        elif any(t is not None for t in timed) or any(u.ts_lost for u in stages):
            s.ts_lost = "merge of a stage without timestamps"
        return s

    # -- event time --------------------------------------------------------------------------
    def with_timestamps(self, ts_fn: Callable[[Any], int], allowed_lag_ms: int) -> Stage:
        """Event time: ``ts_fn(item)`` is the item's timestamp (ms); watermarks trail the
        highest timestamp seen by ``allowed_lag_ms``. Items later than that are dropped by
        the windows downstream (counted in the ``late_items_dropped`` metric)."""
        self._check_open("with_timestamps")
        _check_callable(ts_fn, "ts_fn", "with_timestamps")
        if isinstance(allowed_lag_ms, bool) or not isinstance(allowed_lag_ms, int):
            raise TypeError(f"with_timestamps(): allowed_lag_ms must be an int, got {allowed_lag_ms!r}")
        if allowed_lag_ms < 0:
            raise ValueError(f"with_timestamps(): allowed_lag_ms must be >= 0, got {allowed_lag_ms}")
        s = Stage(self.pipeline, "timestamps", [self], {"ts_fn": ts_fn, "lag": allowed_lag_ms})
        s.timestamps = _Timestamps(ts_fn, s)
        return s

    def window(self, window_def: SlidingWindowDef | SessionWindowDef) -> WindowedStage:
        """Window the stream (after ``with_timestamps``); ``.aggregate(op)`` then gives
        one ``WindowResult(start, end, value)`` per window, or, after ``group_by``,
        ``KeyedWindowResult(start, end, key, value)`` per window and key."""
        self._check_open("window")
        return WindowedStage(self, window_def, None)

    # -- keyed -------------------------------------------------------------------------------
    def group_by(self, key_fn: Callable[[Any], Any]) -> GroupedStage:
        """Group by ``key_fn(item)`` for the next keyed operation."""
        self._check_open("group_by")
        _check_callable(key_fn, "key_fn", "group_by")
        return GroupedStage(self, key_fn)

    def aggregate(self, op: AggregateOperation[Any, Any, Any]) -> Stage:
        """One result over all items (batch): ``op.finish`` of the whole input. Emits
        nothing for an empty input."""
        self._check_open("aggregate")
        _check_op(op, "aggregate")
        agg = Stage(self.pipeline, "aggregate", [self], {"key_fn": unit_key, "op": op})
        out = Stage(self.pipeline, "project", [agg], {"fn": _entry_value})
        out._owner = agg
        return out

    def rolling_aggregate(self, op: AggregateOperation[Any, Any, Any]) -> Stage:
        raise PipelineError(
            f"rolling_aggregate() on {self.describe()!r}: a rolling aggregate is keyed; call "
            "group_by(key_fn) first"
        )

    def map_stateful(self, create: Callable[[], Any], fn: Callable[[Any, Any, Any], Any]) -> Stage:
        raise PipelineError(
            f"map_stateful() on {self.describe()!r}: state is kept per key; call "
            "group_by(key_fn) first"
        )

    # -- joins and sinks -----------------------------------------------------------------------
    def hash_join(
        self,
        other: Stage,
        key_fn: Callable[[Any], Any],
        other_key_fn: Callable[[Any], Any],
        output_fn: Callable[[Any, Any], Any] = pair,
        *,
        inner: bool = False,
    ) -> Stage:
        """Enrich each item with the items of ``other`` (a finite stage) whose
        ``other_key_fn`` equals the item's ``key_fn``: ``output_fn(item, match)``
        (default ``(item, match)``) per match. An item without a match gives
        ``output_fn(item, None)`` (left outer join, like Jet's ``hashJoin``), or nothing
        with ``inner=True``. ``other`` is read completely first, sent to every joining
        processor (broadcast, at a higher priority), and kept in memory."""
        self._check_open("hash_join")
        other = self._own(other, "hash_join")
        if other is self:
            raise PipelineError("hash_join(): a stage cannot be joined with itself")
        _check_callable(key_fn, "key_fn", "hash_join")
        _check_callable(other_key_fn, "other_key_fn", "hash_join")
        _check_callable(output_fn, "output_fn", "hash_join")
        s = Stage(
            self.pipeline,
            "hash_join",
            [self, other],
            {
                "key_fn": key_fn,
                "other_key_fn": other_key_fn,
                "output_fn": output_fn,
                "inner": bool(inner),
            },
        )
        # the output is new items: the timestamps of the input no longer apply
        if self.timestamps is not None or self.ts_lost:
            s.ts_lost = "hash_join stage (after with_timestamps)"
        return s

    def write_to(self, sink: Any) -> SinkStage:
        """End the stage in ``sink`` (any sink supplier: ``slipstream.sinks`` or your own
        processor). Sinks get local parallelism 1 unless ``set_local_parallelism`` says
        otherwise."""
        self._check_open("write_to")
        if sink is None:
            raise TypeError("write_to(): expected a sink supplier, got None")
        return SinkStage(self.pipeline, "sink", [self], {"supplier": sink})


class SinkStage(Stage):
    """The end of a branch: what ``write_to`` returns."""


class GroupedStage:
    """``stage.group_by(key_fn)``: the next operation works per key."""

    def __init__(self, stage: Stage, key_fn: Callable[[Any], Any]) -> None:
        self._stage = stage
        self._key_fn = key_fn

    def aggregate(self, op: AggregateOperation[Any, Any, Any]) -> Stage:
        """``(key, op.finish(acc))`` per key, once the input is complete (batch). Two
        stages when ``op`` can combine: a local accumulation, then a combining stage
        behind a distributed edge partitioned by key."""
        _check_op(op, "aggregate")
        return Stage(
            self._stage.pipeline, "aggregate", [self._stage], {"key_fn": self._key_fn, "op": op}
        )

    def rolling_aggregate(
        self, op: AggregateOperation[Any, Any, Any], *, per_epoch: bool = False
    ) -> Stage:
        """For each item, ``(key, op.finish(acc))`` of its key's items so far.

        ``per_epoch=True`` changes what is emitted (Structured Streaming's update mode):
        once per epoch, ``(key, op.finish(acc))`` for every key whose items changed it in
        the epoch, its latest value. An epoch is a micro-batch of a Spark streaming job,
        the interval between two snapshots on the embedded engine; the last one ends with
        the input. The items are pre-aggregated per key before the shuffle (``op`` must
        combine: ``op.combine``), so a key's many items in an epoch cross it as one."""
        _check_op(op, "rolling_aggregate")
        if per_epoch and op.combine is None:
            raise PipelineError(
                "rolling_aggregate(per_epoch=True): the operation cannot combine "
                "accumulators (op.combine is None), and the once-per-epoch form combines "
                "each epoch's per-key partials; give the AggregateOperation a combine"
            )
        params = {"key_fn": self._key_fn, "op": op, "per_epoch": bool(per_epoch)}
        return self._keyed("rolling_aggregate", params)

    def map_stateful(
        self, create: Callable[[], Any], fn: Callable[[Any, Any, Any], Any]
    ) -> Stage:
        """``fn(state, key, item)`` for each item, with ``state = create()`` made once per
        key and kept (``fn`` may change it in place); a ``None`` result emits nothing."""
        _check_callable(create, "create", "map_stateful")
        _check_callable(fn, "fn", "map_stateful")
        return self._keyed("map_stateful", {"key_fn": self._key_fn, "create": create, "fn": fn})

    def _keyed(self, kind: str, params: dict[str, Any]) -> Stage:
        s = Stage(self._stage.pipeline, kind, [self._stage], params)
        if self._stage.timestamps is not None or self._stage.ts_lost:
            s.ts_lost = f"{kind} stage (after with_timestamps)"
        return s

    def window(self, window_def: SlidingWindowDef | SessionWindowDef) -> WindowedStage:
        """Window each key's items; ``.aggregate(op)`` gives ``KeyedWindowResult``s."""
        return WindowedStage(self._stage, window_def, self._key_fn)

    def __repr__(self) -> str:
        return f"GroupedStage({self._stage.describe()!r})"


class WindowedStage:
    """``stage.window(window_def)``: the next ``aggregate`` works per window."""

    def __init__(
        self,
        stage: Stage,
        window_def: SlidingWindowDef | SessionWindowDef,
        key_fn: Callable[[Any], Any] | None,
    ) -> None:
        from slipstream.window import SessionWindowDef, SlidingWindowDef

        if not isinstance(window_def, (SlidingWindowDef, SessionWindowDef)):
            raise TypeError(
                "window(): expected a window definition (slipstream.window."
                "sliding_window_def / tumbling_window_def / session_window_def), got "
                f"{window_def!r}"
            )
        if stage.timestamps is None:
            if stage.ts_lost:
                raise PipelineError(
                    f"window() on {stage.describe()!r}: a {stage.ts_lost} changed the items, "
                    "so the timestamp function no longer applies; call with_timestamps() "
                    "after it instead"
                )
            raise PipelineError(
                f"window() on {stage.describe()!r}: windows need event time; call "
                "with_timestamps(ts_fn, allowed_lag_ms) first"
            )
        self._stage = stage
        self._window_def = window_def
        self._key_fn = key_fn

    def group_by(self, key_fn: Callable[[Any], Any]) -> WindowedStage:
        """Window each key's items separately."""
        _check_callable(key_fn, "key_fn", "group_by")
        return WindowedStage(self._stage, self._window_def, key_fn)

    def aggregate(self, op: AggregateOperation[Any, Any, Any]) -> Stage:
        """Aggregate each window (and key): results as each window closes."""
        from slipstream.window import SessionWindowDef, SlidingWindowDef

        _check_op(op, "aggregate")
        wd = self._window_def
        if isinstance(wd, SessionWindowDef) and op.combine is None:
            raise PipelineError(
                "aggregate(): session windows need an AggregateOperation with combine (two "
                "sessions merge when an event bridges them)"
            )
        if isinstance(wd, SlidingWindowDef) and not wd.is_tumbling and op.combine is None:
            raise PipelineError(
                "aggregate(): sliding windows need an AggregateOperation with combine (a "
                "window is combined from its frames); use a tumbling window or add combine"
            )
        stage = self._stage
        assert stage.timestamps is not None
        keyed = self._key_fn is not None
        w = Stage(
            stage.pipeline,
            "window",
            [stage],
            {
                "key_fn": self._key_fn if keyed else unit_key,
                "ts_fn": stage.timestamps.ts_fn,
                "window_def": wd,
                "op": op,
                "timestamps": stage.timestamps.origin,
            },
        )
        w.ts_lost = "window aggregation"
        if keyed:
            return w
        out = Stage(stage.pipeline, "project", [w], {"fn": to_window_result})
        out._owner = w
        out.ts_lost = w.ts_lost
        return out

    def __repr__(self) -> str:
        return f"WindowedStage({self._stage.describe()!r}, {self._window_def!r})"


class Pipeline:
    """A graph of stages, from ``read_from`` to ``write_to``; ``to_dag()`` compiles it
    to a Core API :class:`~slipstream.DAG`, and ``engine.new_job(pipeline)`` runs it."""

    def __init__(self) -> None:
        self._stages: list[Stage] = []

    def read_from(self, source: Any) -> Stage:
        """A stage emitting what ``source`` emits: any source supplier (the factories of
        ``slipstream.sources``, or your own processor / supplier)."""
        if source is None:
            raise TypeError("read_from(): expected a source supplier, got None")
        return Stage(self, "source", [], {"supplier": source})

    @property
    def stages(self) -> list[Stage]:
        return list(self._stages)

    def to_dag(
        self, *, members: int | None = None, default_parallelism: int | None = None
    ) -> DAG:
        """Compile to a new Core API DAG (a fresh one on every call).

        The DAG is the same on every engine and entry point (windows in two stages, as
        Jet compiles them; see docs/guide.md, "What the compiler builds"), so metrics
        and snapshot stores carry over between them. ``members`` and
        ``default_parallelism`` are accepted for callers of the earlier signature (when
        the embedded engine compiled a one-processor window to one stage) and do not
        change the DAG."""
        from slipstream.pipeline.compiler import compile_pipeline

        return compile_pipeline(
            self, members=members, default_parallelism=default_parallelism
        )

    def __str__(self) -> str:
        lines = [f"Pipeline ({len(self._stages)} stages):"]
        for s in self._stages:
            ups = ", ".join(u.describe() for u in s.upstream)
            lines.append(f"  {s.kind} {s.describe()!r}" + (f" <- {ups}" if ups else ""))
        try:
            lines.append("compiled to " + str(self.to_dag()))
        except DagError as e:
            lines.append(f"(does not compile: {e})")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"Pipeline({len(self._stages)} stages)"
