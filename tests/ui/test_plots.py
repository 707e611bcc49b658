"""Plot data and figures: Polars in, HoloViews elements or session-long Bokeh figures out."""

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


def test_token_strip_figure_and_cursor_follow_step(short_run):
    from trajscope.ui.step_figures import TokenStripFigure

    P = short_run.prompt_len
    lay = plots.token_layout(short_run.tokens, plots.token_metric_values(short_run.tokens, "entropy"))
    fig = TokenStripFigure()
    fig.show(lay, P, "entropy", ["#000000", "#ffffff"])
    assert fig.source.data["pos"].tolist() == short_run.tokens["pos"].to_list()
    assert fig.bar.data["x0"][0] == pytest.approx(lay.filter(pl.col("pos") == P)["x0"][0] - 0.05)
    vals = lay["value"].drop_nulls()
    assert (fig.mapper.low, fig.mapper.high) == pytest.approx((vals.min(), vals.max()))
    assert fig.colorbar.title == "entropy" and fig.hover.tooltips[-1] == ("entropy", "@value{0.000}")
    fig.show(lay, P, "drift", ["#000000", "#ffffff"], centred=True)  # a centred score: symmetric range
    assert fig.mapper.low == -fig.mapper.high
    b3 = plots.token_cursor_boxes(lay, P + 2, P + 3)
    b4 = plots.token_cursor_boxes(lay, P + 3, P + 4)
    assert b3[0]["left"] != b4[0]["left"]
    assert b4[0]["left"] == pytest.approx(b3[1]["left"])  # step 4's query box is step 3's produced box
    boxes = plots.token_cursor_boxes(lay, P - 1, 10_000)
    assert boxes[0]["visible"] and not boxes[1]["visible"]


def test_token_strip_keeps_its_height_when_a_shorter_run_follows(short_run):
    """The strip grows to the longest run shown (capped) and never shrinks, so the page does not move."""
    from trajscope.ui.step_figures import STRIP_LINES, TokenStripFigure

    P = short_run.prompt_len
    fig = TokenStripFigure()
    long = plots.token_layout(short_run.tokens, wrap=12)  # many lines
    short = plots.token_layout(short_run.tokens.head(2))  # one line
    n_long = int(-long["y0"].min() + 0.5)
    assert n_long > 3
    fig.show(short, P, "entropy", ["#000000"])
    assert fig.figure.height == 34 + 60 and fig.figure.y_range.start == pytest.approx(-1.05)
    fig.show(long, P, "entropy", ["#000000"])
    tall = 34 * min(n_long, STRIP_LINES) + 60
    assert fig.figure.height == tall and fig.figure.y_range.start == pytest.approx(-min(n_long, STRIP_LINES) - 0.05)
    fig.show(short, P, "entropy", ["#000000"])  # boxes keep their size: the range keeps the lines, empty below
    assert fig.figure.height == tall and fig.figure.y_range.start == pytest.approx(-min(n_long, STRIP_LINES) - 0.05)


def test_attention_cursor_box_outlines_the_rows_queried_at_the_step(short_run):
    P = short_run.prompt_len
    n = short_run.attention_rows(0).shape[1]
    a0, a5 = plots.attention_cursor_box(0, P, n), plots.attention_cursor_box(5, P, n)
    assert (a0["bottom"], a0["top"]) == (-0.5, P - 0.5)  # step 0: every prompt row
    assert (a5["bottom"], a5["top"]) == (P + 4 - 0.5, P + 4 + 0.5)  # step 5 queries pos P + 4
    assert (a5["left"], a5["right"]) == (-0.5, n - 0.5)


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
    g2, g7 = plots.head_grid_values(q, 2, "prefix_mass"), plots.head_grid_values(q, 7, "prefix_mass")
    assert g2.shape == (6, 4)  # layer × head
    expect = q.filter((pl.col("step") == 7) & (pl.col("layer") == 3) & (pl.col("head") == 1))["prefix_mass"][0]
    assert g7[3, 1] == pytest.approx(expect)
    assert not np.allclose(g2, g7)
    assert plots.head_box(2, None, 4) == {"left": -0.5, "right": 3.5, "bottom": 1.5, "top": 2.5}


