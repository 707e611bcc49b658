"""Step cursors (``trajscope.ui.views._cursor``): one Cursor follows the step on every figure it was attached to,
whether or not the figure is in a document yet; a figure that is gone leaves the cursor."""

from __future__ import annotations

import gc

from bokeh.document import Document
from bokeh.plotting import figure

import trajscope as ts
from trajscope.studies.drift.card import DriftView
from trajscope.ui.artefacts import sample_data_dir
from trajscope.ui.state import AppState
from trajscope.ui.views._cursor import Cursor, vline


def _cursor() -> Cursor:
    return Cursor([vline()], lambda step: [{"location": float(step)}])


def test_a_cursor_moves_on_every_figure_attached_before_any_document():
    c, figs = _cursor(), [figure(), figure(), figure()]
    for f in figs:
        c.attach(f)
    c.set_step(4)
    assert [a[0].location for a in c.annotations] == [4.0, 4.0, 4.0]
    assert [[r.location for r in f.center if r in sum(c.annotations, [])] for f in figs] == [[4.0]] * 3
    doc = Document()
    doc.add_root(figs[0])
    c.set_step(2)
    assert [a[0].location for a in c.annotations] == [2.0, 2.0, 2.0]


def test_a_figure_that_is_gone_leaves_the_cursor():
    c = _cursor()
    first, last = figure(), figure()
    c.attach(first)
    c.attach(figure())  # nothing else holds this one: it is gone once collected
    gc.collect()
    c.attach(last)  # an attach prunes the entries of figures that are gone
    assert len(c.annotations) == 2
    assert c.annotations[0][0] in first.center and c.annotations[1][0] in last.center
    c.attach(first)  # attaching again only moves it
    assert len(c.annotations) == 2


def test_the_drift_cards_cursor_follows_the_step_on_both_figures():
    traj = ts.Trajectory.load(sample_data_dir() / "runs" / "demo")
    state = AppState()
    state.set_trajectory(traj, step=0)
    view = DriftView(state=state)
    state.step = 5
    for fig in (view.heatmap.figure, view.curves.figure):
        assert [a.location for a in fig.center if a in sum(view.cursor.annotations, [])] == [5.0]
