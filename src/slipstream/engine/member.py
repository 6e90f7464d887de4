"""One member of a job, in its own OS process (``ss.local(processes=N)``, issue 24).

The coordinator (:mod:`slipstream.engine.processes`, in the user's process) starts one
member process per member with :func:`member_main` as its target. A member:

1. reads its setup from the control pipe: the job (DAG, ``JobConfig``, engine settings),
   pickled by the coordinator with cloudpickle, as the Spark engine ships suppliers; then
   the process ids of the other members (channel errors name them). The engine's named
   lists and maps stay in the coordinator: a processor that reads one gets it (a
   ``list_source`` its share) when it asks (:class:`MemberServices`);
2. builds the plan for all members (``build_vertex_plans``, so every processor gets its
   global index and the partitioning of a distributed edge is the same on every member) and
   wires its own share (``plan.wire(..., member=m)``): local pairs get an ``SpscQueue``, the
   pairs with a remote end a lane of a ``ChannelSender``/``ChannelReceiver`` over the
   socket the coordinator handed it (:class:`~slipstream.execution.remote.MemberChannels`);
3. runs its processor tasklets and channel tasklets on a ``WorkerPool``;
4. reports over the control pipe (when: :class:`~slipstream.engine.member_stats.ReportSchedule`)
   its metrics and what its list and map sinks added since the last report (so ``engine.get_list`` fills in the
   coordinator as it does with one process), then ``("done", ...)`` with the last of it,
   or ``("failed", ...)`` naming the vertex, processor and member of the error.

The control pipe is read by :class:`~slipstream.engine.member_control.MemberControl`'s
thread from the moment the setup arrived: it answers the coordinator's heartbeat
(:mod:`slipstream.engine.heartbeat`) apart from the processors, and ``("cancel",)`` from
the coordinator, or the coordinator's end of the pipe closing (it died), stops the member.

With a processing guarantee the member's processors save into a
:class:`~slipstream.engine.member_snapshots.MemberSnapshots` (its chunks go into the
store, its part of each manifest to the coordinator, which commits), and the control
messages about snapshots go to it; a restored execution's member reads the snapshot
from the store itself (:func:`~slipstream.engine.member_snapshots.restore_routing`).
A report also carries the marks of the batches staging list/map sinks published
(``sinks.basic``), with their items, so the coordinator's marks never get ahead of the
items it holds.

The control pipe is a ``multiprocessing`` connection between
the coordinator and its own children: the only pickles a member reads come from it and
from its channel sockets, both private to the job's processes.
"""

from __future__ import annotations

import logging
import os
import pickle
import resource
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Collection, Mapping
from typing import Any

from slipstream.core.resident import resident_kb
from slipstream.core.services import InMemoryServices
from slipstream.engine import gc_tuning, member_logging, member_output
from slipstream.engine.ended import vertex_figures
from slipstream.engine.member_control import NAMED, NAMED_REPLY, Calls, MemberControl
from slipstream.engine.member_reports import ForwardedItemErrors, ForwardedLateItems
from slipstream.engine.member_stats import (
    EARLY_REPORT_S,
    ReportSchedule,
    watermarks_and_fill,
)
from slipstream.engine.workers import (
    TaskletFailure,
    WorkerPool,
    close_tasklets,
    execution_state_dir,
    prepare_context,
    remove_state_dir,
)
from slipstream.execution.plan import build_vertex_plans, close_suppliers, wire
from slipstream.execution.remote import ChannelPeerError, MemberChannels, pack_rows
from slipstream.execution.tasklet import ProcessorTasklet

# imported here, not where they are used: the forkserver preloads this module, so its
# children start with all of them imported

log = logging.getLogger("slipstream.member")

#: the kinds of failure a member reports (the coordinator prefers them in this order)
PROCESSOR = "processor"
JOB = "job"
PEER = "peer"


