"""The README and docs/ hold what a new user reads first: every ```python block runs as
written, the README links every page of docs/, and no page tells users to install a
package that does not exist.

How a block runs: alone in a fresh ``python`` process (a script file), with a timeout,
in a new temporary directory holding ``data/`` with two text files (the word counts of
the README and the guide read ``data/*.txt``). It must exit 0. An HTML comment on the
line before the fence changes that; its words, separated by ``;``:

* ``fragment``: a piece of a larger program (an API shape, a few lines of a DAG); not
  run. Fragments must stay a minority of the blocks, and the test names them.
* ``continues``: the block goes on from the previous block of the same page (it runs
  after that block, in the same script, as a reader following the page would).
* ``needs: spark``: runs only where pyspark and Java are (a slow test: the block starts
  its own local Spark session, ~15-30 s; the suite's shared session lives in another
  process, which a fresh process cannot use). These blocks run two at a time in the
  background from the first one's test on (each alone in its fresh process and
  directory); each block's test waits for its own.
* ``needs: lines at HOST:PORT``: a TCP server that sends a few lines and closes. The test
  serves them on a free port and puts that port for ``PORT`` in the block (the only
  change made to a block), so parallel runs never collide.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]

#: What the ``needs: lines at ...`` server sends: ticker,timestamp_ms,price
TICKER_LINES = "".join(
    f"{ticker},{ts},{price}\n"
    for ts in range(0, 30_000, 500)
    for ticker, price in (("AAPL", 190.5), ("MSFT", 420.0))
)

#: What some blocks print (found by the job name in the block), from the data above.
EXPECTED_STDOUT = {
    "wordcount": "[('to', 3), ('be', 2), ('the', 2), ('or', 1), ('not', 1), ('that', 1),",
    "wordcount-dag": "[('to', 3), ('be', 2), ('the', 2), ('or', 1), ('not', 1), ('that', 1),",
    "wordcount-guide": "incomprehensibilities",
    "wordcount-processes": "[('to', 3), ('be', 2), ('the', 2)]\n2\n",
    "doubled-processes": "True\nTrue\n",
    "prices": "KeyedWindowResult(start=0, end=10000, key='AAPL', value=3810.0)",
    "spark-wordcount": "[('be', 2), ('not', 1), ('or', 1), ('to', 2)]",
    # docs/spark.md, "Event time": native append mode's windows (on main: [])
    "event-time": "[(0, 'a', 1), (0, 'b', 1), (1000, 'a', 1)]",
    # docs/state.md: the point query, and a seeded count continued live
    "user-clicks": "[StateRow(vertex='rolling_aggregate', processor=0, key='a', detail=None, value=334, kind='keyed')]",
    "clicks": "[('a', 4), ('b', 2), ('bot', 1), ('d', 1)]",
    "visits": "KeyedWindowResult(start=200, end=290, key='a', value=5)",
    # docs/state.md: history counted on Spark, continued live over Kafka from the cutoff
    "backfilled-clicks": "[('a', 4), ('b', 2), ('d', 1)]\n3 records read from Kafka",
    # docs/spark.md, "Kafka on Spark": Kafka -> rolling count -> Kafka, then a restart
    "kafka-clicks": "['a=1', 'a=2', 'a=3', 'b=1', 'b=2', 'c=1']\n['c=2', 'd=1']",
    # docs/watching.md: the dashboard's key search over a running job's last snapshot
    "watched-counts": "True 'a' keyed True",
}

_MARKER = re.compile(r"^<!--\s*(.*?)\s*-->$")
_WORDS = re.compile(r"^(fragment|continues|needs: spark|needs: lines at 127\.0\.0\.1:(\d+))$")


@dataclass
class Block:
    page: str  # relative to the repository
    line: int  # of the opening fence
    code: str
    words: list[str] = field(default_factory=list)
    #: the code of the blocks this one continues, then its own
    program: str = ""

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def fragment(self) -> bool:
        return "fragment" in self.words

    def needs(self) -> list[str]:
        return [w.removeprefix("needs: ") for w in self.words if w.startswith("needs: ")]


def _blocks(page: Path) -> list[Block]:
    lines = page.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            end = i + 1
            while end < len(lines) and lines[end].strip() != "```":
                end += 1
            words: list[str] = []
            m = _MARKER.match(lines[i - 1].strip()) if i > 0 else None
            if m is not None:
                words = [w.strip() for w in m.group(1).split(";") if w.strip()]
            code = "\n".join(lines[i + 1 : end]) + "\n"
            found.append(Block(str(page.relative_to(ROOT)), i + 1, code, words))
            i = end
        i += 1
    for n, block in enumerate(found):
        block.program = block.code
        if "continues" in block.words and n > 0 and not found[n - 1].fragment:
            block.program = found[n - 1].program + "\n" + block.code
    return found


BLOCKS = [b for page in PAGES for b in _blocks(page)]
RUNNABLE = [b for b in BLOCKS if not b.fragment]


def test_the_markers_are_known_words() -> None:
    bad = [(b.where, w) for b in BLOCKS for w in b.words if not _WORDS.match(w)]
    assert bad == [], "unknown words in the comment before a ```python block (the module docstring lists them)"
    first = [b.where for b in BLOCKS if "continues" in b.words and b.program == b.code]
    assert first == [], "'continues' on a block with no runnable block before it on its page"


def test_fragments_are_a_minority() -> None:
    fragments = [b.where for b in BLOCKS if b.fragment]
    assert len(BLOCKS) >= 20, f"only {len(BLOCKS)} python blocks found: is the parser broken?"
    assert 2 * len(fragments) < len(BLOCKS), (
        f"{len(fragments)} of {len(BLOCKS)} python blocks are fragments: {fragments}"
    )


def _fill_workdir(path: Path) -> Path:
    data = path / "data"
    data.mkdir()
    (data / "a.txt").write_text("to be or not to be\nthat is the question\n", encoding="utf-8")
    (data / "b.txt").write_text("whether tis nobler in the mind to suffer\nincomprehensibilities\n", encoding="utf-8")
    return path


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return _fill_workdir(tmp_path)


@pytest.fixture
def line_server() -> Iterator[int]:
    """A TCP server on a free loopback port: each connection gets TICKER_LINES, then EOF."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.5)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                conn.sendall(TICKER_LINES.encode("ascii"))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join(timeout=10)
        server.close()


