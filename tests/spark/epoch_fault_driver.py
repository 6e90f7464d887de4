"""A Spark streaming driver program for tests/spark/test_spark_epoch_faults.py, run as a
subprocess (one SparkContext per process, and a driver the test can SIGKILL).

``python epoch_fault_driver.py MODE WORKDIR MASTER [KILL_EPOCH]``: a rolling count per
key over the JSON files ``WORKDIR/events/events-<i>.json`` (written beforehand by the
test), one file per epoch: the driver moves file ``i`` into the query's input
directory and waits for the query to process it. After each epoch it writes the list
sink's output so far to ``WORKDIR/output.json``.

* ``kill``: at epoch ``KILL_EPOCH``, after the tasks wrote their chunks and before the
  manifest commit (the job's ``_before_commit`` hook), it prints ``AT-COMMIT`` and
  waits for the test to SIGKILL it;
* ``retry``: the count's processor 0 fails once after its epoch-1 chunk is written
  (:class:`FailOnceAfterSave`, on Spark's attempt 0 of the task): Spark retries it
  (``MASTER`` must allow a retry, e.g. ``local[2,2]``).
"""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

from slipstream import DAG, Edge, sinks
from slipstream.aggregate import counting
from slipstream.pipeline.keyed import MapStatefulP


def _key(e: tuple[str, int]) -> str:
    return e[0]


def _as_event(row: Any) -> tuple[str, int]:
    return (row.key, row.n)


class FailOnceAfterSave(MapStatefulP):
    """A rolling count whose processor 0 raises in ``close()`` (after the epoch's
    terminal snapshot wrote its chunk) once: on attempt 0 of the task of the epoch that
    restored from snapshot ``fail_after`` (``armed`` names the file that records it)."""

    def __init__(self, armed: str, fail_after: int) -> None:
        super().__init__(_key, None, None, counting())
        self._armed = armed
        self._fail_after = fail_after

    def close(self) -> None:
        super().close()
        from pyspark import TaskContext

        ctx = self.context
        tc = TaskContext.get()
        if (
            ctx.global_processor_index == 0
            and getattr(ctx, "restored_snapshot_id", None) == self._fail_after
            and tc is not None
            and tc.attemptNumber() == 0
        ):
            try:
                fd = os.open(self._armed, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
            except FileExistsError:
                return
            store = os.path.join(os.path.dirname(self._armed), "cp", "slipstream-state")
            prefix = f"chunk-{self._fail_after + 1:010d}-0-"
            written = sorted(n for n in os.listdir(store) if n.startswith(prefix))
            os.write(fd, json.dumps(written).encode())
            os.close(fd)
            raise RuntimeError("injected failure after the chunk write (attempt 0)")


def rolling_dag(source: Any, count: Any) -> DAG:
    dag = DAG()
    src = dag.new_vertex("source", source)
    cnt = dag.new_vertex("count", count)
    out = dag.new_vertex("sink", sinks.list_sink("counts")).local_parallelism(1)
    dag.edge(Edge.between(src, cnt).distributed().partitioned(_key))
    dag.edge(Edge.between(cnt, out).distributed().all_to_one())
    return dag


def main() -> None:
    import functools

    import slipstream as ss
    from slipstream.pipeline.keyed import rolling_aggregate
    from slipstream.spark.io import spark_stream_source
    from slipstream.spark.session import create_session

    mode, workdir, master = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    kill_epoch = int(sys.argv[4]) if len(sys.argv) > 4 else -1
    files = sorted((workdir / "events").iterdir())
    inbox = workdir / "in"
    inbox.mkdir(exist_ok=True)
    session = create_session(
        master, f"slipstream-epoch-faults-{mode}", conf={"spark.default.parallelism": "2"}
    )
    if __name__ != "__main__":
        # this module's classes travel by value: executors cannot import it by name
        from pyspark import cloudpickle

        cloudpickle.register_pickle_by_value(sys.modules[__name__])
    df = session.readStream.schema("key string, n long").json(str(inbox))
    count: Any = rolling_aggregate(_key, counting())
    if mode == "retry":
        count = functools.partial(FailOnceAfterSave, str(workdir / "fired.json"), 1)
    engine = ss.spark(session, members=1, local_parallelism=2)
    job = engine.new_job(
        rolling_dag(spark_stream_source(df, _as_event), count),
        ss.JobConfig(name="rolling"),
        checkpoint_location=str(workdir / "cp"),
    )

    def before_commit(epoch_id: int) -> None:
        if epoch_id == kill_epoch:
            print("AT-COMMIT", flush=True)
            threading.Event().wait()  # until the test kills this process

    job._before_commit = before_commit
    for i, f in enumerate(files):
        os.rename(f, inbox / f.name)  # atomic: the source sees whole files
        job.process_all_available(300)
        out = workdir / "output.json"
        (workdir / ".output.json").write_text(json.dumps(engine.get_list("counts")))
        os.replace(workdir / ".output.json", out)
        print(f"EPOCH {i}", flush=True)
    job.cancel()
    try:
        job.join(60)
    except ss.JobCancelledError:
        pass
    print(json.dumps({"epochs": job.epochs_committed}), flush=True)
    session.stop()


if __name__ == "__main__":
    main()