class TrackedDict(dict[Any, Any]):
    """A dict that records which keys changed since :meth:`take_changes` (a map sink's
    map in a member process: only the changed keys travel to the coordinator).

    A change and its mark happen under one lock, and :meth:`take_changes` swaps the set
    under it: the member's report thread takes the marks while the worker thread writes,
    and without the lock a write could mark the set just taken (its key never reported)
    or grow it while the report iterates (a key whose ``__hash__`` runs Python code lets
    the threads switch in between).

    ``buffered``: the map of a sink that nothing in this member reads yet
    (:meth:`MemberServices.sink_map`). It then holds only the puts not reported yet, one
    value per key (a later put of a key overwrites it), and a report takes them all
    (:meth:`take_changes`), so a put costs the dict's own update and no mark: marking
    each of a map sink's pairs was ~20-25 ns of a member's ~670 per line of the CSV
    running sum (docs/performance.md, "The running sum with two processes"). What was
    reported is kept apart, one value per key, merged at each report; before anything
    reads the map (:meth:`MemberServices.get_map`), or a key is removed,
    :meth:`unbuffer` makes it the whole map again (what was reported, then the newer
    puts not reported yet), with marks from then on."""

    def __init__(self, *args: Any, buffered: bool = False) -> None:
        super().__init__(*args)
        self.dirty: set[Any] = set()
        self._marks_lock = threading.Lock()
        #: buffered: the puts reported so far, one value per key (else ``None``)
        self._reported: dict[Any, Any] | None = {} if buffered else None

    @property
    def buffered(self) -> bool:
        return self._reported is not None

    def unbuffer(self) -> None:
        """A buffered map becomes the whole map: what was reported, under the puts not
        reported yet (which stay marked); no-op for a map that is not buffered."""
        with self._marks_lock:
            reported = self._reported
            if reported is None:
                return
            self._reported = None
            unreported = dict(self)
            super().clear()
            super().update(reported)
            super().update(unreported)
            self.dirty.update(unreported)

    def __setitem__(self, key: Any, value: Any) -> None:
        with self._marks_lock:
            super().__setitem__(key, value)
            self.dirty.add(key)

    def __delitem__(self, key: Any) -> None:
        self.unbuffer()  # of the whole map (a buffered one holds the newest puts)
        with self._marks_lock:
            super().__delitem__(key)
            self.dirty.add(key)

    def update(self, other: Any = (), /, **kw: Any) -> None:  # type: ignore[override]
        # a batch of pairs at C speed: ``dict(pairs)`` reads them as dict.update does
        # (any 2-item iterable; a later pair of a key wins) and its keys are the dirty
        # ones. A Python loop over the pairs cost a member ~10x the update itself
        # (docs/performance.md, "Member processes: where the time goes")
        if hasattr(other, "keys"):
            keys: Any = list(other.keys())
        else:
            if iter(other) is other:
                other = list(other)  # an iterator is read once (a collection: twice)
            try:
                keys = dict(other)
            except (TypeError, ValueError):
                # not all pairs: dict.update applies those before the bad one and then
                # raises its own error; apply and mark them, then let it raise
                with self._marks_lock:
                    for kv in other:
                        try:
                            k, v = kv
                            super().__setitem__(k, v)
                        except (TypeError, ValueError):
                            break
                        self.dirty.add(k)
                    super().update(other, **kw)
                return
            other = keys
        with self._marks_lock:
            super().update(other, **kw)
            self.dirty.update(keys)
            self.dirty.update(kw)

    def put_pairs(self, pairs: Collection[tuple[Any, Any]]) -> None:
        """``update(pairs)`` for a collection of tuples (a map sink's inbox, its types
        checked by the sink): a buffered map takes them as dict.update does, with no
        type scan, batch dict or mark (a tuple that is not a pair raises dict.update's
        own error, the pairs before it applied, as every pair it holds, reported)."""
        with self._marks_lock:
            if self._reported is not None:
                super().update(pairs)
                return
        self.update(pairs)

    def pop(self, key: Any, *default: Any) -> Any:
        self.unbuffer()  # of the whole map (a buffered one holds the newest puts)
        with self._marks_lock:
            self.dirty.add(key)
            return super().pop(key, *default)

    def popitem(self) -> tuple[Any, Any]:
        self.unbuffer()  # of the whole map (a buffered one holds the newest puts)
        with self._marks_lock:
            k, v = super().popitem()
            self.dirty.add(k)
            return k, v

    def setdefault(self, key: Any, default: Any = None) -> Any:
        self.unbuffer()  # of the whole map (a buffered one holds the newest puts)
        with self._marks_lock:
            self.dirty.add(key)
            return super().setdefault(key, default)

    def clear(self) -> None:
        self.unbuffer()  # of the whole map (a buffered one holds the newest puts)
        with self._marks_lock:
            self.dirty.update(self.keys())
            super().clear()

    def take_dirty(self) -> set[Any]:
        with self._marks_lock:
            dirty, self.dirty = self.dirty, set()
        return dirty

    def changed(self) -> bool:
        """Whether :meth:`take_changes` would hand over something now."""
        return bool(self.dirty) or (self._reported is not None and super().__len__() > 0)

    def take_changes(self) -> tuple[dict[Any, Any], list[Any]]:
        """``(updated entries, deleted keys)`` since the last call: a buffered map's
        puts, taken at once (and kept apart as reported), or the marked keys' values
        now (a marked key the map no longer holds: deleted)."""
        with self._marks_lock:
            reported = self._reported
            if reported is not None:
                updates = dict(self)
                super().clear()
                self.dirty = set()
                reported.update(updates)
                return updates, []
            dirty, self.dirty = self.dirty, set()
        missing = object()
        updates = {}
        deleted: list[Any] = []
        for k in dirty:
            v = self.get(k, missing)
            if v is missing:
                deleted.append(k)
            else:
                updates[k] = v
        return updates, deleted


