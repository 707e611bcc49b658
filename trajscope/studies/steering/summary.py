"""The steering study's summary: the decay of the effect with start depth, computed by
:func:`decay_summary` only, and its headline numbers (:func:`headline`) read from that table.

Per (start depth k, strength), over an **equal window** of steered steps ``k … k + window − 1``
for every depth (runs too short for the whole window are counted in ``n_short``, not averaged):
the onset effect, the mean effect over the window, the same absolute steps under a vector
switched on at step 1, the share of changed tokens and the half-life — the steps after onset
until the KL first falls below half its onset value, **looked for inside the same window** for
every depth (a deep start has fewer steps left in the run; searching the whole rest of the run
would give shallow depths more room to halve). Each mean has a prompt-clustered 95 % bootstrap
interval (:func:`trajscope.stats.cluster_bootstrap`); the median half-life a prompt-clustered
percentile interval of its own (:func:`_half_life_interval`: runs that never halve count as
infinite). Effects per step are :func:`trajscope.metrics.steering.step_effects` (DESIGN.md,
"Steering effect at step s").

The study's ``run`` and the app card's sweep call :func:`decay_summary` once; the Result holds
the table (``steering_summary``) and :func:`headline` of it; the report section, the card and the
written marker read them.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import polars as pl


def _half_life_median(values: list[Any]) -> float | None:
    """Median half-life over runs, a run that never halves inside the window counting as longer than any that
    did; None when at least half never halve."""
    if not values:
        return None
    m = float(np.median([math.inf if v is None else float(v) for v in values]))
    return None if math.isinf(m) else m


def _half_life_interval(values: list[Any], clusters: list[Any], level: float, n_boot: int,
                        seed: int = 0) -> tuple[float | None, float | None]:
    """Percentile interval of :func:`_half_life_median` from resampling prompts with replacement.

    A run that never halves inside the window counts as infinite, as in the median; the quantiles are taken
    without interpolation (``inverted_cdf``), so each end is a median some resample gave, and an end that is
    infinite (at least half a resample's runs never halve) is None. ``(None, None)`` below two prompts.
    """
    v = np.array([math.inf if x is None else float(x) for x in values])
    labels, codes = np.unique(np.asarray([str(c) for c in clusters]), return_inverse=True)
    n_cl = labels.size
    if n_cl < 2:
        return None, None
    members = [np.flatnonzero(codes == c) for c in range(n_cl)]
    rng = np.random.default_rng(seed)
    boot = np.empty(n_boot)
    for b in range(n_boot):
        rows = np.concatenate([members[c] for c in rng.integers(0, n_cl, n_cl)])
        boot[b] = np.median(v[rows])
    a = (1 - level) / 2
    lo, hi = (float(q) for q in np.quantile(boot, [a, 1 - a], method="inverted_cdf"))
    return (None if math.isinf(lo) else lo), (None if math.isinf(hi) else hi)


def decay_summary(steps: pl.DataFrame, window: int = 10, level: float = 0.95, n_boot: int = 500) -> pl.DataFrame:
    """Onset and accumulated effect per start depth, over **equal windows**, with intervals across prompts.

    - ``onset_kl``: KL at the first steered step (the vector's immediate effect);
    - ``effect``: mean KL over the window (immediate plus accumulated);
    - ``end_kl``: KL at the window's last step;
    - ``from_step1_kl``: over the *same absolute steps*, the KL of a vector switched on at step 1 (when the
      sweep has depth 1) — equal steering time against equal depth: if it is higher than ``effect``, what
      looked like decay with depth is accumulation;
    - ``changed_frac``: share of the window's steps whose free-running token changed;
    - ``half_life``: steps after onset, inside the window, until KL first falls below half of its onset value.

    Args:
        steps: the sweep's per-step table (run_id, start_step, strength, step, kl_to_base, token_changed,
            and ``prompt_idx`` for clustering; without it each run is its own cluster).
        window: steered steps per summary.
        level, n_boot: the prompt-clustered bootstrap of :mod:`trajscope.stats`.
    Returns:
        One row per (start_step, strength): n_runs, n_prompts, n_short, steps_counted, and for ``effect``,
        ``onset_kl``, ``from_step1_kl`` and ``changed_frac`` the mean with ``_lo`` / ``_hi``;
        ``effect_mean`` / ``effect_std`` / ``onset_kl_mean`` (the app's names), ``end_kl_mean``,
        ``half_life_median`` (None when at least half the runs never halve inside the window) with
        ``half_life_lo`` / ``half_life_hi`` (its prompt-clustered percentile interval; an end is None where
        the resampled median never halves) and ``halved_frac`` (share of runs that halve inside it).
    """
    from trajscope.stats import cluster_bootstrap

    cluster = "prompt_idx" if "prompt_idx" in steps.columns else "run_id"
    on = steps.filter(pl.col("step") >= pl.col("start_step")).with_columns(
        (pl.col("step") - pl.col("start_step")).alias("since"))
    base1 = (steps.filter(pl.col("start_step") == 1).select("run_id", "strength", "step", pl.col("kl_to_base").alias("_kl1"))
             if (steps["start_step"] == 1).any() else None)
    win = on.filter(pl.col("since") < window)
    if base1 is not None:
        win = win.join(base1, on=["run_id", "strength", "step"], how="left")
    else:
        win = win.with_columns(pl.lit(None, dtype=pl.Float64).alias("_kl1"))
    keys = ["run_id", "start_step", "strength"] + ([cluster] if cluster != "run_id" else [])
    per_run = win.sort("since").group_by(keys).agg(
        pl.len().alias("_n"),
        pl.col("kl_to_base").mean().alias("effect"),
        pl.col("kl_to_base").first().alias("onset_kl"),
        pl.col("kl_to_base").last().alias("end_kl"),
        pl.col("_kl1").mean().alias("from_step1_kl"),
        pl.col("token_changed").cast(pl.Float64).mean().alias("changed_frac"),
        pl.col("since").filter(pl.col("kl_to_base") < pl.col("kl_to_base").first() / 2).min().alias("half_life"),
    ).sort(keys)  # group_by's row order is not fixed: unsorted, the means below sum in another order each run
    full, short = per_run.filter(pl.col("_n") == window), per_run.filter(pl.col("_n") < window)
    rows = []
    for (k, strength), part in full.group_by("start_step", "strength", maintain_order=True):
        row = {"start_step": k, "strength": strength, "n_runs": part.height, "n_prompts": part[cluster].n_unique(),
               "n_short": short.filter((pl.col("start_step") == k) & (pl.col("strength") == strength)).height,
               "steps_counted": window}
        for m in ("effect", "onset_kl", "from_step1_kl", "changed_frac"):
            vals = part[m].cast(pl.Float64).to_numpy()
            ok = ~np.isnan(vals)
            if not ok.any():
                row.update({m: None, f"{m}_lo": None, f"{m}_hi": None})
                continue
            labels = [c for c, keep in zip(part[cluster].to_list(), ok) if keep]
            iv = cluster_bootstrap(vals[ok], labels, level=level, n_boot=n_boot)
            row.update({m: iv.estimate, f"{m}_lo": iv.lo, f"{m}_hi": iv.hi})
        halves = part["half_life"].to_list()
        h_lo, h_hi = _half_life_interval(halves, part[cluster].to_list(), level, n_boot)
        row.update(effect_mean=row["effect"], effect_std=part["effect"].std(), onset_kl_mean=row["onset_kl"],
                   end_kl_mean=part["end_kl"].mean(), half_life_median=_half_life_median(halves),
                   half_life_lo=h_lo, half_life_hi=h_hi,
                   halved_frac=sum(h is not None for h in halves) / len(halves))
        rows.append(row)
    for (k, strength), part in short.group_by("start_step", "strength", maintain_order=True):
        if not any(r["start_step"] == k and r["strength"] == strength for r in rows):
            rows.append({"start_step": k, "strength": strength, "n_runs": 0, "n_prompts": 0,
                         "n_short": part.height, "steps_counted": window})
    if not rows:
        return pl.DataFrame(schema={"start_step": pl.Int64, "strength": pl.Float64, "n_runs": pl.Int64})
    return pl.DataFrame(rows, infer_schema_length=None).sort("strength", "start_step")


def _num(v: Any) -> float | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def headline(summary: pl.DataFrame) -> dict[str, Any]:
    """The headline numbers of a :func:`decay_summary` table, as the Result's summaries (no new computation).

    Returns:
        ``{"effect": [{"start_step", "strength", "value", "lo", "hi", "n_prompts", "steps_counted"}, …],
        "half_life": [{"start_step", "strength", "value", "lo", "hi", "halved_frac"}, …]}``, one entry per
        depth × strength (a half-life ``value``, ``lo`` or ``hi`` of None: not within the window)
        with a full window.
    """
    full = summary.filter(pl.col("n_runs") > 0) if "n_runs" in summary.columns else summary
    effect, half = [], []
    for r in full.iter_rows(named=True):
        where = {"start_step": int(r["start_step"]), "strength": float(r["strength"])}
        effect.append({**where, "value": _num(r.get("effect")), "lo": _num(r.get("effect_lo")),
                       "hi": _num(r.get("effect_hi")), "n_prompts": int(r.get("n_prompts") or 0),
                       "steps_counted": int(r.get("steps_counted") or 0)})
        half.append({**where, "value": _num(r.get("half_life_median")), "lo": _num(r.get("half_life_lo")),
                     "hi": _num(r.get("half_life_hi")), "halved_frac": _num(r.get("halved_frac"))})
    return {"effect": effect, "half_life": half}
