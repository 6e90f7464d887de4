"""Channels whose producer and consumer live in different OS processes (issue 24).

For every (edge, remote member) pair one :class:`ChannelSender` runs on the producing
member and one :class:`ChannelReceiver` on the consuming member, joined by a connected
stream socket (an anonymous ``socket.socketpair()`` end per side). Each (producer,
consumer) pair of the edge between the two members is one *lane*: on the producing
side the producer's collector offers into the lane's local
:class:`~slipstream.execution.queues.SpscQueue` (:meth:`ChannelSender.lane`), on the
consuming side the consumer's inbound stream drains the lane's local ``SpscQueue``
(:meth:`ChannelReceiver.lane`). So the processor tasklet, its collectors and its inbound
streams are the same code for local and remote input: items, watermarks, idle marks,
snapshot barriers and end-of-stream travel in band, in order, per lane.

Both are cooperative tasklets (``call()`` returns ``NO_PROGRESS``, ``MADE_PROGRESS`` or
``DONE``, never blocks: the socket is non-blocking), so a worker thread drives them
beside processor tasklets.

**Batching.** A sender call drains what its lanes hold into one frame (at most
``batch_items`` items; consecutive chunks of a lane are merged), so a busy edge sends
big frames and a quiet one sends each item as soon as the sender runs.

**Credits (back-pressure), two bounds.** (1) At most ``window`` frames are in flight per
sender/receiver pair: the receiver acknowledges a frame once it has decoded it into the
lanes' queues; a receiver that does not run (a slow or stuck member) stops its sender
after ``window`` frames, then the lanes' local queues fill and the producers' collectors
are refused, as with a full in-process queue. (2) Per lane, the sender sends only while
``sent - taken < LANE_CREDIT * capacity``, where ``taken`` is the consumer's
``take_count`` the receiver reports back: each lane is bounded like an in-process queue
of the edge's ``queue_size`` (twice it, so that a frame as big as the queue can be in
flight while the consumer works through the previous one), and a consumer that stops
reading one lane (barrier alignment) never blocks the other lanes of the pair. (With the
producing side's local queue, a remote lane buffers up to three times what a local
channel does.)

**Wire format.** Sender to receiver: frames of ``!IB`` (body length, codec) and a body
that is a flat list ``[lane, kind, payload, ...]``: kinds are a data chunk (the items),
a watermark (its timestamp), an idle mark, a barrier (``(id, terminal)``), end of stream
and, once at the start, the lane table (``[(producer, consumer), ...]``). Special items
are rebuilt from their kind, so no class path crosses. A chunk whose items are all of one
``NamedTuple`` class (window results, partial aggregations) travels as its columns (a
column whose items all hold one ``int`` or ``str``, such as a window's bounds, as that
value once), rebuilt with ``tuple.__new__``: a NamedTuple's own pickle
calls two Python functions per item (measured 3x the channel's cost per item; only
classes whose unpickling is exactly that qualify, :func:`_plain_namedtuple`). A chunk
of ``str`` items (lines on their way to a keyed consumer) travels as one string joined by
a newline, split again on arrival (:func:`pack_text`; a chunk of which an item holds a
newline, or is not of exact type ``str``, is pickled as a list). The body is pickled
(protocol 5),
chosen by measurement (docs/performance.md, "Channels" and "The channel's serialisation,
measured"): ``marshal`` is faster on plain builtins but carries a ``bytearray`` (any
buffer-like object) as ``bytes``, and the type scan that would make it safe costs more
than it saves; Arrow record batches cost 1.9-5.4x pickle's per item for every payload the
engine's edges carry once turned back into Python objects. A chunk whose first item is a
big ``bytes`` or ``bytearray`` (>= 4 KiB) sends its big binary items as out-of-band
buffers after the pickle (codec ``O``): 64 KiB items cost 2.2x less per item than in
band, where the pickle and the frame each copied them. Receiver to sender: ``!I``
length and a ``marshal``\\ ed list ``[acked_frames, lane, taken, lane, taken, ...]``.

**Trust.** The receiver unpickles what arrives on its socket, so the socket must be one
nobody else can write to: the engine creates each pair with ``socket.socketpair()``
(no address anyone could connect to) and hands the ends to its own member processes.

**Suspending.** Nothing follows a terminal snapshot barrier on a lane (its producer
ends once the snapshot's outcome is known, ``suspend()``), so a lane ends with it as with
end of stream: both ends of a pair finish when every lane did, without an error.

**A dead peer** (killed, crashed, closed its end early) surfaces as
:class:`ChannelPeerError`, naming the edge, the direction and the member: at the
receiver's next call, at the sender's next frame or credit read (a sender with nothing to
send and credit to spare does not look). A member that hangs without dying is not
detected here (that needs a heartbeat between the member processes).
"""

from __future__ import annotations

import copyreg
import marshal
import pickle
import socket
import struct
from collections.abc import Iterator, Mapping
from functools import partial
from itertools import chain, groupby, islice, repeat
from typing import TYPE_CHECKING, Any

