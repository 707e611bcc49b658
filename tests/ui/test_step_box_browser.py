"""The step box in the served app (headless Chromium): Enter commits it even where the page takes Enter
(JupyterLab), and a step outside the run says so."""

from __future__ import annotations

import pytest

from trajscope.ui.views.app import default_page

pytestmark = pytest.mark.ui
pw = pytest.importorskip("playwright.sync_api")
from panel.tests.util import wait_until  # noqa: E402

from browser import serve_app  # noqa: E402

TIMEOUT = 90_000
# what JupyterLab does: a capture listener on the document that takes Enter (its "edit cell" command)
LAB_TAKES_ENTER = """() => document.addEventListener('keydown', (e) => {
  if (e.key === 'Enter') { e.preventDefault(); window.labTook = (window.labTook || 0) + 1; }
}, true)"""


def test_step_box_takes_enter_and_names_steps_outside_the_run(page, short_run_dir):
    app = serve_app(page, lambda: default_page(short_run_dir), TIMEOUT)
    page.evaluate(LAB_TAKES_ENTER)
    box = page.locator(".ts-step-box input")
    box.fill("5")
    box.press("Enter")
    wait_until(lambda: app.state.step == 5, page, timeout=TIMEOUT)
    assert page.evaluate("() => window.labTook || 0") == 0  # the page never saw the step box's Enter
    page.locator(".ts-prompt textarea").press("Enter")  # other fields' Enter still reach the page
    assert page.evaluate("() => window.labTook || 0") == 1
    box.fill("99")
    box.press("Enter")
    note = page.locator(".ts-step-note").first  # Panel panes render inside a shadow root
    wait_until(lambda: "outside this run" in note.evaluate("el => (el.shadowRoot || el).textContent"), page,
               timeout=TIMEOUT)
    assert app.state.step == 5 and box.input_value() == "5"  # back to the step on screen, and it says why
