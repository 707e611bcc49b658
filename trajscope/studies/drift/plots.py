"""Plot data of the Drift card: a run's drift table in, arrays and labels out. Pure.

A layer × position grid of the drift score (diagonal Mahalanobis distance to the prefill
profile ÷ √d; ≈ 1 in distribution), and per-layer series with each layer's calibrated
threshold. The figures that draw them are built once per session
(:mod:`trajscope.studies.drift.figures`).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from trajscope import positions
from trajscope.ui.analysis_plots import LAYER_COLORS, layer_ticks, robust_clim
from trajscope.ui.plots import position_labels, visible


def _drift_frame(drift: pl.DataFrame, prompt_len: int, texts: list[str] | None) -> pl.DataFrame:
    """``drift`` with ``x`` (:func:`~trajscope.positions.step_axis`), ``step`` and the token text."""
    df = drift.with_columns(pl.col("layer").cast(pl.Int32), positions.query_step_expr(prompt_len).alias("step"),
                            (pl.col("pos") - prompt_len + 1).alias("x"))
    tok = [visible(texts[p]) if texts is not None and p < len(texts) else "" for p in df["pos"].to_list()]
    return df.with_columns(pl.Series("token", tok, dtype=pl.String))


def heatmap_data(drift: pl.DataFrame, prompt_len: int, texts: list[str] | None = None) -> dict:
    """Layer × step grid of the drift score, with its colour range (diverging around 1, the prefill-typical value).

    Cells without a score are NaN. Position 0 (the attention sink) is left out: its residual is far from
    everything and would set the scale.

    Args:
        drift: :func:`trajscope.metrics.profile_drift.profile_drift_table` rows (pos, layer, score).
        prompt_len: P. x is :func:`~trajscope.positions.step_axis` (decode positions at their step, the
            prompt to the left of step 0.5).
        texts: token text per position, for the hover.
    Returns:
        ``grid`` ``[n_rows, n_x]`` (row i = ``layers[i]``, column j = x ``x_min + j``), ``x_min``, ``x_max``,
        ``y0`` (the y of row 0: the first layer when the layers are consecutive, else 0 and y is the row),
        ``yticks`` ``[(y, label)]``, ``clim``, ``x_labels`` (``"<token>, step s"`` per x),
        ``y_labels``, ``sink_max`` (pos 0's largest score, or None).
    """
    df = _drift_frame(drift, prompt_len, texts)
    sink = df.filter(pl.col("pos") == 0)
    df = df.filter(pl.col("pos") > 0)
    layers = sorted(df["layer"].unique().to_list())
    x_min, x_max = (int(df["x"].min()), int(df["x"].max())) if df.height else (0, 0)
    consecutive = layers == list(range(layers[0], layers[-1] + 1)) if layers else True
    row = {layer: i for i, layer in enumerate(layers)}
    grid = np.full((max(1, len(layers)), x_max - x_min + 1), np.nan)
    grid[[row[v] for v in df["layer"].to_list()], (df["x"].to_numpy() - x_min)] = df["score"].to_numpy()
    named = position_labels(texts, prompt_len) if texts is not None else []
    x_labels = []
    for x in range(x_min, x_max + 1):
        pos = x + prompt_len - 1  # the inverse of the step axis
        x_labels.append(f"{named[pos] if pos < len(named) else pos}, step {positions.query_step(pos, prompt_len)}")
    ticks = layer_ticks(layers)
    return {"grid": grid, "x_min": x_min, "x_max": x_max, "y0": layers[0] if layers and consecutive else 0,
            "yticks": [(v if consecutive else row[v], str(v)) for v in ticks],
            "clim": robust_clim(df["score"].to_numpy(), centre=1.0), "x_labels": x_labels,
            "y_labels": [str(v) for v in layers], "sink_max": float(sink["score"].max()) if len(sink) else None}


def curves_data(drift: pl.DataFrame, thresholds: dict[int, float], prompt_len: int,
                texts: list[str] | None = None) -> dict:
    """Drift score over steps, one series per shown layer with its calibrated threshold.

    At most ``len(LAYER_COLORS)`` layers are shown (a legend of 30 would not fit; :func:`layer_ticks`
    picks them); pos 0 is left out, as in :func:`heatmap_data`.

    Returns:
        ``series``: per shown layer ``{"layer", "color", "label", "threshold" (or None), "data": {x, score, pos,
        step, token, layer}}``; ``ylim``; ``n_layers`` (all layers scored).
    """
    df = _drift_frame(drift, prompt_len, texts).filter(pl.col("pos") > 0)
    every = sorted(df["layer"].unique().to_list())
    shown = layer_ticks(every, max_ticks=len(LAYER_COLORS))
    lo, hi = robust_clim(df["score"].to_numpy(), q=99.5)
    series = []
    for i, layer in enumerate(shown):
        sub = df.filter(pl.col("layer") == layer).sort("pos")
        t = thresholds.get(layer)
        series.append({"layer": layer, "color": LAYER_COLORS[i % len(LAYER_COLORS)],
                       "label": f"layer {layer}" + (f" (threshold {t:.2f})" if t is not None else ""),
                       "threshold": None if t is None else float(t),
                       "data": {"x": sub["x"].to_numpy(), "score": sub["score"].cast(pl.Float64).to_numpy(),
                                "pos": sub["pos"].to_numpy(), "step": sub["step"].to_numpy(),
                                "token": sub["token"].to_list(), "layer": [str(layer)] * sub.height}})
    return {"series": series, "ylim": (min(0.0, lo), hi * 1.1), "n_layers": len(every)}
