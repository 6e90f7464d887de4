"""The edge seam: what a producer's collector writes into and an inbound stream reads from.

Between each connected (producer, consumer) pair of an edge there is one *channel*
(docs/internals.md, "Channels"). The producer's collector
(:mod:`~slipstream.execution.collectors`) writes into its end, a
:class:`ChannelWriter`; the consumer's inbound stream
(:class:`~slipstream.execution.inbound.InboundEdgeStream`) reads from its end, a
:class:`ChannelReader`. :func:`~slipstream.execution.plan.wire` asks its queue factory
(a :data:`ChannelFactory`) for one :class:`Channel` per pair, and hands the same object
to both sides.

An entry is either a ``list`` of data items (a chunk) or one special item (watermark,
idle mark, snapshot barrier, end of stream), in the order the producer emitted them.

Implementations:

* :class:`~slipstream.execution.queues.SpscQueue`, the in-process bounded queue (both ends
  in one object; every edge of the embedded engine and the Spark engine's task inputs).
* :mod:`slipstream.execution.remote`, a channel whose two ends live in different OS
  processes: the producer's collector still writes into a local ``SpscQueue`` and the
  consumer's stream still reads from one; a :class:`~slipstream.execution.remote.ChannelSender`
  on the producing side and a :class:`~slipstream.execution.remote.ChannelReceiver` on
  the consuming side, one pair per (edge, remote member), move entries between the two
  queues, batched and serialised, with credits for back-pressure. The processor tasklet
  cannot tell the difference.

The hot path reads the reader's ``entries`` deque directly (one attribute load per
drain, no method call per entry): that is why the protocol names it rather than a
``poll()`` method. Measured in docs/performance.md ("Channels").
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from slipstream.core.dag import Edge


class ChannelWriter(Protocol):
    """The producer's end of a channel: what a collector offers entries to.

    ``offer`` accepts an entry while fewer than ``capacity`` items are in the channel
    (so it overshoots by at most one chunk) and returns ``False`` otherwise: that is the
    producer's back-pressure. A collector never offers a chunk larger than
    ``capacity``. One thread offers (single producer)."""

    #: the channel's bound in items (``Edge.queue_size``)
    capacity: int
    #: names the edge and the pair in errors and ``repr``
    name: str

    def offer(self, entry: Any, size: int) -> bool:
        """Append ``entry`` (``size``: items in a chunk, 1 for a special item) unless the
        channel is full."""
        ...


class ChannelReader(Protocol):
    """The consumer's end of a channel: what an inbound stream drains.

    The consumer takes entries from the head of ``entries`` (``popleft``) and then adds
    the number of items it took to ``take_count``: that frees room for the producer.
    One thread takes (single consumer)."""

    #: entries ready to take, oldest first
    entries: deque[Any]
    #: items the consumer has taken so far (only the consumer writes it)
    take_count: int
    #: the channel's bound in items (``size() / capacity`` is the fill a watcher shows)
    capacity: int
    name: str

    def size(self) -> int:
        """Items offered and not yet taken (a stale read only over-estimates it)."""
        ...


class Channel(ChannelWriter, ChannelReader, Protocol):
    """Both ends in one object, as :func:`~slipstream.execution.plan.wire` hands the
    same channel to the producer's collector and the consumer's inbound stream."""


#: ``plan.wire``'s queue factory: ``(edge, producer, consumer) -> Channel`` for the
#: producer's and the consumer's global processor indices.
ChannelFactory = Callable[["Edge", int, int], Channel]