class NamedFetch:
    """A member's requests for the coordinator's named lists and maps
    (:class:`MemberServices`), answered on the control pipe; the caller (a processor's
    ``init`` or call) waits for the answer, the heartbeat goes on meanwhile."""

    def __init__(self, control: MemberControl) -> None:
        self._control = control
        self._cond = threading.Condition()
        self._answers: dict[int, tuple[bool, Any]] = {}
        self._next = 0
        control.handle(NAMED_REPLY, self._answered)

    def _answered(self, msg: tuple[Any, ...]) -> None:
        with self._cond:
            self._answers[msg[1]] = (msg[2], msg[3])
            self._cond.notify_all()

    def __call__(self, kind: str, name: str, index: int, count: int) -> Any:
        with self._cond:
            req = self._next
            self._next += 1
        what = f"the named {kind} {name!r}"
        if not self._control.send((NAMED, req, kind, name, index, count)):
            raise RuntimeError(f"{what} could not be asked for: the coordinator process is gone")
        with self._cond:
            while req not in self._answers:
                if self._control.cancelled:
                    raise RuntimeError(f"{what}: the coordinator stopped this member first")
                self._cond.wait(0.1)
            ok, content = self._answers.pop(req)
        if not ok:
            raise RuntimeError(content)
        return content


