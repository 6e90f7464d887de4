"""A tiny in-process stand-in for the part of the RDD API the Spark engine's compiler
uses, so the compile + task layer can be tested and profiled without a JVM.

Partitions are Python lists, evaluated eagerly and in order; records still go through
pickle at every shuffle (as they would between Spark stages), so pickling problems show.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import cloudpickle


class FakeRDD:
    def __init__(self, sc: FakeContext, partitions: list[list[Any]]) -> None:
        self.context = sc
        self.partitions = partitions

    # transformations
    def mapPartitionsWithIndex(  # noqa: N802 - mirrors pyspark
        self,
        fn: Callable[[int, Iterator[Any]], Iterable[Any]],
        preservesPartitioning: bool = False,  # noqa: N803
    ) -> FakeRDD:
        fn = cloudpickle.loads(cloudpickle.dumps(fn))  # as Spark ships the function
        return FakeRDD(self.context, [list(fn(i, iter(p))) for i, p in enumerate(self.partitions)])

    def mapPartitions(self, fn: Callable[[Iterator[Any]], Iterable[Any]]) -> FakeRDD:  # noqa: N802
        return self.mapPartitionsWithIndex(lambda _i, it: fn(it))

    def map(self, fn: Callable[[Any], Any]) -> FakeRDD:
        return FakeRDD(self.context, [[fn(x) for x in p] for p in self.partitions])

    def repartitionAndSortWithinPartitions(  # noqa: N802
        self,
        numPartitions: int,  # noqa: N803
        partitionFunc: Callable[[Any], int],  # noqa: N803
        ascending: bool = True,
        keyfunc: Callable[[Any], Any] = lambda k: k,
    ) -> FakeRDD:
        """As Spark's: shuffled, then each partition sorted by key (stable here, which
        Spark does not promise, so keys that matter must be unique)."""
        out = self.partitionBy(numPartitions, partitionFunc)
        for p in out.partitions:
            p.sort(key=lambda kv: keyfunc(kv[0]), reverse=not ascending)
        return out

    def filter(self, fn: Callable[[Any], bool]) -> FakeRDD:
        return FakeRDD(self.context, [[x for x in p if fn(x)] for p in self.partitions])

    def flatMap(self, fn: Callable[[Any], Iterable[Any]]) -> FakeRDD:  # noqa: N802
        return FakeRDD(self.context, [[y for x in p for y in fn(x)] for p in self.partitions])

    def partitionBy(self, n: int, fn: Callable[[Any], int]) -> FakeRDD:  # noqa: N802
        out: list[list[Any]] = [[] for _ in range(n)]
        for p in self.partitions:
            for k, v in p:
                out[fn(k) % n].append(pickle.loads(pickle.dumps((k, v))))
        self.context.shuffles += 1
        return FakeRDD(self.context, out)

    def coalesce(self, n: int) -> FakeRDD:
        out: list[list[Any]] = [[] for _ in range(n)]
        for i, p in enumerate(self.partitions):
            out[i * n // len(self.partitions)].extend(p)
        return FakeRDD(self.context, out)

    def repartition(self, n: int) -> FakeRDD:
        out: list[list[Any]] = [[] for _ in range(n)]
        i = 0
        for p in self.partitions:
            for x in p:
                out[i % n].append(x)
                i += 1
        return FakeRDD(self.context, out)

    def persist(self, level: Any = None) -> FakeRDD:
        return self

    def unpersist(self, blocking: bool = False) -> FakeRDD:
        return self

    def setName(self, name: str) -> FakeRDD:  # noqa: N802
        return self

    # actions
    def getNumPartitions(self) -> int:  # noqa: N802
        return len(self.partitions)

    def collect(self) -> list[Any]:
        return [x for p in self.partitions for x in p]

    def isEmpty(self) -> bool:  # noqa: N802
        return not any(self.partitions)


class FakeBroadcast:
    def __init__(self, value: Any) -> None:
        self.value = pickle.loads(pickle.dumps(value))

    def unpersist(self, blocking: bool = False) -> None:
        pass


class FakeContext:
    """Enough of ``SparkContext`` for ``compile_dag`` and ``SparkEngine``."""

    master = "local[2]"

    def __init__(self, default_parallelism: int = 2) -> None:
        self.shuffles = 0
        self.defaultParallelism = default_parallelism
        self.job_groups: list[str] = []
        self.cancelled: list[str] = []

    def broadcast(self, value: Any) -> FakeBroadcast:
        return FakeBroadcast(value)

    def setJobGroup(self, group: str, description: str, interruptOnCancel: bool = False) -> None:  # noqa: N802, N803
        self.job_groups.append(group)

    def cancelJobGroup(self, group: str) -> None:  # noqa: N802
        self.cancelled.append(group)

    def parallelize(self, data: Iterable[Any], n: int) -> FakeRDD:
        items = list(data)
        return FakeRDD(
            self, [items[i * len(items) // n : (i + 1) * len(items) // n] for i in range(n)]
        )

    def union(self, rdds: list[FakeRDD]) -> FakeRDD:
        return FakeRDD(self, [p for r in rdds for p in r.partitions])


class FakeSession:
    """Stands in for a SparkSession: ``ss.spark(FakeSession())`` runs the whole Spark
    engine (compile, tasks, results, failures) in this process, without a JVM."""

    def __init__(self, default_parallelism: int = 2) -> None:
        self.sparkContext = FakeContext(default_parallelism)

    def stop(self) -> None:
        pass