def _params() -> list[object]:
    params: list[object] = []
    for b in RUNNABLE:
        marks = [pytest.mark.slow] if "spark" in b.needs() else []
        params.append(pytest.param(b, id=b.where, marks=marks))
    return params


def _run(program: str, workdir: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    """``program`` as a script of its own in a fresh ``python`` process in ``workdir``."""
    script = workdir / "example.py"
    script.write_text(program, encoding="utf-8")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), *filter(None, [env.get("PYTHONPATH")])])
    return subprocess.run(
        [sys.executable, str(script)],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def spark_runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Future[subprocess.CompletedProcess[str]]]]:
    """The runs of the selected ``needs: spark`` blocks, started when the first of them
    is tested, two at a time on background threads (each still alone in its own fresh
    process and directory). A Spark block spends much of its 10-20 s waiting (its JVM's
    start, the scheduler between stages and epochs): one after the other they were the
    module's 66 s of 89 in a full run. Each block's test waits for its own run."""
    pool = ThreadPoolExecutor(2, thread_name_prefix="spark-block")
    runs: dict[str, Future[subprocess.CompletedProcess[str]]] = {}
    for item in request.session.items:
        callspec = getattr(item, "callspec", None)
        block = callspec.params.get("block") if callspec is not None else None
        if getattr(item, "module", None) is request.module and isinstance(block, Block):
            if block.needs() == ["spark"] and block.where not in runs:
                where = tmp_path_factory.mktemp("spark-block", numbered=True)
                runs[block.where] = pool.submit(_run, block.program, _fill_workdir(where), 300.0)
    try:
        yield runs
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


@pytest.mark.parametrize("block", _params())
def test_block_runs_as_written(block: Block, workdir: Path, request: pytest.FixtureRequest) -> None:
    program = block.program
    timeout = 120.0
    r: subprocess.CompletedProcess[str] | None = None
    for need in block.needs():
        if need == "spark":
            from slipstream.spark.session import SparkUnavailableError, check_spark_available

            try:
                check_spark_available()
            except SparkUnavailableError as exc:
                pytest.skip(str(exc))
            runs: dict[str, Future[subprocess.CompletedProcess[str]]]
            runs = request.getfixturevalue("spark_runs")
            run = runs.get(block.where)
            r = run.result() if run is not None else _run(program, workdir, 300.0)
        else:
            m = re.fullmatch(r"lines at 127\.0\.0\.1:(\d+)", need)
            assert m is not None, need
            port: int = request.getfixturevalue("line_server")
            assert re.search(rf"\b{m.group(1)}\b", program), f"{block.where} never uses port {m.group(1)}"
            program = re.sub(rf"\b{m.group(1)}\b", str(port), program)
    if r is None:
        r = _run(program, workdir, timeout)
    assert r.returncode == 0, f"{block.where} failed (exit {r.returncode}):\n{r.stderr[-3000:]}"
    for name in re.findall(r'JobConfig\(name="([^"]+)"', block.code):
        if name in EXPECTED_STDOUT:
            assert EXPECTED_STDOUT[name] in r.stdout, f"{block.where} printed:\n{r.stdout[-3000:]}"


def test_the_readme_links_every_page_of_docs() -> None:
    linked = set(re.findall(r"\]\((docs/[^)#\s]+\.md)\)", README.read_text(encoding="utf-8")))
    pages = {f"docs/{p.name}" for p in DOCS.glob("*.md")}
    assert pages - linked == set(), f"README.md does not link {sorted(pages - linked)}"
    assert linked - pages == set(), f"README.md links missing pages {sorted(linked - pages)}"


def test_no_page_installs_slipstream_from_pypi() -> None:
    """slipstream is not on PyPI: ``pip install 'slipstream[...]'`` fails; a checkout
    installs its extras with ``pip install -e '.[...]'``."""
    wrong = [
        f"{page.relative_to(ROOT)}:{n}"
        for page in PAGES
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(r"pip install\s+['\"]?slipstream\b", line)
    ]
    assert wrong == []
