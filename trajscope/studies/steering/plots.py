"""Plot builders of the Steering card: Polars in, HoloViews (or HTML text) out. Pure.

Base and steered continuations aligned by step with the first divergence marked;
KL(p_base ‖ p_steered) by decode step for several start depths; and the decay plot, effect
size against start depth with its interval across prompts.
"""

from __future__ import annotations

import holoviews as hv
import numpy as np
import polars as pl

from trajscope import positions
from trajscope.escaping import html_text
from trajscope.ui.analysis_plots import LAYER_COLORS
from trajscope.ui.plots import visible


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
        m = sub.filter(pl.col("start_step") == k).group_by("step", maintain_order=True).agg(pl.col("kl_to_base").mean()).sort("step")
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
        summary: :func:`trajscope.studies.steering.summary.decay_summary` output (depths whose window does not fit
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
