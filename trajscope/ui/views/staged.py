"""A card's column (or row) that reaches a served page a part at a time.

When a tab opens, the browser builds the views of everything the server sends for it in one
main-thread task: for a card with several figures, tables and widgets that task was over 200 ms
on SmolLM2 (the SAE features card's first opening, 225–275 ms; Chromium trace: mostly BokehJS
building views, then style and layout). A :class:`StagedColumn` sends its first ``first``
children with the tab, then one more child per event-loop tick, each in its own message, so the
browser builds them in separate tasks and can paint and take keypresses between them.

Only the first drawing of the column for a page (a Bokeh root) is staged, and only in a served
page: in a notebook or a test without a server the column is drawn whole, as ``pn.Column``.
Children already drawn are reused, as ``pn.Column`` does; a change to the column's objects while
it is being staged draws the new list from where the staging is. Where it is used: the step bar's two
cards (Step, Tokens) and the Overview's figures at page open, the SAE features card, Attention's two
figures, the Drift figures, and the Eviction and Compaction results (measured in docs/performance.md,
"Cards drawn a part at a time" and "The page's parts staged"). At page open a part can arrive while
BokehJS is still building its column's view; :mod:`~trajscope.ui.views.late_children` makes the page draw it.
"""

from __future__ import annotations

import functools

import panel as pn
from panel.io.state import set_curdoc

from trajscope.ui.views._base import served


class Staged:
    """The staging, for a Panel list layout (``pn.Column``, ``pn.Row``): mixed in before the layout's class."""

    def __init__(self, *objects, first: int = 1, **params):
        super().__init__(*objects, **params)
        self._first = max(1, int(first))
        self._staging: dict[str, int] = {}  # per root being staged: how many children are drawn

    def _get_objects(self, model, old_objects, doc, root, comm=None):
        ref = root.ref["id"]
        n = self._staging.get(ref)
        first_drawing = not old_objects and not model.children
        if n is None and first_drawing and comm is None and served(doc) and len(self.objects) > self._first:
            n = self._staging[ref] = self._first
            doc.add_next_tick_callback(functools.partial(self._more, ref, model, doc, root))
        if n is None or n >= len(self.objects):
            self._staging.pop(ref, None)
            return super()._get_objects(model, old_objects, doc, root, comm)
        for obj in old_objects:  # as the parent: a child taken out of the column lets its models go
            if obj not in self.objects:
                obj._cleanup(root)
        new, old = [], []
        for pane in self.objects[:n]:
            if ref in pane._models:
                child = pane._models[ref][0]
                old.append(child)
            else:
                child = pane._get_model(doc, root, model, comm)
            new.append(child)
        return new, old

    def _more(self, ref: str, model, doc, root) -> None:
        """One tick: draw the next child, and schedule another while some are left. The change goes through
        Panel's own update (as a change of the column's objects), which also gives the new child the page's
        design: set directly, its stylesheets were redone at the next tab change, restyling the whole page
        in one task (0.6–0.9 s)."""
        n = self._staging.get(ref)
        if n is None or ref not in self._models or self._models[ref][0] is not model:
            self._staging.pop(ref, None)  # drawn whole since, or the page dropped the column
            return
        self._staging[ref] = n + 1
        with set_curdoc(doc):
            self.param.trigger("objects")
        if ref in self._staging:
            doc.add_next_tick_callback(functools.partial(self._more, ref, model, doc, root))


class StagedColumn(Staged, pn.Column):
    """``pn.Column`` whose first drawing on a served page sends ``first`` children, then one per tick."""


class StagedRow(Staged, pn.Row):
    """``pn.Row`` whose first drawing on a served page sends ``first`` children, then one per tick."""
