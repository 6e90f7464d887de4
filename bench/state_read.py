"""Reading state as data at scale (issue 25): how long ``ss.state.read``, ``read_arrow`` and
SQL over a snapshot take, against DuckDB over the same rows in a Parquet file.

    python bench/state_read.py [--keys 1M,10M] [--processors 2] [--repeat 3] [--quick]
                               [--only sql,parquet] [--src OLD/src]

``--keys`` takes counts with an optional ``k`` / ``M`` suffix. ``--quick``: 10k and 100k
keys, one round (a smoke run). ``--only``: these variants alone (parquet is always
run: the answers are checked against it). ``--src DIR``: an A/B run: each variant but
``parquet`` also runs with ``DIR`` (another checkout's ``src``) first on
``PYTHONPATH``, interleaved with this checkout's in every round over the same store,
and a second table gives both (the store is built by this checkout: a ``DIR`` that
cannot read its format fails).

The store, per key count K: the snapshot of a rolling count per user behind a generator,

    p = ss.Pipeline()
    (p.read_from(sources.generator(fn, None)).group_by(itemgetter(0))
      .rolling_aggregate(summing(itemgetter(1))).write_to(sinks.noop()))

seeded with ``ss.state.bootstrap`` (the fastest way to build a large store; a job's own
store reads the same way once its chains are compacted): K keys ``"user00000001"``, ...
with the int values ``i * 7919 % 100000``, spread over ``--processors`` processors (one
full chunk each), and the generator's offsets. The same K (key, value) rows are written
to a Parquet file with pyarrow (string and int64 columns, default settings).

What is timed (each in a fresh process, so that its peak RSS, ``VmHWM``, is its own; the best of
``--repeat`` rounds, the rounds interleaving the variants; imports are not timed):

    read        ``rows = ss.state.read(store)``: a StateRow per entry
    to_arrow    ``ss.state.to_arrow(ss.state.read(store))``: the rows, then a table
    read_arrow  ``ss.state.read_arrow(store)``: the columnar path (no row per key)
    sql         ``ss.state.sql(store, Q)``: read the store and run Q with DuckDB
    cli         ``slipstream state STORE --sql Q --format csv``: the whole command,
                Python's start and the imports included (wall clock of the process)
    parquet     ``duckdb.connect().sql(Q over read_parquet(FILE)).fetchall()``: DuckDB
                over the same rows in Parquet (the file in the page cache, as the store)

with ``Q = select count(*), sum(value) from state``. Every answer is checked against
the Parquet one. The last column divides ``sql`` by ``parquet``.

Everything lives in one private temporary directory (the stores, the Parquet files and
the stores' signing keys: ``SLIPSTREAM_KEY_DIR``), removed at the end.
"""

from __future__ import annotations

import argparse
import json
import operator
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import count, peak_rss_mb, run_variant  # noqa: E402

KEY_DIR_ENV = "SLIPSTREAM_KEY_DIR"  # docs/fault-tolerance.md, "Signed snapshot files"
QUERY = "select count(*), sum(value) from state"
VARIANTS = ("read", "to_arrow", "read_arrow", "sql", "cli", "parquet")


def parse_keys(text: str) -> list[int]:
    return [count(part) for part in text.split(",")]


def value_of(i: int) -> int:
    return i * 7919 % 100_000


def pipeline() -> Any:
    import slipstream as ss
    from slipstream import sinks, sources
    from slipstream.aggregate import summing

    p = ss.Pipeline()
    (
        p.read_from(sources.generator(lambda seq: (f"user{seq:08d}", 1), None))
        .group_by(operator.itemgetter(0))
        .rolling_aggregate(summing(operator.itemgetter(1)))
        .write_to(sinks.noop())
    )
    return p


