"""A chunked store never restores wrong state silently (issue 22, item 4): a delta chunk
that is damaged, missing, or swapped for another validly signed chunk (its own signature
holds, the manifest recorded another) fails the restore naming the file; the store
keeps no chunk file that no retained manifest names."""

from __future__ import annotations

import os
import re
import shutil
from typing import Any

import pytest
import snapshot_test_procs as stp

import slipstream as ss
from slipstream import JobConfig, ProcessingGuarantee
from slipstream.state.store import DirectorySnapshotStore

KEY = b"integrity-test-key-0123"
KEYS = 1000


def config(store: str, **kw: Any) -> JobConfig:
    return JobConfig(
        name="integrity",
        processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE,
        snapshot_interval_ms=20,
        snapshot_store=store,
        snapshot_key=KEY,
        restart_delay_ms=1,
        **kw,
    )


@pytest.fixture(scope="module")
def chained_store(tmp_path_factory: Any) -> str:
    """A store whose newest snapshot names a chain of a full chunk and deltas."""
    store_dir = str(tmp_path_factory.mktemp("integrity") / "store")
    engine = ss.local(cooperative_threads=2)
    job = engine.new_job(stp.keyed_sum_dag(10**7, KEYS, rate=3000.0), config(store_dir))

    def newest_has_two_deltas() -> bool:
        manifest = stp.newest_manifest(store_dir, KEY)  # a commit's pruning may race it
        if manifest is None:
            return False
        chains = manifest.vertices["sum"].chains.values()
        return any(len(c) >= 3 and c[-1].mode == c[-2].mode == "delta" for c in chains)

    stp.wait_for(newest_has_two_deltas, what="a chain with two deltas")
    job.cancel()
    with pytest.raises(ss.JobCancelledError):
        job.join(30)
    return store_dir


def damaged_copy(src: str, dst: str, damage: str) -> str:
    """A copy of store ``src`` with one delta chunk of the newest chain damaged;
    returns the damaged file's path."""
    shutil.copytree(src, dst)
    store = DirectorySnapshotStore(dst, key=KEY)
    newest = store.committed_ids()[-1]
    chain = next(
        c for c in store.read_manifest(newest).vertices["sum"].chains.values() if len(c) >= 3
    )
    last, before = (os.path.join(dst, r.file) for r in (chain[-1], chain[-2]))
    if damage == "tampered":
        with open(last, "r+b") as fh:
            fh.seek(-2, os.SEEK_END)
            fh.write(b"!!")
    elif damage == "missing":
        os.remove(last)
    elif damage == "swapped":  # another validly signed delta of the same processor
        shutil.copyfile(before, last)
    elif damage == "reordered":  # the chain's two newest deltas trade places
        tmp = last + ".x"
        os.rename(last, tmp)
        os.rename(before, last)
        os.rename(tmp, before)
    return last


WHAT = {
    "tampered": "fails its signature check",
    "missing": "is missing",
    "swapped": "is not the chunk the manifest names: its signature differs from the one "
    "the manifest recorded",
    "reordered": "is not the chunk the manifest names",
}


def swapped_with(path: str) -> str:
    """The file whose place a reordered delta took (the delta before it)."""
    head, name = os.path.split(path)
    sid = int(name.split("-")[1])
    return os.path.join(head, name.replace(f"{sid:010d}", f"{sid - 1:010d}"))


@pytest.mark.parametrize("damage", list(WHAT))
def test_a_damaged_delta_chunk_fails_the_restore_naming_the_file(
    chained_store: str, tmp_path: Any, damage: str
) -> None:
    store_dir = str(tmp_path / "store")
    path = damaged_copy(chained_store, store_dir, damage)
    newest = DirectorySnapshotStore(store_dir, key=KEY).committed_ids()[-1]
    for kw in ({"resume": True}, {}):
        with pytest.raises(ss.SnapshotStoreDamagedError) as ei:
            ss.local().new_job(
                stp.keyed_sum_dag(100, KEYS),
                config(store_dir, **kw),
                restore_from=None if kw else store_dir,
            )
        text = str(ei.value)
        named = [path] if damage != "reordered" else [path, swapped_with(path)]
        assert any(f"snapshot {newest}: chunk {p} (vertex 'sum', processor " in text for p in named), text
        assert WHAT[damage] in text, text
        assert "its newest committed snapshot cannot be used" in text
        # older snapshots share chunks: one whose chain names the damaged file is not
        # offered as intact
        store = DirectorySnapshotStore(store_dir, key=KEY)
        offered = re.search(r"Intact older snapshots: \[([0-9, ]*)\]", text)
        for i in [int(x) for x in offered.group(1).split(", ")] if offered else []:
            assert not {os.path.basename(p) for p in named} & store.read_manifest(i).files()
    with pytest.raises(ss.SnapshotError, match=WHAT[damage]):
        DirectorySnapshotStore(store_dir, key=KEY).read(newest)


def test_every_chunk_file_is_named_by_a_retained_manifest(chained_store: str) -> None:
    store = DirectorySnapshotStore(chained_store, key=KEY)
    named = set()
    for i in store.committed_ids():
        named |= store.read_manifest(i).files()
    chunks = {n for n in os.listdir(chained_store) if n.startswith("chunk-")}
    # a cancelled job may leave a compaction's output or a snapshot it was writing: the
    # next start removes what no manifest names
    assert named <= chunks
    assert set(store.clean_up()) == {n for n in chunks - named}
    assert {n for n in os.listdir(chained_store) if n.startswith("chunk-")} == named
