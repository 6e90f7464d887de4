"""How the state_backend was chosen (issue 22, item 3): the storage libraries under the
disk-backed keyed state's access pattern, without the engine.

    python bench/disk_backends.py [--keys 2000000] [--items 4000000] [--cache 200000]
                                  [--backends sqlite,lmdb,rocksdict] [--limit-mb 0]

A rolling count (``get`` + ``put`` per item) over ``--keys`` uniformly random keys, in
chunks of 1024 items, through a two-generation write-back cache of ``--cache`` keys (as
state/disk.py): the misses of a chunk are read in one batch, and when the young
generation is full the old one's entries are written in one transaction. Keys and values
are pickled. Each library with settings for scratch state (no fsync, no write-ahead log
where it has one of its own): sqlite3 (WAL, synchronous=OFF, 64 MB page cache, a
WITHOUT ROWID table), lmdb (sync/metasync off, getmulti/putmulti), rocksdict (raw mode,
WAL disabled, bloom filters, 64 MB block cache). lmdb and rocksdict are not dependencies
of slipstream: rows for those not installed are skipped. ``--limit-mb`` runs under
``RLIMIT_AS`` (LMDB maps its whole file: give it room with ``--lmdb-map-mb``).

``--check-snapshots`` checks what a snapshot's *iterator* returns in each library: a
consistent view must return the values of when it was taken, not later writes.
"""

from __future__ import annotations

import argparse
import os
import pickle
import random
import resource
import shutil
import sqlite3
import tempfile
import time
from typing import Any

dumps, loads = pickle.dumps, pickle.loads
CHUNK = 1024


