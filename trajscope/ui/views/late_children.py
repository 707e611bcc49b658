"""Children a layout gains while BokehJS 3.9 is still building its view: drawn, not lost.

BokehJS builds a layout's view in three steps: it makes the view, awaits ``lazy_initialize`` (which
builds the views of the children the model has at that moment, and awaits theirs), and only then
connects the view's listeners (``connect_signals``). A change to the layout's children that arrives in
between, while some child is still being built, reaches a view that is not listening yet: the model
then has the new child and the view never builds it. No error is raised anywhere.

trajscope's page met this at page open. With the step bar staged (its Step card first, its Tokens card
in a message of its own a tick later, see :mod:`~trajscope.ui.views.staged`), the Tokens card's message
arrived while the step bar's view was still building the Step card, and the Tokens card was missing in
3 of 3 sessions, also with the two messages 400 ms apart. What the build awaited is the arrow keys'
component (:mod:`~trajscope.ui.views.keys`, a Panel ``JSComponent``), whose view awaits its compiled
module: on the sample model the patch below rebuilt late children once per page open in 3 of 3 opens,
and in none of 3 with that component left out of the step bar. Cards staged when their tab opens hold no
such component.

:func:`install` makes the page's ``LayoutDOMView.lazy_initialize`` build, before it returns, the views
of children that the model gained while the first ones were built, until each child has one (at most 8
rounds). Only gained children are looked for: a child removed meanwhile is not drawn anyway, since a
layout draws the views of its model's children, and some views (Panel's ``ReactiveESM`` in the light DOM)
keep views of removed children on purpose. A view whose children did not change meanwhile does no more
than look each child up once. Applied only with BokehJS 3.9.x, the release it was measured and checked on.
``tests/ui/test_late_children_browser.py`` slows one child's build in the browser to reproduce the loss
without the patch and checks that the patch draws the child; the app's guard test
(``tests/ui/test_staged_browser.py``) fails without it.
"""

from __future__ import annotations

import bokeh

from trajscope.ui.views._page_patch import bokeh_3_9, run_when_ready

# the page-side patch, run once BokehJS is loaded (idempotent)
PATCH = """
const proto = Bokeh.require("models/layouts/layout_dom").LayoutDOMView.prototype
if (!proto._trajscope_late_children) {
  const lazy_initialize = proto.lazy_initialize
  proto.lazy_initialize = async function () {
    await lazy_initialize.call(this)
    // children added while the first ones were being built: nothing was listening yet, so build them now (a
    // bounded number of rounds, each for the children added during the last)
    for (let round = 0; round < 8 && this.child_models.some(m => !this._child_views.has(m)); round++)
      await this.build_child_views()
  }
  proto._trajscope_late_children = true
}
"""


def needed(version: str = bokeh.__version__) -> bool:
    """Whether this BokehJS connects a layout view's listeners only after building its children (3.9.x:
    the release this was measured and checked on)."""
    return bokeh_3_9(version)


def install(doc) -> bool:
    """Run :data:`PATCH` in the browser when ``doc`` is ready there; True if it was added (a document, and a
    BokehJS that needs it)."""
    return needed() and run_when_ready(doc, PATCH)
