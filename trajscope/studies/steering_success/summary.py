"""The steering-success study's summaries, computed once from its per-run tables; the headline numbers read them.

Definitions (per arm = vector source × layer × strength, each run paired with the unsteered run
of the same prompt):

- ``french``: share of steered texts that meet the criterion (:func:`trajscope.metrics.steering.is_french`);
  ``base_french`` the same for the unsteered texts;
- ``success``: share of prompts whose steered text meets it **while the unsteered one does not**;
- ``wrong_way``: share whose behaviour score (:func:`~trajscope.metrics.steering.french_score`) is
  *lower* steered than unsteered;
- ``nll_diff``: mean over prompts of (steered − unsteered) NLL per token under the unsteered
  model (the log of the perplexity ratio); ``ppl_ratio`` = ``exp(nll_diff)``, with its interval's ends
  exponentiated;
- **anti-steerable** (Tan et al. 2024, per-example steerability): per prompt the least-squares slope
  of the behaviour score against the strength (the unsteered run at strength 0); anti-steerable
  when the slope is below 0. For the headline vector the strengths are −s, 0, s; for a sweep layer
  0 and its multipliers.

Rates carry Wilson intervals over prompts; means a 95 % bootstrap over prompts
(:func:`trajscope.stats.cluster_bootstrap`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import polars as pl

from trajscope.stats import binomial_interval, cluster_bootstrap


def _rate(prefix: str, hits: np.ndarray) -> dict[str, Any]:
    iv = binomial_interval(int(hits.sum()), len(hits))
    return {prefix: iv.estimate, f"{prefix}_k": int(hits.sum()), f"{prefix}_lo": iv.lo, f"{prefix}_hi": iv.hi}


def _mean(prefix: str, values: np.ndarray, labels: list[str], n_boot: int) -> dict[str, Any]:
    ok = ~np.isnan(values)
    if ok.sum() < 2:
        return {prefix: float(values[ok].mean()) if ok.any() else None, f"{prefix}_lo": None, f"{prefix}_hi": None}
    iv = cluster_bootstrap(values[ok], [x for x, keep in zip(labels, ok) if keep], n_boot=n_boot)
    return {prefix: iv.estimate, f"{prefix}_lo": iv.lo, f"{prefix}_hi": iv.hi}


def _paired(df: pl.DataFrame, n_boot: int) -> dict[str, Any]:
    """The behaviour and fluency columns of one group of paired runs."""
    succ = df["success"].to_numpy().astype(bool)
    base = df["base_success"].to_numpy().astype(bool)
    score, base_score = df["score"].to_numpy(), df["base_score"].to_numpy()
    labels = df["prompt_id"].to_list()
    diff = df["nll"].to_numpy() - df["base_nll"].to_numpy()
    out = {"n": df.height, "n_files": df["file"].n_unique(), **_rate("french", succ), **_rate("base_french", base),
           **_rate("success", succ & ~base), **_rate("wrong_way", score < base_score),
           "score_mean": float(score.mean()), "base_score_mean": float(base_score.mean()),
           "nll_mean": float(np.nanmean(df["nll"].to_numpy())), "base_nll_mean": float(np.nanmean(df["base_nll"].to_numpy())),
           **_mean("nll_diff", diff, labels, n_boot)}
    out.update({f"ppl_ratio{suf}": (None if out[f"nll_diff{suf}"] is None else math.exp(out[f"nll_diff{suf}"]))
                for suf in ("", "_lo", "_hi")})
    return out


def arm_summary(runs: pl.DataFrame, n_boot: int = 1000) -> pl.DataFrame:
    """One row per arm × layer × strength: n, ``french``, ``base_french``, ``success``, ``wrong_way`` (each with
    ``_k``, ``_lo``, ``_hi``), score means, NLL means, ``nll_diff`` and ``ppl_ratio`` with intervals, the share
    of repetition loops (``loops``: fewer than half the words distinct), and for the SAE arm its feature and
    cosine."""
    rows = []
    for (arm, layer, strength), g in runs.group_by("arm", "layer", "strength", maintain_order=True):
        row = {"arm": arm, "layer": int(layer), "strength": float(strength), **_paired(g, n_boot),
               "loops": float((g["distinct"] < 0.5).mean())}
        for extra in ("direction_norm", "feature", "cosine"):
            if extra in g.columns and g[extra].drop_nulls().len():
                row[extra] = g[extra].drop_nulls()[0]
        rows.append(row)
    return pl.DataFrame(rows, infer_schema_length=None)


def _slope(strengths: np.ndarray, scores: np.ndarray) -> float:
    x = strengths - strengths.mean()
    if not (x * x).sum() > 0:
        return math.nan  # every strength equal (strength 0): no slope
    return float((x * (scores - scores.mean())).sum() / (x * x).sum())


def anti_steerable(runs: pl.DataFrame) -> pl.DataFrame:
    """Per vector (the headline with its negation; each sweep layer; the SAE arm): n prompts, the anti-steerable
    count and share (slope of the behaviour score against strength below 0) with its Wilson interval, the flat
    share (slope 0) and the mean slope."""
    groups = runs.with_columns(pl.when(pl.col("arm").str.starts_with("headline")).then(pl.lit("headline"))
                               .otherwise(pl.col("arm")).alias("vector"))
    rows = []
    for (vector, layer), g in groups.group_by("vector", "layer", maintain_order=True):
        slopes = []
        for _, p in g.group_by("prompt_id", maintain_order=True):
            s = np.concatenate([[0.0], p["strength"].to_numpy()])
            y = np.concatenate([[p["base_score"][0]], p["score"].to_numpy()])
            slopes.append(_slope(s, y))
        sl = np.array(slopes)
        sl = sl[~np.isnan(sl)]
        if not len(sl):
            continue
        rows.append({"vector": vector, "layer": int(layer), "strengths": sorted({0.0, *g["strength"].to_list()}),
                     "n": len(sl), **_rate("anti", sl < 0), "flat": float((sl == 0).mean()),
                     "slope_mean": float(sl.mean())})
    return pl.DataFrame(rows, infer_schema_length=None)


def depth_summary(rows: pl.DataFrame, steps: pl.DataFrame, window: int, n_boot: int = 1000) -> pl.DataFrame:
    """Per start depth k: the window's behaviour and fluency columns (as :func:`arm_summary`) beside the steering
    study's onset / effect / accumulation / half-life columns (:func:`trajscope.studies.steering.summary.decay_summary`
    of the teacher-forced steps, the same equal window)."""
    from trajscope.studies.steering.summary import decay_summary

    out = [{"start_step": int(k), **_paired(g, n_boot)} for (k,), g in rows.group_by("start_step", maintain_order=True)]
    beh = pl.DataFrame(out, infer_schema_length=None)
    decay = decay_summary(steps, window=window, n_boot=n_boot).drop("strength", strict=False)
    keep = [c for c in decay.columns if c.split("_lo")[0].split("_hi")[0] in
            ("start_step", "onset_kl", "effect", "from_step1_kl", "changed_frac", "half_life_median", "half_life",
             "halved_frac", "n_short")]
    return beh.join(decay.select(keep), on="start_step", how="left").sort("start_step")


def _num(v: Any) -> float | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def _pick(summary: pl.DataFrame, arm: str) -> dict[str, Any] | None:
    rows = summary.filter(pl.col("arm") == arm) if summary.height else summary
    return rows.row(0, named=True) if rows.height else None


def success_number(summary: pl.DataFrame) -> dict[str, Any]:
    """The headline arm's success rate (steered French, unsteered not) with its Wilson interval."""
    r = _pick(summary, "headline") or {}
    return {"value": _num(r.get("success")), "lo": _num(r.get("success_lo")), "hi": _num(r.get("success_hi")),
            "k": r.get("success_k"), "n": r.get("n"), "layer": r.get("layer"), "strength": r.get("strength")}


