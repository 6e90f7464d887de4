"""Command line: ``slipstream run TARGET [options] [-- ARGS]``, ``slipstream dot TARGET``
and ``slipstream state STORE`` (a job's state from its snapshot store:
:mod:`slipstream.cli_state`).

``TARGET`` is ``path/to/file.py:function`` or ``module:function``; the function returns
a :class:`DAG` (or anything with ``to_dag()``). Arguments after ``--`` (``key=value``,
``--key value``, ``--key=value`` or positional) and ``--arg key=value`` are passed to the
function, converted to the types its parameters are annotated with; a mismatch is a
clear error that shows the function's signature.

``module:function`` is imported from ``sys.path`` with the current directory *last*:
a local file named like a standard module (``statistics.py``, ``csv.py``) must not
replace it (``--cwd-first`` restores Python's usual order). A ``file.py`` target's
folder is likewise appended, so it can import its neighbours.

While the job runs, a table per vertex (rate, total, watermark lag, queue fill) refreshes
in place on a terminal; without one, a plain line is printed every few seconds.
``python -m slipstream`` is the same command.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import inspect
import os
import signal
import sys
import threading
import time
import types
import typing
from types import ModuleType
from typing import Any

from slipstream.core.config import JobConfig, ProcessingGuarantee
from slipstream.core.dag import DAG
from slipstream.core.errors import JobFailedError, SlipstreamError
from slipstream.core.item_errors import SKIPPED_METRIC
from slipstream.core.late_items import LATE_METRIC


class CliError(Exception):
    """A usage error: printed as ``error: ...`` with exit status 2."""


# -- loading the target ------------------------------------------------------------------
def _fix_sys_path(cwd_first: bool) -> None:
    """Put the current directory last on ``sys.path`` (``python -m`` puts it first)."""
    cwd = os.getcwd()
    sys.path[:] = [p for p in sys.path if p not in ("", cwd)]
    if cwd_first:
        sys.path.insert(0, cwd)
    else:
        sys.path.append(cwd)


def load_target(spec: str, cwd_first: bool = False) -> tuple[Any, ModuleType]:
    """The object ``spec`` names (``file.py:function`` or ``module:function``) and its
    module."""
    target, sep, attr = spec.rpartition(":")
    if not sep or not target or not attr:
        raise CliError(f"expected FILE.py:FUNCTION or MODULE:FUNCTION, got {spec!r}")
    _fix_sys_path(cwd_first)
    if target.endswith(".py") or os.sep in target or "/" in target:
        module = _load_file(target)
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as e:
            raise CliError(f"cannot import module {target!r}: {e}") from e
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise CliError(f"{target!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj, module


def _load_file(path: str) -> ModuleType:
    full = os.path.abspath(path)
    if not os.path.isfile(full):
        raise CliError(f"no such file: {path!r}")
    folder = os.path.dirname(full)
    if folder not in sys.path:
        sys.path.append(folder)
    name = os.path.splitext(os.path.basename(full))[0]
    existing = sys.modules.get(name)
    if existing is not None and os.path.abspath(getattr(existing, "__file__", "") or "") != full:
        name = f"_slipstream_target_{abs(hash(full)):x}"
    spec = importlib.util.spec_from_file_location(name, full)
    if spec is None or spec.loader is None:
        raise CliError(f"cannot load {path!r} as Python")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # classes and functions in it pickle by reference
    spec.loader.exec_module(module)
    return module


# -- arguments for the target function ---------------------------------------------------
def parse_call_args(tokens: list[str], pairs: list[str]) -> tuple[list[str], dict[str, str]]:
    """Split ``-- ...`` tokens and ``--arg`` pairs into positional and keyword strings."""
    pos: list[str] = []
    kw: dict[str, str] = {}
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok.startswith("--") and len(tok) > 2:
            key, eq, value = tok[2:].partition("=")
            if not eq:
                if i + 1 >= len(tokens):
                    raise CliError(f"argument {tok} needs a value")
                i += 1
                value = tokens[i]
            kw[key.replace("-", "_")] = value
        elif "=" in tok and tok.split("=", 1)[0].isidentifier():
            key, _, value = tok.partition("=")
            kw[key] = value
        else:
            pos.append(tok)
        i += 1
    for p in pairs:
        key, eq, value = p.partition("=")
        if not eq or not key.isidentifier():
            raise CliError(f"--arg expects KEY=VALUE, got {p!r}")
        kw[key] = value
    return pos, kw


def _convert(text: str, annotation: Any, name: str) -> Any:
    """``text`` as the annotated type (int, float, bool, str, their Optionals); without a
    usable annotation, a Python literal if it is one, else the string."""
    if annotation is inspect.Parameter.empty or annotation is Any:
        try:
            return ast.literal_eval(text)
        except (ValueError, SyntaxError):
            return text
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if args and typing.get_origin(annotation) in (typing.Union, types.UnionType):
        if text.lower() in ("none", "null"):
            return None
        return _convert(text, args[0], name)
    if annotation is bool:
        low = text.lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise CliError(f"argument {name!r}: expected a bool (true/false), got {text!r}")
    if annotation in (int, float, str):
        try:
            return annotation(text)
        except ValueError:
            raise CliError(
                f"argument {name!r}: expected {annotation.__name__}, got {text!r}"
            ) from None
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def call_target(fn: Any, spec: str, pos: list[str], kw: dict[str, str]) -> Any:
    """Call ``fn`` with the command line's arguments, converted by its annotations."""
    if not callable(fn):
        if pos or kw:
            raise CliError(f"{spec} is not a function, so it takes no arguments")
        return fn
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return fn(*pos, **kw)
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # noqa: BLE001 - unresolvable annotations: use the raw ones
        hints = {}
    shown = sig.replace(
        parameters=[p.replace(annotation=hints.get(n, p.annotation)) for n, p in sig.parameters.items()],
        return_annotation=hints.get("return", sig.return_annotation),
    )
    usage = f"{getattr(fn, '__name__', spec)}{shown}"
    try:
        bound = sig.bind(*pos, **kw)
    except TypeError as e:
        raise CliError(
            f"{spec}: the arguments do not match the function's parameters ({e}); "
            f"it is {usage}"
        ) from None
    params = sig.parameters
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for name, value in bound.arguments.items():
        p = params[name]
        ann = hints.get(name, p.annotation)
        if p.kind is p.VAR_POSITIONAL:
            args.extend(_convert(v, ann, name) for v in value)
        elif p.kind is p.VAR_KEYWORD:
            kwargs.update({k: _convert(v, ann, k) for k, v in value.items()})
        elif p.kind is p.KEYWORD_ONLY:
            kwargs[name] = _convert(value, ann, name)
        else:
            args.append(_convert(value, ann, name))
    return fn(*args, **kwargs)


