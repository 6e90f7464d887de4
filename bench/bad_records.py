"""What the bad-record policy costs (issue 21, items 3 and 4).

    python bench/bad_records.py [--items 3000000] [--repeat 3] [--bad 0,0.0001,0.01]
                                [--src OTHER/src]

A Core API ``P.map`` and a Pipeline chain (``map`` + ``filter``, fused) over
``--items`` ints, CPU time of the job, best of ``--repeat`` interleaved rounds, for
``on_item_error="fail"`` (the default, no bad item) and ``"skip"`` with the given shares
of items on which the function raises. The bulk paths run the function over a chunk at
C speed; only an exception makes them look for the item, so "fail" and "skip" with no
bad item should cost the same, and each bad item adds one look-up. ``--src`` runs the
default row against another tree too (e.g. main's ``src``), for a before/after figure.
Each row runs in its own process.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any


def job(kind: str, items: int, bad: float) -> float:
    import slipstream as ss
    from slipstream import DAG, Edge, JobConfig, sinks, sources
    from slipstream import processors as P

    # the same check per item in every variant (a set lookup), so that only the
    # failures differ
    bad_items = frozenset(range(0, items, int(1 / bad))) if bad > 0 else frozenset()

    def fn(x: int) -> int:
        if x in bad_items:
            raise ValueError(x)
        return x + 1

    if kind == "map":
        dag: Any = DAG()
        src = dag.new_vertex("src", sources.items(range(items))).local_parallelism(1)
        m = dag.new_vertex("map", P.map(fn)).local_parallelism(1)
        out = dag.new_vertex("out", sinks.noop()).local_parallelism(1)
        dag.edge(Edge.between(src, m)).edge(Edge.between(m, out))
    else:
        dag = ss.Pipeline()
        dag.read_from(sources.items(range(items))).map(fn).filter(bool).write_to(sinks.noop())
    config = JobConfig(on_item_error="skip") if bad >= 0 else JobConfig()
    t0 = time.process_time()
    ss.local().new_job(dag, config).join()
    return time.process_time() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=3_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--bad", default="0,0.0001,0.01", help="shares of bad items under 'skip'")
    ap.add_argument("--src", default=None, help="another tree's src directory, for the 'fail' rows")
    ap.add_argument("--run", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.run:
        kind, bad = a.run.split(":")
        print(json.dumps(job(kind, a.items, float(bad))))
        return
    rows: list[tuple[str, str, str | None]] = []
    for kind in ("map", "pipeline"):
        if a.src:
            rows.append((kind, "-1", a.src))
        rows.append((kind, "-1", None))
        rows.extend((kind, b, None) for b in a.bad.split(","))
    best: dict[tuple[str, str, str | None], float] = {}
    for _ in range(a.repeat):
        for row in rows:
            kind, bad, src = row
            env = dict(os.environ)
            if src:
                env["PYTHONPATH"] = src
            r = subprocess.run(
                [sys.executable, __file__, "--items", str(a.items), "--run", f"{kind}:{bad}"],
                capture_output=True, text=True, env=env, check=True,
            )
            s = float(r.stdout.strip().splitlines()[-1])
            best[row] = min(best.get(row, s), s)
    print(f"{a.items:,} items, CPU seconds, best of {a.repeat}")
    print(f"{'job':<10} {'policy':<28} {'seconds':>8} {'ns/item':>8}")
    for (kind, bad, src), s in best.items():
        b = float(bad)
        what = "fail" if b < 0 else f"skip, {b:.2%} bad"
        if src:
            what += " (--src)"
        print(f"{kind:<10} {what:<28} {s:8.3f} {s / a.items * 1e9:8.1f}")


if __name__ == "__main__":
    main()
