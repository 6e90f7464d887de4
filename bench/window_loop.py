"""The sliding-window processor's item loop in isolation: ns per item of
``aggregate_to_sliding_window(...).process`` (10 s / 1 s window, summing, 1,000 keys,
400,000 in-order events in 2,048-item inboxes), best of 5 by CPU time.

    python bench/window_loop.py

Compare two versions of the code by running it with ``PYTHONPATH=<other checkout>/src``.
"""

from __future__ import annotations

import operator
import random
import time

from slipstream import processors as P
from slipstream.aggregate import summing
from slipstream.core.inbox import Inbox
from slipstream.core.outbox import Outbox
from slipstream.core.processor import Context
from slipstream.window import sliding_window_def


def main() -> None:
    rng = random.Random(1)
    events = [
        (rng.randrange(1000), 1_700_000_000_000 + i // 10, rng.randrange(100)) for i in range(400_000)
    ]
    chunks = [events[i : i + 2048] for i in range(0, len(events), 2048)]
    best = float("inf")
    for _ in range(5):
        p = P.aggregate_to_sliding_window(
            key_fn=operator.itemgetter(0),
            timestamp_fn=operator.itemgetter(1),
            window_def=sliding_window_def(10_000, 1_000),
            agg_op=summing(operator.itemgetter(2)),
        )()
        p.init(Outbox(1, 1 << 30), Context())
        t = time.process_time()
        for c in chunks:
            p.process(0, Inbox(c))
        best = min(best, time.process_time() - t)
    print(f"aggregate_to_sliding_window.process: {best / len(events) * 1e9:.0f} ns per item")


if __name__ == "__main__":
    main()
