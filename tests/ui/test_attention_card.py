"""The Attention card's Bokeh figures hold the run's attention, cell by cell, and change only their data.

The expected values are computed here from the run itself (its kept attention rows, or a loop over its
``attention`` table), not with the functions the card draws with.
"""

from __future__ import annotations

import numpy as np
import panel as pn
import pytest
from bokeh.document import Document
from bokeh.document.events import ColumnDataChangedEvent, ModelChangedEvent
from bokeh.events import Tap

import trajscope as ts
from trajscope.ui.plots import SPARSE_NOTE
from trajscope.ui.state import MEAN, AppState
from trajscope.ui.views.attention import AttentionView

STATS = ("entropy_norm", "prefix_mass", "sink_mass")


def card(run, **state) -> tuple[AttentionView, Document]:
    st = AppState()
    st.set_trajectory(run, step=0)
    st.param.update(**state)
    view = AttentionView(state=st)
    doc = Document()
    doc.add_root(pn.panel(view).get_root(doc))
    return view, doc


def image(fig) -> np.ndarray:
    """The figure's image as the browser draws it: row i at y ∈ [y + i, y + i + 1], column j at x ∈ [x + j, …]."""
    data = fig.source.data
    img = np.asarray(data["image"][0])
    assert data["x"][0] == -0.5 and data["y"][0] == -0.5  # cell centres at integer coordinates
    assert (data["dw"][0], data["dh"][0]) == (img.shape[1], img.shape[0])  # one unit per cell
    return img


def kept_keys_matrix(run, layer: int, head: int | None) -> np.ndarray:
    """The query × key matrix from the table's top keys, by a plain loop over the rows."""
    n = int(run.attention["pos"].max()) + 1
    out = np.zeros((n, n))
    rows = [r for r in run.attention.iter_rows(named=True) if r["layer"] == layer]
    n_heads = len({r["head"] for r in rows})
    for r in rows:
        if head is not None and r["head"] != head:
            continue
        for k, w in zip(r["top_pos"] or [], r["top_w"] or []):
            if k is not None and w is not None:
                out[r["pos"], k] += w / (1 if head is not None else n_heads)
    return out


def grid_at(run, step: int, stat: str) -> np.ndarray:
    """``stat`` per layer × head of the query at ``step`` (the last prompt row at step 0), from the table."""
    q = run.prompt_len - 1 if step == 0 else run.prompt_len + step - 1
    rows = [r for r in run.attention.iter_rows(named=True) if r["pos"] == q and r["step"] == step]
    out = np.full((max(r["layer"] for r in rows) + 1, max(r["head"] for r in rows) + 1), np.nan)
    for r in rows:
        out[r["layer"], r["head"]] = r[stat]
    return out


@pytest.mark.parametrize("head", [MEAN, 2])
def test_heatmap_is_the_kept_attention_rows_query_0_on_top(short_run, head):
    view, _ = card(short_run, layer=0, head=head)
    rows = short_run.attention_rows(0).numpy().astype(np.float64)  # [heads, query, key]
    want = rows.mean(0) if head == MEAN else rows[head]
    fig = view.heatmap_fig
    np.testing.assert_allclose(image(fig), want, rtol=1e-6, atol=1e-7)
    f = fig.figure
    n = want.shape[0]
    assert (f.y_range.start, f.y_range.end) == (n - 0.5, -0.5)  # inverted: query row 0 on top
    assert (f.x_range.start, f.x_range.end) == (-0.5, want.shape[1] - 0.5)
    assert f.xaxis[0].axis_label == "key position (attended token)"
    assert f.yaxis[0].axis_label == "query position (step 0 = prompt rows)"
    P = short_run.prompt_len
    assert fig.key_split.location == fig.query_split.location == P - 0.5
    assert f.title.text == f"Attention weights, layer 0, {'mean over heads' if head == MEAN else 'head 2'}"
    labels = fig.hover.formatters["$y"].args["labels"]
    assert labels == fig.hover.formatters["$x"].args["labels"] and len(labels) == len(short_run.tokens)
    text = short_run.tokens["text"][P + 1]
    assert labels[P + 1].startswith(f"{P + 1} decode «") and text.strip() in labels[P + 1]
    assert [k for k, _ in fig.hover.tooltips] == ["query pos", "key pos", "weight"]
    assert fig.mapper.high == pytest.approx(max(want.max(), 1e-2)) and fig.mapper.low == 1e-3


@pytest.mark.parametrize("head", [MEAN, 1])
def test_heatmap_of_a_layer_without_rows_is_rebuilt_from_the_top_keys(short_run, head):
    view, _ = card(short_run, layer=4, head=head)  # the run kept the rows of layers 0 and 1 only
    want = kept_keys_matrix(short_run, 4, None if head == MEAN else head)
    got = image(view.heatmap_fig)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    assert (got > 0).sum() >= got.shape[0]  # every query row keeps some keys
    assert view.heatmap_fig.figure.title.text.endswith(SPARSE_NOTE)
    view.state.layer = 1
    assert SPARSE_NOTE not in view.heatmap_fig.figure.title.text


