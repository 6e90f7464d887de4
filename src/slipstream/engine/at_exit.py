"""Jobs still running when the interpreter exits are not lost silently.

The embedded engine runs jobs on daemon threads, so a script that starts a job and never
calls ``job.join()`` used to end at once, exit 0, print nothing and leave a hidden empty
``.part-...tmp`` file where its output should be. An ``atexit`` hook (registered by the
first engine) now settles every job still running at exit, after the script's own code
and its non-daemon threads are done:

* a **batch** job (every source bounded, ``Job.bounded``) is waited for, as Python waits
  for non-daemon threads and ``concurrent.futures`` for submitted work: it reads finite
  input, so its output is completed instead of lost. A WARNING says so and that the
  script should call ``join()``; a failure is logged as an ERROR. Ctrl-C while waiting
  cancels it.
* a **streaming** job would never end: it is cancelled (its processors close, its sinks
  release what they hold), with a WARNING that says so.

Either way, part files that a file sink leaves unpublished (under snapshots, for a
``resume`` to publish) are named. Suspended jobs are left alone, and the exit status
stays what the script returns (a failure at exit is logged, not turned into a status).
"""

from __future__ import annotations

import atexit
import logging
import threading
import weakref
from typing import TYPE_CHECKING

from slipstream.core.config import JobStatus
from slipstream.core.errors import JobCancelledError, JobFailedError
from slipstream.engine.ended import uncommitted_files as tasklets_uncommitted_files

if TYPE_CHECKING:
    from slipstream.engine.job import Job
    from slipstream.engine.local import LocalEngine

__all__ = ["settle_at_exit", "watch"]

log = logging.getLogger("slipstream.job")

_engines: weakref.WeakSet[LocalEngine] = weakref.WeakSet()
_lock = threading.Lock()
_registered = False

#: how long a cancelled streaming job may take to stop, beyond the engine's stop grace
_STOP_SLACK_S = 10.0


def watch(engine: LocalEngine) -> None:
    """Settle ``engine``'s running jobs at interpreter exit (registers the hook once)."""
    global _registered
    with _lock:
        _engines.add(engine)
        if not _registered:
            atexit.register(settle_at_exit)
            _registered = True


def settle_at_exit() -> None:
    """The ``atexit`` hook: wait for the batch jobs still running, cancel the streaming
    ones, and say so (see the module docstring)."""
    jobs = [
        job
        for engine in list(_engines)
        for job in engine.jobs
        if not job.status.is_terminal and job.status is not JobStatus.SUSPENDED
    ]
    for job in jobs:
        try:
            _settle(job)
        except Exception:  # noqa: BLE001 - one job's trouble does not hide the others'
            log.exception("job %r: settling it at interpreter exit failed", job.name)


def _settle(job: Job) -> None:
    if job.bounded:
        log.warning(
            "job %r was still running when the script ended: it never called job.join(). "
            "Waiting for it to finish, as it reads bounded input (Ctrl-C cancels it). Call "
            "job.join() after new_job() to wait for a job and to see whether it failed.",
            job.name,
        )
        try:
            job.join()
        except KeyboardInterrupt:
            log.warning("job %r: cancelled (Ctrl-C at exit)", job.name)
            _cancel(job)
        except JobCancelledError:
            pass
        except JobFailedError as e:
            log.error("%s", e)
        else:
            log.warning("job %r completed after the script ended", job.name)
    else:
        log.warning(
            "job %r was still running when the script ended: it never called job.join(). "
            "Cancelling it, as it reads unbounded input and would never end. Call "
            "job.join() to run a streaming job until it ends, job.cancel() to stop it.",
            job.name,
        )
        _cancel(job)
    left = uncommitted_files(job)
    if left:
        shown = ", ".join(left[:5]) + (f" and {len(left) - 5} more" if len(left) > 5 else "")
        log.warning(
            "job %r left unpublished part files (hidden: file sources skip them): %s. "
            "Resuming the job from its snapshot store (JobConfig(resume=True)) publishes "
            "what its last snapshot covers; without a snapshot they hold nothing committed.",
            job.name,
            shown,
        )


def _cancel(job: Job) -> None:
    timeout = job.engine.stop_grace_ms / 1000.0 + _STOP_SLACK_S
    job.cancel()
    try:
        job.join(timeout)
    except (JobCancelledError, JobFailedError):
        pass
    except TimeoutError:
        log.warning("job %r did not stop within %.0f s of its cancel()", job.name, timeout)


def uncommitted_files(job: Job) -> list[str]:
    """The unpublished part files the file sinks of ``job``'s last execution leave."""
    execution = job._execution
    ended = getattr(execution, "ended", None)
    if ended is not None:  # taken when it ended (engine/ended.py)
        return list(ended.uncommitted_files)
    return tasklets_uncommitted_files(execution.tasklets if execution is not None else [])
