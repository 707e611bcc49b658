"""MathJax left out of trajscope's served pages, as it is out of its notebooks.

Panel 1.9 adds BokehJS's MathJax bundle (``bokeh-mathjax.min.js``) to a served page whenever the page's
document has a Panel HTML model when the page is requested, which every template page has (its
``js_area``). With MathJax loaded, every Markdown pane typesets the ``$$…$$``, ``\\[…\\]`` and ``\\(…\\)``
in its text. trajscope shows text that users and files supply in Markdown panes: tokens, prompts, run and
model names. A prompt holding ``$$x^2$$`` would then be shown as typeset math, not as it was typed, and
nothing trajscope itself shows is math. In a notebook Panel loads MathJax only when asked
(``pn.extension("mathjax")``).

:func:`install` makes a served document take the notebook's rule: Panel's test for "a Panel HTML model
is on the page" answers no for a marked document, so the bundle is left out unless a Bokeh model on the
page needs it (Bokeh's own test, a ``MathText`` or a TeX axis label, still applies). Measured on the
SmolLM2 page (Chromium trace, 2026-11-28): evaluating the bundle took 59–65 ms of the page's longest
loading task (181–198 ms, the one that parses the page and runs the bundles).
``tests/ui/test_no_mathjax_browser.py`` checks that the page loads no MathJax and shows ``$$x^2$$`` as typed,
and that an unmarked page typesets it.
"""

from __future__ import annotations

from panel.io import resources

MARK = "_trajscope_no_mathjax"  # the attribute set on a document whose page loads no MathJax


def _marked(roots) -> bool:
    return any(getattr(root.document, MARK, False) for root in roots if root.document is not None)


def _wrap(test):
    def panel_use_mathjax(roots) -> bool:
        return False if _marked(roots) else test(roots)

    panel_use_mathjax._trajscope = True
    return panel_use_mathjax


def install(doc) -> bool:
    """Leave MathJax out of ``doc``'s page; True if done (a document, and a Panel whose resources module has
    the test this wraps, ``_panel_use_mathjax``: Panel 1.9 has it)."""
    test = getattr(resources, "_panel_use_mathjax", None)
    if doc is None or test is None:
        return False
    if not getattr(test, "_trajscope", False):
        resources._panel_use_mathjax = _wrap(test)
    setattr(doc, MARK, True)
    return True
