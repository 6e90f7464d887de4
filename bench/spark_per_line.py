"""count-10k's per-line pieces (bench/spark_streaming.py), each measured alone, in CPU ms.

    PYTHONPATH=src python bench/spark_per_line.py [--lines 500000] [--repeat 7]

The source task of a count-10k epoch reads the micro-batch's Arrow record batches, makes
a ``Row`` per line, calls the job's ``map_fn`` (``row.value``), routes each line by key
and encodes the shuffled chunks; each count task decodes its ~half, counts and emits a
``(key, count)`` per line. This runs those steps over one of the bench's files with the
engine's own functions (``arrow_rows``, ``PerTargetCollector._split``, ``ShuffleChunk``;
the count loop as ``_rolling_additive`` runs it), the heap frozen as in a Spark worker
from its second task, and prints each step's median CPU time: where the floor of
count-10k's per-line contract lies (docs/performance.md, "count-10k's per-line cost,
and its floor"). Run under the bench lock; report ``uptime``.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import os
import pickle
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from spark_streaming import count_files  # noqa: E402

from slipstream.core.outbox import _SPECIAL_TYPES  # noqa: E402
from slipstream.core.partition import partition_table  # noqa: E402
from slipstream.execution.collectors import PerTargetCollector  # noqa: E402
from slipstream.spark.arrow import arrow_column, arrow_rows  # noqa: E402
from slipstream.spark.task import MAX_RECORD_ITEMS, ShuffleChunk  # noqa: E402

BATCH_ROWS = 10_000  # Spark's Arrow batch size for a Row source


def _ident(row: Any) -> str:
    return row.value  # type: ignore[no-any-return]


def _same(k: str) -> str:
    return k


class _Queue:
    capacity = 1 << 30


def _drain(it: Iterator[Any]) -> None:
    """Take ``it`` a bucketful at a time, as the source's outbox does."""
    for _ in iter(lambda: list(itertools.islice(it, MAX_RECORD_ITEMS)), []):
        pass


def _chunks(items: list[Any]) -> list[list[Any]]:
    return [items[i : i + MAX_RECORD_ITEMS] for i in range(0, len(items), MAX_RECORD_ITEMS)]


def _count(chunks: list[list[str]], outputs: bool, call_key: bool = False) -> None:
    """The count loop as ``_rolling_additive`` runs it: the items are the keys (``_same``
    is an identity key function, not called), or with ``call_key`` the key function called
    per item through ``map`` (the loop before identity keys were recognised)."""
    states: dict[str, int] = {}
    get = states.get
    for chunk in chunks:
        bucket: list[tuple[str, int]] = []
        append = bucket.append
        keys = map(_same, chunk) if call_key else chunk
        if outputs:
            for k in keys:
                acc = states[k] = get(k, 0) + 1
                append((k, acc))
        else:
            for k in keys:
                states[k] = get(k, 0) + 1


def main() -> None:
    import pyarrow as pa

    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=500_000)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    directory = count_files(10_000, args.lines, 2)
    with open(os.path.join(directory, sorted(os.listdir(directory))[0]), encoding="utf-8") as fh:
        lines = fh.read().split("\n")
    schema = pa.schema([pa.field("value", pa.string(), True)])
    wire = bytes(schema.serialize().to_pybytes())
    messages = [
        bytes(
            pa.record_batch([pa.array(lines[i : i + BATCH_ROWS], pa.string())], schema=schema)
            .serialize()
            .to_pybytes()
        )
        for i in range(0, len(lines), BATCH_ROWS)
    ]
    router = PerTargetCollector(
        [_Queue(), _Queue()],  # type: ignore[list-item]
        key_fn=_same,
        partition_to_target=partition_table(271, 1, 2, True, 0),
    )
    chunks = _chunks(lines)
    router._split(lines, 2)  # every key seen: the cache is warm after an epoch's first chunks
    half = _chunks(router._split(lines, 2)[0])
    where = ("source", 0, "edge")
    encoded = [pickle.dumps(ShuffleChunk(c, where=where, key=b"k"), 5) for c in half]
    pickled = [pickle.dumps(c, 5) for c in half]
    steps: dict[str, Callable[[], Any]] = {
        "source: Arrow batches -> str (to_pylist)": lambda: _drain(
            arrow_column(messages, ("value",), "value", wire)
        ),
        "source: ... a Row per line and map_fn": lambda: _drain(
            map(_ident, arrow_rows(messages, ("value",), wire))
        ),
        "source: the outbox's check for special items": lambda: [
            _SPECIAL_TYPES.isdisjoint(map(type, c)) for c in chunks
        ],
        "source: routing (PerTargetCollector._split)": lambda: [
            router._split(c, 2) for c in chunks
        ],
        "source: shuffle encoding (ShuffleChunk)": lambda: [
            pickle.dumps(ShuffleChunk(c, where=where, key=b"k"), 5) for c in chunks
        ],
        "source: pickled item by item (the old encoding)": lambda: [
            pickle.dumps(c, 5) for c in chunks
        ],
        "count task: decoding its chunks": lambda: [pickle.loads(b) for b in encoded],
        "count task: unpickling item by item (the old)": lambda: [pickle.loads(b) for b in pickled],
        "count task: count loop, no outputs": lambda: _count(half, False),
        "count task: count loop, a (key, count) per line": lambda: _count(half, True),
        "count task: ... the key function called per line": lambda: _count(half, True, True),
    }
    gc.freeze()  # as a Spark worker's heap from its second task on
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(args.repeat):
        for name, step in steps.items():
            t0 = time.process_time()
            step()
            times[name].append(time.process_time() - t0)
    print(f"source: {len(lines):,} lines; count task: {sum(map(len, half)):,} lines")
    for name, ts in times.items():
        print(f"{name:<52} {1000 * statistics.median(ts):7.1f} ms (min {1000 * min(ts):.1f})")


if __name__ == "__main__":
    main()
