"""Word count over text files, written with the Pipeline API (and, for comparison, the
same job hand-wired with the Core API).

    python examples/wordcount.py                      # generates a corpus, embedded engine
    python examples/wordcount.py --dir my_texts/      # your own *.txt files
    python examples/wordcount.py --engine spark       # the same pipeline on Spark (local[2])
    python examples/wordcount.py --core               # the hand-wired Core API DAG instead

The pipeline: read_files -> flat_map(tokenize) -> group_by(word).aggregate(counting())
-> list sink. ``print(build_pipeline(...))`` shows the DAG it compiles to: the
tokenizer runs inside the first aggregation stage (fused), which feeds the combining
stage through a distributed edge partitioned by word.

The Core API DAG (``build_dag``): read_files -> flat_map(tokenize) -> accumulate_by_key
(local, partitioned by word) -> combine_by_key (distributed, partitioned by word) -> sink.
The embedded engine runs its ``tokenize`` vertex inside ``accumulate``'s tasklet (engine
fusion, ``JobConfig(fuse_vertices=...)``): unfused, every word crossed a queue between
the two, which cost ~20-30 % more CPU than the pipeline (docs/performance.md, "Word
count: why the Core API DAG is ~20-30 % slower").
"""

from __future__ import annotations

import argparse
import os
import random
import re
import sys
import tempfile
import time
from collections.abc import Callable

import slipstream as ss
from slipstream import DAG, Edge, JobConfig, sinks, sources
from slipstream import processors as P
from slipstream.aggregate import counting

WORD = re.compile(r"[a-z']+")


def tokenize(line: str) -> list[str]:
    return WORD.findall(line.lower())


def word(w: str) -> str:
    return w


def build_pipeline(
    directory: str, glob: str = "*.txt", tokenizer: Callable[[str], list[str]] = tokenize
) -> ss.Pipeline:
    """Word count over the files ``directory/glob`` as a pipeline (bench/ reuses it)."""
    p = ss.Pipeline()
    (
        p.read_from(sources.read_files(directory, glob))
        .flat_map(tokenizer)
        .set_name("tokenize")
        .group_by(word)
        .aggregate(counting())
        .set_name("count")
        .write_to(sinks.list_sink("counts"))
    )
    return p


def build_dag(
    directory: str, glob: str = "*.txt", tokenizer: Callable[[str], list[str]] = tokenize
) -> DAG:
    """The same word count hand-wired with the Core API (the guide's example)."""
    dag = DAG()
    src = dag.new_vertex("source", sources.read_files(directory, glob))
    tok = dag.new_vertex("tokenize", P.flat_map(tokenizer))
    acc = dag.new_vertex("accumulate", P.accumulate_by_key(lambda w: w, counting()))
    comb = dag.new_vertex("combine", P.combine_by_key(counting()))
    out = dag.new_vertex("sink", sinks.list_sink("counts")).local_parallelism(1)
    dag.edge(Edge.between(src, tok))
    dag.edge(Edge.between(tok, acc).partitioned(lambda w: w))
    dag.edge(Edge.between(acc, comb).distributed().partitioned(ss.entry_key))
    dag.edge(Edge.between(comb, out))
    return dag


_WORDS = (
    "the of and to in a is that for it as was with be by on not he this are or his from at "
    "which but have an they you were her she there been one all we their has would when if "
    "stream window watermark snapshot barrier processor vertex edge tasklet spark engine "
    "python data event time late early session sliding tumbling frame key value"
).split()


def generate_corpus(directory: str, n_words: int, files: int = 4, seed: int = 7) -> None:
    """Zipf-like text over a small vocabulary, written as ``files`` text files."""
    rng = random.Random(seed)
    weights = [1.0 / (i + 1) for i in range(len(_WORDS))]
    os.makedirs(directory, exist_ok=True)
    per_file = n_words // files
    for f in range(files):
        words = rng.choices(_WORDS, weights, k=per_file)
        lines = (" ".join(words[i : i + 12]).capitalize() + "." for i in range(0, per_file, 12))
        with open(os.path.join(directory, f"text-{f}.txt"), "w", encoding="utf-8") as fh:
            fh.write("\n".join(lines) + "\n")


def make_engine(name: str) -> ss.LocalEngine:
    if name == "local":
        return ss.local()
    engine = ss.spark()  # a local[2] session unless SPARK settings say otherwise
    return engine  # type: ignore[no-any-return]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", help="directory of *.txt files (default: generate a corpus)")
    ap.add_argument("--words", type=int, default=200_000, help="size of the generated corpus")
    ap.add_argument("--engine", choices=["local", "spark"], default="local")
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--core", action="store_true", help="run the hand-wired Core API DAG")
    a = ap.parse_args(argv)
    directory = a.dir
    if directory is None:
        directory = os.path.join(tempfile.gettempdir(), f"slipstream-demo-corpus-{a.words}")
        if not os.path.isdir(directory):
            print(f"generating a corpus of {a.words:,} words in {directory} ...")
            generate_corpus(directory, a.words)
    elif not os.path.isdir(directory):
        print(f"error: {directory} is not a directory", file=sys.stderr)
        return 2
    engine = make_engine(a.engine)
    print(f"counting words in {directory} on the {a.engine} engine ...")
    t0 = time.perf_counter()
    job_definition = build_dag(directory) if a.core else build_pipeline(directory)
    if not a.core:
        # what the compiler built (the tokenizer runs inside the first aggregation stage)
        print("pipeline compiled to: " + " -> ".join(v.name for v in job_definition.to_dag()))
    job = engine.new_job(job_definition, JobConfig(name="wordcount"))
    job.join()
    seconds = time.perf_counter() - t0
    counts = dict(engine.get_list("counts"))
    total = sum(counts.values())
    print(f"{total:,} words, {len(counts):,} distinct, in {seconds:.2f} s ({total / seconds:,.0f} words/s)")
    print(f"top {a.top}:")
    for word, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[: a.top]:
        print(f"  {word:<12} {n:>9,}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
