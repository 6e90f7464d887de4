"""Exactly-once into PostgreSQL across SIGKILLs: a job process is killed at random points
(some right between PREPARE TRANSACTION and COMMIT PREPARED), restarted from its snapshot
store in a new process, and the table ends up holding every item exactly once."""

from __future__ import annotations

import functools
import random
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from seed_pool import SeedRuns, seed_runs

N = 3000

SCRIPT = textwrap.dedent(
    """
    import os, sys
    import psycopg
    import slipstream as ss
    from slipstream import DAG, Edge, JobConfig, ProcessingGuarantee
    from slipstream import processors as P, sinks, sources

    dsn, table, store, mode, kill_after = sys.argv[1:6]
    kill_after = int(kill_after)
    counts = {"PREPARE": 0, "COMMIT": 0}

    class KillingConnection:
        # fault injection: SIGKILL ourselves right after the n-th PREPARE TRANSACTION, or
        # right before the n-th COMMIT PREPARED (its snapshot has committed by then)
        def __init__(self, conn):
            object.__setattr__(self, "_c", conn)
        def __getattr__(self, name):
            return getattr(self._c, name)
        def __setattr__(self, name, value):
            setattr(self._c, name, value)
        def execute(self, sql, *args):
            verb = sql.split(" ", 1)[0]
            # also the commit of a processor's last (completion) transaction: the
            # snapshot that records the completion carries its id
            if verb == mode == "COMMIT":
                counts[verb] += 1
                if counts[verb] == kill_after:
                    os.kill(os.getpid(), 9)
            result = self._c.execute(sql, *args)
            if verb == mode == "PREPARE":
                counts[verb] += 1
                if counts[verb] == kill_after:
                    os.kill(os.getpid(), 9)
            return result

    def connect():
        return KillingConnection(psycopg.connect(dsn))

    dag = DAG()
    # the run that dies is paced; the restore ("none") produces what is left unpaced
    rate = None if mode == "none" else 3000
    src = dag.new_vertex("gen", sources.generator(lambda seq: seq, rate, max_items=N_ITEMS))
    sq = dag.new_vertex("square", P.map(lambda x: (x, x * x)))
    db = dag.new_vertex("db", sinks.sql(connect, f"INSERT INTO {table} (k, v) VALUES (%s, %s)"))
    db.local_parallelism(2)
    dag.edge(Edge.between(src, sq))
    dag.edge(Edge.between(sq, db).partitioned(lambda kv: kv[0]))
    cfg = JobConfig(name="pg-" + table, processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE,
                    snapshot_interval_ms=40, snapshot_store=store,
                    resume=True)
    job = ss.local().new_job(dag, cfg)
    print("started", flush=True)
    job.join(120)
    print("done", flush=True)
    """
).replace("N_ITEMS", str(N))


def _count(dsn: str, table: str) -> int:
    with psycopg.connect(dsn) as c:
        return int(c.execute(f"SELECT count(*) FROM {table}").fetchone()[0])  # type: ignore[index]


def kill_and_restore(tmp_path: Path, seed: int, postgres: Any) -> None:
    """One seed's scenario (its own table and store): kill, restore, check the table."""
    rnd = random.Random(seed)
    table = f"kill{seed}"
    with psycopg.connect(postgres.dsn, autocommit=True) as c:
        c.execute(f"CREATE TABLE {table} (k bigint, v bigint)")
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    store = str(tmp_path / "store")
    # a third of the seeds die right after a PREPARE TRANSACTION, a third between a
    # snapshot's commit and its COMMIT PREPARED, the rest at a random moment
    mode = ("PREPARE", "COMMIT", "time")[seed % 3]
    kill_after = rnd.randint(1, 4)
    args = [sys.executable, str(script), postgres.dsn, table, store]
    p = subprocess.Popen([*args, mode, str(kill_after)], stdout=subprocess.PIPE, text=True)
    try:
        if mode == "time":
            deadline = time.monotonic() + 60
            while _count(postgres.dsn, table) == 0 and p.poll() is None:
                assert time.monotonic() < deadline, "no snapshot committed rows in 60 s"
                time.sleep(0.01)
            time.sleep(rnd.uniform(0, 0.2))
            p.send_signal(signal.SIGKILL)
        p.wait(60)
    finally:
        if p.poll() is None:
            p.kill()
    killed = p.returncode == -signal.SIGKILL
    assert killed or mode == "time", f"the job was to kill itself, exit code {p.returncode}"
    if killed:
        # a job that completed before the kill marked its store completed: resuming it
        # would start a fresh run (a second copy of every row), so only a killed job
        # is resumed
        r = subprocess.run([*args, "none", "0"], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
    else:
        assert p.returncode == 0
    with psycopg.connect(postgres.dsn) as c:
        rows = c.execute(f"SELECT k, count(*), min(v) FROM {table} GROUP BY k").fetchall()
        # this seed's job's transactions (gid "slipstream-<job>-<vertex>-..."): another
        # seed's job runs next to this one on the same server
        prepared = [
            gid
            for (gid,) in c.execute(
                "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()"
            ).fetchall()
            if gid.startswith(f"slipstream-pg-{table}-")
        ]
    assert len(rows) == N, f"{N - len(rows)} items lost"
    assert all(n == 1 for _, n, _ in rows), [r for r in rows if r[1] != 1][:5]
    assert all(v == k * k for k, _, v in rows)
    assert prepared == []


@pytest.fixture(scope="module")
def seeds(request: pytest.FixtureRequest, postgres: Any) -> Iterator[SeedRuns]:
    yield from seed_runs(request, functools.partial(kill_and_restore, postgres=postgres))


@pytest.mark.slow
# 12 seeds: each of the three kill points (after a PREPARE TRANSACTION, between a
# snapshot's commit and its COMMIT PREPARED, a random moment) four times
@pytest.mark.parametrize("seed", range(12))
def test_sigkill_anywhere_then_restore_writes_each_row_once(seeds: SeedRuns, seed: int) -> None:
    seeds.result(seed=seed)  # two seeds at a time
