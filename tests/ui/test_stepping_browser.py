"""Stepping in the served app (headless Chromium): flat memory and labelled hovers.

The browser is asked for its own numbers: the count of Bokeh models in the
session's document and the JS heap (``performance.memory``, precise with
``--enable-precise-memory-info``, after a forced GC with ``--expose-gc``; both
flags are set in ``conftest.py``).
"""

from __future__ import annotations

import pytest

from trajscope.ui.views.app import default_page

pytestmark = pytest.mark.ui
pw = pytest.importorskip("playwright.sync_api")
from panel.tests.util import wait_until  # noqa: E402

from browser import serve_app  # noqa: E402

TIMEOUT = 90_000
N_MODELS = "() => Bokeh.documents.map(d => d.all_models.size).reduce((a, b) => a + b, 0)"
HEAP = "() => { window.gc(); return performance.memory.usedJSHeapSize; }"


@pytest.fixture
def app_page(page, short_run_dir):
    app = serve_app(page, lambda: default_page(short_run_dir), TIMEOUT)
    wait_until(lambda: page.locator("canvas").count() >= 3, page, timeout=TIMEOUT)
    return page, app


def step_to(page, app, target: int) -> None:
    """Press → or ← until the server's step is ``target`` (one key per step, each awaited)."""
    key = "ArrowRight" if target > app.state.step else "ArrowLeft"
    while app.state.step != target:
        before = app.state.step
        page.keyboard.press(key)
        wait_until(lambda: app.state.step != before, page, timeout=TIMEOUT)


@pytest.mark.soak
@pytest.mark.parametrize("tab", ["Overview", "Attention", "SAE features", "Drift"])
def test_memory_stays_flat_over_500_step_changes(app_page, tab):
    page, app = app_page
    page.locator(".bk-tab", has_text=tab).click()
    page.wait_for_timeout(2000)
    page.evaluate("() => document.activeElement && document.activeElement.blur()")
    last = app.state.n_steps - 1
    step_to(page, app, 0)
    changes, marks = 0, {}
    while changes < 500:
        target = last if app.state.step == 0 else 0
        n = abs(target - app.state.step)
        step_to(page, app, target)
        changes += n
        if 10 <= changes and "first" not in marks:
            page.wait_for_timeout(500)
            marks["first"] = (page.evaluate(N_MODELS), page.evaluate(HEAP))
    page.wait_for_timeout(1000)
    (m0, h0), (m1, h1) = marks["first"], (page.evaluate(N_MODELS), page.evaluate(HEAP))
    assert m1 <= 1.10 * m0, f"Bokeh models {m0} -> {m1} over {changes} step changes ({tab})"
    assert h1 <= 1.10 * h0, f"JS heap {h0 / 1e6:.1f} -> {h1 / 1e6:.1f} MB over {changes} step changes ({tab})"


def test_attention_hover_shows_integer_positions_and_token_text(app_page):
    page, app = app_page
    page.locator(".bk-tab", has_text="Attention").click()
    traj = app.state.trajectory
    wait_until(lambda: page.locator(".ts-attention-heatmap canvas").count() >= 1, page, timeout=TIMEOUT)
    canvas = page.locator(".ts-attention-heatmap canvas").first
    canvas.scroll_into_view_if_needed()
    page.wait_for_timeout(500)
    box = canvas.bounding_box()
    texts = []  # hover a few points of the plot area until a tooltip shows (the frame's margins vary)
    for fx, fy in [(0.4, 0.7), (0.3, 0.85), (0.5, 0.9), (0.2, 0.6)]:
        page.mouse.move(box["x"] + fx * box["width"], box["y"] + fy * box["height"])
        page.wait_for_timeout(400)
        tip = page.locator(".bk-tooltip-content")
        if tip.count() and tip.first.is_visible():
            texts.append(tip.first.inner_text())
    assert texts, "no tooltip appeared over the attention heatmap"
    tip = texts[0]
    fields = {}
    for ln in tip.splitlines():
        name, _, val = ln.partition(":")
        fields[name.strip()] = val.strip()
    for field in ("query pos", "key pos"):
        pos, phase, token = fields[field].split(" ", 2)
        assert pos.isdigit(), f"{field} is not an integer position: {fields[field]!r}"
        from trajscope.ui.plots import visible

        assert token == f"«{visible(traj.tokens['text'][int(pos)])}»", (field, fields[field])
        assert phase == ("prefill" if int(pos) < traj.prompt_len else "decode")
