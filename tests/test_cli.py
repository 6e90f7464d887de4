"""The command line: targets as module:function or file.py:function with arguments,
progress output on and off a terminal, --resume, --dashboard, and dot --svg."""

from __future__ import annotations

import os
import pty
import select
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import xml.etree.ElementTree as ET
from pathlib import Path

MODULE = textwrap.dedent(
    """
    from slipstream import DAG, Edge
    from slipstream import processors as P, sinks, sources

    def build(n: int = 1000, scale: int = 1, label: str = "x", *, square: bool = True):
        dag = DAG()
        s = dag.new_vertex("numbers", sources.items(range(n)))
        m = dag.new_vertex("square", P.map(lambda x: (x * x if square else x) * scale))
        out = dag.new_vertex("out", sinks.write_files("out"))
        dag.edge(Edge.between(s, m).partitioned(lambda x: x % 3)).edge(Edge.between(m, out))
        return dag

    def slow(rate: float = 400.0, n: int = 800):
        dag = DAG()
        s = dag.new_vertex("gen", sources.generator(lambda i: i, rate, max_items=n)).local_parallelism(1)
        out = dag.new_vertex("out", sinks.write_files("out")).local_parallelism(1)
        dag.edge(Edge.between(s, out))
        return dag

    def files(directory: str = "data"):
        dag = DAG()
        s = dag.new_vertex("read", sources.read_files(directory, "*.txt")).local_parallelism(1)
        m = dag.new_vertex("slow", P.map(lambda line: __import__("time").sleep(0.0005) or line))
        out = dag.new_vertex("out", sinks.noop())
        dag.edge(Edge.between(s, m)).edge(Edge.between(m, out))
        return dag
    """
)