def build_dag(a: argparse.Namespace) -> tuple[DAG, ModuleType]:
    fn, module = load_target(a.target, a.cwd_first)
    pos, kw = parse_call_args(a.args, a.arg)
    result = call_target(fn, a.target, pos, kw)
    if not isinstance(result, DAG) and hasattr(result, "to_dag"):
        result = result.to_dag()
    if not isinstance(result, DAG):
        raise CliError(f"{a.target} returned {type(result).__name__}, not a slipstream DAG")
    return result, module


# -- commands ----------------------------------------------------------------------------
def _engine(a: argparse.Namespace, module: ModuleType) -> tuple[Any, Any]:
    """The engine, and a dashboard server it does not own itself (Spark)."""
    if a.engine == "spark":
        import cloudpickle

        import slipstream

        if module.__name__ not in ("__main__",) and not module.__name__.startswith("slipstream"):
            # executors cannot import the target's module: ship its code by value, with
            # both picklers (Spark serialises closures with its own copy of cloudpickle)
            cloudpickle.register_pickle_by_value(module)
            try:
                from pyspark import cloudpickle as spark_cloudpickle
            except ImportError:
                pass  # slipstream.spark() below says what to install
            else:
                spark_cloudpickle.register_pickle_by_value(module)
        from slipstream.spark.session import SparkUnavailableError

        try:
            engine = slipstream.spark(master=a.master) if a.master else slipstream.spark()
        except SparkUnavailableError as e:  # no pyspark or Java, a master not there
            raise CliError(str(e)) from None
        server = None
        if a.dashboard is not None:
            from slipstream.dashboard.server import DashboardServer

            server = DashboardServer(lambda: engine.jobs, a.dashboard)
        return engine, server
    if a.master:
        raise CliError("--master applies to --engine spark")
    from slipstream.engine.local import LocalEngine

    processes = a.processes if a.processes == "auto" else _positive_int(a.processes, "--processes")
    if processes != 1:
        import cloudpickle

        if module.__name__ != "__main__" and not module.__name__.startswith("slipstream"):
            # member processes import by name only what is on their sys.path: ship the
            # target's code by value, as for Spark executors
            cloudpickle.register_pickle_by_value(module)
    try:
        local = LocalEngine(
            cooperative_threads=a.threads,
            members=a.members,
            dashboard=a.dashboard,
            processes=processes,
        )
    except ValueError as e:
        raise CliError(str(e)) from None
    return local, None