from slipstream.core.items import (
    DONE_ITEM,
    IDLE_MESSAGE,
    DoneItem,
    IdleMessage,
    SnapshotBarrier,
    Watermark,
)
from slipstream.execution.plan import VertexPlan, edge_label, edge_targets
from slipstream.execution.queues import SpscQueue
from slipstream.execution.tasklet import DONE, MADE_PROGRESS, NO_PROGRESS, yield_cpu

if TYPE_CHECKING:
    from slipstream.core.dag import DAG, Edge

__all__ = [
    "ChannelPeerError",
    "MemberChannels",
    "channel_pairs",
    "channel_sockets",
    "ChannelSender",
    "ChannelReceiver",
    "DEFAULT_WINDOW",
    "DEFAULT_BATCH_ITEMS",
    "LANE_CREDIT",
    "pack_rows",
    "unpack_rows",
]

#: frames in flight per sender/receiver pair
DEFAULT_WINDOW = 16
#: most items in one frame
DEFAULT_BATCH_ITEMS = 1024
#: a lane may hold this many times its capacity beyond what its consumer took (measured:
#: at 1x a lane whose frames are as big as its queue goes stop-and-wait)
LANE_CREDIT = 2
#: the receiver's read buffer (it grows for a bigger frame); ``recv_into`` a buffer that
#: stays: a fresh ``recv(256 KiB)`` allocated 256 KiB per call, the receiver's largest
#: cost per one-item frame under cProfile (A/B at load 6.5: 10-15 % less CPU per frame)
_READ_SIZE = 1 << 18
#: a receiver acknowledges a frame of at most this many items at its next call (after the
#: consumer took them), a bigger one at once (``ChannelReceiver.call``); a sender yields
#: its core after sending one (``ChannelSender.call``)
_LONE_ITEMS = 16
#: bytes the sender reads of credit reports per ``recv`` (they are small)
_REPORT_READ = 1 << 14

_FRAME = struct.Struct("!IB")
_REPORT = struct.Struct("!I")
_PICKLE = 80  # "P": a pickle (protocol 5)
#: "O": a pickle whose out-of-band buffers follow it in the frame (:func:`_encode_out_of_band`)
_OUT_OF_BAND = 79
#: a chunk whose first item is a ``bytes`` or ``bytearray`` of at least this many bytes
#: sends its binary items of that size out of band (:func:`_out_of_band`)
_OUT_OF_BAND_MIN = 4096
#: an out-of-band frame's buffer count, then each buffer's length
_COUNT = struct.Struct("!I")

_CHUNK = 0
_WATERMARK = 1
_IDLE = 2
_BARRIER = 3
_DONE = 4
_LANES = 5
_ROWS = 6  # a chunk of one NamedTuple class's items, packed by pack_rows
_TEXT = 7  # a chunk of ``str`` items as one string, joined by ``_TEXT_SEP``

#: joins a chunk of strings (``_TEXT``): a chunk in which it occurs travels as a list
_TEXT_SEP = "\n"

#: socket errors that mean the other end is gone
_GONE = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError)


class ChannelPeerError(ConnectionError):
    """The process at the other end of a cross-process channel is gone (it died or
    closed its end before the edge ended). The message names the edge, this side's role
    and the peer member."""


