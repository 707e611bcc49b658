"""The SAE drift study's report section, read from its Result only.

The headline numbers come from ``result.summaries`` (:func:`~trajscope.studies.sae_drift.summary.summarize`,
computed once when the study ran). A Result written before the study kept summaries is summarised
from its tables by the same function. One figure: FVU by decode depth band per mix, with the
prefill level as a reference.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from trajscope.escaping import html_text
from trajscope.interval_text import format_interval
from trajscope.studies.registry import Result
from trajscope.studies.sae_drift import summary as S

TITLE = "SAE drift: reconstruction and feature overlap, prefill vs decode"


def summaries_of(result: Result) -> dict[str, Any]:
    """The Result's summaries; for a Result saved without them, :func:`summarize` over its tables."""
    if any(k != "setup" for k in result.summaries):
        return result.summaries
    return {**result.summaries, **S.summarize(result.table("sae-drift_seeds"), result.table("sae-drift_diff"),
                                              result.table("sae-drift_overlap"))}


def _ci(s: dict[str, Any]) -> str:
    return format_interval(s.get("value"), s.get("lo"), s.get("hi"), n_clusters=s.get("n_prompts"))


def _seed_range(s: dict[str, Any]) -> str:
    lo, hi = s.get("seed_min"), s.get("seed_max")
    return "—" if lo is None or hi is None else f"{lo:.3f}–{hi:.3f}"


def _setup(setup: dict[str, Any]) -> str:
    if not setup:
        return ""
    mixes = ", ".join(f"{html_text(k)} (seeds {', '.join(map(str, v))})" for k, v in setup.get("mixes", {}).items())
    lvl = int(round(100 * float(setup.get("level", 0.95))))
    return (f"<p>Layer {setup.get('layer')}: {setup.get('n_prompts')} prompts, {setup.get('n_rows')} rows "
            f"({html_text(str(setup.get('split') or 'unsplit'))} prompts). SAEs: {mixes}. Values are seed means "
            f"with {lvl}% prompt-clustered bootstrap intervals ({setup.get('n_boot')} resamples of prompts); the "
            f"seed range is the noise floor. Overlap: top-{setup.get('overlap_k')} feature sets by frequency, "
            f"beside {setup.get('n_null')} draws of a matched-n prefill-vs-prefill null.</p>")


def _table(head: list[str], rows: list[list[str]]) -> str:
    th = "".join(f"<th>{h}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table class='ts-table'><tr>{th}</tr>{body}</table>"


def section(result: Result) -> tuple[str, str, list]:
    """``(title, html, figures)`` of one SAE drift Result."""
    summ = summaries_of(result)
    mixes = list(summ.get("setup", {}).get("mixes", {})) or sorted(
        {k.split(" ", 2)[2] for k in summ if k.startswith("fvu prefill ")})
    rows = []
    for mix in mixes:
        pre, dec = summ.get(f"fvu prefill {mix}", {}), summ.get(f"fvu decode {mix}", {})
        rows.append([html_text(mix), _ci(pre), _seed_range(pre), _ci(dec), _seed_range(dec)])
    body = _setup(summ.get("setup", {}))
    body += "<h3>FVU (centred), all prefill rows vs all decode rows</h3>" + _table(
        ["SAE", "prefill [95% CI]", "prefill seeds", "decode [95% CI]", "decode seeds"], rows)
    diffs = [(k, s) for k, s in summ.items() if k.startswith("fvu decode ") and " − " in k]
    if diffs:
        body += "<h3>Decode FVU against the first SAE (paired)</h3>" + _table(
            ["difference", "value [95% CI]", "seed floor", "verdict"],
            [[html_text(k.removeprefix("fvu decode ")), _ci(s),
              "—" if s.get("seed_floor") is None else f"{s['seed_floor']:.3f}", html_text(str(s.get("verdict")))]
             for k, s in diffs])
    jac = [(k, s) for k, s in summ.items() if k.startswith("jaccard decode ")]
    if jac:
        body += "<h3>Feature overlap, prefill vs decode, at matched n</h3>" + _table(
            ["SAE", "Jaccard (seed mean)", "prefill-vs-prefill null", "seeds outside the null"],
            [[html_text(k.removeprefix("jaccard decode ")), format_interval(s.get("value"), None, None),
              format_interval(s.get("null_mean"), s.get("null_lo"), s.get("null_hi")),
              f"{s.get('seeds_outside_null')}/{s.get('n_seeds')}"] for k, s in jac])
    return TITLE, body, [_depth_figure(result)]


def _depth_figure(result: Result) -> Any:
    """FVU by decode depth band per mix (seed means with intervals), prefill level as a dashed line."""
    from bokeh.models import Span, Whisker, ColumnDataSource
    from bokeh.palettes import Category10
    from bokeh.plotting import figure

    seeds = result.table("sae-drift_seeds").filter(pl.col("metric") == "fvu")
    bands = seeds.filter(pl.col("kind") == "depth_band")
    order = list(dict.fromkeys(bands["group"].to_list()))
    fig = figure(title="FVU by decode depth (steps); dashed: prefill", x_range=order or ["—"], height=280,
                 sizing_mode="stretch_width", y_axis_label="FVU (centred)", toolbar_location=None)
    for i, (mix, g) in enumerate(bands.group_by(["sae"], maintain_order=True)):
        colour = Category10[10][i % 10]
        src = ColumnDataSource({"x": g["group"].to_list(), "y": g["value"].to_list(), "lo": g["lo"].to_list(),
                                "hi": g["hi"].to_list()})
        fig.line("x", "y", source=src, color=colour, legend_label=str(mix[0]))
        fig.scatter("x", "y", source=src, color=colour)
        fig.add_layout(Whisker(source=src, base="x", lower="lo", upper="hi", line_color=colour))
        pre = seeds.filter((pl.col("kind") == "phase") & (pl.col("phase") == "prefill") & (pl.col("sae") == mix[0]))
        if pre.height:
            fig.add_layout(Span(location=float(pre["value"][0]), dimension="width", line_color=colour,
                                line_dash="dashed"))
    return fig
