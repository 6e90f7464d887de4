"""Which job a snapshot store belongs to, and how far it got: the checks a resume makes.

A store directory can be put back to an earlier state without slipstream noticing from
the inside: restored from a backup, or its newest snapshot file removed together with
``MANIFEST.json`` (the manifest is then rebuilt from the older files). A resume would
then continue from an older snapshot than one whose output the sinks already published,
and publish that output again. So every commit is also recorded **outside** the store:

* the **generation** of a store is the id of its newest committed snapshot. Ids only
  grow in a store: a new submission continues after the highest id the store or its
  generation file has seen, also after a fresh start;
* the **generation file** ``<key dir>/<digest of the store's real path>.generation``
  (next to the store's default signing key, in the same private ``0700`` directory,
  owned by this user; see :mod:`~slipstream.state.signing`) records the job,
  its execution, the generation and whether that execution completed. It is written
  after the manifest and before any sink commits the snapshot's output, so a sink never
  published beyond it. Restoring the store directory from a backup, or removing files
  in it, leaves it alone.

A resume from an older snapshot than the generation file records (or a fresh start
where an unfinished execution had committed snapshots: the store directory was lost)
raises :class:`~slipstream.core.errors.SnapshotStoreRolledBackError`, unless the job
says ``JobConfig(allow_rollback=True)`` (a warning says what is published again). A
store without a generation file (written by an older slipstream, or moved from another
machine or path) resumes as before; its next commit writes one. What this cannot see:
the generation file rolled back with the store (a whole machine restored), or a store
moved to another path.

A store also names its job (``owner.job``, in the manifest) and every snapshot carries
the shape of its DAG (:func:`dag_shape`): ``resume=True`` on another job's unfinished
store, and a restore into another DAG, fail naming both sides unless
``JobConfig(allow_job_change=True)``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from slipstream.core.errors import (
    SnapshotError,
    SnapshotStoreInUseError,
    SnapshotStoreRolledBackError,
)
from slipstream.core.files import atomic_write
from slipstream.state.signing import KEY_DIR_ENV, ensure_key_dir, store_file_path

if TYPE_CHECKING:
    from slipstream.core.dag import DAG
    from slipstream.state.store import SnapshotData

log = logging.getLogger("slipstream.snapshot")

GENERATION_SUFFIX = ".generation"

#: a DAG's shape: its vertex names and its edges ``(source, ordinal, dest, ordinal)``
DagShape = tuple[tuple[str, ...], tuple[tuple[str, int, str, int], ...]]

_unrecorded: set[str] = set()  # stores whose generation file cannot be written (warned)


# -- the generation file ------------------------------------------------------------------
@dataclass(frozen=True)
class Generation:
    """What the generation file of a store records."""

    path: str
    job: str
    execution: str
    generation: int
    completed: bool


def generation_path(store_dir: str) -> str:
    """Where the generation file of the store in ``store_dir`` lives."""
    return store_file_path(store_dir, GENERATION_SUFFIX)


def read_generation(store_dir: str) -> Generation | None:
    """The store's generation file, ``None`` if there is none. One that another user owns,
    that others may write, or that cannot be parsed is a :class:`SnapshotError`."""
    path = generation_path(store_dir)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise SnapshotError(f"snapshot generation file {path} cannot be read: {e}") from e
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        raw = fh.read()
    if st.st_uid != os.getuid() or stat.S_IMODE(st.st_mode) & 0o022:
        raise SnapshotError(
            f"snapshot generation file {path} is not private to this user (uid {st.st_uid}, "
            f"mode {stat.S_IMODE(st.st_mode):o}); remove it or run: chmod 600 {path}"
        )
    try:
        body = json.loads(raw)
        return Generation(
            path,
            str(body["job"]),
            str(body["execution"]),
            int(body["generation"]),
            bool(body["completed"]),
        )
    except (ValueError, KeyError, TypeError) as e:
        raise SnapshotError(
            f"snapshot generation file {path} (of the snapshot store {store_dir}) is damaged "
            f"({e}); remove it to resume without the check that the store was not rolled back"
        ) from e


def record_generation(
    store_dir: str, job: str, execution: str, generation: int, completed: bool = False
) -> None:
    """Record that snapshot ``generation`` of the store in ``store_dir`` committed (durably:
    temp file, fsync, rename). A key directory that cannot be created only costs the
    check (a warning, once per store); one that is not private is an error, as for keys;
    a failed write raises ``OSError`` (the snapshot then counts as failed)."""
    try:
        ensure_key_dir()
    except OSError as e:
        if store_dir not in _unrecorded:
            _unrecorded.add(store_dir)
            log.warning(
                "snapshot store %s: its generation cannot be recorded (%s), so a rollback "
                "of the store (a backup restored) will not be detected; set %s to a "
                "directory this user can create",
                store_dir,
                e,
                KEY_DIR_ENV,
            )
        return
    body = {
        "store": os.path.realpath(store_dir),
        "job": job,
        "execution": execution,
        "generation": generation,
        "completed": completed,
    }
    atomic_write(generation_path(store_dir), json.dumps(body, sort_keys=True).encode("utf-8"))


def recorded_generation(store_dir: str) -> int:
    """The generation recorded for the store (0 if none), for a fresh start: its snapshot
    ids continue after it. A damaged generation file only costs a warning here."""
    try:
        gen = read_generation(store_dir)
    except SnapshotError as e:
        log.warning("%s", e)
        return 0
    return gen.generation if gen is not None else 0


def check_not_rolled_back(
    store_dir: str,
    job_name: str,
    restoring: tuple[int, str] | None,
    allow_rollback: bool,
) -> int:
    """Refuse to resume the store in ``store_dir`` from snapshot ``restoring`` (its id and
    job name; ``None``: a resuming job would start from scratch) when a newer snapshot of
    the same job was committed in it. With ``allow_rollback`` a warning says what is
    published again. Returns the store's recorded generation (0 without a generation
    file): new snapshot ids continue after it."""
    gen = read_generation(store_dir)
    if gen is None:
        return 0
    if restoring is None:
        if gen.completed:
            return gen.generation  # a fresh start after a completed run: nothing to replay
        older = 0
        what = "it holds no unfinished snapshot to resume from"
        consequence = "starting from scratch would publish all of it again"
        action = "start from scratch"
    else:
        older, restoring_job = restoring
        if restoring_job != gen.job or older >= gen.generation:
            return gen.generation  # up to date, or another job's snapshot (restore_from=)
        what = f"the job would resume from snapshot {older}"
        consequence = f"resuming from snapshot {older} would publish what came after it again"
        action = f"resume from snapshot {older}"
    if allow_rollback:
        log.warning(
            "job %s: snapshot store %s was rolled back: snapshot %d of job %r was committed "
            "in it, but %s; allow_rollback=True: the output its sinks published after "
            "snapshot %d is published again",
            job_name,
            store_dir,
            gen.generation,
            gen.job,
            what,
            older,
        )
        return gen.generation
    raise SnapshotStoreRolledBackError(
        f"snapshot store {store_dir} was rolled back: snapshot {gen.generation} of job "
        f"{gen.job!r} was committed in it (recorded outside the store in {gen.path}), but "
        f"{what}. The sinks may have published the output of every snapshot up to "
        f"{gen.generation}: {consequence}. (The store directory was restored from a backup "
        f"or lost, or its newest snapshot files and MANIFEST.json were removed.) Put the "
        f"newest snapshots back; or pass JobConfig(allow_rollback=True) to {action} and "
        f"accept that replay (duplicates downstream); or start from scratch with another "
        f"snapshot_store."
    )


# -- the job and its DAG ------------------------------------------------------------------
def check_same_job(store_dir: str, store_job: str, job_name: str, allow_job_change: bool) -> None:
    """``resume=True`` continues a job from its own store: refuse the unfinished
    snapshots of a job of another name unless ``allow_job_change``."""
    if not store_job or store_job == job_name:
        return
    if allow_job_change:
        log.warning(
            "job %s: resuming from the snapshots of job %r in %s (allow_job_change=True)",
            job_name,
            store_job,
            store_dir,
        )
        return
    raise SnapshotStoreInUseError(
        f"snapshot store {store_dir} holds the unfinished snapshots of job {store_job!r}, "
        f"not of job {job_name!r}: resume=True continues a job from its own store only. "
        f"Give job {job_name!r} its own snapshot_store; or, to continue job "
        f"{store_job!r}'s work under the name {job_name!r}, pass "
        f"JobConfig(allow_job_change=True)."
    )


def dag_shape(dag: DAG) -> DagShape:
    """What makes two DAGs "the same" for a restore: the vertex names and the edges
    between them with their ordinals. Parallelism, processors, edge routing and queue
    sizes may change (a restore routes state by vertex name and key)."""
    vertices = tuple(sorted(v.name for v in dag.vertices))
    edges = tuple(
        sorted(
            (e.source.name, e.source_ordinal, e.dest.name, e.dest_ordinal)  # type: ignore[union-attr]
            for e in dag.edges
        )
    )
    return vertices, edges


def dag_fingerprint(shape: DagShape) -> str:
    """A stable hash of a DAG's shape (recorded in the manifest and snapshot headers)."""
    return hashlib.sha256(json.dumps(shape).encode("utf-8")).hexdigest()[:16]


