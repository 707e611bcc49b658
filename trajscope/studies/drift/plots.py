"""Plot builders of the Drift card: a run's drift table in, HoloViews out. Pure.

A layer × position heatmap of the drift score (diagonal Mahalanobis distance to the prefill
profile ÷ √d; ≈ 1 in distribution) with the prefill/decode boundary, and per-layer curves with
each layer's calibrated threshold.
"""

from __future__ import annotations

import holoviews as hv
import numpy as np
import polars as pl

from trajscope import positions
from trajscope.ui.analysis_plots import (
    LAYER_COLORS,
    STEP_AXIS,
    layer_ticks,
    robust_clim,
)
from trajscope.ui.plots import integer_hover, position_labels, visible


def _drift_frame(drift: pl.DataFrame, prompt_len: int, texts: list[str] | None) -> pl.DataFrame:
    """``drift`` with ``x`` (:func:`~trajscope.positions.step_axis`), ``step`` and the token text."""
    df = drift.with_columns(pl.col("layer").cast(pl.Int32), positions.query_step_expr(prompt_len).alias("step"),
                            (pl.col("pos") - prompt_len + 1).alias("x"))
    tok = [visible(texts[p]) if texts is not None and p < len(texts) else "" for p in df["pos"].to_list()]
    return df.with_columns(pl.Series("token", tok, dtype=pl.String))


def drift_heatmap(drift: pl.DataFrame, prompt_len: int, texts: list[str] | None = None) -> hv.Overlay:
    """Layer × step heatmap of the drift score, diverging around 1 (the prefill-typical value).

    One image (a glyph per cell made 3,000+ rectangles on SmolLM2's chat runs); cells without a score are blank.

    Args:
        drift: :func:`trajscope.metrics.profile_drift.profile_drift_table` rows (pos, layer, score).
        prompt_len: P. x is :func:`~trajscope.positions.step_axis` (decode positions at their step, the
            prompt to the left of a dashed line at step 0.5).
        texts: token text per position, for the hover.
    Returns:
        ``Image`` (x = step axis, y = layer; y = the layer's row when the layers are not consecutive, labelled by
        layer) with the prompt/decode boundary.
    """
    df = _drift_frame(drift, prompt_len, texts)
    sink = df.filter(pl.col("pos") == 0)
    df = df.filter(pl.col("pos") > 0)  # the sink's residual is far from everything: apart, or it sets the scale
    layers = sorted(df["layer"].unique().to_list())
    lo, hi = robust_clim(df["score"].to_numpy(), centre=1.0)
    note = (f"; pos 0 (attention sink) left out: score up to {float(sink['score'].max()):.0f}" if len(sink) else "")
    x_min, x_max = (int(df["x"].min()), int(df["x"].max())) if df.height else (0, 0)
    consecutive = layers == list(range(layers[0], layers[-1] + 1)) if layers else True
    y0 = layers[0] if layers and consecutive else 0  # y of the first row
    row = {layer: i for i, layer in enumerate(layers)}
    grid = np.full((max(1, len(layers)), x_max - x_min + 1), np.nan)
    grid[[row[v] for v in df["layer"].to_list()], (df["x"].to_numpy() - x_min)] = df["score"].to_numpy()
    named = position_labels(texts, prompt_len) if texts is not None else []
    x_labels = []
    for x in range(x_min, x_max + 1):
        pos = x + prompt_len - 1  # the inverse of the step axis
        x_labels.append(f"{named[pos] if pos < len(named) else pos}, step {positions.query_step(pos, prompt_len)}")
    y_labels = [str(v) for v in layers]
    hover = integer_hover([("pos", "$x{custom}"), ("layer", "$y{custom}"), ("drift score", "@image{0.00}")],
                          {"$x": x_labels, "$y": y_labels}, origin={"$x": x_min, "$y": y0})
    ticks = layer_ticks(layers)
    yticks = ticks if consecutive else [(row[v], str(v)) for v in ticks]
    n = len(layers)
    hm = hv.Image(grid[::-1], bounds=(x_min - 0.5, y0 - 0.5, x_max + 0.5, y0 + n - 0.5),
                  kdims=[hv.Dimension("xstep", label="x"), "layer"], vdims=["score"]).opts(
        cmap="RdBu_r", clim=(lo, hi), clipping_colors={"min": "#053061", "max": "#67001f", "NaN": "white"},
        colorbar=True, responsive=True, height=max(230, 14 * n + 90), tools=[hover], xlabel=STEP_AXIS,
        ylabel="layer", invert_yaxis=True, yticks=yticks, ylim=(y0 - 0.5, y0 + n - 0.5), toolbar="right",
        title=f"Residual drift vs prefill profile (diag. Mahalanobis / √d; 1 = typical, red = further){note}",
        colorbar_opts={"title": "drift score (clipped at the 99th percentile)"})
    edge = hv.VLine(0.5).opts(color="black", line_dash="dashed", line_width=1.5)
    return hm * edge


def drift_curves(drift: pl.DataFrame, thresholds: dict[int, float], prompt_len: int,
                 texts: list[str] | None = None) -> hv.Overlay:
    """Drift score over steps, one curve per layer, each with its calibrated threshold (dotted, same colour,
    its value in the legend).

    Args:
        drift: rows (pos, layer, score).
        thresholds: ``{layer: threshold}`` from the profile.
        prompt_len: P; x as in :func:`drift_heatmap`.
    """
    df = _drift_frame(drift, prompt_len, texts).filter(pl.col("pos") > 0)  # the sink apart, as in the heatmap
    items = []
    every = sorted(df["layer"].unique().to_list())
    shown = layer_ticks(every, max_ticks=len(LAYER_COLORS))  # a legend of 30 layers would not fit
    lo, hi = robust_clim(df["score"].to_numpy(), q=99.5)
    for i, layer in enumerate(shown):
        color = LAYER_COLORS[i % len(LAYER_COLORS)]
        sub = df.filter(pl.col("layer") == layer).sort("pos")
        t = thresholds.get(layer)
        name = f"layer {layer}" + (f" (threshold {t:.2f})" if t is not None else "")
        items.append(hv.Curve(sub.select("x", "score", "pos", "step", "token").to_pandas(),
                              kdims=[hv.Dimension("x", label="x")], vdims=["score", "pos", "step", "token"],
                              label=name).opts(
            color=color, line_width=1.5, tools=["hover"],
            hover_tooltips=[("layer", str(layer)), ("pos", "@pos"), ("step", "@step"), ("token", "@token"),
                            ("drift score", "@score{0.00}")]))
        if t is not None:
            items.append(hv.HLine(float(t)).opts(color=color, line_dash="dotted", line_width=1.5))
    items.append(hv.VLine(0.5).opts(color="#6c757d", line_dash="dashed"))
    some = "" if len(shown) == len(every) else f" ({len(shown)} of {len(every)} layers; pos 0 left out)"
    return hv.Overlay(items).opts(
        responsive=True, height=max(300, 26 * len(shown) + 90), legend_position="right", xlabel=STEP_AXIS,
        ylabel="drift score", ylim=(min(0.0, lo), hi * 1.1), toolbar="right",
        title=f"Drift by layer{some}; dotted = that layer's threshold, calibrated on held-out prefill")