class ChannelSender:
    """The producing member's end of one (edge, remote member) pair: drains its lanes'
    local queues into frames on ``sock`` (module docstring).

    ``label`` names the edge (``plan.edge_label``); ``member`` is the remote (consuming)
    member's index, ``pid`` its process id when known: both go into errors. ``window``:
    frames in flight; ``batch_items``: most items per frame (a frame may pass it by one
    chunk)."""

    cooperative = True
    callback_name = "send"

    def __init__(
        self,
        sock: socket.socket,
        label: str,
        member: int,
        *,
        pid: int | None = None,
        window: int = DEFAULT_WINDOW,
        batch_items: int = DEFAULT_BATCH_ITEMS,
    ) -> None:
        if window < 1 or batch_items < 1:
            raise ValueError(f"window and batch_items must be >= 1, got {window}, {batch_items}")
        sock.setblocking(False)
        self.sock = sock
        self.label = label
        self.member = member
        self.pid = pid
        self.window = window
        self.batch_items = batch_items
        self.vertex_name = f"{label}: sender to member {member}"
        self.index = member
        self.cancelled = False
        self.keys: list[tuple[int, int]] = []
        self.queues: list[SpscQueue] = []
        self.sent: list[int] = []
        self.taken: list[int] = []
        self.capacity: list[int] = []
        self.open: list[int] = []  # lanes whose end of stream has not been sent
        self.in_flight = 0  # frames not yet acknowledged
        self.frames_sent = 0
        self.items_sent = 0
        self._table_sent = False
        self._out: memoryview | None = None  # the unsent rest of the current frame
        self._in = bytearray()  # received report bytes not yet parsed
        self._cursor = 0
        self._starved = False  # the last frame left entries behind for want of lane credit
        self._done = False

    def lane(self, producer: int, consumer: int, capacity: int) -> SpscQueue:
        """Register the lane (``producer`` here -> ``consumer`` on the remote member,
        global indices) and return the local queue its producer's collector offers
        into. All lanes are registered before the first ``call()``."""
        if self._table_sent:
            raise RuntimeError(f"{self.vertex_name}: lane added after the channel started")
        q = SpscQueue(
            capacity, f"{self.label}, processor {producer} -> {consumer} (member {self.member})"
        )
        self.open.append(len(self.keys))
        self.keys.append((producer, consumer))
        self.queues.append(q)
        self.sent.append(0)
        self.taken.append(0)
        self.capacity.append(capacity)
        return q

    def __repr__(self) -> str:
        return f"ChannelSender({self.vertex_name}, in flight {self.in_flight}/{self.window})"

    @property
    def done(self) -> bool:
        return self._done

    def _peer(self) -> ChannelPeerError:
        pid = f" (pid {self.pid})" if self.pid is not None else ""
        return ChannelPeerError(
            f"{self.label}: the channel to member {self.member}{pid} closed before the "
            f"edge ended: member {self.member} died or closed its end (seen by the sender)"
        )

    def call(self) -> int:
        if self._done:
            return DONE
        progress = self._read_reports() if self._reads_reports() else False
        if self._out is not None:
            if not self._write():
                return MADE_PROGRESS if progress else NO_PROGRESS
            progress = True
        if self.in_flight < self.window and (self.open or not self._table_sent):
            before = self.items_sent
            frame = self._build()
            if frame is not None:
                self._out = memoryview(frame)
                self.frames_sent += 1
                self.in_flight += 1
                if self._write() and self.items_sent - before <= _LONE_ITEMS:
                    # a lone frame's send woke a receiving worker that slept in select,
                    # and Linux queues a process woken by a socket on the sender's core
                    # (it expects the sender to sleep next); it would wait there for the
                    # rest of this worker's pass and its next, idle one (~40 us at p50).
                    # Yielding runs it now (docs/performance.md, "A lone frame's
                    # receiver, woken on the sender's core"); a bigger frame's receiver
                    # is busy, not asleep, and its sender does not pay the system call
                    yield_cpu()
                progress = True
        if not self.open and self._out is None and self.in_flight == 0:
            # every lane ended and the receiver has decoded every frame: closing tells
            # it so (it ends on the end of file)
            self._done = True
            self.sock.close()
            return DONE
        return MADE_PROGRESS if progress else NO_PROGRESS

    def waits_on(self) -> tuple[list[socket.socket], list[socket.socket]]:
        """``(read, write)``: the sockets an idle worker may wait on (``select``) for this
        sender to have work: its socket for reading when its next call reads credit
        reports (a report it would leave unread must not wake the worker again and
        again), for writing while a frame is half sent."""
        if self._done:
            return [], []
        reads = [self.sock] if self._reads_reports() else []
        return reads, ([self.sock] if self._out is not None else [])

    def _reads_reports(self) -> bool:
        # reports are read when credits run short (or at the end), not on every call: a
        # recv that finds nothing costs as much as the frame's own send
        return self._starved or self.in_flight * 2 >= self.window or not self.open

    def _build(self) -> bytes | None:
        """One frame of what the lanes hold and their credits allow (``None``: nothing)."""
        records: list[Any] = []
        if not self._table_sent:
            records += [-1, _LANES, self.keys]
            self._table_sent = True
        budget = self.batch_items
        open_lanes = self.open
        n = len(open_lanes)
        start = self._cursor % n if n else 0
        finished: list[int] = []
        self._starved = False
        for k in range(n):
            if budget <= 0:
                break
            i = open_lanes[(start + k) % n]
            q = self.queues[i]
            entries = q.entries
            if not entries:
                continue
            room = LANE_CREDIT * self.capacity[i] - (self.sent[i] - self.taken[i])
            taken = 0
            at = -1  # where in ``records`` this lane's current chunk is
            owned = False  # that chunk is a list of our own (extend() is allowed)
            while entries and budget > 0 and room > 0:
                entry = entries[0]
                if type(entry) is list:
                    size = len(entry)
                    if at < 0:
                        # the producer's list (a broadcast shares it): never mutated
                        at = len(records) + 2
                        records += [i, _CHUNK, entry]
                        owned = False
                    elif owned:
                        records[at].extend(entry)
                    else:
                        records[at] = records[at] + entry
                        owned = True
                    entries.popleft()
                    taken += size
                    budget -= size
                    room -= size
                    continue
                entries.popleft()
                taken += 1
                budget -= 1
                room -= 1
                at = -1
                t = type(entry)
                if t is Watermark:
                    records += [i, _WATERMARK, entry.timestamp]
                elif t is IdleMessage:
                    records += [i, _IDLE, None]
                elif t is SnapshotBarrier:
                    records += [i, _BARRIER, (entry.snapshot_id, entry.is_terminal)]
                    if entry.is_terminal:
                        # nothing follows a terminal barrier (the producer ends once its
                        # snapshot's outcome is known): the lane ends as at end of stream
                        finished.append(i)
                        break
                elif t is DoneItem:
                    records += [i, _DONE, None]
                    finished.append(i)
                    break
                else:
                    raise TypeError(f"{q.name}: unexpected special item {entry!r}")
            if room <= 0 and entries:
                self._starved = True
            if taken:
                q.take_count += taken
                self.sent[i] += taken
                self.items_sent += taken
        self._cursor = start + 1
        for i in finished:
            open_lanes.remove(i)
        if not records:
            return None
        return self._encode(records)

    def _encode(self, records: list[Any]) -> bytes:
        chunks = [records[j + 2] for j in range(0, len(records), 3) if records[j + 1] == _CHUNK]
        binary = _pack_chunks(records) if chunks else False
        try:
            if binary:
                return _encode_out_of_band(records)
            body = pickle.dumps(records, pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            raise pickle.PicklingError(
                f"{self.vertex_name}: {_unpicklable(chunks)} cannot be pickled "
                f"({type(exc).__name__}: {exc}); items that cross processes "
                "(distributed edges) must pickle"
            ) from exc
        return _FRAME.pack(len(body), _PICKLE) + body

    def _write(self) -> bool:
        """Send what the socket takes of the current frame; ``True`` when all of it went."""
        out = self._out
        assert out is not None
        try:
            n = self.sock.send(out)
        except BlockingIOError:
            return False
        except _GONE as exc:
            raise self._peer() from exc
        if n == len(out):
            self._out = None
            return True
        self._out = out[n:]
        return False

    def _read_reports(self) -> bool:
        try:
            data = self.sock.recv(_REPORT_READ)
        except BlockingIOError:
            return False
        except _GONE as exc:
            raise self._peer() from exc
        if not data:
            raise self._peer()
        buf = self._in
        buf += data
        pos = 0
        size = _REPORT.size
        while len(buf) - pos >= size:
            (length,) = _REPORT.unpack_from(buf, pos)
            if len(buf) - pos - size < length:
                break
            report = marshal.loads(bytes(buf[pos + size : pos + size + length]))
            pos += size + length
            self.in_flight -= report[0]
            taken = self.taken
            for j in range(1, len(report), 2):
                taken[report[j]] = report[j + 1]
        del buf[:pos]
        return True


class ChannelReceiver:
    """The consuming member's end of one (edge, remote member) pair: decodes frames from
    ``sock`` into its lanes' local queues and reports credits back (module docstring).

    ``member`` is the remote (producing) member's index, ``pid`` its process id when
    known."""

    cooperative = True
    callback_name = "receive"

    def __init__(
        self, sock: socket.socket, label: str, member: int, *, pid: int | None = None
    ) -> None:
        sock.setblocking(False)
        self.sock = sock
        self.label = label
        self.member = member
        self.pid = pid
        self.vertex_name = f"{label}: receiver from member {member}"
        self.index = member
        self.cancelled = False
        self.by_key: dict[tuple[int, int], SpscQueue] = {}
        self.queues: list[SpscQueue] = []  # by the sender's lane index
        self.started = False  # the sender's lane table arrived
        self.reported: list[int] = []
        self.thresholds: list[int] = []
        self.open = 0  # lanes that have not ended
        self.frames_received = 0
        self.items_received = 0
        self._buf = bytearray(_READ_SIZE)  # received bytes: _fill of them, from the start
        self._view = memoryview(self._buf)
        self._fill = 0
        self._acks = 0  # decoded frames not yet acknowledged
        self._out: memoryview | None = None
        self._eof = False
        self._done = False

    def lane(self, producer: int, consumer: int, capacity: int) -> SpscQueue:
        """Register the lane (``producer`` on the remote member -> ``consumer`` here) and
        return the local queue the consumer's inbound stream drains."""
        q = SpscQueue(
            capacity, f"{self.label}, processor {producer} (member {self.member}) -> {consumer}"
        )
        self.by_key[(producer, consumer)] = q
        return q

    def __repr__(self) -> str:
        return f"ChannelReceiver({self.vertex_name}, {self.frames_received} frames)"

    @property
    def done(self) -> bool:
        return self._done

    def _peer(self) -> ChannelPeerError:
        pid = f" (pid {self.pid})" if self.pid is not None else ""
        return ChannelPeerError(
            f"{self.label}: the channel from member {self.member}{pid} closed before the "
            f"edge ended: member {self.member} died or closed its end (seen by the receiver)"
        )

    def call(self) -> int:
        if self._done:
            return DONE
        progress = False
        if self._out is not None and self._flush():
            progress = True
        # report before reading: a lone small frame this call delivers is acknowledged
        # at the next call, after the pass let its consumer take it, so the
        # acknowledgement and the consumer's taken count go in one report, and its send
        # does not delay the delivered item (a report per frame and one per drained lane
        # before). Several frames or a big one are acknowledged at once: their sender may
        # be waiting on its window, and its next frames overlap with the consumer's work
        if self._report():
            progress = True
        if not self._eof:
            before = self.items_received
            if self._read():
                progress = True
                if self._acks > 1 or self.items_received - before > _LONE_ITEMS:
                    self._report()
        if self._eof and self.started and self.open == 0 and self._out is None:
            self._done = True
            self.sock.close()
            return DONE
        return MADE_PROGRESS if progress else NO_PROGRESS

    def waits_on(self) -> tuple[list[socket.socket], list[socket.socket]]:
        """``(read, write)``: the sockets an idle worker may wait on for this receiver to
        have work: its socket for reading (frames, the end of file), for writing while a
        credit report is half sent."""
        if self._done:
            return [], []
        return [self.sock], ([self.sock] if self._out is not None else [])

    def _read(self) -> bool:
        fill = self._fill
        try:
            n = self.sock.recv_into(self._view[fill:])
        except BlockingIOError:
            return False
        except _GONE as exc:
            if self.started and not self.open:
                # the sender closed with our last report unread: it had every frame acked
                n = 0
            else:
                raise self._peer() from exc
        if not n:
            if not self.started or self.open:
                raise self._peer()
            self._eof = True
            return True
        fill += n
        pos = self._frames(fill)
        rest = fill - pos
        if rest and pos:
            self._buf[:rest] = self._view[pos:fill].tobytes()
        self._fill = rest
        if rest >= _FRAME.size:
            length = _FRAME.unpack_from(self._buf, 0)[0]
            need = _FRAME.size + length
            if need > len(self._buf):  # a frame bigger than the buffer: make room
                self._view.release()
                self._buf = self._buf[:rest] + bytearray(need - rest)
                self._view = memoryview(self._buf)
        return True

    def _frames(self, fill: int) -> int:
        """Decode and deliver the whole frames in the first ``fill`` bytes of the buffer;
        returns where the first incomplete one starts."""
        pos = 0
        size = _FRAME.size
        buf = self._buf
        view = self._view
        while fill - pos >= size:
            length, codec = _FRAME.unpack_from(buf, pos)
            end = pos + size + length
            if fill < end:
                break
            if codec == _PICKLE:
                records = pickle.loads(view[pos + size : end])
            elif codec == _OUT_OF_BAND:
                records = _decode_out_of_band(view[pos + size : end])
            else:
                raise ValueError(f"{self.vertex_name}: a frame of unknown codec {codec}")
            pos = end
            self._deliver(records)
            self.frames_received += 1
            self._acks += 1
        return pos

    def _deliver(self, records: list[Any]) -> None:
        queues = self.queues
        for j in range(0, len(records), 3):
            i = records[j]
            kind = records[j + 1]
            payload = records[j + 2]
            if kind == _TEXT:
                kind = _CHUNK
                payload = unpack_text(payload)
            elif kind == _ROWS:
                kind = _CHUNK
                payload = unpack_rows(payload)
            if kind == _CHUNK:
                q = queues[i]
                q.entries.append(payload)
                q.put_count += len(payload)
                self.items_received += len(payload)
                continue
            if kind == _LANES:
                self._lanes(payload)
                queues = self.queues
                continue
            q = queues[i]
            if kind == _WATERMARK:
                item: Any = Watermark(payload)
            elif kind == _IDLE:
                item = IDLE_MESSAGE
            elif kind == _BARRIER:
                item = SnapshotBarrier(payload[0], payload[1])
                if payload[1]:
                    self.open -= 1  # a terminal barrier ends the lane (see the sender)
            elif kind == _DONE:
                item = DONE_ITEM
                self.open -= 1
            else:
                raise ValueError(f"{self.vertex_name}: unknown record kind {kind!r}")
            q.entries.append(item)
            q.put_count += 1
            self.items_received += 1

    def _lanes(self, keys: list[tuple[int, int]]) -> None:
        """The sender's lane table: map its lane indices to this side's queues."""
        mine = set(self.by_key)
        theirs = {tuple(k) for k in keys}
        if mine != theirs:
            raise RuntimeError(
                f"{self.vertex_name}: the two ends disagree on the lanes (producer, consumer): "
                f"the sender has {sorted(theirs - mine)} that this side lacks, this side "
                f"has {sorted(mine - theirs)} that the sender lacks"
            )
        self.queues = [self.by_key[(p, c)] for p, c in keys]
        self.started = True
        self.reported = [0] * len(keys)
        # report a lane's progress once a quarter of its capacity was taken (or it ran dry)
        self.thresholds = [max(1, q.capacity // 4) for q in self.queues]
        self.open = len(keys)

    def _report(self) -> bool:
        """Acknowledge decoded frames and report lanes' taken counts to the sender."""
        if self._out is not None or self._eof:
            return False
        report: list[int] = [self._acks]
        if not self.open:
            queues = []  # every lane ended: the sender only needs the acknowledgements
        else:
            queues = self.queues
        reported = self.reported
        thresholds = self.thresholds
        for i, q in enumerate(queues):
            t = q.take_count
            r = reported[i]
            if t != r and (t - r >= thresholds[i] or t == q.put_count):
                report += [i, t]
                reported[i] = t
        if len(report) == 1 and not self._acks:
            return False
        self._acks = 0
        body = marshal.dumps(report, 4)
        self._out = memoryview(_REPORT.pack(len(body)) + body)
        self._flush()
        return True

    def _flush(self) -> bool:
        out = self._out
        assert out is not None
        try:
            n = self.sock.send(out)
        except BlockingIOError:
            return False
        except _GONE as exc:
            if not self.open and self.started:
                # every lane ended: the sender needs no more credits
                self._out = None
                return True
            raise self._peer() from exc
        self._out = None if n == len(out) else out[n:]
        return self._out is None


#: per item class: whether its chunks travel as plain tuples (:func:`_plain_namedtuple`)
_ROW_CLASSES: dict[type, bool] = {}

#: what a class of the rows must not define (a pickle of its own, an instance state)
_PICKLE_HOOKS = ("__reduce__", "__reduce_ex__", "__getstate__", "__setstate__", "__getnewargs_ex__")


def _plain_namedtuple(cls: type) -> bool:
    """Whether ``tuple.__new__(cls, tuple(item))`` rebuilds any ``item`` of exact type
    ``cls`` as its unpickling would: a ``NamedTuple`` (``collections.namedtuple``) class,
    or subclasses of one, none with an instance ``__dict__`` or slots (every class up to
    ``tuple`` declares ``__slots__ = ()``), a pickle hook, or a ``__new__`` /
    ``__getnewargs__`` other than the generated ones, and not in ``copyreg``'s dispatch
    table."""
    if not issubclass(cls, tuple) or cls is tuple or cls in copyreg.dispatch_table:
        return False
    fields = False
    for k in cls.__mro__:
        if k is tuple:
            return fields
        own = vars(k)
        if own.get("__slots__") != () or any(h in own for h in _PICKLE_HOOKS):
            return False
        generated = "_fields" in own and "_make" in own
        if ("__new__" in own or "__getnewargs__" in own) and not generated:
            return False
        fields = fields or generated
    return False  # pragma: no cover - every tuple subclass has tuple in its MRO


#: a chunk of one NamedTuple class's items, as :func:`pack_rows` packs it: ``(class,
#: item count, columns)``, a column a tuple of its values or, when every item holds the
#: same ``int`` or ``str`` in it, a list of that one value, or when they come in long
#: runs of one such value, a list of the runs' values and lengths (:func:`_column`); or
#: ``(class, plain tuples)`` for items of unequal lengths
Packed = tuple[Any, ...]


def pack_rows(items: list[Any]) -> list[Any] | Packed:
    """``items`` as columns (``Packed``) when they are all of one
    :func:`_plain_namedtuple` class, else ``items`` itself (not changed: a broadcast
    shares a chunk). Measured: pickling a NamedTuple calls its ``__getnewargs__`` and
    unpickling its ``__new__``, two Python calls per item; as rows both sides run at C
    speed (docs/performance.md, "Member processes: where the time goes"), and as
    columns the window bounds every result of a window shares travel once (500 window
    results: 468 -> 303 ns an item, pack, pickle, unpickle and unpack; "The distributed
    edge's per-item costs"). A column is collapsed only when its values are all of
    exact type ``int`` or all ``str`` and equal: then each is the same value (``1``,
    ``1.0`` and ``True`` are equal but not the same, nor ``0.0`` and ``-0.0``), and
    sent as runs under the same condition (:func:`_column`).
    :func:`unpack_rows` undoes it."""
    if not items:
        return items
    t = type(items[0])
    ok = _ROW_CLASSES.get(t)
    if ok is None:
        ok = _ROW_CLASSES[t] = _plain_namedtuple(t)
    n = len(items)
    if not ok or list(map(type, items)).count(t) != n:
        return items
    # items of unequal lengths make the strict zip raise: no length scan first (13 ns
    # of a window result's 111; docs/performance.md, "Window results to the coordinator")
    try:
        columns = list(zip(*items, strict=True))
    except ValueError:
        return t, list(map(tuple, items))
    return t, n, [_column(c, n) for c in columns]


#: a column is sent as runs when it has at most one run per this many values
_RUN_MIN = 16


def _column(values: tuple[Any, ...], n: int) -> tuple[Any, ...] | list[Any]:
    """``values`` as :func:`pack_rows` sends them: ``[v]`` when all are ``v``; ``[run
    values, run lengths]`` when they come in runs of equal values (at most one run per
    :data:`_RUN_MIN` values: a report's window bounds, ~500 results of a window in a
    row, whose unpickled ints the coordinator spent ~40 of its ~175 ns a result on;
    docs/performance.md, "Window results to the coordinator"); else ``values``. Both
    only for values all of exact type ``int`` or all ``str``, where equal is the same."""
    v = values[0]
    kind = type(v)
    if kind is not int and kind is not str:
        return values
    last = values[-1]
    # the ends first: most columns of unequal values are known by them (a report's keys
    # and results), without a count or a scan of every value
    if last == v:
        if values.count(v) == n and list(map(type, values)).count(kind) == n:
            return [v]
    elif values[1] == v and values[-2] == last and list(map(type, values)).count(kind) == n:
        limit = n // _RUN_MIN
        runs = [(k, len(list(g))) for k, g in islice(groupby(values), limit + 1)]
        if len(runs) <= limit:
            keys, counts = zip(*runs, strict=True)
            return [keys, counts]
    return values


def unpack_rows(packed: list[Any] | Packed) -> list[Any]:
    """The items :func:`pack_rows` packed."""
    if type(packed) is not tuple:
        return packed  # type: ignore[return-value]
    if len(packed) == 2:
        cls, rows = packed
        return list(map(partial(tuple.__new__, cls), rows))
    cls, n, columns = packed
    if not columns:
        return [tuple.__new__(cls) for _ in range(n)]
    cols = [
        c if type(c) is not list else repeat(c[0], n) if len(c) == 1 else _runs(*c) for c in columns
    ]
    return list(map(tuple.__new__, repeat(cls), zip(*cols, strict=True)))


def _runs(values: tuple[Any, ...], counts: tuple[int, ...]) -> Iterator[Any]:
    """A column :func:`_column` sent as runs: each value ``count`` times."""
    return chain.from_iterable(map(repeat, values, counts))


def pack_text(items: list[Any]) -> str | None:
    """``items`` joined by ``_TEXT_SEP`` when they are all of exact type ``str`` and
    none holds the separator (``str.split`` then gives them back, equal and of type
    ``str``), else ``None``. Measured per line of the running sum's chunks (fresh
    strings): pickling the list 41 ns and unpickling it 34, against the type scan 10,
    join 6, the separator count 3 and the split 20 (docs/performance.md, "The
    distributed edge's per-item costs")."""
    if type(items[0]) is not str or list(map(type, items)).count(str) != len(items):
        return None
    text = _TEXT_SEP.join(items)
    if text.count(_TEXT_SEP) != len(items) - 1:
        return None
    return text


def unpack_text(text: str) -> list[str]:
    """The items :func:`pack_text` joined into ``text``."""
    return text.split(_TEXT_SEP)


def _pack_chunks(records: list[Any]) -> bool:
    """Turn each chunk record of ``records`` that :func:`pack_text` or :func:`pack_rows`
    packs into a ``_TEXT`` or ``_ROWS`` record, and the big binary items of a chunk whose
    first item is one into out-of-band buffers (:func:`_out_of_band`); returns whether
    a chunk has such items."""
    binary = False
    for j in range(1, len(records), 3):
        if records[j] != _CHUNK:
            continue
        items = records[j + 1]
        if not items:
            continue
        t = type(items[0])
        if t is str:
            text = pack_text(items)
            if text is not None:
                records[j] = _TEXT
                records[j + 1] = text
            continue
        if (t is bytes or t is bytearray) and len(items[0]) >= _OUT_OF_BAND_MIN:
            records[j + 1] = _out_of_band(items)
            binary = True
            continue
        packed = pack_rows(items)
        if type(packed) is tuple:
            records[j] = _ROWS
            records[j + 1] = packed
    return binary


class _Copied:
    """A big ``bytes`` or ``bytearray`` item sent out of band: pickled as
    ``bytes(<buffer>)`` (``bytearray(...)``), so it arrives as a copy of its own type out
    of the receiver's read buffer, which the next frame reuses. (A bare out-of-band
    ``PickleBuffer`` would arrive as a read-only memoryview of a ``bytes``, as the
    receiver's buffer object itself for a ``bytearray``; a pickler's
    ``reducer_override`` is never called for exact ``bytes``.)"""

    __slots__ = ("item",)

    def __init__(self, item: bytes | bytearray) -> None:
        self.item = item

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        return type(self.item), (pickle.PickleBuffer(self.item),)


def _out_of_band(items: list[Any]) -> list[Any]:
    """``items`` (not changed: a broadcast shares a chunk) with each exact ``bytes`` or
    ``bytearray`` of at least ``_OUT_OF_BAND_MIN`` bytes wrapped in :class:`_Copied`."""
    big = _OUT_OF_BAND_MIN
    return [
        _Copied(x) if (type(x) is bytes or type(x) is bytearray) and len(x) >= big else x
        for x in items
    ]


def _encode_out_of_band(records: list[Any]) -> bytes:
    """A frame of codec ``_OUT_OF_BAND``: the buffer count and lengths (``!I`` each), the
    pickle (protocol 5, the :class:`_Copied` items' memory left out of it), the buffers.
    Joined into one ``bytes`` (one copy of each buffer) so the sender's one ``send`` path
    stays as it is: measured, 64 KiB items 54-56 -> 24-26 µs an item against the pickle
    in band, which copies each item into the pickle and the pickle into the frame
    (``sendmsg`` of the parts would save ~5 µs more; docs/performance.md, "The channel's
    serialisation, measured")."""
    buffers: list[pickle.PickleBuffer] = []
    body = pickle.dumps(records, pickle.HIGHEST_PROTOCOL, buffer_callback=buffers.append)
    raws = [b.raw() for b in buffers]
    sizes = [len(r) for r in raws]
    table = struct.pack(f"!{len(sizes) + 1}I", len(sizes), *sizes)
    length = len(table) + len(body) + sum(sizes)
    return b"".join([_FRAME.pack(length, _OUT_OF_BAND), table, body, *raws])


def _decode_out_of_band(frame: memoryview) -> Any:
    """The records of a frame :func:`_encode_out_of_band` encoded (without its head): the
    buffers are slices of ``frame``, each item copied out of its slice."""
    (n,) = _COUNT.unpack_from(frame, 0)
    sizes = struct.unpack_from(f"!{n}I", frame, _COUNT.size)
    at = len(frame) - sum(sizes)
    body = frame[_COUNT.size * (n + 1) : at]
    buffers = []
    for size in sizes:
        buffers.append(frame[at : at + size])
        at += size
    return pickle.loads(body, buffers=buffers)


def _unpicklable(chunks: list[list[Any]]) -> str:
    """Names the first item of ``chunks`` that does not pickle."""
    for chunk in chunks:
        for item in chunk:
            try:
                pickle.dumps(item, pickle.HIGHEST_PROTOCOL)
            except Exception:  # noqa: BLE001 - this is the one
                t = type(item)
                name = (
                    t.__qualname__
                    if t.__module__ == "builtins"
                    else f"{t.__module__}.{t.__qualname__}"
                )
                return f"an item of type {name}"
    return "a frame"


# -- one member's channels ---------------------------------------------------------------

#: ``(edge index in dag.edges, producing member, consuming member)``
Pair = tuple[int, int, int]


def channel_pairs(dag: DAG, plans: Mapping[str, VertexPlan]) -> list[Pair]:
    """Every (edge, producing member, consuming member) with at least one lane between two
    different members: one sender/receiver pair each."""
    out: set[Pair] = set()
    for ei, e in enumerate(dag.edges):
        src = plans[e.source.name]
        dst = plans[e.dest.name]  # type: ignore[union-attr]
        for p in range(src.total_parallelism):
            a = src.member_of(p)
            for c in edge_targets(e, src, dst, p):
                b = dst.member_of(c)
                if a != b:
                    out.add((ei, a, b))
    return sorted(out)


def channel_sockets(
    dag: DAG, plans: Mapping[str, VertexPlan]
) -> dict[Pair, tuple[socket.socket, socket.socket]]:
    """One ``socketpair()`` per :func:`channel_pairs` entry: ``(sender's end, receiver's
    end)``; the coordinator hands each end to its member's process and closes its own
    copies."""
    return {pair: socket.socketpair() for pair in channel_pairs(dag, plans)}


class MemberChannels:
    """The queue factory of one member process (``plan.wire(..., queue_factory=this,
    member=member)``): a pair on this member gets an in-process ``SpscQueue``, a pair
    with a remote end a lane of the (edge, remote member)'s sender or receiver.

    ``sockets`` holds this member's end of every pair it takes part in (keys as
    :func:`channel_pairs`); ``pids`` the process ids of the other members, when known
    (errors name them). After wiring, :attr:`tasklets` are the senders and receivers to
    run beside the processor tasklets."""

    def __init__(
        self,
        member: int,
        dag: DAG,
        plans: Mapping[str, VertexPlan],
        sockets: Mapping[Pair, socket.socket],
        *,
        pids: Mapping[int, int] | None = None,
        window: int = DEFAULT_WINDOW,
        batch_items: int = DEFAULT_BATCH_ITEMS,
    ) -> None:
        self.member = member
        self.plans = plans
        edges = dag.edges
        self._index = {id(e): i for i, e in enumerate(edges)}
        pids = pids or {}
        self.senders: dict[tuple[int, int], ChannelSender] = {}
        self.receivers: dict[tuple[int, int], ChannelReceiver] = {}
        for (ei, a, b), sock in sockets.items():
            label = edge_label(edges[ei])
            if a == member and b != member:
                self.senders[(ei, b)] = ChannelSender(
                    sock, label, b, pid=pids.get(b), window=window, batch_items=batch_items
                )
            elif b == member and a != member:
                self.receivers[(ei, a)] = ChannelReceiver(sock, label, a, pid=pids.get(a))
            else:
                raise ValueError(
                    f"member {member} was given the socket of {label} from member {a} to "
                    f"member {b}, a pair it is not an end of"
                )

    def __call__(self, edge: Edge, producer: int, consumer: int) -> SpscQueue:
        src = self.plans[edge.source.name]
        dst = self.plans[edge.dest.name]  # type: ignore[union-attr]
        a, b = src.member_of(producer), dst.member_of(consumer)
        capacity = edge.get_queue_size()
        if a == b == self.member:
            return SpscQueue(
                capacity, f"{edge.source.name}#{producer}->{dst.vertex.name}#{consumer}"
            )
        ei = self._index[id(edge)]
        try:
            if a == self.member:
                return self.senders[(ei, b)].lane(producer, consumer, capacity)
            if b == self.member:
                return self.receivers[(ei, a)].lane(producer, consumer, capacity)
        except KeyError:
            raise ValueError(
                f"{edge_label(edge)}: member {self.member} has no channel for processor "
                f"{producer} (member {a}) -> {consumer} (member {b})"
            ) from None
        raise ValueError(
            f"{edge_label(edge)}: processor {producer} (member {a}) -> {consumer} (member "
            f"{b}) does not concern member {self.member}"
        )

    @property
    def tasklets(self) -> list[ChannelSender | ChannelReceiver]:
        """The senders and receivers, to run as cooperative tasklets."""
        return [*self.senders.values(), *self.receivers.values()]