class MemberServices(InMemoryServices):
    """The named lists and maps a member process's processors see. The coordinator holds
    them and ships none with the job: a processor that reads one (``get_list`` /
    ``get_map``) gets the coordinator's content the first time, a ``list_source`` or
    ``map_source`` processor only its share (``list_share`` / ``map_share``), and a
    list or map sink nothing (``sink_list`` / ``sink_map``: it only writes), each asked
    of the coordinator with ``fetch(kind, name, index, count)`` (:class:`NamedFetch`;
    ``count`` 0: the whole list or map). :meth:`take_changes` hands over what the
    processors added since the last call (appended list items are then dropped here:
    the coordinator keeps them)."""

    def __init__(self, fetch: Callable[[str, str, int, int], Any] | None = None) -> None:
        super().__init__()
        self._fetch = fetch
        self._marks: dict[str, int] = {}
        self._published: dict[tuple[str, str, int], int] = {}  # the marks reported
        # (kind, name) of the lists and maps that hold the coordinator's content
        self._seeded: set[tuple[str, str]] = set()

    def _fetched(self, kind: str, name: str, index: int, count: int) -> Any:
        if self._fetch is None:
            return [] if kind == "list" or count else {}
        return self._fetch(kind, name, index, count)

    def get_list(self, name: str) -> list[Any]:
        with self._lock:
            lst = self.lists.get(name)
            if lst is not None and ("list", name) in self._seeded:
                return lst
        content = self._fetched("list", name, 0, 0)  # a wait on the pipe: not locked
        with self._lock:
            lst = self.lists.get(name)
            if lst is None:
                lst = self.lists[name] = list(content)
                self._marks[name] = len(lst)
            elif ("list", name) not in self._seeded:
                # a sink's list: what it appended (not reported yet) stays after it
                lst[0:0] = content
                self._marks[name] += len(content)
            self._seeded.add(("list", name))
            return lst

    def get_map(self, name: str) -> dict[Any, Any]:
        with self._lock:
            m = self.maps.get(name)
            if m is not None and ("map", name) in self._seeded:
                return m
        content = self._fetched("map", name, 0, 0)
        with self._lock:
            m = self.maps.get(name)
            if m is None:
                m = self.maps[name] = TrackedDict(content)
            elif ("map", name) not in self._seeded:
                # a sink's map: only its puts came before (newer than the content)
                assert isinstance(m, TrackedDict)
                m.unbuffer()
                dict.update(m, {k: v for k, v in content.items() if k not in m})
            self._seeded.add(("map", name))
            return m

    def sink_list(self, name: str) -> list[Any]:
        with self._lock:
            lst = self.lists.get(name)
            if lst is None:
                lst = self.lists[name] = []
                self._marks[name] = 0
            return lst

    def sink_map(self, name: str) -> dict[Any, Any]:
        with self._lock:
            m = self.maps.get(name)
            if m is None:
                # only the sink writes it until a processor of this member reads it
                m = self.maps[name] = TrackedDict(buffered=True)
            return m

    def list_share(self, name: str, index: int, count: int) -> list[Any]:
        return list(self._fetched("list", name, index, count))

    def map_share(self, name: str, index: int, count: int) -> list[tuple[Any, Any]]:
        return list(self._fetched("map", name, index, count))

    def take_output(
        self,
    ) -> tuple[
        dict[str, list[Any]],
        dict[str, tuple[dict[Any, Any], list[Any]]],
        dict[tuple[str, str, int], int],
    ]:
        """:meth:`take_changes` and the marks of the batches the staging sinks
        published since the last call (``sinks.basic``), taken at once: a batch's
        items travel with its mark, so a restore after this member dies publishes a
        batch again only if its items never reached the coordinator."""
        from slipstream.sinks import basic

        with basic._PUBLISHED_LOCK:
            lists, maps = self.take_changes()
            marks = {k: v for k, v in basic._PUBLISHED.items() if self._published.get(k) != v}
            self._published.update(marks)
        return lists, maps, marks

    def has_output(self) -> bool:
        """Whether a list holds items or a map changes that :meth:`take_changes` would
        hand over now."""
        with self._lock:
            marks = self._marks
            if any(len(lst) > marks[name] for name, lst in self.lists.items()):
                return True
            return any(isinstance(m, TrackedDict) and m.changed() for m in self.maps.values())

    def take_changes(
        self,
    ) -> tuple[dict[str, list[Any]], dict[str, tuple[dict[Any, Any], list[Any]]]]:
        """``(appended items per list, (updated entries, deleted keys) per map)`` since
        the last call. Safe beside running sinks: a list's ``extend`` and the slice and
        ``del`` here are each one step under the GIL, and what a sink appends meanwhile
        lands after the reported part."""
        lists: dict[str, list[Any]] = {}
        with self._lock:  # get_list may put the coordinator's content before the mark
            maps = list(self.maps.items())
            for name, lst in self.lists.items():
                mark = self._marks[name]
                n = len(lst)
                if n > mark:
                    lists[name] = lst[mark:n]
                    del lst[mark:n]
        changed: dict[str, tuple[dict[Any, Any], list[Any]]] = {}
        for name, m in maps:
            assert isinstance(m, TrackedDict)
            updates, deleted = m.take_changes()
            if updates or deleted:
                changed[name] = (updates, deleted)
        return lists, changed