def test_top_attended(short_run):
    q = step_queries(short_run.attention)
    top = plots.top_attended(q, short_run.tokens, 4, 0, 1)
    row = q.filter((pl.col("step") == 4) & (pl.col("layer") == 0) & (pl.col("head") == 1))
    assert top["pos"].to_list() == row["top_pos"][0].to_list()[: len(top)]
    assert top["rank"].to_list() == list(range(1, len(top) + 1))
    mean = plots.top_attended(q, short_run.tokens, 4, 0, None)
    assert mean["weight"].sum() <= 1.0 + 1e-6 and (mean["weight"].diff().drop_nulls() <= 0).all()


def test_telemetry_and_next_token_figures(short_run):
    from trajscope.ui.step_figures import NextTokenFigure, TelemetryFigure

    tele = step_telemetry(short_run.attention, 0, None)
    fig = TelemetryFigure()
    fig.show(tele, "layer 0")
    data = fig.source.data
    assert data["step"].tolist() == list(range(short_run.n_steps)) and fig.figure.title.text == "layer 0"
    np.testing.assert_allclose(data["prefix_mass"], tele["prefix_mass"].to_numpy())
    assert len(fig.jumps.data["step"]) == int(tele["sharp_jump"].sum()) <= int(tele["jump"].sum())
    models = {m.id for m in fig.figure.references()}
    fig.show(step_telemetry(short_run.attention), "mean")  # a new selection: same models, new data
    assert {m.id for m in fig.figure.references()} == models
    nt = NextTokenFigure()
    nt.show(short_run.tokens, short_run.prompt_len)
    assert len(nt.source.data["step"]) == short_run.n_steps
    np.testing.assert_allclose(-nt.source.data["nll"][:3], short_run.tokens["logprob"].to_numpy()[
        short_run.prompt_len: short_run.prompt_len + 3], rtol=1e-6)


def test_token_text_colour_has_the_higher_contrast():
    """Issue: some colourings put black text on dark purple."""
    from trajscope.ui.plots import text_colors

    vals = np.array([0.0, 1.0, np.nan])
    assert text_colors(vals, "viridis", 0.0, 1.0) == ["white", "black", "black"]  # dark purple → white; yellow → black
    assert text_colors(vals, "YlOrRd", 0.0, 1.0)[:2] == ["black", "white"]  # pale yellow → black; dark red → white


def test_token_strip_colours_a_chat_run_by_segment(short_run):
    """Colour by segment: each position gets its segment's colour, and the colour bar names the segments."""
    from trajscope import positions
    from trajscope.ui.step_figures import TokenStripFigure

    P = short_run.prompt_len
    segs = [positions.SYSTEM] * 2 + [positions.USER] * (P - 2) + \
        [positions.ASSISTANT] * (len(short_run.tokens) - P - 1) + [positions.THINKING]
    tokens = short_run.tokens.with_columns(pl.Series("segment", segs))
    values = plots.token_metric_values(tokens, "segment")
    assert values["value"].to_list() == [float(positions.SEGMENTS.index(s)) for s in segs]
    lay = plots.token_layout(tokens, values)
    fig = TokenStripFigure()
    fig.show(lay, P, "segment", list(plots.SEGMENT_COLORS.values()), categories=list(plots.SEGMENT_COLORS))
    assert fig.source.data["segment"] == segs
    assert (fig.mapper.low, fig.mapper.high) == (-0.5, len(positions.SEGMENTS) - 0.5)
    assert fig.colorbar.major_label_overrides == dict(enumerate(positions.SEGMENTS))
    assert fig.hover.tooltips[-1] == ("segment", "@segment")
    assert list(fig.colorbar.ticker.ticks) == list(range(len(positions.SEGMENTS)))
    # a numeric metric afterwards gets its scale back
    fig.show(lay, P, "entropy", ["#000000", "#ffffff"])
    assert fig.colorbar.major_label_overrides == {} and fig.hover.tooltips[-1] == ("entropy", "@value{0.000}")
    # switching back and forth reuses the figure's models: no new ticker is sent to the page per run
    models = {m.id for m in fig.figure.references()}
    fig.show(lay, P, "segment", list(plots.SEGMENT_COLORS.values()), categories=list(plots.SEGMENT_COLORS))
    fig.show(lay, P, "entropy", ["#000000", "#ffffff"])
    assert {m.id for m in fig.figure.references()} == models
    # a run without a segment column: no colour, no error
    old = plots.token_metric_values(short_run.tokens.drop("segment", strict=False), "segment")
    assert old["value"].null_count() == len(old)
