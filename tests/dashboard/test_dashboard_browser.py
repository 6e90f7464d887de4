"""The dashboard in a real browser: headless Chromium (Debian's package, installed by
``make test``) loads the page while a job runs; the DAG and live counters must appear.

Driven through Selenium with Debian's chromedriver, so nothing is downloaded. The
screenshots go to the test's temp dir; with SLIPSTREAM_DOCS_SCREENSHOT=path the one of
the whole page at 1280 px is also copied there (that is how docs/images/dashboard.png is
made, see docs/watching.md).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from dashboard_support import LONG_NAMES, member_pipeline, streaming_dag, wait_for

import slipstream as ss
from slipstream import JobConfig, ProcessingGuarantee, sinks, sources
from slipstream.aggregate import counting

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


@pytest.fixture
def browser(tmp_path: Path) -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    # never skip quietly: `make test` installs these (see the Makefile's chromium step)
    assert os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER), (
        "headless Chromium is missing: run `make test` (it installs Debian's chromium and "
        "chromium-driver) or `apt-get install -y chromium chromium-driver`"
    )
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--window-size=1280,900",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
    ):
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.mark.slow
def test_page_shows_dag_and_live_counters(browser: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    with ss.local(dashboard=0) as engine:
        engine.new_job(
            streaming_dag(),
            JobConfig(
                name="trades",
                processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE,
                snapshot_interval_ms=500,
                snapshot_store=str(tmp_path / "snaps"),
            ),
        )
        browser.get(engine.dashboard_url)

        def text(css: str) -> str:
            return str(browser.find_element(By.CSS_SELECTOR, css).text)

        # the DAG: an SVG with a box per vertex, its name as text
        svg = browser.find_element(By.CSS_SELECTOR, "section.job svg.dag")
        names = [e.text for e in svg.find_elements(By.CSS_SELECTOR, "g.vertex text.name")]
        assert names and set(names) == {"events", "timestamps", "count-per-window", "sink"}
        edge_labels = [e.text for e in svg.find_elements(By.CSS_SELECTOR, "g.edge text")]
        assert any("partitioned" in t for t in edge_labels)
        # live: the page updates itself (no reload) and the counters grow
        sink_in = 'tr[data-vertex="sink"] [data-f=items_in]'
        first = int(wait_for(lambda: text(sink_in).isdigit() and text(sink_in), what="a count"))
        wait_for(lambda: int(text(sink_in)) > first, what="the count to grow")
        wait_for(lambda: text('tr[data-vertex="events"] [data-f=out_rate]') not in ("", "0/s"), what="a rate")
        wait_for(lambda: text('tr[data-vertex="count-per-window"] [data-f=late]') not in ("", "0"))
        wait_for(lambda: "ms" in text('tr[data-vertex="timestamps"] [data-f=watermark_lag]')
                 or " s" in text('tr[data-vertex="timestamps"] [data-f=watermark_lag]'))
        wait_for(lambda: text("[data-f=snapshot]").startswith("#"), what="a snapshot")
        assert text("section.job .status") == "running"
        rate = wait_for(lambda: svg.find_element(By.CSS_SELECTOR, 'g.vertex[data-vertex="events"] .m-rate').text)
        assert rate.startswith("in ")
        updates = int(browser.find_element(By.TAG_NAME, "body").get_attribute("data-updates"))
        wait_for(lambda: int(browser.find_element(By.TAG_NAME, "body").get_attribute("data-updates")) > updates)
        shot = tmp_path / "dashboard.png"
        assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000


#: Keeps the page's first /api/jobs answer (set before the page's own script runs).
FIRST_ANSWER = """
(function(){var f=window.fetch;window.fetch=function(u,o){var p=f.apply(this,arguments);
  if(String(u).indexOf('api/jobs')===0&&!window.__firstJobs){p.then(function(r){return r.clone().json();})
    .then(function(d){if(!window.__firstJobs)window.__firstJobs=d;});}
  return p;};})();
"""

#: Per edge label: its box (getBBox, in the SVG's user units), and the boxes of the vertices.
LABEL_BOXES = """
var svg=document.querySelector('section.job svg.dag'), vb=svg.viewBox.baseVal;
function box(e){var b=e.getBBox();return [b.x,b.y,b.x+b.width,b.y+b.height];}
return {view:[vb.x,vb.y,vb.x+vb.width,vb.y+vb.height],
  labels:Array.from(svg.querySelectorAll('g.edge text')).map(function(t){return [t.textContent,box(t)];}),
  vertices:Array.from(svg.querySelectorAll('g.vertex')).map(function(g){return [
    g.getAttribute('data-vertex'),box(g.querySelector('rect.box')),box(g.querySelector('text.name')),
    box(g.querySelector('text.par'))];})};