def build(keys: int, processors: int, store: str, parquet: str) -> tuple[float, float]:
    """Seed ``store`` and write ``parquet``; returns their sizes in MB."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    import slipstream as ss

    ss.state.bootstrap(
        pipeline(),
        "rolling_aggregate",
        ((f"user{i:08d}", value_of(i)) for i in range(keys)),
        store,
        parallelism=processors,
        offsets={"source": keys},
    )
    names = [f"user{i:08d}" for i in range(keys)]
    values = [value_of(i) for i in range(keys)]
    pq.write_table(
        pa.table({"key": pa.array(names), "value": pa.array(values, pa.int64())}), parquet
    )
    del names, values
    size = sum(os.path.getsize(os.path.join(store, n)) for n in os.listdir(store))
    return size / 1e6, os.path.getsize(parquet) / 1e6


def measure(variant: str, store: str, parquet: str) -> dict[str, Any]:
    """One variant in this process: seconds, peak RSS and the answer (count, sum)."""
    if variant == "cli":
        t = time.perf_counter()
        r = subprocess.run(
            [sys.executable, "-m", "slipstream", "state", store, "--sql", QUERY, "--format", "csv"],
            capture_output=True,
            text=True,
            check=False,
        )
        seconds = time.perf_counter() - t
        if r.returncode != 0:
            raise SystemExit(f"slipstream state --sql failed: {r.stderr}")
        count, total = r.stdout.splitlines()[1].split(",")
        return {"seconds": seconds, "answer": [int(count), int(total)], "peak_mb": None}
    import duckdb
    import pyarrow  # noqa: F401

    import slipstream as ss
    import slipstream.state.query  # noqa: F401  (the imports are not timed)

    answer: list[int]
    t = time.perf_counter()
    if variant == "read":
        rows = ss.state.read(store)
        seconds = time.perf_counter() - t
        data = [r.value for r in rows if r.kind == "keyed"]
        answer = [len(data), sum(data)]
    elif variant == "to_arrow":
        table = ss.state.to_arrow(ss.state.read(store))
        seconds = time.perf_counter() - t
        answer = [table.num_rows, 0]
    elif variant == "read_arrow":
        table = ss.state.read_arrow(store)
        seconds = time.perf_counter() - t
        answer = [table.num_rows, 0]
    elif variant == "sql":
        (row,) = ss.state.sql(store, QUERY).to_pylist()
        seconds = time.perf_counter() - t
        answer = [int(v) for v in row.values()]
    elif variant == "parquet":
        con = duckdb.connect()
        (row,) = con.sql(QUERY.replace("from state", f"from read_parquet('{parquet}')")).fetchall()
        seconds = time.perf_counter() - t
        answer = [int(v) for v in row]
    else:
        raise SystemExit(f"unknown variant {variant!r}")
    return {"seconds": seconds, "answer": answer, "peak_mb": own_peak_mb()}


def own_peak_mb() -> float:
    """This process image's peak RSS (``VmHWM``): ``ru_maxrss`` also counts what the
    parent had mapped when it forked this process (Linux keeps it across ``exec``)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return peak_rss_mb()


