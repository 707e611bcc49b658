"""The compaction study's summary: one function computes every headline number, everything else reads it.

:func:`summarize` turns the per-session tables into ``compaction_summary``: one row per metric, pair
(``A_vs_C`` …, or a setup for attention and decode metrics) and layer (null when not per layer) with
``estimate, lo, hi, n_sessions`` — the mean over sessions of each session's mean over its T3 tokens,
with a percentile-bootstrap interval over sessions (:func:`trajscope.studies.probe.bootstrap_interval`).
Metrics: ``rel_l2`` and ``cosine`` of T3's block outputs (per layer), ``next_token_kl`` and
``next_token_top1_agrees``, ``attention_summary_mass`` / ``attention_summary_mass_max`` /
``attention_masked_mass`` (per layer and setup), and for the greedy continuation after T3
``decode_diverged`` (share of sessions whose continuation leaves C's), ``decode_agree_fraction`` and
``decode_first_divergence`` (the first index where it leaves C's, ``n_new`` when it never does).

:func:`headlines` copies the headline rows into the Result's summaries (the marker file): the
**divergence** — relative L2 of T3's hidden states under A (mask) against C (full context) at the
deepest layer measured — and the next-token KL of A, B and D against C. The report section, the
app's card and the printout read those rows; none of them computes a mean of its own.
"""

from __future__ import annotations

from typing import Any

import polars as pl

SCHEMA = dict(metric=pl.Utf8, pair=pl.Utf8, layer=pl.Int32, estimate=pl.Float64, lo=pl.Float64, hi=pl.Float64,
              n_sessions=pl.Int32)
HEADLINE = ("rel_l2", "A_vs_C")  # metric and pair of the headline number, at the deepest layer


def summarize(states: pl.DataFrame, next_token: pl.DataFrame, attention: pl.DataFrame, decode: pl.DataFrame,
              level: float = 0.95, n_boot: int = 1000) -> pl.DataFrame:
    """The ``compaction_summary`` table (module docstring); each session contributes its mean over T3 tokens."""
    from trajscope.studies.probe import bootstrap_interval

    rows = []

    def add(df: pl.DataFrame, value: str, keys: list[str], metric: str) -> None:
        if df.is_empty():
            return
        # sorted by session: the bootstrap resamples rows in order, so the interval is reproducible
        per = df.group_by(["session_id", *keys]).agg(pl.col(value).mean()).drop_nulls(value).sort("session_id")
        for key, g in per.group_by(keys, maintain_order=True):
            est, lo, hi = bootstrap_interval(g[value].to_numpy(), level=level, n_boot=n_boot)
            d = dict(zip(keys, key))
            rows.append(dict(metric=metric, pair=d.get("pair", d.get("setup")), layer=d.get("layer"),
                             estimate=est, lo=lo, hi=hi, n_sessions=g.height))

    add(states, "rel_l2", ["pair", "layer"], "rel_l2")
    add(states, "cosine", ["pair", "layer"], "cosine")
    add(next_token, "kl", ["pair"], "next_token_kl")
    add(next_token, "top1_agrees", ["pair"], "next_token_top1_agrees")
    att = attention.rename({"setup": "pair"})
    for col in ("summary_mass", "summary_mass_max", "masked_mass"):
        add(att.drop_nulls(col), col, ["pair", "layer"], f"attention_{col}")
    if not decode.is_empty():
        dec = decode.with_columns(pl.col("first_divergence").is_not_null().cast(pl.Float64).alias("diverged"),
                                  pl.col("first_divergence").fill_null(pl.col("n_new")).cast(pl.Float64).alias("depth"))
        add(dec, "diverged", ["setup"], "decode_diverged")
        add(dec, "agree_fraction", ["setup"], "decode_agree_fraction")
        add(dec, "depth", ["setup"], "decode_first_divergence")
    return pl.DataFrame(rows, schema=SCHEMA).sort("metric", "pair", "layer")


def headline(summary: pl.DataFrame) -> dict[str, Any] | None:
    """The headline row of a ``compaction_summary`` (A vs C relative L2 at the deepest layer), or None."""
    metric, pair = HEADLINE
    rows = summary.filter((pl.col("metric") == metric) & (pl.col("pair") == pair)).sort("layer")
    return rows.row(-1, named=True) if rows.height else None


def headlines(summary: pl.DataFrame) -> dict[str, Any]:
    """The Result's summaries: ``divergence`` (:func:`headline`) and ``next_token_kl`` of A, B and D vs C
    (rows of :func:`summarize`'s table, copied)."""
    out: dict[str, Any] = {}
    h = headline(summary)
    if h is not None:
        out["divergence"] = {k: h[k] for k in ("metric", "pair", "layer", "estimate", "lo", "hi", "n_sessions")}
    kl = summary.filter((pl.col("metric") == "next_token_kl") & pl.col("pair").is_in(["A_vs_C", "B_vs_C", "D_vs_C"]))
    out["next_token_kl"] = {r["pair"]: {k: r[k] for k in ("estimate", "lo", "hi", "n_sessions")}
                            for r in kl.iter_rows(named=True)}
    return out