"""


def overlap(a: list[float], b: list[float]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


@pytest.mark.slow
def test_charts_snapshots_and_a_dag_that_fits_1280_px(
    browser: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from selenium.webdriver.common.by import By

    from slipstream.dashboard import history, server

    # the server reads a point of history every 0.25 s instead of every second: the
    # sparklines' four points below come in about 1 s, not 4
    monkeypatch.setattr(server, "History", functools.partial(history.History, interval_s=0.25))

    browser.set_window_size(1280, 800)
    browser.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": FIRST_ANSWER})
    names = LONG_NAMES
    with ss.local(dashboard=0) as engine:
        job = engine.new_job(
            streaming_dag(long_names=True),
            JobConfig(
                name="trades",
                processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE,
                snapshot_interval_ms=300,
                snapshot_store=str(tmp_path / "snaps"),
            ),
        )
        wait_for(lambda: job.metrics.get(names["events"], {}).get("items_out", 0) >= 100, what="output")
        browser.get(engine.dashboard_url)

        def js(script: str) -> Any:
            return browser.execute_script(script)

        # rates from the first load of a running job (on main the first answer said 0/s)
        first = wait_for(lambda: js("return window.__firstJobs"), what="the first answer")
        (j,) = first["jobs"]
        rates = {v["name"]: (v["in_rate"], v["out_rate"]) for v in j["vertices"]}
        assert rates[names["events"]][1] > 0 and rates[names["timestamps"]][0] > 0, rates
        events_row = f'tr[data-vertex="{names["events"]}"] [data-f=out_rate]'
        shown = wait_for(lambda: browser.find_element(By.CSS_SELECTOR, events_row).text, what="a rate")
        assert shown.endswith("/s") and shown != "0/s"

        # no horizontal scrolling at 1280 px, neither the page nor the DAG's box
        wait_for(lambda: int(browser.find_element(By.TAG_NAME, "body").get_attribute("data-updates")) >= 1)
        page_w = js("return [document.documentElement.scrollWidth, document.documentElement.clientWidth]")
        assert page_w[0] <= page_w[1], page_w
        dag_w = js("var b=document.querySelector('.dagbox');return [b.scrollWidth, b.clientWidth]")
        assert dag_w[0] <= dag_w[1], dag_w

        # every edge label inside the picture and clear of every box; names inside theirs
        boxes = js(LABEL_BOXES)
        view = boxes["view"]
        assert any("partitioned by" in text and "lambda e: e[1] % 4" in text for text, _ in boxes["labels"])
        for text, b in boxes["labels"]:
            assert view[0] <= b[0] and b[2] <= view[2] and view[1] <= b[1] and b[3] <= view[3], (text, b, view)
            for name, rect, _, _ in boxes["vertices"]:
                assert not overlap(b, rect), (text, b, name, rect)
        for name, rect, name_text, par_text in boxes["vertices"]:
            assert rect[0] <= name_text[0] and name_text[2] <= par_text[0] and par_text[2] <= rect[2], name

        # the sparklines fill in from the server's history: a line of several points
        def points(vertex: str, cls: str) -> int:
            path = browser.find_element(By.CSS_SELECTOR, f'.vchart[data-vertex="{vertex}"] path.{cls}')
            return len(re.findall(r"[ML][-\d.]+,[-\d.]+", path.get_attribute("d") or ""))

        wait_for(lambda: points(names["events"], "out") >= 4, what="the rate sparkline")
        assert points(names["timestamps"], "lag") >= 4 and points(names["sink"], "fill") >= 4
        assert points(names["events"], "lag") == 0  # a source has no watermark to lag

        # the snapshot table: a row per commit the dashboard saw, newest first
        def rows() -> list[list[str]]:
            trs = browser.find_elements(By.CSS_SELECTOR, "table.snapshots tbody tr")
            return [[td.text for td in tr.find_elements(By.TAG_NAME, "td")] for tr in trs]

        table = wait_for(lambda: len(r := rows()) >= 3 and r[0][0].isdigit() and r, what="snapshot rows")
        ids = [int(r[0]) for r in table]
        assert ids == sorted(ids, reverse=True)
        for _id, committed, duration, size, entries, pause in table:
            assert re.fullmatch(r"\d+:\d\d:\d\d( [AP]M)?", committed), committed
            assert re.fullmatch(r"[\d.]+ (ms|s)", duration) and re.fullmatch(r"[\d.]+ (B|KiB|MiB)", size)
            assert entries.isdigit() and int(entries) > 0 and re.fullmatch(r"[\d.]+ ms|\u2013", pause)
        assert any(r[5] != "\u2013" for r in table)  # pauses known

        # one screenshot of the whole page at 1280 px (docs/images/dashboard.png is made this way)
        height = js("return document.documentElement.scrollHeight")
        browser.set_window_size(1280, height + 140)
        shot = tmp_path / "dashboard.png"
        assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
        target = os.environ.get("SLIPSTREAM_DOCS_SCREENSHOT")
        if target:
            shutil.copyfile(shot, target)


def html_key(seq: int) -> str:
    return f"<i>k{seq % 3}</i>"


@pytest.mark.slow
def test_state_sizes_and_a_key_search(browser: Any, tmp_path: Path) -> None:
    """A running rolling count whose keys are HTML: the page shows its vertex's state
    size once a snapshot is counted, and a key search shows the key's count in the
    snapshot the answer names (equal to ss.state.read of that snapshot), as text; a
    missing key and a job without snapshots say so."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    from slipstream.state.store import DirectorySnapshotStore

    directory = str(tmp_path / "snaps")
    p = ss.Pipeline()
    p.read_from(sources.generator(html_key, 200.0)).group_by(lambda k: k).rolling_aggregate(
        counting()
    ).write_to(sinks.noop())
    q = ss.Pipeline()
    q.read_from(sources.generator(html_key, 20.0)).group_by(lambda k: k).rolling_aggregate(
        counting()
    ).write_to(sinks.noop())
    with ss.local(dashboard=0) as engine:
        engine.new_job(
            p,
            JobConfig(
                name="counts",
                processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE,
                snapshot_interval_ms=300,
                snapshot_store=DirectorySnapshotStore(directory, keep=1000),
            ),
        )
        plain = engine.new_job(q, JobConfig(name="nosnapshots"))
        browser.get(engine.dashboard_url)

        def text(css: str) -> str:
            return str(browser.find_element(By.CSS_SELECTOR, css).text)

        sec = "section.job[data-job='%s']"
        sections = "//section[h2[starts-with(., 'counts')]]"
        counts = sec % wait_for(
            lambda: [e.get_attribute("data-job") for e in browser.find_elements(By.XPATH, sections)],
            what="the job's section",
        )[0]

        # the row is remade when a commit changes the figures: read its cells at once
        def state_row(vertex: str) -> dict[str, str]:
            return dict(browser.execute_script(
                "var tr=document.querySelector(arguments[0]+' table.state tr[data-vertex=\"'+arguments[1]+'\"]');"
                "var out={};if(tr)tr.querySelectorAll('td[data-f]').forEach(function(td){"
                "out[td.getAttribute('data-f')]=td.textContent;});return out;", counts, vertex))

        # all three keys counted (and the size on disk shown) in some snapshot
        shown = wait_for(lambda: (r := state_row("rolling_aggregate")).get("keys") == "3" and r, what="the state size")
        assert shown["entries"] == "3" and shown["processors"].isdigit() and shown["chunks"].isdigit()
        assert re.fullmatch(r"[\d.]+ (B|KiB)", shown["bytes"]), shown
        assert text(f"{counts} [data-f=statenote]").startswith("as of snapshot #")

        # the vertex choice lists the vertices with state, the first with keys chosen
        choice = Select(browser.find_element(By.CSS_SELECTOR, f"{counts} form.statesearch select"))
        wait_for(lambda: [o.text for o in choice.options] == ["source", "rolling_aggregate"], what="the choice")
        assert choice.first_selected_option.text == "rolling_aggregate"

        def look_up(section: str, key: str) -> Any:
            form = browser.find_element(By.CSS_SELECTOR, f"{section} form.statesearch")
            box = form.find_element(By.NAME, "key")
            box.clear()
            box.send_keys(key)
            form.find_element(By.CSS_SELECTOR, "button").click()
            out = browser.find_element(By.CSS_SELECTOR, f"{section} .stateresult")
            wait_for(lambda: out.get_attribute("data-state"), what="the search's answer")
            return out

        out = look_up(counts, "<i>k1</i>")
        assert out.get_attribute("data-state") == "found"
        head = out.find_element(By.CSS_SELECTOR, "div").text
        m = re.fullmatch(r"'<i>k1</i>' in rolling_aggregate, snapshot #(\d+):", head)
        assert m, head
        (expected,) = ss.state.read(directory, "rolling_aggregate", int(m.group(1)), key="<i>k1</i>")
        assert out.find_element(By.CSS_SELECTOR, "td.value").text == repr(expected.value)
        assert expected.value > 0
        assert out.find_elements(By.CSS_SELECTOR, "i") == []  # the key is text, not markup

        out = look_up(counts, '"<b>nope</b>"')
        assert out.get_attribute("data-state") == "missing"
        assert re.fullmatch(
            r"no such key: '<b>nope</b>' in vertex 'rolling_aggregate' as of snapshot \d+", out.text
        ), out.text
        assert out.find_elements(By.CSS_SELECTOR, "b") == []

        other = sec % plain.id
        wait_for(lambda: text(f"{other} [data-f=statenote]") == "this job takes no snapshots")
        out = look_up(other, "1")
        assert (out.get_attribute("data-state"), out.text) == (
            "error",
            "job 'nosnapshots' takes no snapshots (processing_guarantee NONE): it has no state to read",
        )


