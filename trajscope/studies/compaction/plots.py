"""Plot data of the Compaction card: pure functions, the card's Result (Polars tables) in, plain tables or columns
out (drawn by :mod:`trajscope.studies.compaction.figures`).

- :func:`divergence_by_layer` — per layer, how far T3's hidden states under A (mask), B (restart)
  and D (mask early) are from C (full context): relative L2, the rows of the Result's
  ``compaction_summary`` (mean over T3 tokens; computed once by the study's summary function);
- :func:`attention_by_layer` — per layer, the attention mass T3's queries put on the summary's
  keys under each setup (the summary's ``attention_summary_mass`` rows);
- :func:`probe_data` — the shipped study's held-out probe accuracy by layer under each setup,
  with its 95% intervals, the shuffled-label control and the majority baseline;
- :func:`continuations_html` — the setups' greedy continuations after T3, side by side.
"""

from __future__ import annotations


import polars as pl

from trajscope.escaping import html_text
from trajscope.studies.compaction.state import SETUP_LABELS, CardResult

COLORS = {"A": "#1f77b4", "B": "#ff7f0e", "C": "#2ca02c", "D": "#9467bd"}
SETUPS = ("A", "B", "C", "D")
PAIRS = ("A_vs_C", "B_vs_C", "D_vs_C")


def _rows(summary: pl.DataFrame, metric: str) -> pl.DataFrame:
    return summary.filter(pl.col("metric") == metric).sort("pair", "layer")


def divergence_by_layer(summary: pl.DataFrame) -> pl.DataFrame:
    """``pair, layer, rel_l2, cosine``: the summary's rows for A, B and D against C."""
    rel = _rows(summary, "rel_l2").select("pair", "layer", pl.col("estimate").alias("rel_l2"))
    cos = _rows(summary, "cosine").select("pair", "layer", pl.col("estimate").alias("cosine"))
    return (rel.join(cos, on=["pair", "layer"], how="left").filter(pl.col("pair").is_in(["A_vs_C", "B_vs_C", "D_vs_C"]))
            .sort("pair", "layer"))


def attention_by_layer(summary: pl.DataFrame) -> pl.DataFrame:
    """``setup, layer, summary_mass``: the summary's ``attention_summary_mass`` rows (mean over T3 tokens and heads)."""
    return _rows(summary, "attention_summary_mass").select(pl.col("pair").alias("setup"), "layer",
                                                           pl.col("estimate").alias("summary_mass"))


def probe_by_layer(probe: pl.DataFrame) -> pl.DataFrame:
    """``setup, control, layer, accuracy, lo, hi, majority``: the probe fitted and read under the same setup."""
    return (probe.filter(pl.col("train_setup") == pl.col("test_setup"))
            .select(pl.col("train_setup").alias("setup"), "control", "layer", "accuracy", "lo", "hi", "majority")
            .sort("setup", "control", "layer"))


def probe_data(res: CardResult) -> dict | None:
    """The probe's held-out accuracy by layer per setup (real labels, 95% CI), the shuffled-label control (mean
    over setups) and the majority baseline; None when the result has no probe table.

    Returns:
        ``{"setups": {setup: {"x", "layer", "accuracy", "lo", "hi"}}`` (x: the layer nudged per setup so the
        intervals do not overlap), ``"shuffled": {"layer", "accuracy"}, "majority": {"layer", "majority"}}``.
    """
    if res.probe is None or res.probe.is_empty():
        return None
    df = probe_by_layer(res.probe)
    setups = {}
    for i, s in enumerate(SETUPS):
        sub = df.filter((pl.col("setup") == s) & (pl.col("control") == "real")).with_columns(
            (pl.col("layer") + (i - 1.5) * 0.06).alias("x"))
        setups[s] = {c: sub[c].to_list() for c in ("x", "layer", "accuracy", "lo", "hi")}
    sh = df.filter(pl.col("control") == "shuffled").group_by("layer", maintain_order=True).agg(
        pl.col("accuracy").mean()).sort("layer")
    maj = df.group_by("layer", maintain_order=True).agg(pl.col("majority").first()).sort("layer")
    return {"setups": setups, "shuffled": {c: sh[c].to_list() for c in ("layer", "accuracy")},
            "majority": {c: maj[c].to_list() for c in ("layer", "majority")}}


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