class Sqlite:
    def __init__(self, d: str, a: argparse.Namespace) -> None:
        db = self.db = sqlite3.connect(os.path.join(d, "s.db"), isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=OFF")
        db.execute("PRAGMA cache_size=-65536")
        db.execute("CREATE TABLE s (k BLOB PRIMARY KEY, v BLOB NOT NULL) WITHOUT ROWID")

    def get_many(self, kl: list[bytes]) -> dict[bytes, bytes]:
        kl.sort()
        out: dict[bytes, bytes] = {}
        for j in range(0, len(kl), 500):
            part = kl[j : j + 500]
            q = f"SELECT k, v FROM s WHERE k IN ({','.join('?' * len(part))})"
            out.update(self.db.execute(q, part).fetchall())
        return out

    def put_many(self, items: list[tuple[bytes, bytes]]) -> None:
        items.sort()
        self.db.execute("BEGIN")
        self.db.executemany("INSERT OR REPLACE INTO s VALUES (?, ?)", items)
        self.db.execute("COMMIT")


class Lmdb:
    def __init__(self, d: str, a: argparse.Namespace) -> None:
        import lmdb

        self.env = lmdb.open(
            d, map_size=a.lmdb_map_mb << 20, sync=False, metasync=False, readahead=False
        )

    def get_many(self, kl: list[bytes]) -> dict[bytes, bytes]:
        kl.sort()
        with self.env.begin() as txn:
            return dict(txn.cursor().getmulti(kl))

    def put_many(self, items: list[tuple[bytes, bytes]]) -> None:
        items.sort()
        with self.env.begin(write=True) as txn:
            txn.cursor().putmulti(items)


class Rocksdict:
    def __init__(self, d: str, a: argparse.Namespace) -> None:
        from rocksdict import BlockBasedOptions, Cache, Options, Rdict, WriteBatch, WriteOptions

        o = Options(raw_mode=True)
        o.create_if_missing(True)
        o.set_write_buffer_size(64 << 20)
        bo = BlockBasedOptions()
        bo.set_bloom_filter(10, False)
        bo.set_block_cache(Cache(64 << 20))
        o.set_block_based_table_factory(bo)
        self.db = Rdict(d, o)
        wo = WriteOptions()
        wo.disable_wal = True
        self.db.set_write_options(wo)
        self.batch = WriteBatch

    def get_many(self, kl: list[bytes]) -> dict[bytes, bytes]:
        return {k: v for k, v in zip(kl, self.db.get(kl)) if v is not None}  # noqa: B905

    def put_many(self, items: list[tuple[bytes, bytes]]) -> None:
        wb = self.batch(raw_mode=True)
        for k, v in items:
            wb.put(k, v)
        self.db.write(wb)


BACKENDS = {"sqlite": Sqlite, "lmdb": Lmdb, "rocksdict": Rocksdict}


def rolling_count(be: Any, keys: list[int], cache: int) -> tuple[float, float]:
    young: dict[int, Any] = {}
    old: dict[int, Any] = {}
    dirty_y: set[int] = set()
    dirty_o: set[int] = set()
    half = cache // 2
    t0 = time.perf_counter()
    flush_s = 0.0
    for i in range(0, len(keys), CHUNK):
        chunk = keys[i : i + CHUNK]
        missing = [k for k in set(chunk) if k not in young and k not in old]
        if missing:
            enc = {dumps(k): k for k in missing}
            got = be.get_many(list(enc))
            for kb, k in enc.items():
                v = got.get(kb)
                young[k] = loads(v) if v is not None else None
        for k in chunk:
            if k in young:
                v = young[k]
            else:
                v = young[k] = old.pop(k)
                if k in dirty_o:
                    dirty_o.discard(k)
                    dirty_y.add(k)
            young[k] = (v or 0) + 1
            dirty_y.add(k)
        if len(young) > half:
            t1 = time.perf_counter()
            if dirty_o:
                be.put_many([(dumps(k), dumps(old[k])) for k in dirty_o])
            flush_s += time.perf_counter() - t1
            old, young, dirty_o, dirty_y = young, {}, dirty_y, set()
    return time.perf_counter() - t0, flush_s


def check_snapshots() -> None:
    d = tempfile.mkdtemp()
    try:
        db = sqlite3.connect(os.path.join(d, "s.db"), isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("CREATE TABLE s (k BLOB PRIMARY KEY, v BLOB)")
        db.execute("INSERT INTO s VALUES (?, ?)", (b"k", b"old"))
        reader = sqlite3.connect(os.path.join(d, "s.db"), isolation_level=None)
        reader.execute("BEGIN")
        reader.execute("SELECT 1 FROM s LIMIT 1").fetchall()
        db.execute("UPDATE s SET v = ? WHERE k = ?", (b"new", b"k"))
        print("sqlite3 read transaction iterates:", reader.execute("SELECT v FROM s").fetchall())
    finally:
        shutil.rmtree(d)
    try:
        from rocksdict import Options, Rdict
    except ImportError:
        print("rocksdict: not installed")
    else:
        d = tempfile.mkdtemp()
        o = Options(raw_mode=True)
        o.create_if_missing(True)
        rdb = Rdict(d, o)
        rdb[b"k"] = b"old"
        snap = rdb.snapshot()
        rdb[b"k"] = b"new"
        print(f"rocksdict snapshot: [k] -> {snap[b'k']!r}, items() -> {list(snap.items())!r}")
        del snap
        rdb.close()
        shutil.rmtree(d)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--keys", type=int, default=2_000_000)
    ap.add_argument("--items", type=int, default=4_000_000)
    ap.add_argument("--cache", type=int, default=200_000)
    ap.add_argument("--backends", default="sqlite,lmdb,rocksdict")
    ap.add_argument("--limit-mb", type=int, default=0)
    ap.add_argument("--lmdb-map-mb", type=int, default=16_384)
    ap.add_argument("--check-snapshots", action="store_true")
    a = ap.parse_args()
    if a.check_snapshots:
        check_snapshots()
        return
    if a.limit_mb:
        resource.setrlimit(resource.RLIMIT_AS, (a.limit_mb << 20, a.limit_mb << 20))
    rng = random.Random(1)
    keys = [rng.randrange(a.keys) for _ in range(a.items)]
    print(f"# {a.keys:,} keys, {a.items:,} items, cache {a.cache:,}; load {os.getloadavg()[0]:.1f}")
    print("| library | items/s | s | of which writes s | files MB |")
    print("|---|---|---|---|---|")
    for name in a.backends.split(","):
        d = tempfile.mkdtemp()
        try:
            try:
                be = BACKENDS[name](d, a)
            except ImportError:
                print(f"| {name} | not installed | | | |")
                continue
            wall, flush_s = rolling_count(be, keys, a.cache)
            size = sum(
                os.stat(os.path.join(r, f)).st_blocks * 512 for r, _, fs in os.walk(d) for f in fs
            )
            print(
                f"| {name} | {a.items / wall:,.0f} | {wall:.1f} | {flush_s:.1f} | {size / 1e6:.0f} |",
                flush=True,
            )
        finally:
            shutil.rmtree(d)
    print(f"# load after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
