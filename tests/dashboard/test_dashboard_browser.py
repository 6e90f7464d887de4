"""The dashboard in a real browser: headless Chromium (Debian's package, installed by
``make test``) loads the page while a job runs; the DAG and live counters must appear.

Driven through Selenium with Debian's chromedriver, so nothing is downloaded. The
screenshot goes to the test's temp dir; with SLIPSTREAM_DOCS_SCREENSHOT=path it is also
copied there (that is how docs/images/dashboard.png is made, see docs/watching.md).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from dashboard_support import streaming_dag, wait_for

import slipstream as ss
from slipstream import JobConfig, ProcessingGuarantee

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
        target = os.environ.get("SLIPSTREAM_DOCS_SCREENSHOT")
        if target:
            shutil.copyfile(shot, target)
