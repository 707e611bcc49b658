"""Fast step cursors: Bokeh annotations moved in place when the step changes.

Redrawing a figure for every step is too slow for scrubbing a long run. The figures are
filled once per run / selection; a :class:`Cursor` adds a few Bokeh annotations to each
figure (:meth:`Cursor.attach`) and, on a step change, only sets their coordinates, which
Bokeh sends to the browser as a handful of property changes. The coordinates come from the
pure functions of :mod:`trajscope.ui.plots` (``*_box``).
"""

from __future__ import annotations

from typing import Callable

import weakref
from functools import partial

from bokeh.models import BoxAnnotation, Span
from panel.io.document import unlocked
from panel.io.notebook import push_notebook
from panel.io.state import state

from trajscope.ui.plots import CURSOR_COLOR
from trajscope.ui.views._base import served


def box(**style) -> Callable[[], BoxAnnotation]:
    """Factory of an outline box annotation (data coordinates)."""
    def make():
        kw = dict(fill_alpha=0.0, line_color=CURSOR_COLOR, line_width=3, left=0, right=0, top=0, bottom=0,
                  level="overlay", editable=False)
        kw.update(style)
        return BoxAnnotation(**kw)
    return make


def vline(**style) -> Callable[[], Span]:
    """Factory of a vertical line annotation at an x data coordinate."""
    def make():
        kw = dict(dimension="height", location=0, line_color=CURSOR_COLOR, line_width=2, level="overlay")
        kw.update(style)
        return Span(**kw)
    return make


class Cursor:
    """Annotations that follow the step on every figure a base plot was rendered into.

    Args:
        factories: one factory per annotation (see :func:`box`, :func:`vline`).
        props: ``props(step) -> list[dict]``, the annotation properties at ``step`` (one dict per factory;
            ``visible=False`` hides one).
    """

    def __init__(self, factories: list[Callable], props: Callable[[int], list[dict]]):
        self.factories, self.props = factories, props
        self.annotations: list[list] = []
        self._figures: list[weakref.ref] = []  # the figure of each entry of ``annotations``
        self.step = 0

    def attach(self, fig) -> None:
        """Add the annotations to the Bokeh figure ``fig`` (once; again only moves them to the current step)."""
        mine = [a for a in self.annotations if a[0] in fig.center]
        if mine:
            self._apply(mine[0], self.props(self.step))
            return
        # figures gone (garbage-collected) leave; a figure not yet in a document stays
        live = [(a, f) for a, f in zip(self.annotations, self._figures) if f() is not None]
        self.annotations, self._figures = [a for a, _ in live], [f for _, f in live]
        anns = [f() for f in self.factories]
        for a in anns:
            fig.add_layout(a)
        self.annotations.append(anns)
        self._figures.append(weakref.ref(fig))
        self._apply(anns, self.props(self.step))

    @staticmethod
    def _apply(anns, props) -> None:
        for a, p in zip(anns, props):
            p = dict(p)
            p.setdefault("visible", True)
            a.update(**p)

    def set_step(self, step: int, *panes) -> None:
        """Move every annotation to ``step``; ``panes`` are pushed to Jupyter (no-op when served)."""
        self.step = step
        props = self.props(step)
        for anns in self.annotations:
            doc = anns[0].document
            apply = partial(self._apply, anns, props)
            # Panel's own rule for touching models: now when this thread may dispatch the document's
            # events (dispatching them to the sockets), else on the session's next tick, under its lock.
            if not served(doc) or state._unblocked(doc):
                with unlocked():
                    apply()
            else:
                doc.add_next_tick_callback(apply)
        if panes:
            push_notebook(*panes)
