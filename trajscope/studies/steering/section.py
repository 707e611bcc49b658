"""The steering study's report section: a function of its :class:`~trajscope.studies.registry.Result` only.

It shows the setup (layer, mode, strengths, the equal window, prompts), the headline numbers as
the Result holds them — the effect (mean KL to the base run over the window) and the half-life
per start depth — and the decay plot drawn from the ``steering_summary`` table. Nothing is
recomputed.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from trajscope.escaping import html_text
from trajscope.interval_text import format_interval
from trajscope.studies.registry import Result, Section
from trajscope.studies.serving.sections import num


def half_life_text(value: Any, lo: Any = None, hi: Any = None, *, interval: bool = True) -> str:
    """``3 [2, 5]`` steps; an end of None (the resampled median never halves in the window) reads ``∞``."""
    if value is None:
        text = "never within the window"
    else:
        text = f"{value:g}"
    if not interval:
        return text
    end = (lambda v: "∞" if v is None else f"{v:g}")
    return f"{text} [{end(lo)}, {end(hi)}]"


def effect_rows(summaries: dict[str, Any]) -> pl.DataFrame:
    """The headline numbers as one row per start depth × strength: effect [95 % CI], half-life [95 % CI] (a Result
    written before the half-life had an interval shows the median alone)."""
    half = {(h["start_step"], h["strength"]): h for h in summaries.get("half_life") or []}
    with_iv = any("lo" in h for h in half.values())
    label = "half-life (steps, median [95% CI])" if with_iv else "half-life (steps, median)"
    rows = []
    for e in summaries.get("effect") or []:
        h = half.get((e["start_step"], e["strength"]), {})
        rows.append({"start step": e["start_step"], "strength": e["strength"],
                     f"effect: mean KL over {e.get('steps_counted')} steps [95% CI]":
                         format_interval(e.get("value"), e.get("lo"), e.get("hi"), 4, n_clusters=e.get("n_prompts")),
                     label: half_life_text(h.get("value"), h.get("lo"), h.get("hi"), interval=with_iv),
                     "halved within the window": num(h.get("halved_frac")),
                     "prompts": e.get("n_prompts")})
    return pl.DataFrame(rows)


def steering_section(result: Result) -> Section:
    """``(title, html, figures)`` of a steering Result."""
    from trajscope.studies.serving.sections import table

    c, s = result.config, result.summaries
    rows = effect_rows(s)
    setup = (f"<p class='note'><b>Setup.</b> Vector {html_text(str(c.get('vector_name') or c.get('vector') or c.get('pairs')))} "
             f"at layer {num(c.get('layer'))}, mode {html_text(str(c.get('mode')))}; strengths "
             f"{html_text(', '.join(map(str, c.get('strengths') or [])))}; every start depth k is summarised over the "
             f"same window of {num(c.get('window'))} steered steps (k … k + window − 1), teacher-forced on the base "
             f"run's tokens. Intervals: 95 % bootstrap over prompts. "
             + ("" if s.get("complete", True) else "The sweep was stopped early: finished cells only. ") + "</p>")
    body = setup + (table(rows) if rows.height else "<p class='note'>No depth had a full window.</p>")
    return "Steering by start depth", body, [decay_figure(result.table("steering_summary"))]


def decay_figure(summary: pl.DataFrame) -> Any:
    """Bokeh: effect against start depth per strength, whiskers = the 95 % interval (from the summary table)."""
    from bokeh.models import ColumnDataSource, Whisker
    from bokeh.plotting import figure

    summ = summary.filter(pl.col("n_runs") > 0) if "n_runs" in summary.columns else summary
    fig = figure(height=280, sizing_mode="stretch_width", x_axis_type="log", title="Effect vs start depth",
                 x_axis_label="steering starts at decode step k", y_axis_label="mean KL over the window")
    for strength in sorted(summ["strength"].unique().to_list()):
        sub = summ.filter(pl.col("strength") == strength).sort("start_step")
        col = {c: sub[c].cast(pl.Float64).fill_nan(None).to_list() for c in ("effect", "effect_lo", "effect_hi")}
        src = ColumnDataSource({"k": sub["start_step"].to_list(), **col})
        fig.line("k", "effect", source=src, legend_label=f"strength {strength:g}")
        fig.scatter("k", "effect", source=src, size=7)
        fig.add_layout(Whisker(source=src, base="k", lower="effect_lo", upper="effect_hi"))
    return fig