@pytest.mark.parametrize("stat", STATS)
def test_grid_is_the_statistic_of_every_layer_and_head_at_the_step(short_run, stat):
    view, _ = card(short_run, grid_stat=stat, layer=3, head=1)
    for step in (0, 4, short_run.n_steps - 1):
        view.state.step = step
        want = grid_at(short_run, step, stat)
        np.testing.assert_allclose(image(view.grid_fig), want, rtol=1e-6)
    f = view.grid_fig.figure
    n_layers, n_heads = want.shape
    assert (f.y_range.start, f.y_range.end) == (n_layers - 0.5, -0.5)  # layer 0 on top
    assert (f.xaxis[0].axis_label, f.yaxis[0].axis_label) == ("head", "layer")
    sel = view.grid_fig.selection
    assert (sel.left, sel.right, sel.bottom, sel.top) == (0.5, 1.5, 2.5, 3.5)  # layer 3, head 1
    view.state.head = MEAN
    assert (sel.left, sel.right) == (-0.5, n_heads - 0.5)  # the whole layer
    other = next(s for s in STATS if s != stat)
    view.state.grid_stat = other
    np.testing.assert_allclose(image(view.grid_fig), grid_at(short_run, view.state.step, other), rtol=1e-6)


def test_a_step_change_changes_only_the_grid_values_and_the_cursor(short_run):
    view, doc = card(short_run, layer=0, head=MEAN)
    events = []
    doc.on_change(events.append)
    view.state.step = 6
    heat, grid = view.heatmap_fig, view.grid_fig
    changed = set()
    for e in events:
        if isinstance(e, ColumnDataChangedEvent):
            changed |= {(e.model.id, f"data.{c}") for c in e.cols}
        elif isinstance(e, ModelChangedEvent):
            changed.add((e.model.id, "data" if e.attr == "data" else e.attr))
    in_figures = {m.id for fig in (heat.figure, grid.figure) for m in fig.references()}
    row = view.row_cursor.annotations[0][0]
    assert {c for c in changed if c[0] in in_figures} == {(grid.source.id, "data.image"), (row.id, "bottom"),
                                                           (row.id, "top")}
    P = short_run.prompt_len
    assert (row.bottom, row.top) == (P + 5 - 0.5, P + 5 + 0.5)
    np.testing.assert_allclose(image(grid), grid_at(short_run, 6, "entropy_norm"), rtol=1e-6)


def test_a_new_run_creates_no_bokeh_model(short_run, sample_model):
    view, doc = card(short_run, layer=0)
    before = {m.id for m in doc.models}
    other = ts.capture(sample_model, "for i in range(3):\n    print(", max_new_tokens=5, attention_layers=[0])
    view.state.set_trajectory(other, step=2)
    assert {m.id for m in doc.models} == before
    want = other.attention_rows(view.state.layer).numpy().astype(np.float64).mean(0)
    np.testing.assert_allclose(image(view.heatmap_fig), want, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(image(view.grid_fig), grid_at(other, 2, view.state.grid_stat), rtol=1e-6)
    row = view.row_cursor.annotations[0][0]
    assert row.bottom == other.prompt_len + 1 - 0.5 and row.right == want.shape[1] - 0.5


def test_a_grid_click_selects_its_layer_and_head(short_run):
    view, doc = card(short_run, layer=0, head=MEAN)
    fig = view.grid_fig.figure
    events = []
    doc.on_change(events.append)
    fig._trigger_event(Tap(fig, x=2.2, y=3.4))  # what a click in the cell of head 2, layer 3 sends
    st = view.state
    assert (st.layer, st.head) == (3, 2)
    assert not any(getattr(e, "model", None) is view.grid_fig.source for e in events)  # the grid's values stay
    sel = view.grid_fig.selection
    assert (sel.left, sel.right, sel.bottom, sel.top) == (1.5, 2.5, 2.5, 3.5)
    assert view.heatmap_fig.figure.title.text.startswith("Attention weights, layer 3, head 2")
    np.testing.assert_allclose(image(view.heatmap_fig), kept_keys_matrix(short_run, 3, 2), rtol=1e-5, atol=1e-7)
    fig._trigger_event(Tap(fig, x=40.0, y=3.0))  # beside the grid: nothing changes
    assert (st.layer, st.head) == (3, 2)


def test_hidden_card_waits_and_draws_the_latest_when_shown(short_run, sample_model):
    view, _ = card(short_run, layer=0)
    view.shown = False
    title = view.heatmap_fig.figure.title.text
    view.state.layer = 1
    view.state.step = 3
    assert view.heatmap_fig.figure.title.text == title  # nothing drawn while hidden
    view.shown = True
    assert view.heatmap_fig.figure.title.text.startswith("Attention weights, layer 1")
    np.testing.assert_allclose(image(view.grid_fig), grid_at(short_run, 3, view.state.grid_stat), rtol=1e-6)
