"""A child that a column gains while BokehJS is still building the column's view is drawn with the patch and lost
without it (what :mod:`trajscope.ui.views.late_children` mends)."""

from __future__ import annotations

import pytest
from bokeh.models import CustomJS, Div

from trajscope.ui.views import late_children

pytestmark = [pytest.mark.ui, pytest.mark.skipif(not late_children.needed(), reason="the patch is for BokehJS 3.9")]
pw = pytest.importorskip("playwright.sync_api")
from panel.io.state import set_curdoc  # noqa: E402
from panel.tests.util import serve_component  # noqa: E402
import panel as pn  # noqa: E402

# the first child's view takes 800 ms to build (as a figure can at page open on a slow host); the late child is
# sent 200 ms after the column, while that build is still awaited
SLOW = """
const view = Bokeh.Models.get("Div").prototype.default_view.prototype
const lazy_initialize = view.lazy_initialize
view.lazy_initialize = async function () {
  await new Promise(resolve => setTimeout(resolve, 800))
  await lazy_initialize.call(this)
}
"""


@pytest.mark.parametrize("patched", [True, False], ids=["patched", "as BokehJS 3.9 ships"])
def test_a_child_sent_while_the_column_is_being_built(page, patched):
    columns = []

    def app():
        doc = pn.state.curdoc
        doc.js_on_event("document_ready", CustomJS(code=SLOW))
        if patched:
            assert late_children.install(doc)
        outer = pn.Column()

        def draw():
            column = pn.Column(pn.pane.Bokeh(Div(text="slow child")))
            columns.append(column)
            outer[:] = [column]

            def late():
                with set_curdoc(doc):
                    column.append(pn.pane.Markdown("late child"))

            doc.add_timeout_callback(late, 200)

        pn.state.onload(draw)
        return outer

    serve_component(page, app)
    page.get_by_text("slow child", exact=True).wait_for(timeout=30_000)
    page.wait_for_timeout(1500)  # long after the late child was sent
    assert len(columns[0].objects) == 2  # the server's column has it either way
    assert page.get_by_text("late child", exact=True).count() == (1 if patched else 0)
