"""The served app loads no MathJax, so a Markdown pane shows ``$$x^2$$`` as typed
(:mod:`trajscope.ui.views.no_mathjax`); a page without the mark typesets it (what the mark prevents)."""

from __future__ import annotations

import panel as pn
import pytest

from trajscope.ui.views import no_mathjax
from trajscope.ui.views.app import Page

pytestmark = pytest.mark.ui
pw = pytest.importorskip("playwright.sync_api")
from panel.tests.util import serve_component, wait_until  # noqa: E402

TEXT = "Price $$x^2$$ today"  # as a prompt or a token sequence could hold it
SCRIPTS = "() => [...document.scripts].map(s => s.src).filter(s => s.includes('mathjax'))"
# the pane's text as shown, and how many MathJax elements the page holds (shadow roots included)
SHOWN = r"""() => {
  let mjx = 0, text = null
  const visit = root => {
    for (const el of root.querySelectorAll("*")) {
      if (el.tagName.toLowerCase().startsWith("mjx-")) mjx++
      if (el.classList && el.classList.contains("ts-math-probe")) text = el.shadowRoot ? el.shadowRoot.textContent : el.textContent
      if (el.shadowRoot) visit(el.shadowRoot)
    }
  }
  visit(document)
  return {mjx, text}
}"""


def _page(mark: bool):
    def make():
        if mark:
            no_mathjax.install(pn.state.curdoc)
        return Page(title="math", main=[pn.pane.Markdown(TEXT, css_classes=["ts-math-probe"])], busy_indicator=None)
    return make


def test_the_app_page_loads_no_mathjax(app_page):
    page, _ = app_page
    assert page.evaluate("() => document.scripts.length") > 3  # the page and its bundles
    assert page.evaluate(SCRIPTS) == []


@pytest.mark.parametrize("mark", [True, False], ids=["marked: as typed", "unmarked: typeset"])
def test_a_markdown_pane_shows_tex_as_typed_only_where_marked(page, mark):
    serve_component(page, _page(mark))
    wait_until(lambda: (page.evaluate(SHOWN)["text"] or "").strip() != "", page, timeout=30_000)
    page.wait_for_timeout(500)  # MathJax typesets as the pane renders: give it time to show it did
    shown = page.evaluate(SHOWN)
    if mark:
        assert page.evaluate(SCRIPTS) == [] and shown["mjx"] == 0 and TEXT in shown["text"], shown
    else:  # Panel's default: the bundle is loaded and the pane typesets x²
        assert page.evaluate(SCRIPTS) != [] and shown["mjx"] > 0 and "$$" not in shown["text"], shown
