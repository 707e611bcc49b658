"""The drift study's scoring and summary tables: three regimes at matched positions, held-out
calibration and intervals.

A decode position differs from a prefill position in two ways at once: it reads
text the model wrote itself, and it sits at a later absolute position (prompts
are short, so deep decode steps sit where prefill rarely reaches). Three
regimes separate the two:

- ``prefill``: the model reading the human prompt (positions 1..P−1);
- ``decode``: greedy decode over self-generated text (positions P..P+n−1);
- ``continuation``: the human text that really followed the prompt,
  teacher-forced at the same absolute positions as ``decode``.

``decode`` − ``continuation`` at the same prompt and position is the effect of
self-generated input; ``continuation`` against ``prefill`` at the same position
bin is the effect of position alone. Rows are grouped by absolute-position bin
(:data:`POS_ORDER`: 0–31, 32–63, 64–127, 128–255, 256+), regime and
layer, and every mean comes with a prompt-clustered bootstrap interval
(:func:`trajscope.stats.bootstrap_frame`). Every row also carries its position's chat segment
(system, user, assistant, thinking; :mod:`trajscope.positions`), so drift can be read by turn: the
prompt's system and user turns and its generation prompt in ``prefill``, the answer in ``decode``.

Held-out calibration: the profile's moments, its per-position threshold and
the trajectory-level threshold come from prompt sets disjoint from the
evaluated one (:func:`trajscope.stats.split_ids`). :func:`heldout_fpr` is the
evaluated prompts' prefill false-positive rate per layer; :func:`trajectory_calibration`
calibrates the run statistic (max over steps and layers of score / layer
threshold, :meth:`~trajscope.profile.DriftProbe.run_statistic`) on prefill-like
continuation runs and measures its false-alarm rate on held-out ones.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import polars as pl
import torch

from trajscope import positions
from trajscope.metrics.bands import (POSITION_ORDER, depth_band_expr, entropy_band_expr, position_bin,
                                     position_bin_expr, sort_bands)
from trajscope.profile import ReferenceProfile
from trajscope.conformal import calibrate_max, false_alarm_rate
from trajscope.stats import binomial_interval, bootstrap_frame

REGIMES = ("prefill", "decode", "continuation")
POS_ORDER = POSITION_ORDER  # absolute-position bins, defined once in metrics/bands.py (shared with the SAE report)
ROW_COLUMNS = ("prompt_id", "regime", "pos", "step", "layer", "score", "ratio", "flagged", "entropy",
               "pos_bin", "depth_band", "entropy_band", "segment")


def pos_bin(pos: int) -> str:
    """Label of an absolute position's bin (:func:`trajscope.metrics.bands.position_bin`): ``"0-31"`` … ``"256+"``."""
    if pos < 0:
        raise ValueError(f"positions are ≥ 0, not {pos}")
    return position_bin(pos)


def pos_bin_expr(pos: pl.Expr) -> pl.Expr:
    """:func:`pos_bin` of a Polars column of positions."""
    return position_bin_expr(pos)


def regime_rows(profile: ReferenceProfile, prompt_id: str, regime: str, resid: dict[int, torch.Tensor],
                pos: Sequence[int], prompt_len: int, entropy: Sequence[float] | None = None,
                segments: Sequence[str] | None = None) -> pl.DataFrame:
    """Score residuals of one prompt in one regime against ``profile``.

    Args:
        resid: ``{layer: [n, d_model]}`` block outputs at positions ``pos`` (length n).
        pos: absolute positions of the rows; ``prompt_len`` (P) gives each its query step.
        entropy: ``[n]`` next-token entropy (nats) at each position, or None.
        segments: ``[n]`` each position's chat segment (:mod:`trajscope.positions`: system, user, assistant,
            thinking), or None (then null: not known).
    Returns:
        One row per position × layer with :data:`ROW_COLUMNS`; ``ratio`` = score / the layer's threshold.
    """
    if regime not in REGIMES:
        raise ValueError(f"regime must be one of {REGIMES}, not {regime!r}")
    pos_arr = np.asarray(pos, dtype=np.int64)
    ent = np.full(pos_arr.size, np.nan) if entropy is None else np.asarray(entropy, dtype=np.float64)
    if segments is not None and len(segments) != pos_arr.size:
        raise ValueError(f"{len(segments)} segments for {pos_arr.size} positions")
    seg = pl.Series("segment", [None] * pos_arr.size if segments is None else list(segments), dtype=pl.String)
    parts = []
    for layer in sorted(resid):
        score = profile.score(layer, resid[layer]).numpy()
        thr = float(profile.threshold[layer])
        parts.append(pl.DataFrame({
            "pos": pos_arr, "layer": np.full(pos_arr.size, layer, dtype=np.int16), "score": score,
            "ratio": score / thr, "flagged": score > thr, "entropy": ent, "segment": seg}))
    df = pl.concat(parts).with_columns(
        pl.lit(prompt_id).alias("prompt_id"), pl.lit(regime).alias("regime"),
        pl.col("entropy").fill_nan(None),
        positions.query_step_expr(int(prompt_len)).cast(pl.Int32).alias("step"))
    return df.with_columns(pos_bin_expr(pl.col("pos")).alias("pos_bin"),
                           depth_band_expr(pl.col("step")).alias("depth_band"),
                           entropy_band_expr(pl.col("entropy")).alias("entropy_band")).select(ROW_COLUMNS)


