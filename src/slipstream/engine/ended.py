"""What an execution keeps once it ended for good, and what it lets go.

A job's handle outlives its executions: ``job.metrics``, ``job.watch()`` (the
dashboard) and the at-exit report read an execution after its end, and the engine lists
every job it ran (``engine.jobs``). Holding the ended execution whole kept its
processors, their keyed state, the queues and the contexts for as long as the job
handle lived, and, since these objects refer to each other (a processor's error's
traceback holds the frames of the worker that ran it; the pool's callbacks are methods
of the execution), until a full collection of the cyclic garbage collector once the
handle was dropped: a process running many jobs held their state until then (the test
suite's process grew to 1.7 GB).

So an execution that ended (the job completed, failed, was cancelled or suspended, or
a restart replaces it) freezes the figures those readers take (:class:`EndedFigures`)
and drops its processors: their state goes by reference counting at the job's end. It
breaks the cycles it was in (the contexts' ``item_errors``, the callbacks of the pool and
the snapshot coordinator, a weak reference back to the job), and an ended job refers to
its engine weakly: an engine and its jobs that the caller dropped go by reference
counting too, with the lists and maps the sinks filled.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from slipstream.engine.member_stats import watermarks_and_fill
from slipstream.execution.fusion import stage_figures


@dataclass
class EndedFigures:
    """The figures of an ended execution's processors, taken at its end."""

    #: per vertex: ``items_in``, ``items_out`` and the processors' own counters
    vertices: dict[str, dict[str, int]] = field(default_factory=dict)
    #: ``commit_retries`` summed over the processors
    commit_retries: int = 0
    #: the earliest ``context.unavailable_since`` of a sink (``None``: none was)
    unavailable_since: float | None = None
    #: :func:`~slipstream.engine.member_stats.watermarks_and_fill` at the end
    watermarks: dict[str, int | None] = field(default_factory=dict)
    queue_fill: dict[str, float] = field(default_factory=dict)
    #: per vertex: ``(done, total)`` of the processors that report progress
    progress: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: per processor (``"vertex#index"``): what kept it from progressing at the end
    warnings: dict[str, str] = field(default_factory=dict)
    #: the unpublished part files the file sinks left (engine/at_exit.py names them)
    uncommitted_files: list[str] = field(default_factory=list)


def vertex_figures(
    tasklets: Sequence[Any],
) -> tuple[dict[str, dict[str, int]], int, float | None]:
    """Per vertex ``items_in``, ``items_out`` and the processors' counters, the
    commit retries and the earliest outage start (what ``job.metrics`` sums)."""
    out: dict[str, dict[str, int]] = {}
    retries = 0
    since: float | None = None
    for t in tasklets:
        for vertex, items_in, items_out, ctx in stage_figures(t):
            m = out.setdefault(vertex, {"items_in": 0, "items_out": 0})
            m["items_in"] += items_in
            m["items_out"] += items_out
            for k, v in ctx.metrics.items():
                m[k] = m.get(k, 0) + v
            retries += ctx.metrics.get("commit_retries", 0)
        ctx = t.context
        s = ctx.unavailable_since
        if s is not None and (since is None or s < since):
            since = s
    return out, retries, since


def progress_figures(tasklets: Sequence[Any]) -> dict[str, tuple[int, int]]:
    """Per vertex, ``(done, total)`` summed over the processors with a ``progress()``."""
    progress: dict[str, tuple[int, int]] = {}
    for t in tasklets:
        p = getattr(t.processor, "progress", None)
        if callable(p):
            try:
                done_total = p()
            except Exception:  # noqa: BLE001 - a watcher never breaks the job
                continue
            if done_total is not None:
                d0, t0 = progress.get(t.vertex_name, (0, 0))
                progress[t.vertex_name] = (d0 + done_total[0], t0 + done_total[1])
    return progress


def warning_figures(tasklets: Sequence[Any]) -> dict[str, str]:
    """What keeps a processor from making progress right now, per processor
    (``"vertex#index"``): a sink's outage (``context.warning``). A stalled snapshot is
    ``watch()["error"]`` (see ``Job.snapshot_error``)."""
    return {
        f"{t.vertex_name}#{t.index}": t.context.warning
        for t in tasklets
        if t.context.warning is not None
    }


def uncommitted_files(tasklets: Sequence[Any]) -> list[str]:
    """The unpublished part files the file sinks among ``tasklets`` leave."""
    from slipstream.core.processor import Processor

    def fused(p: Any) -> list[Any]:  # p and the processors fused into it
        out = [p]
        for attr in ("inner", "first", "second"):
            inner = getattr(p, attr, None)
            if isinstance(inner, Processor) and inner is not p:
                out.extend(fused(inner))
        return out

    found: list[str] = []
    for t in tasklets:
        for p in fused(t.processor):
            files = getattr(p, "uncommitted_files", None)
            if callable(files):
                found.extend(files())
    return sorted(found)


def freeze(tasklets: Sequence[Any]) -> EndedFigures:
    """The figures of ``tasklets`` (an ended execution's) as its readers take them."""
    vertices, retries, since = vertex_figures(tasklets)
    watermarks, fill = watermarks_and_fill(tasklets)
    return EndedFigures(
        vertices,
        retries,
        since,
        watermarks,
        fill,
        progress_figures(tasklets),
        warning_figures(tasklets),
        uncommitted_files(tasklets),
    )


def detach_contexts(tasklets: Sequence[Any], keep: Sequence[Any]) -> None:
    """Break the one cycle a processor's context is in (its ``item_errors`` refers back
    to it): an ended execution's contexts then go by reference counting, with the
    engine's services they refer to. ``keep``: tasklets still in a call on a thread the
    pool gave up on (their processor may still use its context)."""
    kept = {id(t) for t in keep}
    for t in tasklets:
        if id(t) in kept:
            continue
        # and the contexts of the processors fused into it (execution/fusion.py)
        for ctx in (t.context, *(s.context for s in getattr(t, "fused_stages", ()))):
            try:
                del ctx.item_errors
            except AttributeError:
                pass


class EndedTasklet:
    """Names the processor an ended execution's failure came from (what the job's
    error and log lines read), without holding the processor."""

    __slots__ = ("vertex_name", "index", "member")

    def __init__(self, vertex_name: str, index: int, member: int | None) -> None:
        self.vertex_name = vertex_name
        self.index = index
        self.member = member

    def __repr__(self) -> str:
        return f"{self.vertex_name}#{self.index}"


def ended_tasklet(t: Any) -> Any:
    """``t``'s name only (``None`` stays ``None``)."""
    if t is None or isinstance(t, EndedTasklet):
        return t
    return EndedTasklet(t.vertex_name, t.index, getattr(t, "member", None))


def clear_error_frames(error: BaseException | None, seen: set[int] | None = None) -> None:
    """Drop the local variables of the frames ``error`` (and the exceptions chained to
    it) holds: the processor's frame holds the processor, the frames that called it
    (the worker's, each frame holds its caller) the tasklets. The traceback still prints
    (files, lines, functions) and the job keeps its text. A frame still running (a
    thread's own) is left as it is."""
    if error is None:
        return
    seen = set() if seen is None else seen
    if id(error) in seen:
        return
    seen.add(id(error))
    frames: list[FrameType] = []
    tb = error.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    caller = frames[0].f_back if frames else None
    while caller is not None:
        frames.append(caller)
        caller = caller.f_back
    for f in frames:
        try:
            f.clear()
        except RuntimeError:  # still running
            pass
    clear_error_frames(error.__cause__, seen)
    clear_error_frames(error.__context__, seen)