def _positive_int(text: str, option: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise CliError(f'{option} takes a number >= 1 or "auto", got {text!r}')
    return n


def _guarantee(a: argparse.Namespace) -> ProcessingGuarantee:
    if a.guarantee is None:
        # a snapshot store (or resuming from one) means the user wants snapshots
        g = "exactly-once" if (a.snapshot_store or a.resume) else "none"
    else:
        g = a.guarantee
    return ProcessingGuarantee[g.upper().replace("-", "_")]


def _check_resume(a: argparse.Namespace, guarantee: ProcessingGuarantee) -> None:
    """``--resume`` (``JobConfig(resume=True)``): say when the job starts from the
    beginning (the engine itself warns which snapshot a resumed job continues from)."""
    if not a.resume:
        return
    if not a.snapshot_store:
        raise CliError("--resume needs --snapshot-store DIR (the store the job wrote before)")
    if guarantee is ProcessingGuarantee.NONE:
        raise CliError("--resume needs a processing guarantee (at-least-once or exactly-once)")
    from slipstream.state.store import DirectorySnapshotStore

    store = DirectorySnapshotStore(a.snapshot_store)
    owner = store.owner()
    if owner is None or owner.completed:
        print(f"no snapshot to resume in {a.snapshot_store}: starting from the beginning", file=sys.stderr)


def _print_job_error(e: SlipstreamError) -> None:
    """A failed job: the processor's traceback (from its own code on), once, then the
    one ``error:`` line that says which vertex failed on which item."""
    tb = e.processor_traceback() if isinstance(e, JobFailedError) else None
    if tb:
        print(tb.rstrip("\n"), file=sys.stderr)
    print(f"error: {e}", file=sys.stderr)


def cmd_run(a: argparse.Namespace) -> int:
    dag, module = build_dag(a)
    guarantee = _guarantee(a)
    _check_resume(a, guarantee)
    if a.engine == "spark" and a.resume:
        raise CliError("--resume is supported on the local engine (Spark resumes from its checkpoint)")
    engine, server = _engine(a, module)
    url = server.url if server is not None else getattr(engine, "dashboard_url", None)
    if url:
        print(f"dashboard: {url}", file=sys.stderr, flush=True)
    config = JobConfig(
        name=a.name or a.target.rpartition(":")[2],
        processing_guarantee=guarantee,
        snapshot_interval_ms=a.snapshot_interval_ms,
        snapshot_store=a.snapshot_store,
        resume=a.resume,
        on_item_error=a.on_item_error,
    )
    start = time.monotonic()
    from slipstream.dashboard.console import Progress

    stop = threading.Event()
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, lambda *_: stop.set()) if in_main else None
    progress: Progress | None = None
    try:
        job = engine.new_job(dag, config)
        progress = None if a.quiet else Progress(job, interval=a.interval)
        while not stop.is_set():
            try:
                job.join(timeout=0.25)
                break
            except TimeoutError:
                if progress is not None:
                    progress.update()
        if stop.is_set():
            print("cancelling ...", file=sys.stderr)
            job.cancel()
            try:
                job.join(30)
            except SlipstreamError:
                pass
            return 130
    except SlipstreamError as e:
        _print_job_error(e)
        return 1
    finally:
        if progress is not None:
            progress.close()
        if in_main:
            signal.signal(signal.SIGINT, previous)
        if a.dashboard is not None and a.linger > 0 and not stop.is_set():
            print(f"dashboard stays up for {a.linger:g} s (Ctrl-C ends)", file=sys.stderr)
            try:
                time.sleep(a.linger)
            except KeyboardInterrupt:
                pass
        if server is not None:
            server.close()
        engine.shutdown()
    # the summary says what the job dropped (the engine warned about it, too)
    metrics = [m for n, m in job.metrics.items() if n != "__job__"]
    late = sum(m.get(LATE_METRIC, 0) for m in metrics)
    dropped = f", dropping {late} late item{'s' if late != 1 else ''}" if late else ""
    bad = sum(m.get(SKIPPED_METRIC, 0) for m in metrics)
    skipped = f", skipping {bad} item{'s' if bad != 1 else ''} that raised" if bad else ""
    print(
        f"job {job.name!r} completed in {time.monotonic() - start:.2f} s{dropped}{skipped}",
        file=sys.stderr,
    )
    return 0


