"""Plots of the Compaction card: pure functions, the card's Result (Polars tables) in, HoloViews elements out.

- :func:`divergence_plot` — per layer, how far T3's hidden states under A (mask), B (restart)
  and D (mask early) are from C (full context): relative L2, the rows of the Result's
  ``compaction_summary`` (mean over T3 tokens; computed once by the study's summary function);
- :func:`attention_plot` — per layer, the attention mass T3's queries put on the summary's
  keys under each setup (the summary's ``attention_summary_mass`` rows);
- :func:`probe_plot` — the shipped study's held-out probe accuracy by layer under each setup,
  with its 95% intervals, the shuffled-label control and the majority baseline;
- :func:`continuations_html` — the setups' greedy continuations after T3, side by side.
"""

from __future__ import annotations


import holoviews as hv
import holoviews.plotting.bokeh  # noqa: F401  (registers the bokeh backend's plot options)
import polars as pl

from trajscope.escaping import html_text
from trajscope.studies.compaction.state import SETUP_LABELS, CardResult

COLORS = {"A": "#1f77b4", "B": "#ff7f0e", "C": "#2ca02c", "D": "#9467bd"}


def _rows(summary: pl.DataFrame, metric: str) -> pl.DataFrame:
    return summary.filter(pl.col("metric") == metric).sort("pair", "layer")


def divergence_by_layer(summary: pl.DataFrame) -> pl.DataFrame:
    """``pair, layer, rel_l2, cosine``: the summary's rows for A, B and D against C."""
    rel = _rows(summary, "rel_l2").select("pair", "layer", pl.col("estimate").alias("rel_l2"))
    cos = _rows(summary, "cosine").select("pair", "layer", pl.col("estimate").alias("cosine"))
    return (rel.join(cos, on=["pair", "layer"], how="left").filter(pl.col("pair").is_in(["A_vs_C", "B_vs_C", "D_vs_C"]))
            .sort("pair", "layer"))


def divergence_plot(res: CardResult) -> hv.Overlay:
    """Relative L2 of T3's block outputs to C's, per layer, one line per setup (A, B, D)."""
    df = divergence_by_layer(res.summary)
    curves = []
    for pair in ("A_vs_C", "B_vs_C", "D_vs_C"):
        sub = df.filter(pl.col("pair") == pair).select("layer", "rel_l2", "cosine").to_pandas()
        s = pair[0]
        curves.append(hv.Curve(sub, "layer", ["rel_l2", "cosine"], label=SETUP_LABELS[s]).opts(
            color=COLORS[s], tools=["hover"], line_width=2,
            hover_tooltips=[("layer", "@layer"), ("rel. L2", "@rel_l2{0.0000}"), ("cosine", "@cosine{0.0000}")]))
        curves.append(hv.Scatter(sub, "layer", "rel_l2").opts(color=COLORS[s], size=6))
    return hv.Overlay(curves).opts(
        title="T3 hidden states vs the full context C (rel. L2, mean over T3 tokens)", responsive=True, height=260,
        legend_position="right", xlabel="layer (block output)", ylabel="‖x − x_C‖ / ‖x_C‖", show_grid=True)


def attention_by_layer(summary: pl.DataFrame) -> pl.DataFrame:
    """``setup, layer, summary_mass``: the summary's ``attention_summary_mass`` rows (mean over T3 tokens and heads)."""
    return _rows(summary, "attention_summary_mass").select(pl.col("pair").alias("setup"), "layer",
                                                           pl.col("estimate").alias("summary_mass"))


def attention_plot(res: CardResult) -> hv.Overlay:
    """Attention mass of T3's queries on the summary, per layer, one line per setup."""
    df = attention_by_layer(res.summary)
    curves = []
    for s in ("A", "B", "C", "D"):
        sub = df.filter(pl.col("setup") == s).to_pandas()
        curves.append(hv.Curve(sub, "layer", ["summary_mass"], label=SETUP_LABELS[s]).opts(
            color=COLORS[s], line_width=2, tools=["hover"],
            hover_tooltips=[("layer", "@layer"), ("on summary", "@summary_mass{0.000}")]))
    return hv.Overlay(curves).opts(
        title="Attention of T3's queries on the summary's keys (mean over T3 tokens and heads)", responsive=True,
        height=260, legend_position="right", xlabel="layer", ylabel="attention mass", ylim=(-0.02, 1.02),
        show_grid=True)


