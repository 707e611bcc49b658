"""The cards' busy spinner in headless Chromium: it follows its ``busy`` parameter without a layout change."""

from __future__ import annotations

import panel as pn
import param
import pytest

from trajscope.ui.views.spinner import Spinner

pytestmark = pytest.mark.ui
pytest.importorskip("playwright.sync_api")
from panel.tests.util import serve_component, wait_until  # noqa: E402


class Work(param.Parameterized):
    busy = param.Boolean(default=False)


def test_the_spinner_turns_while_busy_and_sends_no_layout_change(page):
    work = Work()
    spinner = Spinner(value=work.param.busy)
    serve_component(page, pn.Row(spinner))
    ring = page.locator(".ts-spin")
    ring.wait_for(state="attached", timeout=30_000)
    assert ring.get_attribute("aria-label") == "idle" and "on" not in ring.get_attribute("class")
    # every patch the browser applies: a spinner change must touch only the spinner's own `value`
    page.evaluate("""() => { window.__attrs = [];
      for (const doc of Bokeh.documents) { const orig = doc.apply_json_patch.bind(doc);
        doc.apply_json_patch = (p, b) => { for (const e of p.events || []) window.__attrs.push(e.attr || e.kind);
                                           return orig(p, b); }; } }""")
    work.busy = True
    wait_until(lambda: "on" in ring.get_attribute("class").split(), page, timeout=10_000)
    assert ring.get_attribute("aria-label") == "running" and ring.is_visible()
    work.busy = False
    wait_until(lambda: "on" not in ring.get_attribute("class").split(), page, timeout=10_000)
    assert not ring.is_visible()  # hidden, its box kept: nothing around it moves
    assert page.evaluate("() => window.__attrs") == ["value", "value"]