def _order(df: pl.DataFrame, by: Sequence[str]) -> pl.DataFrame:
    """Sort by regime / bins in their natural order (:func:`~trajscope.metrics.bands.sort_bands`), other keys
    as they are."""
    return sort_bands(df, *by, orders={"regime": REGIMES, "pos_bin": POS_ORDER, "segment": positions.SEGMENTS})


def _with_counts(out: pl.DataFrame, df: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """``out`` (a bootstrap summary whose ``n_clusters`` counts resampling units) plus ``n_prompts`` per group."""
    n = (df.group_by(by).agg(pl.col("prompt_id").n_unique().alias("n_prompts")) if by
         else pl.DataFrame({"n_prompts": [df["prompt_id"].n_unique()]}))
    return out.join(n, on=by, how="left", nulls_equal=True) if by else out.with_columns(n["n_prompts"])


def summarize(rows: pl.DataFrame, by: Sequence[str] = ("regime", "pos_bin", "layer"), *, n_boot: int = 1000,
              seed: int = 0, cluster: str = "prompt_id") -> pl.DataFrame:
    """Mean drift score and flagged fraction per group, each with a clustered 95% bootstrap interval.

    ``cluster`` names the resampling unit: ``prompt_id``, or a coarser column such as the prompts'
    source file (prompts cut from one file are not independent).

    Returns:
        One row per group: ``*by, score, score_lo, score_hi, flagged_frac, flagged_frac_lo, flagged_frac_hi,
        n`` (rows), ``n_clusters`` (resampling units), ``n_prompts``.
    """
    by = list(by)
    df = rows.filter(pl.col(by[0]).is_not_null()) if by else rows
    for c in by:
        df = df.filter(pl.col(c).is_not_null())
    df = df.with_columns(pl.col("flagged").cast(pl.Float64).alias("flagged_frac"))
    s = bootstrap_frame(df, "score", by, cluster=cluster, n_boot=n_boot, seed=seed)
    f = bootstrap_frame(df, "flagged_frac", by, cluster=cluster, n_boot=n_boot, seed=seed)
    out = s.drop("n_clusters").join(f.drop("n"), on=by, how="left", nulls_equal=True)
    return _order(_with_counts(out, df, by), by)


def paired_gap(rows: pl.DataFrame, by: Sequence[str] = ("pos_bin", "layer"), *, a: str = "decode",
               b: str = "continuation", n_boot: int = 1000, seed: int = 0, cluster: str = "prompt_id") -> pl.DataFrame:
    """Regime ``a`` minus regime ``b`` at the same prompt, position and layer, averaged per group.

    Returns:
        ``*by, score_gap, score_gap_lo, score_gap_hi, flagged_gap, flagged_gap_lo, flagged_gap_hi, n`` (matched
        position × layer rows), ``n_clusters``, ``n_prompts``; intervals are bootstrap (95%) clustered by
        ``cluster`` (see :func:`summarize`).
    """
    by = list(by)
    key = ["prompt_id", "pos", "layer"]
    keep = [*key, *[c for c in (*by, cluster) if c not in key], "score", "flagged"]
    x = rows.filter(pl.col("regime") == a).select(keep)
    y = rows.filter(pl.col("regime") == b).select(*key, "score", "flagged")
    m = x.join(y, on=key, suffix="_b").with_columns(
        (pl.col("score") - pl.col("score_b")).alias("score_gap"),
        (pl.col("flagged").cast(pl.Float64) - pl.col("flagged_b").cast(pl.Float64)).alias("flagged_gap"))
    if m.height == 0:
        return pl.DataFrame()
    s = bootstrap_frame(m, "score_gap", by, cluster=cluster, n_boot=n_boot, seed=seed)
    f = bootstrap_frame(m, "flagged_gap", by, cluster=cluster, n_boot=n_boot, seed=seed)
    out = s.drop("n_clusters").join(f.drop("n"), on=by, how="left", nulls_equal=True)
    return _order(_with_counts(out, m, by), by)


def heldout_fpr(rows: pl.DataFrame, *, n_boot: int = 1000, seed: int = 0, cluster: str = "prompt_id") -> pl.DataFrame:
    """Per layer, the flagged fraction of the ``prefill`` rows (held-out prompts' prefill positions).

    Returns:
        ``layer, fpr, fpr_lo, fpr_hi`` (bootstrap clustered by ``cluster``, 95%), ``wilson_lo, wilson_hi``
        (binomial Wilson interval treating positions as independent: narrower, shown for comparison),
        ``n_positions``, ``n_clusters``, ``n_prompts``.
    """
    pre = rows.filter(pl.col("regime") == "prefill").with_columns(pl.col("flagged").cast(pl.Float64).alias("fpr"))
    out = _with_counts(bootstrap_frame(pre, "fpr", ["layer"], cluster=cluster, n_boot=n_boot, seed=seed), pre, ["layer"])
    wil = []
    for layer, g in pre.partition_by("layer", as_dict=True, maintain_order=True).items():
        iv = binomial_interval(int(g["flagged"].sum()), g.height)
        wil.append({"layer": layer[0], "wilson_lo": iv.lo, "wilson_hi": iv.hi})
    out = out.join(pl.DataFrame(wil, schema={"layer": pre.schema["layer"], "wilson_lo": pl.Float64,
                                             "wilson_hi": pl.Float64}), on="layer")
    return out.rename({"n": "n_positions"}).select(
        "layer", "fpr", "fpr_lo", "fpr_hi", "wilson_lo", "wilson_hi", "n_positions", "n_clusters", "n_prompts").sort("layer")


def run_statistics(rows: pl.DataFrame, regime: str) -> pl.DataFrame:
    """Per prompt, the run statistic of ``regime``'s rows: max over (step ≥ 1, layer) of ``ratio``.

    Returns:
        ``prompt_id, run_statistic, n_scores`` (the (step, layer) cells behind each max).
    """
    return (rows.filter((pl.col("regime") == regime) & (pl.col("step") >= 1))
            .group_by("prompt_id").agg(pl.col("ratio").max().alias("run_statistic"), pl.len().alias("n_scores"))
            .sort("prompt_id"))


def trajectory_calibration(calibrate: pl.DataFrame, evaluate: dict[str, pl.DataFrame], target_rate: float) -> dict[str, Any]:
    """Calibrate the trajectory-level threshold and measure flag rates on held-out runs.

    Args:
        calibrate: :func:`run_statistics` of prefill-like calibration runs (continuation regime, calibrate split).
        evaluate: ``{name: run_statistics frame}`` of held-out runs to measure (e.g. ``continuation``, ``decode``).
        target_rate: the false-alarm rate wanted (:func:`trajscope.conformal.calibrate_max`).
    Returns:
        ``{"target_rate", "expected_rate", "threshold", "n_calibrate", "rates": {name: {"rule", "rate", "se", "lo",
        "hi", "k", "n"}}}`` with Wilson 95% intervals, for the calibrated rule and (``"<name>, any flagged
        cell"``) for the uncontrolled rule "any (step, layer) above its per-position threshold"; ``expected_rate`` = (n+1−k)/(n+1), the exact false-alarm rate of
        the k-th smallest of n calibration maxima on exchangeable runs (≤ target; equal when (n+1)·target is an
        integer).
    """
    import math

    cal = [np.array([v]) for v in calibrate["run_statistic"].to_list()]
    thr = calibrate_max(cal, target_rate)
    n_cal = len(cal)
    k_order = math.ceil(round((n_cal + 1) * (1 - target_rate), 9))
    expected = (n_cal + 1 - k_order) / (n_cal + 1)
    rates = {}
    for name, df in evaluate.items():
        runs = [np.array([v]) for v in df["run_statistic"].to_list()]
        for rule, t in (("trajectory", thr), ("any cell", 1.0)):  # any cell: a flagged (step, layer) is ratio > 1
            rate, se = false_alarm_rate(runs, t)
            k = int(round(rate * len(runs)))
            iv = binomial_interval(k, len(runs))
            rates[name if rule == "trajectory" else f"{name}, any flagged cell"] = {
                "rule": rule, "rate": rate, "se": se, "lo": iv.lo, "hi": iv.hi, "k": k, "n": len(runs)}
    return {"target_rate": float(target_rate), "expected_rate": expected, "threshold": thr, "n_calibrate": n_cal,
            "rates": rates}