@pytest.mark.slow
def test_member_processes_each_get_a_row_and_the_total_sums_them(browser: Any) -> None:
    """``processes=2``: the Members table shows each member process (pid, state, items,
    CPU, resident set) and a total row; a job in one process has no such table."""
    from selenium.webdriver.common.by import By

    engine = ss.local(processes=2, dashboard=0)
    try:
        job = engine.new_job(member_pipeline(), JobConfig(name="members"))
        browser.get(engine.dashboard_url)
        sec = f"#job-{job.id}"

        def cells(tr: Any) -> dict[str, str]:
            return {td.get_attribute("data-f"): td.text for td in tr.find_elements(By.TAG_NAME, "td")}

        def table() -> Any:
            rows = browser.find_elements(By.CSS_SELECTOR, f"{sec} table.members tbody tr")
            got = [cells(tr) for tr in rows]
            ok = len(got) == 2 and all(r.get("items_in", "0") not in ("", "0") for r in got)
            return ok and got

        rows = wait_for(table, what="a row per member with items")
        pids = [str(p.pid) for p in job._execution._procs]
        assert [(r["member"], r["pid"], r["state"]) for r in rows] == [
            ("member 0", pids[0], "running"),
            ("member 1", pids[1], "running"),
        ]
        for r in rows:
            assert re.fullmatch(r"\d+\.\d s", r["cpu"]), r
            assert re.fullmatch(r"\d+%|\u2013", r["cpu_share"]), r
            assert re.fullmatch(r"[\d.]+ (KiB|MiB)", r["rss"]) and re.fullmatch(r"[\d.]+ (KiB|MiB)", r["peak_rss"]), r
        assert browser.find_element(By.CSS_SELECTOR, f"{sec} div.members").is_displayed()

        # the total row sums what the same poll brought (the page fills both from one answer)
        def consistent() -> Any:
            snap = browser.execute_script(
                "var s=document.querySelector(arguments[0]);"
                "function n(tr,f){return tr.querySelector('[data-f='+f+']').textContent;}"
                "var rs=Array.from(s.querySelectorAll('table.members tbody tr')),"
                "t=s.querySelector('table.members tfoot tr');"
                "return {rows:rs.map(function(r){return [n(r,'items_in'),n(r,'items_out')];}),"
                "total:[n(t,'member'),n(t,'state'),n(t,'items_in'),n(t,'items_out')]};",
                sec,
            )
            ins = sum(int(r[0]) for r in snap["rows"])
            outs = sum(int(r[1]) for r in snap["rows"])
            return snap["total"] == ["total", "2 processes", str(ins), str(outs)] and snap

        wait_for(consistent, what="a total row that sums the members")
        job.cancel()

        def states() -> list[str]:
            return [r["state"] for r in cells_of(browser, sec)]

        try:
            wait_for(lambda: states() == ["cancelled", "cancelled"], what="the members' end")
        except AssertionError:
            assert states() == ["cancelled", "cancelled"], (job.status, job.watch().get("members"))
    finally:
        engine.shutdown()

    with ss.local(dashboard=0) as one:
        plain = one.new_job(member_pipeline(), JobConfig(name="one"))
        browser.get(one.dashboard_url)
        wait_for(lambda: int(browser.find_element(By.TAG_NAME, "body").get_attribute("data-updates")) >= 2)
        box = browser.find_element(By.CSS_SELECTOR, f"#job-{plain.id} div.members")
        assert not box.is_displayed()
        plain.cancel()


def cells_of(browser: Any, sec: str) -> list[dict[str, str]]:
    from selenium.webdriver.common.by import By

    return [
        {td.get_attribute("data-f"): td.text for td in tr.find_elements(By.TAG_NAME, "td")}
        for tr in browser.find_elements(By.CSS_SELECTOR, f"{sec} table.members tbody tr")
    ]