@dataclass(frozen=True)
class ShapeDifference:
    """How DAG shape ``new`` differs from ``old`` (:func:`shape_difference`)."""

    #: vertex names only in ``old`` / only in ``new``, sorted
    only_old: list[str]
    only_new: list[str]
    #: the vertices in both whose edges differ, sorted
    rewired: list[str]
    #: the edges only in ``old`` / only in ``new``
    edges_only_old: set[tuple[Any, ...]]
    edges_only_new: set[tuple[Any, ...]]


def shape_difference(old: Any, new: Any) -> ShapeDifference | None:
    """How DAG shape ``new`` differs from ``old`` (each a :data:`DagShape`, or its JSON
    form: lists for tuples); ``None`` when they are the same DAG. The restore check and
    ``ss.state.transform``'s check of its destination store both name the difference."""
    old_v, old_e = set(old[0]), {tuple(e) for e in old[1]}
    new_v, new_e = set(new[0]), {tuple(e) for e in new[1]}
    if old_v == new_v and old_e == new_e:
        return None
    only_old, only_new = sorted(old_v - new_v), sorted(new_v - old_v)
    rewired = sorted(
        {n for e in old_e ^ new_e for n in (e[0], e[2])} - set(only_old) - set(only_new)
    )
    return ShapeDifference(only_old, only_new, rewired, old_e - new_e, new_e - old_e)


