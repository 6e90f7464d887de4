"""Command line: ``slipstream run module:build_dag [--engine local|spark] ...``.

``module:build_dag`` names a function (no arguments) returning a :class:`DAG`; the module
is imported from the current directory or ``sys.path``. While the job runs, a progress line
per second shows items in/out per vertex (``--quiet`` turns it off).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from typing import Any

from slipstream.core.config import JobConfig, ProcessingGuarantee
from slipstream.core.dag import DAG
from slipstream.core.errors import SlipstreamError


def load_dag(spec: str) -> DAG:
    """Import ``module:function`` and call the function to get the DAG."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise SystemExit(f"error: expected MODULE:FUNCTION, got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise SystemExit(f"error: cannot import module {module_name!r}: {e}") from e
    fn = getattr(module, attr, None)
    if fn is None:
        raise SystemExit(f"error: module {module_name!r} has no attribute {attr!r}")
    dag = fn() if callable(fn) and not isinstance(fn, DAG) else fn
    if not isinstance(dag, DAG):
        raise SystemExit(f"error: {spec} returned {type(dag).__name__}, not a slipstream DAG")
    return dag


def _progress(job: Any) -> str:
    parts = []
    for vertex, m in job.metrics.items():
        if vertex.startswith("__"):
            continue
        parts.append(f"{vertex} {m.get('items_in', 0):,}>{m.get('items_out', 0):,}")
    return f"[{job.status.value}] " + "  ".join(parts)


def cmd_run(a: argparse.Namespace) -> int:
    dag = load_dag(a.dag)
    engine: Any
    if a.engine == "spark":
        import slipstream

        engine = slipstream.spark(master=a.master) if a.master else slipstream.spark()
    else:
        from slipstream.engine.local import LocalEngine

        engine = LocalEngine(cooperative_threads=a.threads, members=a.members)
    config = JobConfig(
        name=a.name or a.dag,
        processing_guarantee=ProcessingGuarantee[a.guarantee.upper().replace("-", "_")],
        snapshot_interval_ms=a.snapshot_interval_ms,
        snapshot_store=a.snapshot_store,
    )
    start = time.monotonic()
    job = engine.new_job(dag, config)
    try:
        while True:
            try:
                job.join(timeout=1.0)
                break
            except TimeoutError:
                if not a.quiet:
                    print(_progress(job), file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        print("cancelling ...", file=sys.stderr)
        job.cancel()
        return 130
    except SlipstreamError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if not a.quiet:
        print(_progress(job), file=sys.stderr)
    print(f"job {job.name!r} completed in {time.monotonic() - start:.2f} s", file=sys.stderr)
    return 0


def cmd_dot(a: argparse.Namespace) -> int:
    print(load_dag(a.dag).to_dot())
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="slipstream", description="Run slipstream DAGs.")
    sub = ap.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a DAG until it completes (Ctrl-C cancels)")
    run.add_argument("dag", help="MODULE:FUNCTION returning a DAG")
    run.add_argument("--engine", choices=["local", "spark"], default="local")
    run.add_argument("--master", help="Spark master URL (spark engine)")
    run.add_argument("--threads", type=int, default=None, help="cooperative threads (local)")
    run.add_argument("--members", type=int, default=1, help="simulated members (local)")
    run.add_argument("--name", help="job name")
    run.add_argument(
        "--guarantee", choices=["none", "at-least-once", "exactly-once"], default="none"
    )
    run.add_argument("--snapshot-interval-ms", type=int, default=10_000)
    run.add_argument("--snapshot-store", help="snapshot directory")
    run.add_argument("--quiet", action="store_true", help="no progress lines")
    run.set_defaults(fn=cmd_run)
    dot = sub.add_parser("dot", help="print the DAG as Graphviz text")
    dot.add_argument("dag", help="MODULE:FUNCTION returning a DAG")
    dot.set_defaults(fn=cmd_dot)
    a = ap.parse_args(argv)
    return int(a.fn(a))


if __name__ == "__main__":
    sys.exit(main())
