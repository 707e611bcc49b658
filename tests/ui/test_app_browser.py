"""The served app in headless Chromium (Playwright): render, Generate/stream, step keys, download.

Each test serves :func:`trajscope.ui.views.app.default_page` (what ``panel serve
apps/trajscope.py`` shows) in-process, so the test can also look at the
session's server-side state.
"""

from __future__ import annotations

import os
import pathlib
import time

import polars as pl
import pytest

from trajscope.ui import operator
from trajscope.ui.views.app import TrajScope, default_page

pytestmark = pytest.mark.ui
pw = pytest.importorskip("playwright.sync_api")
from panel.tests.util import serve_component, wait_until  # noqa: E402
from browser import TITLES  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
# the first plot render can take a while on a loaded 2-core machine
TIMEOUT = 60_000


def serve(page, **kwargs) -> list[TrajScope]:
    """Serve a fresh page per session; returns the list that collects each session's TrajScope."""
    apps: list[TrajScope] = []

    def make():
        tpl = default_page(**kwargs)
        apps.append(getattr(tpl, "_trajscope", None))  # None: the server-full page
        return tpl

    serve_component(page, make)
    return apps


def text(page, css: str) -> str:
    """Text of the element with class ``css`` (Panel panes render inside a shadow root)."""
    return page.locator(css).first.evaluate("el => (el.shadowRoot || el).textContent", timeout=TIMEOUT)


def readout(page) -> str:
    return text(page, ".ts-step-readout")


@pytest.fixture
def served_app_file(short_run_dir):
    """``panel serve apps/trajscope.py`` as a user runs it (subprocess), opening the short run."""
    import socket
    import subprocess
    import sys

    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "TRAJSCOPE_RUN": str(short_run_dir), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "panel", "serve", str(ROOT / "apps" / "trajscope.py"),
                             "--port", str(port), "--allow-websocket-origin", f"localhost:{port}"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    yield f"http://localhost:{port}/trajscope", proc
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()


def test_served_app_renders_plots(page, served_app_file):
    url, proc = served_app_file
    deadline = time.time() + 60
    while True:
        try:
            page.goto(url, timeout=5_000)
            break
        except pw.Error:
            assert proc.poll() is None and time.time() < deadline, "panel serve did not start"
            time.sleep(0.5)
    page.locator(".ts-token-strip").wait_for(timeout=TIMEOUT)
    wait_until(lambda: page.locator("canvas").count() >= 3, page, timeout=TIMEOUT)
    assert "Step 0 / 11" in readout(page)
    assert "does decode still look like prefill" in page.content()
    # each plot is a Bokeh figure with a title that says what it shows
    titles = page.evaluate(TITLES)
    assert any("telemetry" in t for t in titles), titles
    page.locator(".bk-tab", has_text="Attention").click()  # analyses sit in tabs, drawn when first shown
    wait_until(lambda: any("Attention weights" in t for t in page.evaluate(TITLES)), page, timeout=TIMEOUT)


def test_generate_streams_and_counter_advances(page):
    apps = serve(page, run_dir="/nonexistent", autostart=False, max_new_tokens=16)
    app = apps[0]
    seen_server = []
    app.state.param.watch(lambda e: seen_server.append(e.new), "progress")
    page.locator(".ts-generate button").click()
    seen, t0 = set(), time.time()
    while time.time() - t0 < 120:
        txt = text(page, ".ts-ticker")
        if "Generating: step" in txt:
            seen.add(txt)
        if "Done" in text(page, ".ts-status"):
            break
        time.sleep(0.02)
    assert "Done" in text(page, ".ts-status")
    # steps arrive in batches (a few per second), in order; the long-run streaming is in test_generate_browser
    assert seen_server == sorted(set(seen_server)) and seen_server[-1] == 16
    wait_until(lambda: "Step 15 / 15" in readout(page), page, timeout=TIMEOUT)
    assert page.locator("canvas").count() >= 3
    # bad input shows a readable message and the app stays usable
    page.locator(".ts-prompt textarea").fill("")
    page.locator(".ts-prompt textarea").blur()
    page.locator(".ts-generate button").click()
    wait_until(lambda: "prompt is empty" in text(page, ".ts-error"), page, timeout=TIMEOUT)


