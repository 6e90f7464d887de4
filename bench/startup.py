"""Start-up time: a fresh ``python`` process that imports slipstream and runs a 10-item job.

    python bench/startup.py [--rounds 15] [--clock wall|cpu] [--pyc cached|none]
                            [--src DIR ...] [--bytewax-python PATH] [--imports] [--processes]

Every variant is a fresh interpreter (``python -c ...``), run ``--rounds`` times,
interleaved (round 1 of every variant, then round 2, ...) so that a noisy moment of a
shared machine hurts all alike; the table shows the best and the median run. Variants:

* ``python -c pass``: the interpreter alone (the floor no Python library can go below);
* ``import slipstream``;
* ``slipstream pipeline job``: ``import slipstream`` plus a Pipeline of 10 items with a
  ``map(lambda ...)`` into a list sink on ``ss.local()``, joined (a lambda: the job pays
  for cloudpickle, which the submission check needs for lambdas and closures);
* ``slipstream DAG job``: the same with the Core API and named functions only;
* ``slipstream pipeline job, processes=2`` (``--processes``): the Pipeline job on
  ``ss.local(processes=2)``: the whole process, forkserver start included; and, inside
  fresh interpreters, its parts: the forkserver's start, ``new_job`` and ``new_job`` to
  ``join()`` of the first job and of later ones;
* ``bytewax job``: the same 10-item map with Bytewax (``TestingSource`` -> ``map`` ->
  ``TestingSink``, ``run_main``), when Bytewax is importable by this interpreter or by
  the one ``--bytewax-python`` names (e.g. a separate venv with ``pip install bytewax``).

``--pyc`` says whether the children find compiled bytecode (``.pyc`` files): ``cached``
(the default; what an installed package gives: the warm-up run writes them where they
are missing, whatever ``PYTHONDONTWRITEBYTECODE`` says) or ``none`` (slipstream's modules
are compiled from source on every start, as from a checkout in an environment with
``PYTHONDONTWRITEBYTECODE=1``: each source tree is copied without ``__pycache__`` to a
temporary directory put first on ``PYTHONPATH``; the standard library and installed
packages keep their bytecode). ``--src DIR``
(repeatable) adds the slipstream rows once more for another source tree (e.g. an older
checkout's ``src``, put first on ``PYTHONPATH``), interleaved with the rest: an A/B
comparison in one run.

``--clock cpu`` measures the child's CPU time (user + system, from the kernel's
accounting of the finished child) instead of wall-clock time: on a machine shared with
other work that is what the process itself spent. ``--imports`` also prints the modules
whose own import time is largest (``python -X importtime -c 'import slipstream'``).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

PIPELINE_JOB = """
import slipstream as ss
from slipstream import sinks, sources
p = ss.Pipeline()
p.read_from(sources.items(range(10))).map(lambda x: x * 2).write_to(sinks.list_sink("out"))
engine = ss.local()
engine.new_job(p).join()
assert sorted(engine.get_list("out")) == list(range(0, 20, 2))
"""

DAG_JOB = """
import slipstream as ss
from slipstream import processors as P, sinks, sources
dag = ss.DAG()
src = dag.new_vertex("src", sources.items(range(10)))
neg = dag.new_vertex("neg", P.map(abs))
out = dag.new_vertex("out", sinks.list_sink("out"))
dag.edge(ss.Edge.between(src, neg)).edge(ss.Edge.between(neg, out))
engine = ss.local()
engine.new_job(dag).join()
assert sorted(engine.get_list("out")) == list(range(10))
"""

PROCESSES_JOB = PIPELINE_JOB.replace("ss.local()", "ss.local(processes=2)")

#: in a fresh interpreter: the forkserver's start alone (what the first job with
#: processes > 1 pays once per process), then jobs with the forkserver up; prints seconds
IN_PROCESS = """
import os, sys, time
def proc_cpu(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
t0 = time.perf_counter()
from slipstream.engine.processes import member_context
ctx = member_context()
from multiprocessing import forkserver
forkserver.ensure_running()
t_server = time.perf_counter() - t0
import slipstream as ss
from slipstream import sinks, sources
jobs = []
cpu = []
for i in range(int(sys.argv[1])):
    c0 = time.process_time()
    p = ss.Pipeline()
    p.read_from(sources.items(range(10))).map(lambda x: x * 2).write_to(sinks.list_sink("out"))
    engine = ss.local(processes=2)
    t = time.perf_counter()
    job = engine.new_job(p)
    t_new = time.perf_counter() - t
    job.join()
    jobs.append((t_new, time.perf_counter() - t))
    assert sorted(engine.get_list("out")) == list(range(0, 20, 2))
    if i == 0:
        cpu = [time.process_time() - c0, job.metrics["__job__"]["member_cpu_ms_total"] / 1000,
               proc_cpu(forkserver._forkserver._forkserver_pid)]
print(t_server, ",".join(f"{c:.4f}" for c in cpu), *[f"{a},{b}" for a, b in jobs])
"""

BYTEWAX_JOB = """
import bytewax.operators as op
from bytewax.dataflow import Dataflow
from bytewax.testing import TestingSink, TestingSource, run_main
flow = Dataflow("startup")
s = op.map("double", op.input("in", flow, TestingSource(range(10))), lambda x: x * 2)
out = []
op.output("out", s, TestingSink(out))
run_main(flow)
assert sorted(out) == list(range(0, 20, 2))
"""


def run_once(python: str, code: str, cpu: bool, env: dict[str, str]) -> float:
    """Seconds for one fresh ``python -c code`` (wall-clock, or the child's CPU time)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([python, "-c", code], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode() if proc.stderr else ""
    if proc.stderr:
        proc.stderr.close()
    if proc.returncode != 0:
        raise SystemExit(f"{python} -c ... failed ({proc.returncode}):\n{code}\n{err}")
    return usage.ru_utime + usage.ru_stime if cpu else wall


def installed_src() -> str:
    """The directory holding the ``slipstream`` package this interpreter imports."""
    spec = importlib.util.find_spec("slipstream")
    assert spec is not None and spec.origin is not None, "slipstream is not installed"
    return os.path.dirname(os.path.dirname(spec.origin))


def importable(python: str, module: str) -> bool:
    r = subprocess.run([python, "-c", f"import {module}"], capture_output=True, check=False)
    return r.returncode == 0


def slowest_imports(n: int = 15) -> None:
    r = subprocess.run([sys.executable, "-X", "importtime", "-c", "import slipstream"],
                       capture_output=True, text=True, check=True)
    rows = []
    for line in r.stderr.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[0].strip().startswith("import time:") and parts[1].strip().isdigit():
            rows.append((int(parts[0].split(":")[1]), int(parts[1]), parts[2].rstrip()))
    print("\nslowest modules of `import slipstream` (own / cumulative microseconds, one run)")
    for own, cum, name in sorted(rows, reverse=True)[:n]:
        print(f"{own:>9}{cum:>10}  {name.strip()}")


def in_process(env: dict[str, str], rounds: int) -> None:
    """The parts of a processes=2 job's start-up, measured inside fresh interpreters:
    the forkserver's start (once per process), ``new_job`` (validating and pickling the
    job, starting the members) and ``new_job`` to ``join()``'s return, of the first job
    after the forkserver is up and of later jobs."""
    env = dict(env, PYTHONPATH=installed_src())
    server: list[float] = []
    cpus: list[list[float]] = []
    first: list[tuple[float, float]] = []
    later: list[tuple[float, float]] = []
    for _ in range(max(1, rounds)):
        r = subprocess.run([sys.executable, "-c", IN_PROCESS, "5"], capture_output=True,
                           text=True, env=env, check=True)
        t_server, cpu, *jobs = r.stdout.split()
        server.append(float(t_server))
        cpus.append([float(x) for x in cpu.split(",")])
        pairs = [tuple(float(x) for x in j.split(",")) for j in jobs]
        first.append(pairs[0])  # type: ignore[arg-type]
        later += pairs[1:]  # type: ignore[arg-type]
    print(f"\nprocesses=2 inside one process, {rounds} fresh interpreters, seconds best / median "
          f"(load average {os.getloadavg()[0]:.1f} at the end)")
    print(f"  forkserver started (its preload goes on)   {min(server):.3f} / {statistics.median(server):.3f}")
    for label, rows in (("first job", first), ("later jobs", later)):
        print(f"  {label:<11} new_job {min(r[0] for r in rows):.3f} / {statistics.median(r[0] for r in rows):.3f}"
              f"   new_job..join {min(r[1] for r in rows):.3f} / {statistics.median(r[1] for r in rows):.3f}")
    med = [statistics.median(c[i] for c in cpus) for i in range(3)]
    print(f"  CPU of the first job, median s: this process {med[0]:.3f}, both members {med[1]:.3f}, "
          f"the forkserver (its start and preload) {med[2]:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=15, help="runs of each variant (interleaved)")
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                    help="wall-clock time of the child, or its CPU time (user + system)")
    ap.add_argument("--bytewax-python", default=None,
                    help="an interpreter that can import bytewax (default: this one, if it can)")
    ap.add_argument("--imports", action="store_true", help="also list the slowest imports")
    ap.add_argument("--pyc", choices=["cached", "none"], default="cached",
                    help="children use cached bytecode, or compile every module on every start")
    ap.add_argument("--processes", action="store_true",
                    help="also a processes=2 job: whole process, and the forkserver's start "
                    "and jobs with the forkserver up measured inside one process")
    ap.add_argument("--src", action="append", default=[],
                    help="another slipstream source tree to compare (repeatable)")
    a = ap.parse_args()

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPATH")}
    tmp = tempfile.mkdtemp(prefix="slipstream-bench-startup-")
    if a.pyc == "none":
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    py = sys.executable
    variants: list[tuple[str, str, str, dict[str, str]]] = [("python -c pass", py, "pass", env)]
    for i, src in enumerate([None, *a.src]):
        tag = "" if src is None else f" [{src}]"
        tree = src or installed_src()
        if a.pyc == "none":  # a copy without bytecode, never written to
            copy = os.path.join(tmp, str(i))
            shutil.copytree(os.path.join(tree, "slipstream"), os.path.join(copy, "slipstream"),
                            ignore=shutil.ignore_patterns("__pycache__"))
            tree = copy
        src_env = dict(env, PYTHONPATH=os.path.abspath(tree))
        variants += [
            (f"import slipstream{tag}", py, "import slipstream", src_env),
            (f"slipstream pipeline job (lambda){tag}", py, PIPELINE_JOB, src_env),
            (f"slipstream DAG job (named functions){tag}", py, DAG_JOB, src_env),
        ]
        if a.processes:
            variants.append((f"slipstream pipeline job, processes=2{tag}", py, PROCESSES_JOB, src_env))
    bw = a.bytewax_python or py
    if importable(bw, "bytewax"):
        variants.append(("bytewax job (lambda)", bw, BYTEWAX_JOB, env))
        if bw != py:
            variants.append(("python -c pass (bytewax's python)", bw, "pass", env))
    else:
        print(f"bytewax is not importable by {bw}: its row is left out "
              "(pip install bytewax, or --bytewax-python PATH)")
    for _, python, code, venv in variants:  # warm the OS caches (and write .pyc files) once
        run_once(python, code, False, venv)
    times: dict[str, list[float]] = {name: [] for name, _, _, _ in variants}
    for _ in range(max(1, a.rounds)):
        for name, python, code, venv in variants:
            times[name].append(run_once(python, code, a.clock == "cpu", venv))

    base = min(times["python -c pass"])
    what = "CPU" if a.clock == "cpu" else "wall-clock"
    print(f"\nwhole-process start-up, {what} seconds, {a.rounds} interleaved rounds, "
          f".pyc {a.pyc} (load average {os.getloadavg()[0]:.1f} at the end)")
    width = max(40, *(len(name) + 2 for name in times))
    header = f"{'variant':<{width}}{'best s':>9}{'median s':>10}{'best - python':>15}"
    print(header)
    print("-" * len(header))
    for name, _, _, _ in variants:
        ts = times[name]
        print(f"{name:<{width}}{min(ts):>9.3f}{statistics.median(ts):>10.3f}"
              f"{(min(ts) - base) * 1000:>12.0f} ms")
    if a.processes:
        in_process(env, a.rounds)
    if a.imports:
        slowest_imports()
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