def run(tmp_path: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    (tmp_path / "mydag.py").write_text(MODULE)
    return subprocess.run(
        [sys.executable, "-m", "slipstream", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def output(tmp_path: Path) -> list[int]:
    return sorted(
        int(x)
        for p in (tmp_path / "out").iterdir()
        if not p.name.startswith((".", "_"))
        for x in p.read_text().split()
    )


def test_run_module_function(tmp_path: Path) -> None:
    r = run(tmp_path, "run", "mydag:build")
    assert r.returncode == 0, r.stderr
    assert "completed" in r.stderr
    assert output(tmp_path) == [x * x for x in range(1000)]


def test_version_and_module_entry_point(tmp_path: Path) -> None:
    r = run(tmp_path, "--version")
    assert r.returncode == 0 and r.stdout.startswith("slipstream 0.")
    r2 = subprocess.run(
        [sys.executable, "-m", "slipstream.cli", "--version"], capture_output=True, text=True, timeout=60
    )
    assert r2.stdout == r.stdout


def test_file_target_with_arguments_after_dashes_and_arg(tmp_path: Path) -> None:
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "pipeline.py").write_text(MODULE)
    r = run(tmp_path, "run", "jobs/pipeline.py:build", "--arg", "square=false", "--", "20", "--scale", "3")
    assert r.returncode == 0, r.stderr
    assert output(tmp_path) == [3 * x for x in range(20)]


def test_arguments_that_do_not_match_are_a_clear_error(tmp_path: Path) -> None:
    r = run(tmp_path, "run", "mydag:build", "--", "--nope", "1")
    assert r.returncode == 2
    assert "do not match" in r.stderr and "nope" in r.stderr
    assert "build(n: int = 1000, scale: int = 1" in r.stderr  # shows the signature
    r = run(tmp_path, "run", "mydag:build", "--", "n=many")
    assert r.returncode == 2 and "argument 'n': expected int, got 'many'" in r.stderr
    r = run(tmp_path, "run", "mydag:build", "--arg", "oops")
    assert r.returncode == 2 and "KEY=VALUE" in r.stderr


def test_bad_spec_is_a_clear_error(tmp_path: Path) -> None:
    r = run(tmp_path, "run", "mydag")
    assert r.returncode != 0 and "MODULE:FUNCTION" in r.stderr
    r = run(tmp_path, "run", "nosuchmodule:build")
    assert r.returncode != 0 and "cannot import module 'nosuchmodule'" in r.stderr
    r = run(tmp_path, "run", "nosuch/file.py:build")
    assert r.returncode != 0 and "no such file" in r.stderr


def test_local_file_named_like_a_standard_module_does_not_shadow_it(tmp_path: Path) -> None:
    (tmp_path / "statistics.py").write_text("raise SystemExit('the local statistics.py ran')\n")
    (tmp_path / "stats_dag.py").write_text(
        MODULE + "\nimport statistics\n\ndef stat_build():\n    statistics.mean([1, 2])\n    return build(10)\n"
    )
    r = run(tmp_path, "run", "stats_dag:stat_build")
    assert r.returncode == 0, r.stderr
    assert output(tmp_path) == [x * x for x in range(10)]


def test_plain_progress_lines_without_a_terminal(tmp_path: Path) -> None:
    # 1 s of items (was 2 s: the suite's time) and a block every 0.2 s
    r = run(tmp_path, "run", "mydag:slow", "--interval", "0.2", "--", "--rate", "300", "--n", "300")
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    heads = [i for i, ln in enumerate(lines) if ln.startswith("[")]
    assert len(heads) >= 2 and lines[heads[0]].startswith("[running") and "slow" in lines[heads[0]]
    # the last block: one aligned line per vertex, final totals
    gen, out = lines[heads[-1] + 1], lines[heads[-1] + 2]
    assert gen.split() == ["gen", "out", "300", "0/s"] or gen.split()[:3] == ["gen", "out", "300"]
    assert out.split()[:3] == ["out", "in", "300"]
    assert "\x1b[" not in r.stderr  # no terminal control codes in logs


def test_a_source_feeding_two_branches_says_its_out_count_sums_both_edges(tmp_path: Path) -> None:
    """items_out counts an item once per outbound edge: the source of a 30,000-item job
    with two branches handed out 60,000 items, and the progress says so (issue 21: it
    showed a bare figure larger than the input, with nothing to explain it)."""
    (tmp_path / "branches.py").write_text(
        textwrap.dedent(
            """
            import slipstream as ss
            from slipstream import sinks, sources

            def build():
                p = ss.Pipeline()
                src = p.read_from(sources.items(range(30_000))).set_name("numbers")
                src.map(lambda x: x * 2).write_to(sinks.list_sink("doubled"))
                src.filter(lambda x: x % 3 == 0).write_to(sinks.list_sink("thirds"))
                return p
            """
        )
    )
    r = run(tmp_path, "run", "branches:build")
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    last = max(i for i, ln in enumerate(lines) if ln.startswith("[completed"))
    assert lines[last + 1 : last + 6] == [
        "  numbers  out  60.0k      0/s (sum of 2 edges)  100% ETA 0:00",
        "  map      in  30.0k      0/s  out  30.0k      0/s",
        "  filter   in  30.0k      0/s  out  10.0k      0/s",
        "  sink     in  30.0k      0/s",
        "  sink-2   in  10.0k      0/s",
    ]


def test_the_terminal_table_says_it_too() -> None:
    import io

    from rich.console import Console

    from slipstream.dashboard.console import Progress

    vertex = {"name": "numbers", "parallelism": 1, "in_rate": 0.0, "out_rate": 0.0,
              "items_in": 0, "items_out": 60_000, "out_edges": 2, "watermark_lag_ms": None,
              "queue_fill": None, "late_items_dropped": 0}
    doc = {"name": "build", "status": "completed", "elapsed_s": 0.1, "vertices": [vertex]}
    buf = io.StringIO()
    Console(file=buf, width=120).print(Progress(None, stream=io.StringIO()).table(doc))
    row = [ln for ln in buf.getvalue().splitlines() if ln.startswith("numbers")]
    assert row[0].split() == ["numbers", "1", "0", "0", "60.0k", "(sum", "of", "2", "edges)",
                              "-", "-", "0"]


def test_members_in_processes_get_a_row_each_and_a_total() -> None:
    """A job whose members run in processes: the plain block and the terminal table show
    per member its pid, state, items, CPU and resident set, and the total (as the
    dashboard's Members table)."""
    import io

    from rich.console import Console

    from slipstream.dashboard.console import Progress
    from slipstream.dashboard.stats import members_total

    rows = [
        {"member": 0, "pid": 4242, "state": "running", "items_in": 6400, "items_out": 6400,
         "cpu_ms": 1234, "cpu_share": 0.95, "rss_kb": 46080, "peak_rss_kb": 51300},
        {"member": 1, "pid": 4243, "state": "died", "items_in": 6390, "items_out": 390,
         "cpu_ms": 1180, "cpu_share": None, "rss_kb": 45000, "peak_rss_kb": 52000},
    ]
    vertex = {"name": "numbers", "parallelism": 2, "in_rate": 0.0, "out_rate": 0.0,
              "items_in": 0, "items_out": 12_790, "out_edges": 1, "watermark_lag_ms": None,
              "queue_fill": None, "late_items_dropped": 0}
    doc = {"name": "build", "status": "running", "elapsed_s": 3.0, "vertices": [vertex],
           "members": rows, "members_total": members_total(rows)}
    progress = Progress(None, stream=io.StringIO())
    assert progress.line(doc).splitlines()[2:] == [
        "  member 0  pid 4242  running      in  6.4k  out 6.4k  cpu 1.2s 95%  rss 45.0MB peak  50.1MB",
        "  member 1  pid 4243  died         in  6.4k  out  390  cpu 1.2s   -  rss 43.9MB peak  50.8MB",
        "  total               2 processes  in 12.8k  out 6.8k  cpu 2.4s 95%  rss 88.9MB peak 100.9MB",
    ]
    buf = io.StringIO()
    Console(file=buf, width=120).print(progress.table(doc))
    table = [ln.split() for ln in buf.getvalue().splitlines()]
    at = table.index(["members"])
    assert table[at + 1 :] == [
        ["member", "pid", "state", "items", "in", "items", "out", "CPU", "CPU", "now", "RSS",
         "peak", "RSS"],
        ["member", "0", "4242", "running", "6.4k", "6.4k", "1.2s", "95%", "45.0MB", "50.1MB"],
        ["member", "1", "4243", "died", "6.4k", "390", "1.2s", "-", "43.9MB", "50.8MB"],
        ["total", "2", "processes", "12.8k", "6.8k", "2.4s", "95%", "88.9MB", "100.9MB"],
    ]
    one = {k: v for k, v in doc.items() if k not in ("members", "members_total")}
    assert "member" not in progress.line(one)  # a job in one process: no such rows


def test_progress_bar_with_eta_for_files(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    for i in range(2):
        (tmp_path / "data" / f"{i}.txt").write_text("".join(f"line {n}\n" for n in range(1500)))
    r = run(tmp_path, "run", "mydag:files", "--interval", "0.2")
    assert r.returncode == 0, r.stderr
    reads = [ln for ln in r.stderr.splitlines() if ln.startswith("  read")]
    assert "% ETA" in reads[0] and reads[-1].endswith("100% ETA 0:00")


def test_table_refreshes_in_place_on_a_terminal(tmp_path: Path) -> None:
    (tmp_path / "mydag.py").write_text(MODULE)
    master, slave = pty.openpty()
    env = dict(os.environ, COLUMNS="120", LINES="40", TERM="xterm")
    proc = subprocess.Popen(
        [sys.executable, "-m", "slipstream", "run", "mydag:slow", "--interval", "0.2", "--", "--n", "600"],
        cwd=tmp_path, stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True,
    )
    os.close(slave)
    out = b""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 1.0)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
        elif proc.poll() is not None:
            break
    assert proc.wait(60) == 0, out.decode(errors="replace")
    os.close(master)
    text = out.decode(errors="replace")
    assert "vertex" in text and "out/s" in text and "wm lag" in text
    assert "\x1b[2K" in text or "\x1b[1A" in text or "\x1b[A" in text  # redrawn in place
    assert "completed" in text


def test_resume_continues_from_the_committed_snapshot(tmp_path: Path) -> None:
    (tmp_path / "mydag.py").write_text(MODULE)
    store = tmp_path / "snaps"
    args = [sys.executable, "-m", "slipstream", "run", "mydag:slow", "--snapshot-store", str(store),
            "--snapshot-interval-ms", "200", "--quiet", "--resume", "--", "--rate", "400", "--n", "1200"]
    first = subprocess.Popen(args, cwd=tmp_path, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (store / "MANIFEST.json").exists():
        assert time.monotonic() < deadline and first.poll() is None, "no snapshot committed"
        time.sleep(0.05)
    first.send_signal(signal.SIGINT)
    _, err1 = first.communicate(timeout=60)
    assert first.returncode == 130, err1
    assert "starting from the beginning" in err1
    second = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert second.returncode == 0, second.stderr
    assert "resuming from snapshot" in second.stderr
    # exactly-once file sink: each item once across the interrupted and the resumed run
    assert output(tmp_path) == list(range(1200))


SCRIPT = textwrap.dedent(
    """
    import operator

    import slipstream as ss
    from slipstream import JobConfig, ProcessingGuarantee, sinks, sources
    from slipstream.aggregate import summing
    from slipstream.window import tumbling_window_def

    def event(seq):
        return (seq % 5, seq * 3, seq % 7)

    def line(r):
        return f"{r.start} {r.key} {r.value}"

    def build(n: int = 4000, rate: float = 2000.0):
        p = ss.Pipeline()
        p.read_from(sources.generator(event, rate, max_items=n)).with_timestamps(
            operator.itemgetter(1), 0
        ).group_by(operator.itemgetter(0)).window(tumbling_window_def(300)).aggregate(
            summing(operator.itemgetter(2))
        ).write_to(sinks.write_files("out", line))
        return p

    if __name__ == "__main__":
        config = JobConfig(
            name="windows",
            processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE,
            snapshot_interval_ms=200,
            snapshot_store="snaps",
        )
        ss.local().new_job(build(), config).join()
    """
)


def test_a_store_written_by_a_script_resumes_with_the_cli(tmp_path: Path) -> None:
    """A windowed pipeline run by a script (ss.local().new_job) and killed resumes with
    `slipstream run --resume` on its store, exactly once (issue 21, item 8: on main the
    script compiled the window to one stage and the CLI to two, so the resume failed
    with a SnapshotError naming the vertices 'window' and 'with_timestamps')."""
    (tmp_path / "windows.py").write_text(SCRIPT)
    script = subprocess.Popen(
        [sys.executable, "windows.py"], cwd=tmp_path, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 60
    while not (tmp_path / "snaps" / "MANIFEST.json").exists():
        assert time.monotonic() < deadline and script.poll() is None, "no snapshot committed"
        time.sleep(0.02)
    script.kill()  # SIGKILL: no final snapshot, no clean-up
    script.communicate(timeout=60)
    r = subprocess.run(
        [sys.executable, "-m", "slipstream", "run", "windows.py:build", "--name", "windows",
         "--snapshot-store", "snaps", "--resume", "--snapshot-interval-ms", "200", "--quiet"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert "resuming from snapshot" in r.stderr
    sums: dict[tuple[int, int], int] = {}
    for seq in range(4000):
        k, t, v = seq % 5, seq * 3, seq % 7
        sums[(t - t % 300, k)] = sums.get((t - t % 300, k), 0) + v
    got = sorted(
        line
        for p in (tmp_path / "out").iterdir()
        if not p.name.startswith((".", "_"))
        for line in p.read_text().splitlines()
    )
    assert got == sorted(f"{s} {k} {v}" for (s, k), v in sums.items())


def test_resume_needs_a_store(tmp_path: Path) -> None:
    r = run(tmp_path, "run", "mydag:build", "--resume")
    assert r.returncode == 2 and "--snapshot-store" in r.stderr


def test_dashboard_flag_prints_the_address(tmp_path: Path) -> None:
    r = run(tmp_path, "run", "mydag:build", "--dashboard", "0", "--quiet")
    assert r.returncode == 0, r.stderr
    assert "dashboard: http://127.0.0.1:" in r.stderr


def test_dot(tmp_path: Path) -> None:
    r = run(tmp_path, "dot", "mydag:build")
    assert r.returncode == 0 and '"numbers" -> "square"' in r.stdout


def test_dot_svg_draws_the_picture(tmp_path: Path) -> None:
    r = run(tmp_path, "dot", "mydag.py:build", "--svg", "dag.svg")
    assert r.returncode == 0, r.stderr
    root = ET.parse(tmp_path / "dag.svg").getroot()
    texts = [" ".join(t.itertext()) for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert {"numbers", "square", "out"} <= set(texts)
    assert "partitioned by lambda x: x % 3" in texts and "unicast" in texts  # the key's source


def test_run_a_function_returning_a_pipeline(tmp_path: Path) -> None:
    (tmp_path / "mypipe.py").write_text(
        textwrap.dedent(
            """
            import slipstream as ss
            from slipstream import sinks, sources

            def build():
                p = ss.Pipeline()
                p.read_from(sources.items(range(10))).map(lambda x: x + 1).write_to(
                    sinks.write_files("out"))
                return p
            """
        )
    )
    r = run(tmp_path, "run", "mypipe:build")
    assert r.returncode == 0, r.stderr
    assert output(tmp_path) == list(range(1, 11))


def test_the_demo_dag_make_demo_points_to_loads(tmp_path: Path) -> None:
    # `make demo` tells the user to run examples/trade_monitor.py:watch_dag with --dashboard
    example = Path(__file__).resolve().parent.parent / "examples" / "trade_monitor.py"
    r = run(tmp_path, "dot", f"{example}:watch_dag", "--svg", "-", "--", "--rate", "100")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("<svg") and 'data-vertex="trades"' in r.stdout


LATE_MODULE = textwrap.dedent(
    """
    import slipstream as ss
    from slipstream import sinks, sources
    from slipstream.aggregate import counting
    from slipstream.window import tumbling_window_def

    def ticks(n: int = 3000):
        p = ss.Pipeline()
        (
            p.read_from(sources.generator(lambda i: (i % 3, 10 * i + (i * 7919) % 1500), None, max_items=n))
            .with_timestamps(lambda e: e[1], allowed_lag_ms=100)
            .group_by(lambda e: e[0])
            .window(tumbling_window_def(1000))
            .aggregate(counting())
            .write_to(sinks.noop())
        )
        return p
    """
)


def test_the_summary_says_how_many_late_items_were_dropped(tmp_path: Path) -> None:
    """Issue 21, item 1: on main the CLI said only "completed" after dropping items."""
    (tmp_path / "late.py").write_text(LATE_MODULE)
    r = subprocess.run(
        [sys.executable, "-m", "slipstream", "run", "late:ticks", "--quiet", "--threads", "1"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    final = [x for x in lines if " late items in all " in x]
    assert len(final) == 1 and final[0].startswith("job 'ticks' dropped ")
    late = int(final[0].split()[3])
    assert lines[-1].startswith("job 'ticks' completed in ")
    assert lines[-1].endswith(f" s, dropping {late} late items")


FAILING_MODULE = textwrap.dedent(
    """
    from slipstream import DAG, Edge
    from slipstream import processors as P, sinks, sources

    def invert(x):
        return 1 / x

    def boom():
        dag = DAG()
        s = dag.new_vertex("numbers", sources.items([1, 2, 0, 4])).local_parallelism(1)
        m = dag.new_vertex("invert", P.map(invert)).local_parallelism(1)
        out = dag.new_vertex("out", sinks.noop())
        dag.edge(Edge.between(s, m)).edge(Edge.between(m, out))
        return dag
    """
)


def test_a_failing_job_prints_the_processor_traceback_once(tmp_path: Path) -> None:
    """Issue 21, item 3: on main the error line carried the whole traceback after a
    '--- processor traceback ---' line, starting at the engine's worker loop."""
    (tmp_path / "failing.py").write_text(FAILING_MODULE)
    r = subprocess.run(
        [sys.executable, "-m", "slipstream", "run", "failing:boom", "--quiet"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 1
    lines = r.stderr.splitlines()
    assert lines[0] == "Traceback (most recent call last):"
    files = [x.split('"')[1].rsplit("/", 1)[-1] for x in lines if x.startswith('  File "')]
    assert files == ["basic.py", "failing.py"]  # the processor's frame, then the user's
    assert lines[-2] == "ZeroDivisionError: division by zero"
    assert lines[-1] == (
        "error: job 'boom' failed: vertex 'invert', processor 0, on item 0: ZeroDivisionError: "
        "division by zero"
    )
    assert r.stderr.count("Traceback") == 1


def test_processes_auto_runs_a_member_per_usable_core() -> None:
    """--processes auto: the local engine gets a member process per core this process
    may run on, as ``ss.local(processes="auto")`` (the engine only: no job runs)."""
    import types

    from slipstream import cli

    a = cli.parser().parse_args(["run", "mydag:build", "--processes", "auto"])
    engine, server = cli._engine(a, types.ModuleType("__main__"))
    try:
        assert server is None
        assert engine.process_count == engine.member_count == len(os.sched_getaffinity(0))
    finally:
        engine.shutdown()


def test_run_with_member_processes(tmp_path: Path) -> None:
    """--processes 2: the members run in two processes (the target's module travels by
    value); the files written are those of one process, also with snapshots."""
    r = run(tmp_path, "run", "mydag:build", "--processes", "2")
    assert r.returncode == 0, r.stderr
    assert output(tmp_path) == [x * x for x in range(1000)]
    shutil.rmtree(tmp_path / "out")
    r = run(tmp_path, "run", "mydag:build", "--processes", "2", "--guarantee", "exactly-once")
    assert r.returncode == 0, r.stderr
    assert output(tmp_path) == [x * x for x in range(1000)]
    # the last block has a line per member and their total (on main: none): 1,000 items
    # into 'square' and 'out', 1,000 out of 'numbers' and 'square'
    lines = r.stderr.splitlines()
    last = max(i for i, ln in enumerate(lines) if ln.startswith("[completed"))
    rows = [ln.split() for ln in lines[last + 4 : last + 7]]
    assert [r[:2] + r[4:5] for r in rows[:2]] == [["member", "0", "done"], ["member", "1", "done"]]
    assert [r[2] for r in rows[:2]] == ["pid", "pid"]
    assert rows[2][:8] == ["total", "2", "processes", "in", "2.0k", "out", "2.0k", "cpu"]
    r = run(tmp_path, "run", "mydag:build", "--processes", "none")
    assert r.returncode != 0
    assert """--processes takes a number >= 1 or "auto", got 'none'""" in r.stderr