def cmd_dot(a: argparse.Namespace) -> int:
    dag, _ = build_dag(a)
    if a.svg:
        from slipstream.dashboard.svg import dag_svg

        text = dag_svg(dag)
        if a.svg == "-":
            sys.stdout.write(text + "\n")
        else:
            with open(a.svg, "w", encoding="utf-8") as fh:
                fh.write(text + "\n")
            print(f"wrote {a.svg}", file=sys.stderr)
        return 0
    print(dag.to_dot())
    return 0


def _version() -> str:
    from slipstream import __version__

    return f"slipstream {__version__} (Python {sys.version.split()[0]})"


def _add_target(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", metavar="TARGET", help="FILE.py:FUNCTION or MODULE:FUNCTION returning a DAG")
    p.add_argument(
        "--arg", action="append", default=[], metavar="KEY=VALUE", help="an argument for the function"
    )
    p.add_argument(
        "--cwd-first",
        action="store_true",
        help="put the current directory first on sys.path (default: last, so local files "
        "cannot replace standard modules)",
    )


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="slipstream",
        description="Run slipstream DAGs and draw them.",
        epilog="Arguments after -- go to the function: slipstream run f.py:build -- --rate 500",
    )
    ap.add_argument("--version", action="version", version=_version())
    sub = ap.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a DAG until it completes (Ctrl-C cancels)")
    _add_target(run)
    run.add_argument("--engine", choices=["local", "spark"], default="local")
    run.add_argument("--master", help="Spark master URL (--engine spark)")
    run.add_argument(
        "--threads", type=int, default=None,
        help="cooperative threads (local; with the GIL more than 1 runs as 1 unless "
        "SLIPSTREAM_ALLOW_GIL_THREADS=1)",
    )
    run.add_argument("--members", type=int, default=1, help="simulated members (local)")
    run.add_argument(
        "--processes",
        default="1",
        help='member processes (local): a number or "auto" (the usable cores); the '
        "progress shows each member and their total",
    )
    run.add_argument("--name", help="job name (default: the function's name)")
    run.add_argument(
        "--guarantee",
        choices=["none", "at-least-once", "exactly-once"],
        default=None,
        help="processing guarantee (default: exactly-once with --snapshot-store, else none)",
    )
    run.add_argument("--snapshot-interval-ms", type=int, default=10_000)
    run.add_argument("--snapshot-store", metavar="DIR", help="snapshot directory")
    run.add_argument(
        "--resume",
        action="store_true",
        help="continue from the last committed snapshot in --snapshot-store, if there is one",
    )
    run.add_argument(
        "--on-item-error",
        choices=["fail", "skip"],
        default="fail",
        help="when user code raises on an item: fail the job (default) or skip the item "
        "(counted, warned about; JobConfig(on_item_error=...))",
    )
    run.add_argument(
        "--dashboard", type=int, metavar="PORT", help="serve the live dashboard on 127.0.0.1:PORT"
    )
    run.add_argument(
        "--linger", type=float, default=0.0, metavar="S",
        help="keep the dashboard up S seconds after the job ends",
    )
    run.add_argument("--interval", type=float, default=None, help="seconds between progress updates")
    run.add_argument("--quiet", action="store_true", help="no progress output")
    run.set_defaults(fn=cmd_run)
    dot = sub.add_parser("dot", help="print the DAG as Graphviz text, or draw it (--svg)")
    _add_target(dot)
    dot.add_argument("--svg", metavar="FILE", help="write an SVG picture to FILE ('-': stdout)")
    dot.set_defaults(fn=cmd_dot)
    from slipstream.cli_state import add_parser as add_state

    add_state(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # everything after the first "--" belongs to the target function
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1 :]
    ap = parser()
    a = ap.parse_args(argv)
    a.args = extra
    try:
        return int(a.fn(a))
    except CliError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
