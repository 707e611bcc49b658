"""Plot builders: Polars in, HoloViews out; changing the step changes the elements' data."""

import holoviews as hv
import panel as pn
from bokeh.document import Document
from bokeh.models import Plot
import numpy as np
import polars as pl
import pytest

from trajscope.metrics.attention import step_queries, step_telemetry
from trajscope.metrics.position_zscore import position_zscore
from trajscope.ui import plots


def test_visible_whitespace():
    assert plots.visible(" a\n\tb") == "·a↵→b"
    assert plots.visible("") == "∅"


def test_token_layout_wraps_and_breaks_lines(short_run):
    tokens = short_run.tokens
    lay = plots.token_layout(tokens, plots.token_metric_values(tokens, "entropy"), wrap=20)
    assert lay["pos"].to_list() == tokens["pos"].to_list()
    assert (lay["x1"] <= 20.5).all() and (lay["x1"] > lay["x0"]).all()
    newline = [i for i, t in enumerate(tokens["text"].to_list()) if t.endswith("\n")]
    for i in newline[:-1] if newline and newline[-1] == len(tokens) - 1 else newline:
        assert lay["y0"][i + 1] < lay["y0"][i]  # the next token starts a new line
    # a click inside a box finds that token
    row = lay.row(5, named=True)
    assert plots.token_at(lay, row["xc"], row["yc"]) == row["pos"]
    assert plots.token_at(lay, -10, 10) is None


def test_token_metric_values(short_run):
    t = short_run.tokens
    ent = plots.token_metric_values(t, "entropy")
    assert ent["value"].to_list()[:3] == pytest.approx(t["entropy"].to_list()[:3])
    assert ent["value"][-1] is None
    drift = plots.token_metric_values(t, "drift", position_zscore(short_run.activations, 0))
    assert drift["value"].null_count() <= 1 and len(drift) == len(t)


def test_token_strip_and_cursor_follow_step(short_run):
    P = short_run.prompt_len
    lay = plots.token_layout(short_run.tokens, plots.token_metric_values(short_run.tokens, "entropy"))
    strip = plots.token_strip(lay, P, "entropy")
    rects = strip.get(0)
    assert isinstance(rects, hv.Rectangles) and len(rects) == len(short_run.tokens)
    bar = strip.get(2)
    assert bar.dimension_values("x0")[0] == pytest.approx(lay.filter(pl.col("pos") == P)["x0"][0] - 0.05)
    c3 = plots.token_cursor(lay, P + 2, P + 3)
    c4 = plots.token_cursor(lay, P + 3, P + 4)
    assert not np.allclose(c3.array(["x0"]), c4.array(["x0"]))
    # step 4's query box is step 3's produced box
    assert c4.array(["x0"])[0, 0] == pytest.approx(c3.array(["x0"])[1, 0])
    boxes = plots.token_cursor_boxes(lay, P - 1, 10_000)
    assert boxes[0]["visible"] and not boxes[1]["visible"]


def test_attention_heatmap_and_cursor(short_run):
    P = short_run.prompt_len
    rows = short_run.attention_rows(0)
    n = rows.shape[1]
    overlay = plots.attention_heatmap(rows.mean(0).numpy(), P, "t")
    img = overlay.get(0)
    assert isinstance(img, hv.Image)
    # the image is displayed query-major with row 0 on top: y = query position
    assert img[3, 5] == pytest.approx(float(rows.mean(0)[5, 3]))
    assert overlay.get(1).data == P - 0.5 and overlay.get(2).data == P - 0.5
    a0, a5 = plots.attention_cursor(0, P, n), plots.attention_cursor(5, P, n)
    assert a0.dimension_values("y0")[0] == -0.5 and a0.dimension_values("y1")[0] == P - 0.5
    assert a5.dimension_values("y0")[0] == P + 4 - 0.5
    assert plots.attention_cursor_box(5, P, n)["top"] == P + 4 + 0.5