def test_the_autostarted_first_page_raises_no_script_error(page):
    """The page without a run starts Generate as it is drawn; the buttons that run disables must not get that
    change before the browser has rendered them (BokehJS then throws on the button's missing element)."""
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    apps = serve(page, run_dir="/nonexistent", max_new_tokens=8)
    wait_until(lambda: apps[0].state.trajectory is not None and not apps[0].state.busy, page, timeout=120_000)
    wait_until(lambda: "Step 7 / 7" in readout(page), page, timeout=TIMEOUT)
    page.wait_for_timeout(500)
    assert errors == []
    assert page.locator(".ts-generate button").is_enabled() and page.locator(".ts-stop button").is_disabled()


def test_player_and_arrow_keys_move_marker(page, short_run_dir):
    apps = serve(page, run_dir=short_run_dir)
    app = apps[0]
    wait_until(lambda: page.locator("canvas").count() >= 3, page, timeout=TIMEOUT)
    span_id = app.telemetry.cursors["attention"].annotations[0][0].id
    span_at = lambda: page.evaluate(  # noqa: E731  the cursor's location as the browser holds it
        f"() => Bokeh.documents.map(d => d.get_model_by_id('{span_id}')).filter(m => m)[0].location")
    assert span_at() == 0
    page.locator(".ts-player button.next").click()  # the player's "next step" button
    wait_until(lambda: "Step 1 / 11" in readout(page), page, timeout=TIMEOUT)
    # the readout and the step box are separate models: their changes may reach the browser in separate frames
    wait_until(lambda: page.locator(".ts-step-box input").input_value() == "1", page, timeout=TIMEOUT)
    wait_until(lambda: span_at() == 1, page, timeout=TIMEOUT)
    page.evaluate("() => document.activeElement && document.activeElement.blur()")  # keys go to the page
    page.keyboard.press("ArrowRight")
    page.keyboard.press("ArrowRight")
    wait_until(lambda: "Step 3 / 11" in readout(page), page, timeout=TIMEOUT)
    wait_until(lambda: span_at() == 3, page, timeout=TIMEOUT)
    page.keyboard.press("ArrowLeft")
    wait_until(lambda: app.state.step == 2 and span_at() == 2, page, timeout=TIMEOUT)
    # typing in a text field does not move the step
    page.locator(".ts-prompt textarea").press("ArrowLeft")
    time.sleep(0.3)
    assert app.state.step == 2


def test_parquet_download_reads_back(page, short_run_dir, tmp_path, short_run):
    serve(page, run_dir=short_run_dir)
    page.locator(".bk-tab", has_text="Export").click()
    button = page.locator(".ts-download-table")
    button.wait_for(timeout=TIMEOUT)
    with page.expect_download(timeout=TIMEOUT) as info:
        button.locator("button, a").first.click()
    path = tmp_path / info.value.suggested_filename
    info.value.save_as(path)
    assert path.name.endswith("-tokens.parquet")
    df = pl.read_parquet(path)
    assert df.height == short_run.tokens.height == short_run.prompt_len + 12
    assert df["pos"].to_list() == list(range(df.height))
    assert (df["phase"] == "decode").sum() == 12