class _Member:
    """What :func:`member_main` runs: one member's tasklets and its reports."""

    def __init__(
        self, control: MemberControl, member: int, setup: dict[str, Any], sockets: Any
    ) -> None:
        self.control = control
        self.member = member
        self.failure: tuple[Any, ...] | None = None
        self.failed_tasklet: Any = None
        self._report_lock = threading.Lock()
        self.cancelled = False
        self.finished = threading.Event()
        self._output_waiting = threading.Event()
        config = setup["config"]
        self.job_name = name = setup["job_name"]
        self.services = MemberServices(NamedFetch(control))
        if setup.get("published"):
            from slipstream.sinks.basic import merge_published

            merge_published(setup["published"])
            self.services._published.update(setup["published"])
        # the job's warnings come from the coordinator's reports (member_reports.py)
        self.late_items = ForwardedLateItems(name, control.send)
        self.item_errors = ForwardedItemErrors(name, control.send)
        dag = setup["dag"]
        self.plans = build_vertex_plans(
            dag,
            config,
            setup["member_count"],
            setup["default_parallelism"],
            self.services,
            name,
            self.item_errors,
            check_pickle=False,  # checked by the coordinator before it shipped the job
            snapshots=setup.get("snapshots") is not None or setup.get("restore") is not None,
        )
        channels = MemberChannels(member, dag, self.plans, sockets, pids=setup["pids"])
        specs = wire(dag, self.plans, config.processing_guarantee, channels, member=member)
        self.state_dir = execution_state_dir(setup["work_dir"], name, member)
        self.snapshots: Any = None
        restore: Any = None
        if setup.get("snapshots") is not None:
            from slipstream.engine.member_snapshots import member_snapshots, restore_routing

            self.snapshots = member_snapshots(self, setup)
            restore = restore_routing(setup, dag, self.plans, member)
        self.tasklets: list[Any] = []
        for s in specs:
            prepare_context(s.context, s.vertex.vertex, config, self.state_dir, self.late_items.on_metric)
            entries, completed = None, False
            if self.snapshots is not None:
                entries, completed = self.snapshots.prepare(s, restore)
            self.tasklets.append(
                ProcessorTasklet(
                    s.processor,
                    s.context,
                    s.inbound,
                    s.outbound,
                    guarantee=config.processing_guarantee,
                    snapshot_sink=self.snapshots,
                    restore_entries=entries,
                    restore_completed=completed,
                    outbox_capacity=setup["outbox_capacity"],
                )
            )
        if self.snapshots is not None:
            from slipstream.engine.member_snapshots import MESSAGES

            self.snapshots.attach(self.tasklets)
            for kind in MESSAGES:
                control.handle(kind, self.snapshots.handle)
        # a worker's pass runs the receivers first and the senders last: a frame that
        # ends an idle worker's wait reaches its consumer in that pass, and what the
        # producers emitted in it leaves at its end (docs/performance.md, "Member
        # processes": latency)
        self.receiver_tasklets: list[Any] = list(channels.receivers.values())
        self.sender_tasklets: list[Any] = list(channels.senders.values())
        self.setup = setup
        self.pool: Any = None

    # -- reports -------------------------------------------------------------------------
    def send(self, message: tuple[Any, ...]) -> bool:
        """Send ``message`` to the coordinator; ``False`` if it is gone."""
        return self.control.send(message)

    def metrics(self) -> dict[str, dict[str, int]]:
        """Per vertex, as ``Job.metrics`` sums them over this member's processors."""
        return vertex_figures(self.tasklets)[0]

    def report(self, kind: str = "report", watch: bool = False) -> bool:
        """Send the metrics and the sinks' new output (with ``watch``, the watermarks
        and queue fill too: one message, one wake-up of the coordinator); a sink item
        that cannot be pickled fails the member, naming the list or map."""
        # one report at a time, taken and sent in order: a map's newer value never
        # arrives before an older one (the store thread reports too, see member_snapshots)
        with self._report_lock:
            # what was printed since, before the report; all of it at the member's end
            member_output.flush(final=kind != "report")
            lists, maps, marks = self.services.take_output()
            # window results and other NamedTuples as rows (the coordinator unpacks them)
            packed = {name: pack_rows(items) for name, items in lists.items()}
            spins, pauses = self.pool.idle_counts() if self.pool is not None else (0, 0)
            watched = watermarks_and_fill(self.tasklets) if watch else None
            figures = (*usage(), spins, pauses)
            message = (kind, self.metrics(), packed, maps, figures, marks, watched)
            try:
                data = pickle.dumps(message, pickle.HIGHEST_PROTOCOL)
            except Exception as e:  # noqa: BLE001 - the user's items
                names = ", ".join(repr(n) for n in [*lists, *maps])
                self.fail(
                    None,
                    TypeError(
                        f"member {self.member}: the output of the list/map sink(s) {names} "
                        f"cannot be pickled to reach the coordinator process "
                        f"({type(e).__name__}: {e})"
                    ),
                    JOB,
                )
                return False
            return self.control.send_bytes(data)

    def _on_idle(self) -> None:
        """A worker went idle: wake the report loop if the sinks hold output it has not
        reported (flush on idle)."""
        if not self._output_waiting.is_set() and self.services.has_output():
            self._output_waiting.set()

    def _pool_finished(self) -> None:
        self.finished.set()
        self._output_waiting.set()

    def fail(self, tasklet: Any, error: BaseException, kind: str) -> None:
        """Record this member's first failure and stop its tasklets."""
        if self.failure is None:
            self.failure = failure_message(
                kind, getattr(tasklet, "vertex_name", None), getattr(tasklet, "index", None), error
            )
            self.failed_tasklet = tasklet
        self.stop()

    def stop(self) -> None:
        if self.snapshots is not None:
            self.snapshots.stop_member()
        for t in self.tasklets:
            t.cancelled = True
        if self.pool is not None:
            self.pool.stop()

    def _on_failure(self, failure: Any) -> None:
        t = failure.tasklet
        if isinstance(failure.error, ChannelPeerError):
            kind = PEER
        elif t is not None and getattr(t, "processor", None) is not None:
            kind = PROCESSOR
        else:
            kind = JOB
        self.fail(t, failure.error, kind)

    def _cancel(self) -> None:
        """The coordinator's ``cancel`` (or its end of the pipe closing): stop."""
        self.cancelled = True
        self.stop()

    def running_calls(self) -> Calls:
        """The processors' (and channels') calls running longer than ``slow_call_ms``
        now, for the heartbeat's answer (:mod:`slipstream.engine.member_control`)."""
        pool = self.pool
        if pool is None:
            return []
        return pool.calls_running(self.setup["slow_call_ms"] / 1000.0)

    # -- the run -------------------------------------------------------------------------
    def run(self) -> None:
        for t in self.tasklets:
            try:
                t.init()
            except BaseException as e:  # noqa: BLE001 - reported to the coordinator
                self._on_failure(TaskletFailure(t, e))
                self._close_all()
                self._end()
                return
        self.control.on_cancel(self._cancel)
        tune = self.setup["tune_gc"]
        if tune:
            gc_tuning.job_started()
        self.pool = WorkerPool(
            [*self.receiver_tasklets, *self.tasklets, *self.sender_tasklets],
            self.setup["cooperative_threads"],
            self._on_failure,
            self._pool_finished,
            name=f"{self.job_name}-member{self.member}",
            slow_call_s=self.setup["slow_call_ms"] / 1000.0,
            stop_grace_s=self.setup["stop_grace_ms"] / 1000.0,
            on_idle=self._on_idle,
            idle_spin_s=self.setup["config"].idle_spin_ms / 1000.0,
        )
        self.control.running_calls = self.running_calls
        if self.cancelled:
            self.stop()
        self.pool.start()
        schedule = ReportSchedule(time.monotonic(), self.member, self.setup["member_count"])
        while True:
            # at the schedule's ticks, or sooner when a worker went idle with new sink
            # output (_on_idle): a lone item reaches the coordinator's list at once, not
            # at the next tick (docs/performance.md, "A lone item across processes")
            self._output_waiting.wait(schedule.wait_s(time.monotonic()))
            if self.finished.is_set():
                break
            self._output_waiting.clear()
            now = time.monotonic()
            output = self.services.has_output()
            if not schedule.due(now, output):
                continue
            if not self.report(watch=schedule.reporting(now)):
                self.cancelled = True
                self.stop()
            if output and self.finished.wait(EARLY_REPORT_S):
                break
        if tune:
            gc_tuning.job_ended()
        if self.snapshots is not None:
            self.snapshots.execution_ended(self)
        if self.failure is not None or self.cancelled:
            self._close_all()
        error = None
        if self.failure is not None:
            error = RuntimeError(f"member {self.member} failed: {self.failure[5]}")
        close_suppliers(self.plans, error)
        self._end()

    def _end(self) -> None:
        remove_state_dir(self.state_dir)
        self.late_items.finish()
        self.item_errors.finish()
        if self.failure is None and self.report("cancelled" if self.cancelled else "done"):
            return
        if self.failure is not None:  # also: the last report's sink output did not pickle
            self.report()
            member_output.flush(final=True)  # an unfinished line of the crash's text
            self.send(self.failure)

    def _close_all(self) -> None:
        close_tasklets(self.tasklets, self.pool)