def test_sparse_matrix_matches_full_rows_on_top_keys(short_run):
    """The top-8 fallback equals the stored rows at the kept keys (independent data paths)."""
    n = short_run.attention_rows(1).shape[1]
    sparse = plots.attention_matrix(short_run.attention, 1, 2, n)
    full = short_run.attention_rows(1)[2].numpy()
    nz = sparse > 0
    assert nz.sum() >= n  # every row keeps at least one key
    np.testing.assert_allclose(sparse[nz], full[nz], rtol=1e-5)
    # rows' kept weights are the largest of the full row
    q = n - 1
    kept = sparse[q][sparse[q] > 0]
    assert kept.min() >= np.sort(full[q])[-8] - 1e-6


def test_head_grid_changes_with_step(short_run):
    q = step_queries(short_run.attention)
    g2, g7 = plots.head_grid(q, 2, "prefix_mass"), plots.head_grid(q, 7, "prefix_mass")
    assert g2.dimension_values(2, flat=False).shape == (6, 4)
    expect = q.filter((pl.col("step") == 7) & (pl.col("layer") == 3) & (pl.col("head") == 1))["prefix_mass"][0]
    assert g7[1, 3] == pytest.approx(expect)
    assert not np.allclose(g2.dimension_values(2), g7.dimension_values(2))
    assert plots.head_box(2, None, 4) == {"left": -0.5, "right": 3.5, "bottom": 1.5, "top": 2.5}


def test_top_attended(short_run):
    q = step_queries(short_run.attention)
    top = plots.top_attended(q, short_run.tokens, 4, 0, 1)
    row = q.filter((pl.col("step") == 4) & (pl.col("layer") == 0) & (pl.col("head") == 1))
    assert top["pos"].to_list() == row["top_pos"][0].to_list()[: len(top)]
    assert top["rank"].to_list() == list(range(1, len(top) + 1))
    mean = plots.top_attended(q, short_run.tokens, 4, 0, None)
    assert mean["weight"].sum() <= 1.0 + 1e-6 and (mean["weight"].diff().drop_nulls() <= 0).all()


def test_telemetry_plot_and_step_cursor(short_run):
    tele = step_telemetry(short_run.attention, 0, None)
    ov = plots.telemetry_plot(tele)
    curves = [e for e in ov if isinstance(e, hv.Curve)]
    assert len(curves) == 5 and len(curves[0]) == short_run.n_steps  # 4 statistics + the top-8 overlap
    jumps = [e for e in ov if isinstance(e, hv.Scatter)][0]
    assert len(jumps) == int(tele["sharp_jump"].sum()) <= int(tele["jump"].sum())
    assert plots.step_cursor(3).data == 3 and plots.step_cursor(8).data == 8
    nt = plots.next_token_plot(short_run.tokens, short_run.prompt_len)
    assert len(nt.get(0)) == short_run.n_steps


def test_builders_render_with_bokeh(short_run):
    P = short_run.prompt_len
    q = step_queries(short_run.attention)
    lay = plots.token_layout(short_run.tokens, plots.token_metric_values(short_run.tokens, "logprob"))
    for el in (plots.token_strip(lay, P) * plots.token_cursor(lay, P, P + 1),
               plots.attention_heatmap(short_run.attention_rows(0)[0].numpy(), P) * plots.attention_cursor(2, P, 20),
               plots.head_grid(q, 1, "entropy"), plots.telemetry_plot(step_telemetry(short_run.attention)) * plots.step_cursor(1)):
        root = pn.pane.HoloViews(el).get_root(Document())  # as the views render them
        assert root.select_one({"type": Plot}) is not None


def test_token_text_colour_has_the_higher_contrast():
    """Issue: some colourings put black text on dark purple."""
    from trajscope.ui.plots import text_colors

    vals = np.array([0.0, 1.0, np.nan])
    assert text_colors(vals, "viridis", 0.0, 1.0) == ["white", "black", "black"]  # dark purple → white; yellow → black
    assert text_colors(vals, "YlOrRd", 0.0, 1.0)[:2] == ["black", "white"]  # pale yellow → black; dark red → white
