"""BokehJS 3.9's CSS-variable reads for plot visuals, skipped on trajscope's pages (none of them defines one).

BokehJS 3.9 lets CSS variables (``--bk-axis-line-color``, ``--bk-major-label-text-color``, …) override a
plot's line, fill and text visuals, so before it paints any of them it looks the variable up with
``getComputedStyle(element).getPropertyValue(...)``. While a card's figures are being added the page's
styles are dirty, and each of those reads forces the browser to recalculate them. In a Chromium profile of
the Eviction result on SmolLM2 (four figures, six main-thread tasks), ``getPropertyValue`` was the largest
self time of the page's JavaScript, 272–304 ms of 2.0–2.2 s busy. Bokeh's issue #15286 reports the same;
Bokeh's PR #15205 (merged upstream, not in 3.9.2, the newest release on PyPI on 2026-11-28) keeps each
visual's reads until the next microtask. That cache, applied here, removed little (232–312 ms left):
most reads are the first of their visual in a paint.

No stylesheet on trajscope's pages defines a ``--bk-*`` variable: Panel 1.9's and Bokeh 3.9's own CSS define
none, trajscope adds none (``tests/ui/test_css_reads_browser.py`` checks every stylesheet of a served page,
shadow roots included), so every one of those reads returns the empty string, which tells BokehJS to use the
model's own value. :func:`install` makes the page return that empty string without reading. Measured on the
same Eviction result, three runs each: the longest task 221–225 ms without it and 125–182 ms with it, busy
time 1.6–1.9 s (``benchmarks/app_cards.py`` gives the app-wide reading). A page that did define such a
variable would lose it: add one only together with removing this.
"""

from __future__ import annotations

import bokeh

from trajscope.ui.views._page_patch import bokeh_3_9, run_when_ready

# the page-side patch, run once BokehJS is loaded (idempotent)
PATCH = """
const proto = Bokeh.require("core/visuals/visual").VisualProperties.prototype
if (!proto._trajscope_no_css_reads) {
  proto._get_css_value = function (name) { return "" }  // no --bk-* variable on this page: the model's value
  proto._trajscope_no_css_reads = true
}
"""


def needed(version: str = bokeh.__version__) -> bool:
    """Whether this BokehJS looks up a CSS variable for every visual property it paints (3.9.x: the release
    this was measured and checked on)."""
    return bokeh_3_9(version)


def install(doc) -> bool:
    """Run :data:`PATCH` in the browser when ``doc`` is ready there; True if it was added (a document, and a
    BokehJS that needs it)."""
    return needed() and run_when_ready(doc, PATCH)
