"""A job still running when the interpreter exits is not lost silently (issue 21, item
2): on main a script that forgot ``job.join()`` exited 0 at once, printed nothing and
left only a hidden empty ``.part-...tmp`` file. Now a batch job is waited for (its output
is complete) and a streaming job is cancelled, each with a WARNING that names the job and
``join()``; part files a sink leaves unpublished are named."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

BATCH = textwrap.dedent(
    """
    import builtins, logging, sys, threading
    import slipstream as ss
    from slipstream import sinks, sources

    # the map waits until the engine's exit warning is logged: the job is surely still
    # running when the script ends
    builtins._released = threading.Event()

    class Release(logging.Filter):
        def filter(self, record):
            if "still running" in record.getMessage():
                builtins._released.set()
            return True

    logging.getLogger("slipstream.job").addFilter(Release())

    def held(line):
        __import__("builtins")._released.wait()
        return line.upper()

    p = ss.Pipeline()
    p.read_from(sources.read_files(sys.argv[1])).map(held).write_to(sinks.write_files(sys.argv[2]))
    ss.local().new_job(p, ss.JobConfig(name="forgot"))
    """
)

STREAM = textwrap.dedent(
    """
    import os, sys, time
    import slipstream as ss
    from slipstream import sinks, sources

    out, store = sys.argv[1], sys.argv[2]
    p = ss.Pipeline()
    p.read_from(sources.generator(lambda i: i, 1000)).write_to(sinks.write_files(out))
    config = ss.JobConfig(
        name="ticker",
        processing_guarantee=ss.ProcessingGuarantee.EXACTLY_ONCE,
        snapshot_store=store,
        snapshot_interval_ms=600_000,
    )
    ss.local().new_job(p, config)
    # the script ends once the sink has opened its part file
    while not (os.path.isdir(out) and any(n.startswith(".part") for n in os.listdir(out))):
        time.sleep(0.01)
    """
)


def run_script(tmp_path: Path, text: str, *args: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "script.py"
    script.write_text(text)
    return subprocess.run(
        [sys.executable, str(script), *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_batch_job_is_finished_at_exit_and_reported(tmp_path: Path) -> None:
    src, out = tmp_path / "in", tmp_path / "out"
    src.mkdir()
    (src / "a.txt").write_text("".join(f"line {i}\n" for i in range(500)))
    r = run_script(tmp_path, BATCH, str(src), str(out))
    assert r.returncode == 0
    assert r.stderr.splitlines() == [
        "job 'forgot' was still running when the script ended: it never called job.join(). "
        "Waiting for it to finish, as it reads bounded input (Ctrl-C cancels it). Call "
        "job.join() after new_job() to wait for a job and to see whether it failed.",
        "job 'forgot' completed after the script ended",
    ]
    assert sorted(os.listdir(out)) == ["part-00000"]
    assert (out / "part-00000").read_text() == "".join(f"LINE {i}\n" for i in range(500))


def test_a_streaming_job_is_cancelled_at_exit_naming_its_part_files(tmp_path: Path) -> None:
    out, store = tmp_path / "out", tmp_path / "store"
    r = run_script(tmp_path, STREAM, str(out), str(store))
    assert r.returncode == 0
    hidden = sorted(str(out / n) for n in os.listdir(out) if n.startswith("."))
    assert len(hidden) == 1
    assert r.stderr.splitlines() == [
        "job 'ticker' was still running when the script ended: it never called job.join(). "
        "Cancelling it, as it reads unbounded input and would never end. Call job.join() to "
        "run a streaming job until it ends, job.cancel() to stop it.",
        f"job 'ticker' left unpublished part files (hidden: file sources skip them): "
        f"{hidden[0]}. Resuming the job from its snapshot store (JobConfig(resume=True)) "
        "publishes what its last snapshot covers; without a snapshot they hold nothing "
        "committed.",
    ]
