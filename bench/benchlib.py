"""Shared helpers for the benchmarks: deterministic data, isolated runs, result tables.

Each variant runs in a fresh subprocess so that its peak memory (VmHWM) is its own
and one variant's garbage does not slow the next.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

VOCAB_SIZE = 50_000
WORDS_PER_LINE = 10


def count(text: str) -> int:
    """A count as the benches' options take it: ``"2500000"``, ``"10k"``, ``"1.5M"``
    (``k`` / ``M``, either case). ``ValueError`` for anything else."""
    text = text.strip()
    scale = {"k": 1_000, "m": 1_000_000}.get(text[-1:].lower(), 1)
    return int(float(text[:-1] if scale != 1 else text) * scale)


def cache_path(name: str) -> str:
    """``name`` inside this user's private benchmark cache directory
    (``<temp>/slipstream-<uid>/bench``, mode 0700, owner checked), where generated
    inputs are kept between runs. Private because a cache in the shared temp directory
    could be planted or swapped by another user (and the windowing events are pickled)."""
    from slipstream.core.files import user_temp_dir

    return os.path.join(user_temp_dir("bench"), name)


def set_input_dirs(a: Any) -> None:
    """The word-count corpus (``a.dir`` unless given) and the running-sum CSV directory
    (``a.rsf_dir``) of ``a.words`` / ``a.events``, in the private cache: the benchmarks
    that share these inputs find them in one place."""
    if a.dir is None:
        a.dir = cache_path(f"corpus-{a.words}")
    a.rsf_dir = cache_path(f"rsf-{a.events}")


def vocabulary(size: int = VOCAB_SIZE) -> list[str]:
    """Pronounceable pseudo-words, the same on every run."""
    syll = ["ka", "lo", "mi", "ne", "ru", "sa", "to", "vi", "ze", "po", "da", "fu", "gi", "he"]
    out = []
    i = 0
    while len(out) < size:
        n = i
        w = ""
        while True:
            w += syll[n % len(syll)]
            n //= len(syll)
            if n == 0:
                break
        out.append(w)
        i += 1
    return out


def zipf_words(n: int, vocab_size: int = VOCAB_SIZE, seed: int = 42) -> list[str]:
    """``n`` words drawn Zipf-like (weight 1/rank) over the vocabulary, fixed seed."""
    rng = random.Random(seed)
    vocab = vocabulary(vocab_size)
    weights = [1.0 / (r + 1) for r in range(vocab_size)]
    return rng.choices(vocab, weights, k=n)


def write_corpus(directory: str, n_words: int, files: int = 8, seed: int = 42) -> None:
    """The corpus as ``files`` text files of ten words per line (reused if present)."""
    marker = os.path.join(directory, f".complete-{n_words}-{files}-{seed}")
    if os.path.exists(marker):
        return
    os.makedirs(directory, exist_ok=True)
    for name in os.listdir(directory):
        os.remove(os.path.join(directory, name))
    words = zipf_words(n_words, seed=seed)
    lines = [" ".join(words[i : i + WORDS_PER_LINE]) for i in range(0, n_words, WORDS_PER_LINE)]
    per = -(-len(lines) // files)
    for f in range(files):
        with open(os.path.join(directory, f"part-{f:02d}.txt"), "w", encoding="utf-8") as fh:
            fh.write("\n".join(lines[f * per : (f + 1) * per]))
            fh.write("\n")
    open(marker, "w").close()


def count_words(directory: str, index: int = 0, count: int = 1) -> dict[str, int]:
    """Word count of the ``.txt`` files of ``directory`` as a plain Python loop: the
    baseline the word count benches compare the engines with (and check their counts
    against). ``index``, ``count``: only the files ``index, index + count, ...`` of the
    sorted list (a share, as ``read_files`` splits them over processors)."""
    counts: dict[str, int] = {}
    get = counts.get
    names = sorted(n for n in os.listdir(directory) if n.endswith(".txt"))
    for name in names[index::count]:
        with open(os.path.join(directory, name), encoding="utf-8") as fh:
            for line in fh:
                for w in line.split():
                    counts[w] = get(w, 0) + 1
    return counts


def load_example(name: str) -> Any:
    """Import ``examples/<name>.py`` (the examples are scripts, not a package)."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", f"{name}.py")
    module_name = f"slipstream_example_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


def run_variant(script: str, variant: str, args: Sequence[str]) -> dict[str, Any]:
    """Run ``script --variant NAME ...`` in a fresh interpreter; it prints one JSON line."""
    r = subprocess.run(
        [sys.executable, script, "--run-variant", variant, *args],
        capture_output=True,
        text=True,
        check=False,
    )
    if r.returncode != 0:
        raise SystemExit(f"variant {variant} failed:\n{r.stderr}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def wait_for_spares(engine: Any, processes: int, timeout: float = 5.0) -> None:
    """Wait until ``engine`` (``ss.local(processes=N)``, after a job ended) has its spare
    member processes up (engine/member_spares.py), so that the next job on it starts as
    a cluster's job does, on members that run before it, without forks in its time."""
    import time

    spares = getattr(engine, "_member_spares", None)  # a private attribute: a bench's look
    deadline = time.monotonic() + timeout
    while spares is not None and len(spares) < processes and time.monotonic() < deadline:
        time.sleep(0.005)


def peak_rss_mb() -> float:
    """This process's peak resident set in MB: ``VmHWM`` of ``/proc/self/status`` (its
    own address space's), else ``ru_maxrss``. Not ``ru_maxrss`` first: on Linux it
    survives ``execve``, so a fresh interpreter started by a parent that once held 600 MB
    reports at least 600 MB (measured: bench/processes.py's rows run after its Kafka
    rows, whose parent held the 1M input records)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def print_table(title: str, rows: list[dict[str, Any]], baseline: str, count_key: str = "items") -> None:
    """One row per variant: seconds, items/s, throughput ratio to ``baseline``, peak MB."""
    base = next(r for r in rows if r["name"] == baseline)
    base_rate = base[count_key] / base["seconds"]
    print(f"\n{title}")
    header = f"{'variant':<34}{'seconds':>9}{'items/s':>14}{'vs ' + baseline:>22}{'peak MB':>10}"
    print(header)
    print("-" * len(header))
    for r in rows:
        rate = r[count_key] / r["seconds"]
        print(
            f"{r['name']:<34}{r['seconds']:>9.2f}{rate:>14,.0f}{rate / base_rate:>21.2f}x"
            f"{r.get('peak_mb', 0):>10.0f}"
        )
