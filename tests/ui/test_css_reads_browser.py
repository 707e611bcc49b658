"""The served page skips BokehJS's CSS-variable reads, and no stylesheet on it defines a ``--bk-*`` variable
(what makes skipping them draw the same; see :mod:`trajscope.ui.views.css_reads`)."""

from __future__ import annotations

import pytest

from trajscope.ui.views import css_reads

pytestmark = pytest.mark.ui
pw = pytest.importorskip("playwright.sync_api")
from panel.tests.util import wait_until  # noqa: E402
from browser import open_card  # noqa: E402

# every CSS custom property named --bk-… that a stylesheet or an inline style of the page defines, shadow roots
# included (Bokeh and Panel draw inside shadow roots, each with its own and adopted stylesheets)
DEFINED = r"""() => {
  const found = new Set(), seen = new Set()
  const rules = sheet => { try { return [...sheet.cssRules] } catch (e) { return [] } }
  const scan = text => { for (const m of text.matchAll(/(--bk-[\w-]+)\s*:/g)) found.add(m[1]) }
  const sheets = root => [...(root.styleSheets || []), ...(root.adoptedStyleSheets || [])]
  const visit = root => {
    for (const sheet of sheets(root)) {
      if (seen.has(sheet)) continue
      seen.add(sheet)
      for (const rule of rules(sheet)) scan(rule.cssText)
    }
    for (const el of root.querySelectorAll("*")) {
      if (el.getAttribute("style")) scan(el.getAttribute("style"))
      if (el.shadowRoot) visit(el.shadowRoot)
    }
  }
  visit(document)
  return {found: [...found], sheets: seen.size}
}"""

PATCHED = "() => !!Bokeh.require('core/visuals/visual').VisualProperties.prototype._trajscope_no_css_reads"


@pytest.mark.skipif(not css_reads.needed(), reason="the patch is for BokehJS 3.9")
def test_the_page_skips_the_reads_and_defines_no_variable_they_would_find(app_page):
    page, app = app_page
    wait_until(lambda: page.evaluate(PATCHED), page, timeout=30_000)
    for title in [t for t, _ in app._cards]:  # every card drawn, so its stylesheets are on the page
        open_card(page, app, title)
        page.wait_for_timeout(300)
    result = page.evaluate(DEFINED)
    assert result["sheets"] > 10 and result["found"] == [], result  # a page with its stylesheets, none defining one


def test_a_page_with_a_variable_would_have_found_it(page):
    """The scan finds a --bk-* variable where one is defined (so its empty answer above means none is)."""
    page.set_content("<style>div { --bk-axis-line-color: red }</style><div></div>")
    assert page.evaluate(DEFINED)["found"] == ["--bk-axis-line-color"]
