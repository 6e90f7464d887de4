"""The processor tasklet's state machine in isolation: ns per ``ProcessorTasklet.call()``
of a sink tasklet (its ``process`` clears the inbox) fed one chunk per call, chunks of 1
and of 64 items, 200,000 calls, best of 7 by CPU time. What the tasklet adds per call
(state compares, inbox fill, the commit-outcome check) is most of this figure.

    python bench/tasklet_loop.py

Compare two versions of the code by running it with ``PYTHONPATH=<other checkout>/src``.
"""

from __future__ import annotations

import time
from typing import Any

from slipstream.core.inbox import Inbox
from slipstream.core.processor import AbstractProcessor, Context
from slipstream.execution.inbound import InboundEdgeStream
from slipstream.execution.queues import SpscQueue
from slipstream.execution.tasklet import ProcessorTasklet

CALLS = 200_000


class Sink(AbstractProcessor):
    def process(self, ordinal: int, inbox: Inbox) -> None:
        inbox.clear()


def ns_per_call(chunk: int) -> float:
    q = SpscQueue(CALLS + 1)
    t = ProcessorTasklet(Sink(), Context(), [InboundEdgeStream(0, 0, [q], exactly_once=False)], [])
    t.init()
    items: list[Any] = list(range(chunk))
    for _ in range(CALLS):
        q.offer(items, 1)
    call = t.call
    c0 = time.process_time()
    for _ in range(CALLS):
        call()
    return (time.process_time() - c0) / CALLS * 1e9


def main() -> None:
    for chunk in (1, 64):
        best = min(ns_per_call(chunk) for _ in range(7))
        print(f"chunks of {chunk:>2} items: {best:,.0f} ns per call")


if __name__ == "__main__":
    main()