def probe_by_layer(probe: pl.DataFrame) -> pl.DataFrame:
    """``setup, control, layer, accuracy, lo, hi, majority``: the probe fitted and read under the same setup."""
    return (probe.filter(pl.col("train_setup") == pl.col("test_setup"))
            .select(pl.col("train_setup").alias("setup"), "control", "layer", "accuracy", "lo", "hi", "majority")
            .sort("setup", "control", "layer"))


def probe_plot(res: CardResult) -> hv.Overlay | None:
    """Held-out probe accuracy by layer per setup (real labels, 95% CI), shuffled labels and majority baseline."""
    if res.probe is None or res.probe.is_empty():
        return None
    df = probe_by_layer(res.probe)
    parts = []
    for i, s in enumerate(("A", "B", "C", "D")):
        sub = df.filter((pl.col("setup") == s) & (pl.col("control") == "real")).with_columns(
            (pl.col("layer") + (i - 1.5) * 0.06).alias("x"), (pl.col("accuracy") - pl.col("lo")).alias("neg"),
            (pl.col("hi") - pl.col("accuracy")).alias("pos")).to_pandas()
        parts.append(hv.ErrorBars(sub, "x", ["accuracy", "neg", "pos"]).opts(color=COLORS[s]))
        parts.append(hv.Scatter(sub, "x", ["accuracy", "lo", "hi", "layer"], label=SETUP_LABELS[s]).opts(
            color=COLORS[s], size=7, tools=["hover"],
            hover_tooltips=[("layer", "@layer"), ("accuracy", "@accuracy{0.000} [@lo{0.000}, @hi{0.000}]")]))
    sh = (df.filter(pl.col("control") == "shuffled").group_by("layer", maintain_order=True).agg(pl.col("accuracy").mean())
          .sort("layer").to_pandas())
    parts.append(hv.Curve(sh, "layer", "accuracy", label="shuffled labels (mean over setups)").opts(
        color="#888888", line_dash="dashed"))
    maj = df.group_by("layer", maintain_order=True).agg(pl.col("majority").first()).sort("layer").to_pandas()
    parts.append(hv.Curve(maj, "layer", "majority", label="majority baseline").opts(color="black", line_dash="dotted"))
    return hv.Overlay(parts).opts(
        title="Probe of the masked fact by layer (shipped study, held-out accuracy, 95% CI)", responsive=True,
        height=280, legend_position="right", xlabel="layer", ylabel="accuracy", ylim=(0, 1), show_grid=True)


def continuations_html(res: CardResult) -> str:
    """The greedy continuations after T3 of A, B and C (and D), side by side, with where each leaves C's."""
    cells = []
    for s in ("A", "B", "C", "D"):
        fd = res.first_divergence.get(s)
        tag = ("reference" if s == "C" else ("same as C" if fd is None else f"leaves C's at token {fd}"))
        text = html_text(res.continuations.get(s, ""))
        cells.append(f"<div class='ts-cp-setup ts-cp-{s}' style='flex:1;min-width:180px;border-top:3px solid "
                     f"{COLORS[s]};padding:4px'><b>{html_text(SETUP_LABELS[s])}</b><br><small>{tag}</small>"
                     f"<pre style='white-space:pre-wrap;font-size:12px'>{text}</pre></div>")
    t3 = html_text(res.session.t3)
    fact = f"; the fact only T1 states: <code>{html_text(res.session.fact)}</code>" if res.session.fact else ""
    return (f"<div><small>continuations after T3 <code>{t3}</code> ({res.n_new} greedy tokens){fact}</small>"
            f"<div style='display:flex;gap:8px;flex-wrap:wrap'>{''.join(cells)}</div></div>")