def fmt_s(s: float) -> str:
    return f"{s:.3f} s" if s < 1 else f"{s:.2f} s"


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--keys", default=None, help="key counts, e.g. 1M,10M (default)")
    ap.add_argument("--processors", type=int, default=2, help="processors (chunks) of the store")
    ap.add_argument("--repeat", type=int, default=None, help="rounds (default 3; --quick 1)")
    ap.add_argument("--quick", action="store_true", help="10k and 100k keys, one round")
    ap.add_argument("--only", default=None, help="variants to run, e.g. sql,parquet")
    ap.add_argument("--src", default=None, help="A/B: another checkout's src directory")
    ap.add_argument("--run-variant", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--store", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--parquet", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--key-count", type=int, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.run_variant == "build":  # in its own process: the bench's stays small
        sizes = build(a.key_count, a.processors, a.store, a.parquet)
        print(json.dumps({"sizes": sizes}))
        return
    if a.run_variant:
        print(json.dumps(measure(a.run_variant, a.store, a.parquet)))
        return
    variants = VARIANTS
    if a.only:
        wanted = set(a.only.split(",")) | {"parquet"}
        unknown = wanted - set(VARIANTS)
        if unknown:
            raise SystemExit(f"--only: unknown variants {sorted(unknown)}; known: {VARIANTS}")
        variants = tuple(v for v in VARIANTS if v in wanted)
    old_src = os.path.abspath(a.src) if a.src else None
    keys = parse_keys(a.keys or ("10k,100k" if a.quick else "1M,10M"))
    repeat = a.repeat or (1 if a.quick else 3)
    load = os.getloadavg()
    print(f"load: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} (1/5/15 min), {os.cpu_count()} cpus")
    tmp = tempfile.mkdtemp(prefix="slipstream-bench-state-read-")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # kill: still remove tmp
    os.environ[KEY_DIR_ENV] = os.path.join(tmp, "keys")
    script = os.path.abspath(__file__)
    results: list[dict[str, Any]] = []
    try:
        for k in keys:
            store, parquet = (
                os.path.join(tmp, f"store-{k}"),
                os.path.join(tmp, f"state-{k}.parquet"),
            )
            t = time.perf_counter()
            store_mb, parquet_mb = run_variant(
                script,
                "build",
                ["--key-count", str(k), "--processors", str(a.processors), "--store", store,
                 "--parquet", parquet],
            )["sizes"]  # fmt: skip
            print(f"{k:,} keys: store {store_mb:.1f} MB, parquet {parquet_mb:.1f} MB, built in "
                  f"{time.perf_counter() - t:.1f} s", flush=True)  # fmt: skip
            best: dict[str, dict[str, Any]] = {}
            files = ["--store", store, "--parquet", parquet]
            for _ in range(repeat):
                for v in variants:
                    runs: list[tuple[str, str | None]] = [(v, None)]
                    if old_src is not None and v != "parquet":
                        runs.append((f"{v} (before)", old_src))
                    for name, env in runs:
                        r = (
                            run_variant(script, v, files)
                            if env is None
                            else _run_variant_env(script, v, files, env)
                        )
                        if name not in best or r["seconds"] < best[name]["seconds"]:
                            best[name] = r
            want = best["parquet"]["answer"]
            for v in best:
                if v.split(" ")[0] not in ("read", "sql", "cli"):
                    continue
                if best[v]["answer"] != want:
                    raise SystemExit(
                        f"{v} answered {best[v]['answer']}, DuckDB over Parquet {want}"
                    )
            for v in best:
                if v.split(" ")[0] not in ("to_arrow", "read_arrow"):
                    continue
                if best[v]["answer"][0] != k + a.processors:  # the keys and the offsets
                    raise SystemExit(
                        f"{v} made {best[v]['answer'][0]} rows, not {k + a.processors}"
                    )
            results.append({"keys": k, "store_mb": store_mb, "parquet_mb": parquet_mb, **best})
            shutil.rmtree(store, ignore_errors=True)
            os.unlink(parquet)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if old_src is not None:
        _print_ab(results, variants, old_src, repeat)
    if variants != VARIANTS:
        return _print_some(results, variants, a.processors, repeat)
    print(f"\nReading state ({a.processors} processors, best of {repeat}; {QUERY!r})\n")
    print("| keys | store / parquet | read | to_arrow(read) | read_arrow | sql | cli --sql "
          "| DuckDB over Parquet | sql / Parquet |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        cells = [f"{r['keys']:,}", f"{r['store_mb']:.1f} / {r['parquet_mb']:.1f} MB"]
        for v in VARIANTS:
            peak = r[v]["peak_mb"]
            cells.append(fmt_s(r[v]["seconds"]) + (f" ({peak:,.0f} MB)" if peak else ""))
        cells.append(f"{r['sql']['seconds'] / r['parquet']['seconds']:.0f}x")
        print("| " + " | ".join(cells) + " |")
    print(
        "\n- each cell: seconds (peak RSS of its process); cli: the command's wall clock, "
        "Python's start included\n- sql / Parquet: ss.state.sql's time over DuckDB's over "
        "the same rows in Parquet"
    )
    load = os.getloadavg()
    print(f"\nload after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} (1/5/15 min)")


def _run_variant_env(script: str, variant: str, args: list[str], src: str) -> Any:
    """:func:`benchlib.run_variant` with another checkout's ``src`` first on the path."""
    env = dict(os.environ, PYTHONPATH=src)
    r = subprocess.run(
        [sys.executable, script, "--run-variant", variant, *args],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    if r.returncode != 0:
        raise SystemExit(f"variant {variant} (before) failed:\n{r.stderr}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def _print_some(
    results: list[dict[str, Any]], variants: tuple[str, ...], processors: int, repeat: int
) -> None:
    """The table of an ``--only`` run: the variants run, and sql / Parquet if sql ran."""
    print(f"\nReading state ({processors} processors, best of {repeat}; {QUERY!r})\n")
    print("| keys | store / parquet | " + " | ".join(variants) + " |")
    print("|---:|---:|" + "---:|" * len(variants))
    for r in results:
        cells = [f"{r['keys']:,}", f"{r['store_mb']:.1f} / {r['parquet_mb']:.1f} MB"]
        for v in variants:
            peak = r[v]["peak_mb"]
            cells.append(fmt_s(r[v]["seconds"]) + (f" ({peak:,.0f} MB)" if peak else ""))
        print("| " + " | ".join(cells) + " |")
    if "sql" in variants:
        for r in results:
            print(
                f"- {r['keys']:,} keys: sql / Parquet {r['sql']['seconds'] / r['parquet']['seconds']:.1f}x"
            )
    load = os.getloadavg()
    print(f"\nload after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} (1/5/15 min)")


def _print_ab(
    results: list[dict[str, Any]], variants: tuple[str, ...], src: str, repeat: int
) -> None:
    """The A/B table of a ``--src`` run: each variant before (``src``) and now, and each
    one's ratio to DuckDB over Parquet."""
    print(f"\nA/B, best of {repeat} interleaved rounds: before = {src}, after = this checkout\n")
    print("| keys | variant | before | after | before / Parquet | after / Parquet |")
    print("|---:|---|---:|---:|---:|---:|")
    for r in results:
        pq = r["parquet"]["seconds"]
        for v in variants:
            if v == "parquet":
                continue
            b, n = r[f"{v} (before)"]["seconds"], r[v]["seconds"]
            print(
                f"| {r['keys']:,} | {v} | {fmt_s(b)} | {fmt_s(n)} | {b / pq:.1f}x | {n / pq:.1f}x |"
            )
        print(f"| {r['keys']:,} | DuckDB over Parquet | | {fmt_s(pq)} | | |")


if __name__ == "__main__":
    main()
