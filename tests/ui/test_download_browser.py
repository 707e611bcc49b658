"""Downloads in the served app (headless Chromium): a refused download says why on the page and leaves no traceback in
the server's log, and the next press of the same button downloads."""

from __future__ import annotations

import logging

import pytest

pytestmark = pytest.mark.ui
pw = pytest.importorskip("playwright.sync_api")
from panel.tests.util import wait_until  # noqa: E402
from browser import set_field  # noqa: E402

TIMEOUT = 90_000


def test_a_refused_report_download_says_why_and_the_next_press_downloads(app_page, caplog):
    page, app = app_page
    caplog.set_level(logging.ERROR)
    logging.getLogger("panel").addHandler(caplog.handler)  # Panel's logger does not pass its records to the root

    def errors():  # Panel's sessions also log at DEBUG; one CI run's handler caught two such records
        return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]

    try:
        page.locator(".bk-tab", has_text="Export").click()
        page.locator(".ts-download-report button").wait_for(timeout=TIMEOUT)
        set_field(page, "Compare with run directory (optional)", "/nope/other")
        page.locator(".ts-download-report button").click()
        wait_until(lambda: "outside the directories this server reads" in app.state.error, page, timeout=TIMEOUT)
        page.locator(".ts-error", has_text="/nope/other").wait_for(timeout=TIMEOUT)
        page.wait_for_timeout(500)  # the refused transfer has run on the server
        assert not errors(), errors()  # was: "Callback failed … NoneType"

        set_field(page, "Compare with run directory (optional)", "")
        with page.expect_download(timeout=TIMEOUT) as download:
            page.locator(".ts-download-report button").click()
        html = open(download.value.path(), encoding="utf-8").read()
        assert html.lstrip().lower().startswith("<!doctype html") and app.state.trajectory.run_id in html
        assert not errors(), errors()
    finally:
        logging.getLogger("panel").removeHandler(caplog.handler)