def fluency_number(summary: pl.DataFrame) -> dict[str, Any]:
    """The headline arm's fluency cost: steered − unsteered NLL per token (nats) with its bootstrap interval."""
    r = _pick(summary, "headline") or {}
    return {"value": _num(r.get("nll_diff")), "lo": _num(r.get("nll_diff_lo")), "hi": _num(r.get("nll_diff_hi")),
            "n": r.get("n"), "ppl_ratio": _num(r.get("ppl_ratio"))}


def anti_number(anti: pl.DataFrame) -> dict[str, Any]:
    """The headline vector's anti-steerable fraction (slope over −s, 0, s below 0) with its Wilson interval."""
    hit = anti.filter(pl.col("vector") == "headline") if anti.height else anti
    r = hit.row(0, named=True) if hit.height else {}
    return {"value": _num(r.get("anti")), "lo": _num(r.get("anti_lo")), "hi": _num(r.get("anti_hi")),
            "k": r.get("anti_k"), "n": r.get("n")}


def depth_numbers(depth: pl.DataFrame) -> list[dict[str, Any]]:
    """Per start depth: the window's success rate and NLL difference with their intervals."""
    return [{"start_step": r["start_step"], "n": r["n"],
             "success": {"value": _num(r["success"]), "lo": _num(r["success_lo"]), "hi": _num(r["success_hi"])},
             "nll_diff": {"value": _num(r["nll_diff"]), "lo": _num(r["nll_diff_lo"]), "hi": _num(r["nll_diff_hi"])}}
            for r in depth.iter_rows(named=True)] if depth.height else []


def headline(summary: pl.DataFrame, anti: pl.DataFrame, depth: pl.DataFrame) -> dict[str, Any]:
    """The Result's summaries: one entry per headline number (no new computation)."""
    return {"success": success_number(summary), "fluency": fluency_number(summary), "anti_steerable": anti_number(anti),
            "by_depth": depth_numbers(depth)}