def _edge_text(e: tuple[str, int, str, int]) -> str:
    return f"{e[0]}[{e[1]}]->{e[2]}[{e[3]}]"


def check_same_dag(data: SnapshotData, shape: DagShape, allow_job_change: bool) -> None:
    """Refuse to restore ``data`` into a DAG of another shape (naming the vertices that
    differ) unless ``allow_job_change``. A snapshot without a recorded shape (written by
    an older slipstream) is not checked."""
    saved: Any = getattr(data, "dag_shape", None)
    if saved is None:
        return
    diff = shape_difference(saved, shape)
    if diff is None:
        return
    parts = []
    if diff.only_old:
        parts.append(f"vertices {diff.only_old} are not in this DAG")
    if diff.only_new:
        parts.append(f"vertices {diff.only_new} are new")
    if diff.rewired:
        parts.append(f"the edges of vertices {diff.rewired} differ")
    edges = ""
    if diff.edges_only_old or diff.edges_only_new:
        edges = (
            f" (edges only in the snapshot: {sorted(map(_edge_text, diff.edges_only_old))}; "
            f"only in this DAG: {sorted(map(_edge_text, diff.edges_only_new))})"
        )
    text = (
        f"snapshot {data.snapshot_id} of job {data.job_name!r} was taken of another DAG: "
        f"{', '.join(parts)}{edges}"
    )
    if allow_job_change:
        log.warning("%s; restoring it all the same (allow_job_change=True)", text)
        return
    raise SnapshotError(
        f"{text}. A snapshot is restored into the same DAG (the same vertex names and "
        f"edges; parallelism may change). Pass JobConfig(allow_job_change=True) to restore "
        f"it into this DAG anyway (vertices match by name)."
    )