def test_paths_outside_the_data_directories_are_refused(page, short_run_dir, tmp_path_factory):
    outside = pathlib.Path("/tmp") / f"trajscope-outside-{os.getpid()}"  # not under the tests' data directories
    outside.mkdir(exist_ok=True)
    (outside / "meta.json").write_text("{}")
    link = short_run_dir.parent / "escape"  # inside a data directory, pointing out of it
    if not link.exists():
        link.symlink_to(outside)
    apps = serve(page, run_dir=short_run_dir)
    app = apps[0]
    wait_until(lambda: page.locator("canvas").count() >= 3, page, timeout=TIMEOUT)
    shown = app.state.trajectory.run_id
    for bad in ("/etc", "../../..", "/proc/self", str(link)):
        box = page.get_by_label("Open a saved run directory", exact=True)
        box.fill(bad)
        box.press("Enter")
        page.locator(".ts-open button").click()
        wait_until(lambda: "outside the directories this server reads" in text(page, ".ts-error"), page, timeout=TIMEOUT)
        assert app.state.trajectory.run_id == shown  # nothing was read; the run on screen stays
        app.state.error = ""
        wait_until(lambda: "outside" not in text(page, ".ts-error"), page, timeout=TIMEOUT)
    # the Model box is a dropdown of the operator's models: nothing else can be chosen in the browser
    options = page.locator(".ts-model select option").all_inner_texts()
    assert options and "/etc/passwd" not in options and set(options) <= {*operator.config().models, "sample"}
    # a model that is not on the list (set by a script, not the page): refused at the click, nothing is loaded
    app.state.model_source = "/etc/passwd"
    page.locator(".ts-generate button").click()
    wait_until(lambda: "not on this server's list" in text(page, ".ts-error"), page, timeout=TIMEOUT)
    assert app.controls.job is None and not app.state.busy


def test_a_full_server_says_so(page, short_run_dir, monkeypatch, browser):
    from trajscope.ui import operator

    monkeypatch.setenv("TRAJSCOPE_MAX_SESSIONS", "1")
    operator.configure(None)
    apps = serve(page, run_dir=short_run_dir)
    wait_until(lambda: len(apps) == 1, page, timeout=TIMEOUT)
    second = browser.new_page()
    second.goto(page.url)
    second.get_by_text("This trajscope server is full").wait_for(timeout=TIMEOUT)
    assert apps[1:] == [None] and operator.SESSIONS.open == 1  # no second app was built
    second.close()


def test_clicking_a_token_or_a_curve_in_the_browser_moves_the_step(page, short_run_dir):
    """Clicks must reach the server from the real page (a Tap on a DynamicMap of overlays once never fired)."""
    apps = serve(page, run_dir=short_run_dir)
    app = apps[0]
    wait_until(lambda: page.locator(".ts-token-strip canvas").count() >= 1, page, timeout=TIMEOUT)
    app.state.go(9)
    wait_until(lambda: "Step 9 / 11" in readout(page), page, timeout=TIMEOUT)
    taps = []
    app.tokens.strip.on_click(lambda x, y: taps.append((x, y)))
    strip = page.locator(".ts-token-strip canvas").first
    strip.scroll_into_view_if_needed()
    b = strip.bounding_box()
    page.mouse.click(b["x"] + 24, b["y"] + 50)  # the first prompt token ("def"): read at step 0
    wait_until(lambda: bool(taps) and app.state.step == 0, page, timeout=TIMEOUT)
    wait_until(lambda: "Step 0 / 11" in readout(page), page, timeout=TIMEOUT)
    curves = page.locator(".ts-telemetry canvas").first
    curves.scroll_into_view_if_needed()
    c = curves.bounding_box()
    page.mouse.click(c["x"] + 0.5 * c["width"], c["y"] + 0.5 * c["height"])
    wait_until(lambda: app.state.step > 0, page, timeout=TIMEOUT)  # somewhere mid-run on the telemetry plot


def test_the_page_requests_nothing_outside_its_server(page, short_run_dir):
    """Newcomer item: no Google Fonts or CDN request; every tab draws from the server's own resources."""
    requested: list[str] = []
    page.on("request", lambda r: requested.append(r.url))
    serve(page, run_dir=short_run_dir)
    wait_until(lambda: page.locator("canvas").count() >= 3, page, timeout=TIMEOUT)
    for tab in ("Attention", "SAE features", "Drift", "Steering", "Eviction", "Export", "Overview"):
        page.locator(".bk-tab", has_text=tab).click()
        time.sleep(0.5)
    outside = [u for u in requested if not u.startswith(("http://localhost", "ws://localhost", "data:", "blob:"))]
    assert requested and not outside, outside
