"""Plot builders of the Steering card: Polars in, Bokeh figures (or HTML text) out. Pure.

Base and steered continuations aligned by step with the first divergence marked;
KL(p_base ‖ p_steered) by decode step for several start depths; and the decay plot, effect
size against start depth with its interval across prompts.
"""

from __future__ import annotations

import numpy as np
import polars as pl
from bokeh.models import ColumnDataSource, FixedTicker, HoverTool, Span, Whisker
from bokeh.plotting import figure

from trajscope import positions
from trajscope.escaping import html_text
from trajscope.ui.analysis_plots import FIGURE_TOOLS, LAYER_COLORS, side_legend
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


def effect_figure(steps: pl.DataFrame, strength: float | None = None):
    """KL(p_base ‖ p_steered) by decode step (log y), one curve per start depth (mean over prompts/seeds), each
    depth's first steered step as a dotted line of its colour.

    Args:
        steps: the sweep's ``steps`` table (start_step, strength, step, kl_to_base).
        strength: which strength to show (default: the largest).
    Returns:
        A Bokeh figure; a curve's source holds ``step, kl, start_step`` (KL floored at 1e-6 for the log axis).
    """
    strength = strength if strength is not None else float(steps["strength"].max())
    sub = steps.filter(pl.col("strength") == strength)
    fig = figure(height=260, sizing_mode="stretch_width", y_axis_type="log", x_axis_label="decode step",
                 y_axis_label="KL to base (nats)", tools=FIGURE_TOOLS, toolbar_location="right",
                 title=f"Steering effect by step: KL(p_base ‖ p_steered), strength {strength:g}")
    items = []
    for i, k in enumerate(sorted(sub["start_step"].unique().to_list())):
        m = (sub.filter(pl.col("start_step") == k).group_by("step", maintain_order=True)
             .agg(pl.col("kl_to_base").mean()).sort("step"))
        color = LAYER_COLORS[i % len(LAYER_COLORS)]
        src = ColumnDataSource({"step": m["step"].to_list(), "start_step": [k] * m.height,
                                "kl": np.maximum(m["kl_to_base"].to_numpy(), 1e-6).tolist()})
        items.append((f"start at step {k}", [fig.line("step", "kl", source=src, color=color, line_width=2)]))
        fig.add_layout(Span(dimension="height", location=k, line_color=color, line_dash="dotted"))
    if items:
        fig.add_tools(HoverTool(renderers=[r for _, rs in items for r in rs], tooltips=[
            ("start step", "@start_step"), ("decode step", "@step"), ("KL to base", "@kl{0.0000} nats")]))
        side_legend(fig, items)
    return fig


def decay_figure(summary: pl.DataFrame):
    """Effect (mean KL over an equal window of steered steps) against start depth (log x), a line and dots per
    strength with its 95% interval across prompts as whiskers (drawn when the sweep had more than one prompt).

    Args:
        summary: :func:`trajscope.studies.steering.summary.decay_summary` output (depths whose window does not fit
            the run are listed in its ``n_short`` and not drawn).
    Returns:
        A Bokeh figure; a strength's source holds ``start_step, effect, lo, hi, strength``.
    """
    full = summary.filter(pl.col("n_runs") > 0) if "n_runs" in summary.columns else summary
    n_prompts = int(full["n_prompts"].max() or 0) if "n_prompts" in full.columns and full.height else 0
    window = int(full["steps_counted"].max()) if "steps_counted" in full.columns and full.height else 0
    spread = (f"95% interval across {n_prompts} prompts" if n_prompts > 1
              else "1 prompt: no interval — sweep more prompts for one")
    fig = figure(height=280, sizing_mode="stretch_width", x_axis_type="log",
                 x_axis_label="steering starts at decode step k", y_axis_label=f"mean KL over {window} steered steps",
                 tools=FIGURE_TOOLS, toolbar_location="right",
                 title=f"Effect vs start depth, equal windows ({spread})")
    depths = sorted(full["start_step"].unique().to_list()) if full.height else []
    fig.xaxis.ticker = FixedTicker(ticks=depths)  # the depths swept (a log axis would label fractional steps)
    items, dots = [], []
    whiskers = n_prompts > 1 and "effect_lo" in full.columns
    for i, strength in enumerate(sorted(full["strength"].unique().to_list())):
        sub = full.filter(pl.col("strength") == strength).sort("start_step")
        color = LAYER_COLORS[i % len(LAYER_COLORS)]
        src = ColumnDataSource({"start_step": sub["start_step"].to_list(), "effect": sub["effect_mean"].to_list(),
                                "lo": sub["effect_lo"].to_list() if whiskers else [None] * sub.height,
                                "hi": sub["effect_hi"].to_list() if whiskers else [None] * sub.height,
                                "strength": [strength] * sub.height})
        line = fig.line("start_step", "effect", source=src, color=color, line_width=2)
        dots.append(fig.scatter("start_step", "effect", source=src, color=color, size=8))
        if whiskers:
            fig.add_layout(Whisker(base="start_step", lower="lo", upper="hi", source=src, line_color=color))
        items.append((f"strength {strength:g}", [line, dots[-1]]))
    if items:
        tips = [("strength", "@strength"), ("start step", "@start_step"), ("effect", "@effect{0.0000} nats")]
        fig.add_tools(HoverTool(renderers=dots, tooltips=tips + ([("95% interval", "@lo{0.0000} – @hi{0.0000}")]
                                                                  if whiskers else [])))
        side_legend(fig, items)
    return fig