def member_main(conn: Any, member: int, sockets: Mapping[Any, Any]) -> None:
    """The target of a member process: read the setup, run, report (module docstring).
    Any error before the run (building the plan: a supplier that raises, a setup that
    does not unpickle) is reported as the member's failure.

    Ctrl-C reaches every process of the terminal's process group, members included: a
    member ignores SIGINT and leaves the decision to the coordinator (a script's
    ``KeyboardInterrupt``, the CLI's cancel), which stops it; were the coordinator to die
    instead, its end of the control pipe closes and the member stops too."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        data = conn.recv_bytes()
        pids, environ, path, cwd = conn.recv()
    except (EOFError, OSError):
        return  # the coordinator is gone
    # the coordinator's environment, module path and working directory as its job
    # starts, not the forkserver's (the one of the first ss.local(processes=N)) nor those
    # of when this process was forked (a spare, engine/member_spares.py), before the
    # job's code is unpickled and imported
    if environ != os.environ:
        os.environ.clear()
        os.environ.update(environ)
    if path != sys.path:
        sys.path[:] = path
    try:
        if cwd != os.getcwd():
            os.chdir(cwd)
    except OSError:  # gone since: the job's own paths say what is missing
        pass
    # from here on the member answers heartbeats, however long its set-up takes
    control = MemberControl(conn)
    control.start()
    try:
        setup = pickle.loads(data)
        setup["pids"] = pids
        member_logging.install(control.send, setup.get("log_levels", {}))
        member_output.install(control.send)
    except ModuleNotFoundError as e:
        _report_setup_error(
            control,
            ModuleNotFoundError(
                f"the job's code cannot be loaded in member process {member}: {e}. A module "
                "the DAG's functions come from must be importable there by name (on "
                "the sys.path the coordinator has when the job starts, which each member "
                "takes), or registered "
                "with cloudpickle.register_pickle_by_value(module) to travel by value "
                "(as __main__'s functions do)"
            ),
        )
        return
    except BaseException as e:  # noqa: BLE001
        _report_setup_error(control, e)
        return
    try:
        m = _Member(control, member, setup, sockets)
    except BaseException as e:  # noqa: BLE001
        _report_setup_error(control, e)
        return
    m.run()


def usage() -> tuple[float, int, int]:
    """This process's CPU seconds so far, its peak resident set and its resident set now
    (KiB; 0 where ``/proc`` does not tell)."""
    rss = resident_kb()  # first: the peak read after it is at least as large
    return time.process_time(), max(rss, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss), rss


def failure_message(
    kind: str, vertex: str | None, index: int | None, error: BaseException
) -> tuple[Any, ...]:
    """``("failed", kind, vertex, index, type name, message, traceback text, pickled
    error)``; the pickled error is ``None`` when it does not survive a round trip (an
    exception class whose ``__init__`` needs other arguments than its ``args``): the
    coordinator then rebuilds it from its type name and message."""
    tb = "".join(traceback.format_exception(error))
    blob: bytes | None
    try:
        blob = pickle.dumps(error, pickle.HIGHEST_PROTOCOL)
        pickle.loads(blob)
    except Exception:  # noqa: BLE001
        blob = None
    return ("failed", kind, vertex, index, type(error).__name__, str(error), tb, blob)


def _report_setup_error(control: MemberControl, error: BaseException) -> None:
    member_output.flush(final=True)
    control.send(failure_message(JOB, None, None, error))

