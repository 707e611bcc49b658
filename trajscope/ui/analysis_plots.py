"""Plot builders for the Drift and Steering views: Polars in, HoloViews (or HTML text) out. Pure.

Drift: a layer × position heatmap of the drift score (diagonal Mahalanobis
distance to the prefill profile ÷ √d; ≈ 1 in distribution) with the
prefill/decode boundary, and per-layer curves with each layer's calibrated
threshold.

Steering: base and steered continuations aligned by step with the first
divergence marked; KL(p_base ‖ p_steered) by decode step for several start
depths; and the decay plot, effect size against start depth with its spread
across prompts.
"""

from __future__ import annotations


import holoviews as hv
import numpy as np
import polars as pl

from trajscope import positions
from trajscope.escaping import html_text
from trajscope.ui.plots import CURSOR_COLOR, integer_hover, position_labels, visible

LAYER_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                "#bcbd22", "#17becf")


STEP_AXIS = "step (≤ 0: prompt positions, all read at step 0)"


def layer_ticks(layers: list[int], max_ticks: int = 16) -> list[int]:
    """Every layer when few, else every k-th (labels of 30+ layers would overlap), always the last."""
    if len(layers) <= max_ticks:
        return list(layers)
    k = -(-(len(layers) - 1) // (max_ticks - 1))  # the ticks of every k-th layer plus the last fit max_ticks
    return sorted({*layers[::k], layers[-1]})


def robust_clim(values: np.ndarray, centre: float | None = None, q: float = 99.0) -> tuple[float, float]:
    """A colour range from the ``q``-th percentile, so a few extreme cells do not turn the rest one colour.

    With ``centre``, the range is symmetric around it (``centre ± percentile of |v − centre|``);
    NaNs are ignored; an empty or constant input gives a unit-wide range.
    """
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    if centre is not None:
        dev = float(np.percentile(np.abs(v - centre), q)) if v.size else 1.0
        dev = dev if dev > 0 else 1.0
        return centre - dev, centre + dev
    if not v.size:
        return 0.0, 1.0
    lo, hi = float(np.percentile(v, 100 - q)), float(np.percentile(v, q))
    return (lo, hi) if hi > lo else (lo, lo + 1.0)


def _drift_frame(drift: pl.DataFrame, prompt_len: int, texts: list[str] | None) -> pl.DataFrame:
    """``drift`` with ``x`` (:func:`~trajscope.positions.step_axis`), ``step`` and the token text."""
    df = drift.with_columns(pl.col("layer").cast(pl.Int32), positions.query_step_expr(prompt_len).alias("step"),
                            (pl.col("pos") - prompt_len + 1).alias("x"))
    tok = [visible(texts[p]) if texts is not None and p < len(texts) else "" for p in df["pos"].to_list()]
    return df.with_columns(pl.Series("token", tok, dtype=pl.String))


def drift_heatmap(drift: pl.DataFrame, prompt_len: int, texts: list[str] | None = None) -> hv.Overlay:
    """Layer × step heatmap of the drift score, diverging around 1 (the prefill-typical value).

    Args:
        drift: :func:`trajscope.metrics.profile_drift.profile_drift_table` rows (pos, layer, score).
        prompt_len: P. x is :func:`~trajscope.positions.step_axis` (decode positions at their step, the
            prompt to the left of a dashed line at step 0.5).
        texts: token text per position, for the hover.
    """
    df = _drift_frame(drift, prompt_len, texts)
    sink = df.filter(pl.col("pos") == 0)
    df = df.filter(pl.col("pos") > 0)  # the sink's residual is far from everything: apart, or it sets the scale
    layers = sorted(df["layer"].unique().to_list())
    lo, hi = robust_clim(df["score"].to_numpy(), centre=1.0)
    note = (f"; pos 0 (attention sink) left out: score up to {float(sink['score'].max()):.0f}" if len(sink) else "")
    # HeatMap grids its value columns, so they stay numeric; the hover looks the token text up by pos
    labels = position_labels(texts, prompt_len) if texts is not None else None
    hover = integer_hover([("pos", "@pos{custom}"), ("step", "@step"), ("layer", "@layer"),
                           ("drift score", "@score{0.00}")], {"@pos": labels})
    hm = hv.HeatMap(df.select(pl.col("x").alias("xstep"), "layer", "score", "pos", "step").to_pandas(),
                    kdims=[hv.Dimension("xstep", label="x"), "layer"], vdims=["score", "pos", "step"]).opts(
        cmap="RdBu_r", clim=(lo, hi), clipping_colors={"min": "#053061", "max": "#67001f"}, colorbar=True,
        responsive=True, height=max(230, 14 * len(layers) + 90), tools=[hover], xlabel=STEP_AXIS, ylabel="layer",
        invert_yaxis=True, yticks=layer_ticks(layers), ylim=(min(layers) - 0.5, max(layers) + 0.5), toolbar="right",
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
        responsive=True, height=max(260, 22 * len(shown) + 60), legend_position="right", xlabel=STEP_AXIS,
        ylabel="drift score", ylim=(min(0.0, lo), hi * 1.1), toolbar="right",
        title=f"Drift by layer{some}; dotted = that layer's threshold, calibrated on held-out prefill")


def aligned_continuations(base: pl.DataFrame, steered: pl.DataFrame, prompt_len: int, start_step: int) -> str:
    """HTML: base and steered generated tokens side by side, one row per step, divergence marked.

    Args:
        base, steered: ``tokens`` tables of the two runs.
        prompt_len: P (the same for both runs).
        start_step: first steered step; the token produced by step s sits at ``pos = P + s``.
    Returns:
        An HTML table (escaped token texts).
    """
    b = dict(zip(base["pos"].to_list(), base["text"].to_list()))
    s = dict(zip(steered["pos"].to_list(), steered["text"].to_list()))
    last = max(max(b), max(s))
    diverged = False
    rows = []
    for pos in range(prompt_len, last + 1):
        step = positions.produced_at_step(pos, prompt_len)
        bt, st = b.get(pos), s.get(pos)
        differs = bt != st
        first = differs and not diverged
        diverged = diverged or differs
        style = "background:#fde2e2;" if differs else ""
        mark = " ◀ first divergence" if first else (" ◀ steering on" if step == start_step else "")
        rows.append(f"<tr style='{style}'><td>{step}</td><td><code>{html_text(visible(bt))}</code></td>"
                    f"<td><code>{html_text(visible(st))}</code></td><td>{mark}</td></tr>")
    head = ("<tr><th>step producing it</th><th>base</th><th>steered</th><th></th></tr>")
    return ("<div style='max-height:320px;overflow:auto'><table style='font-size:12px;border-collapse:collapse'>"
            + head + "".join(rows) + "</table></div>")


def effect_curves(steps: pl.DataFrame, strength: float | None = None) -> hv.Overlay:
    """KL(p_base ‖ p_steered) by decode step, one curve per start depth (mean over prompts/seeds).

    Args:
        steps: the sweep's ``steps`` table (start_step, strength, step, kl_to_base).
        strength: which strength to show (default: the largest).
    """
    strength = strength if strength is not None else float(steps["strength"].max())
    sub = steps.filter(pl.col("strength") == strength)
    curves = []
    for i, k in enumerate(sorted(sub["start_step"].unique().to_list())):
        m = sub.filter(pl.col("start_step") == k).group_by("step").agg(pl.col("kl_to_base").mean()).sort("step")
        color = LAYER_COLORS[i % len(LAYER_COLORS)]
        curves.append(hv.Curve((m["step"].to_numpy(), np.maximum(m["kl_to_base"].to_numpy(), 1e-6)), "step",
                               "KL", label=f"start at step {k}").opts(color=color, tools=["hover"]))
        curves.append(hv.VLine(k).opts(color=color, line_dash="dotted"))
    return hv.Overlay(curves).opts(
        responsive=True, height=260, logy=True, legend_position="right", xlabel="decode step",
        ylabel="KL to base (nats)",
        title=f"Steering effect by step: KL(p_base ‖ p_steered), strength {strength:g}")


def decay_plot(summary: pl.DataFrame) -> hv.Overlay:
    """Effect (mean KL over an equal window of steered steps) against start depth, with its interval.

    Args:
        summary: :func:`trajscope.metrics.steering.decay_summary` output (depths whose window does not fit
            the run are listed in its ``n_short`` and not drawn).
    """
    items = []
    full = summary.filter(pl.col("n_runs") > 0) if "n_runs" in summary.columns else summary
    n_prompts = int(full["n_prompts"].max() or 0) if "n_prompts" in full.columns and full.height else 0
    for i, strength in enumerate(sorted(full["strength"].unique().to_list())):
        sub = full.filter(pl.col("strength") == strength).sort("start_step")
        x, y = sub["start_step"].to_numpy(), sub["effect_mean"].to_numpy()
        color = LAYER_COLORS[i % len(LAYER_COLORS)]
        items.append(hv.Curve((x, y), "start step", "effect", label=f"strength {strength:g}").opts(color=color))
        items.append(hv.Scatter((x, y), "start step", "effect").opts(color=color, size=8, tools=["hover"]))
        if n_prompts > 1 and "effect_lo" in sub.columns:
            lo, hi = sub["effect_lo"].to_numpy(), sub["effect_hi"].to_numpy()
            items.append(hv.ErrorBars((x, y, y - lo, hi - y), "start step", ["effect", "neg", "pos"]).opts(color=color))
    window = int(full["steps_counted"].max()) if "steps_counted" in full.columns and full.height else 0
    spread = (f"95% interval across {n_prompts} prompts" if n_prompts > 1
              else "1 prompt: no interval — sweep more prompts for one")
    return hv.Overlay(items or [hv.Curve([])]).opts(
        responsive=True, height=280, logx=True, legend_position="right", xlabel="steering starts at decode step k",
        ylabel=f"mean KL over {window} steered steps", title=f"Effect vs start depth, equal windows ({spread})")


def no_data(message: str) -> hv.Text:
    """A placeholder element that says why a plot is empty."""
    return hv.Text(0.5, 0.5, message).opts(xaxis=None, yaxis=None, height=120, responsive=True, color=CURSOR_COLOR,
                                           toolbar=None)
