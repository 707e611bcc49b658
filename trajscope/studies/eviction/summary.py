"""The eviction study's summary: one function computes every headline number, everything else reads it.

:func:`summarize` turns the per-step tables (``eviction_steps``, ``eviction_rerun``) into the
``eviction_summary`` table: per policy, budget and decode-depth band — plus one row per policy and
budget over **every** decode step (``depth_band = "all"``) — the mean of

- ``recall_at_k``: share of a decode step's top-k attended prompt positions that were kept;
- ``evicted_mass``: the step's attention on evicted prompt keys;
- ``kl_to_full``: KL(p_full ‖ p_masked) of the next-token distribution, teacher-forced;
- ``token_agreement``: the free-running masked run's greedy token equals the full run's;
- ``forced_agreement``: the teacher-forced masked cache's greedy token equals the full cache's;

each with a prompt-clustered bootstrap interval (:func:`trajscope.stats.bootstrap_frame`; columns
``{metric}_lo`` / ``{metric}_hi``, NaN with one prompt) and ``n_prompts``. Step 0 (the prefill's own
prediction, the same in every arm) is left out.

The study's :class:`~trajscope.studies.registry.Result` holds this table, and :func:`headlines` copies
its ``all`` rows into the Result's summaries (the marker file). The report section, the app's card
and ``trajscope study eviction``'s printout read those; none of them computes a mean of its own.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from trajscope.metrics.bands import DEPTH_ORDER, depth_band_expr, sort_bands

ALL = "all"
METRICS = ("recall_at_k", "evicted_mass", "kl_to_full", "token_agreement", "forced_agreement")
RERUN_SCHEMA = {"run_id": pl.String, "policy": pl.String, "budget": pl.Float64, "step": pl.Int32,
                "kl_to_full": pl.Float64, "token_agrees": pl.Boolean, "forced_agrees": pl.Boolean}
HEADLINE = "kl_to_full"  # the number the card, the report and the marker lead with (recall without re-runs)


def summarize(steps: pl.DataFrame, rerun: pl.DataFrame, level: float = 0.95, n_boot: int = 500) -> pl.DataFrame:
    """The ``eviction_summary`` table (module docstring).

    Args:
        steps: ``eviction_steps`` (run_id, policy, budget, step, layer, head, recall_at_k, evicted_mass).
        rerun: ``eviction_rerun`` (run_id, policy, budget, step, kl_to_full, token_agrees, forced_agrees);
            may be empty (no re-runs).
    Returns:
        policy, budget, depth_band (``all`` first, then the bands in depth order), each metric with
        ``_lo`` / ``_hi``, ``n_rows`` and ``n_prompts``.
    """
    from trajscope.stats import bootstrap_frame

    def boot(df: pl.DataFrame, metric: str, keys: list[str]) -> pl.DataFrame:
        return bootstrap_frame(df, metric, keys, "run_id", level=level, n_boot=n_boot)

    band = depth_band_expr(pl.col("step")).alias("depth_band")
    st = steps.filter(pl.col("step") >= 1)
    if "forced_agrees" not in rerun.columns:  # tables written before it was measured
        rerun = rerun.with_columns(pl.lit(None, pl.Boolean).alias("forced_agrees"))
    rr = rerun.filter(pl.col("step") >= 1).with_columns(
        pl.col("token_agrees").cast(pl.Float64).alias("token_agreement"),
        pl.col("forced_agrees").cast(pl.Float64).alias("forced_agreement"))
    parts = []
    for frame_st, frame_rr, keys in ((st.with_columns(pl.lit(ALL).alias("depth_band")),
                                      rr.with_columns(pl.lit(ALL).alias("depth_band")), ["policy", "budget", "depth_band"]),
                                     (st.with_columns(band), rr.with_columns(band), ["policy", "budget", "depth_band"])):
        out = boot(frame_st, "recall_at_k", keys).join(boot(frame_st, "evicted_mass", keys).drop("n", "n_clusters"),
                                                        on=keys)
        for metric in METRICS[2:]:
            if frame_rr[metric].drop_nulls().len():
                out = out.join(boot(frame_rr, metric, keys).drop("n", "n_clusters"), on=keys, how="left")
            else:
                out = out.with_columns(pl.lit(None, pl.Float64).alias(c) for c in (metric, f"{metric}_lo", f"{metric}_hi"))
        parts.append(out.rename({"n_clusters": "n_prompts", "n": "n_rows"}))
    return sort_bands(pl.concat(parts, how="vertical_relaxed"), "policy", "budget", "depth_band",
                      orders={"depth_band": (ALL, *DEPTH_ORDER)})


def headlines(summary: pl.DataFrame) -> dict[str, Any]:
    """The Result's summaries: ``{"<policy>@<budget>": {metric: {value, lo, hi}, n_prompts}}`` from the
    ``all`` rows of :func:`summarize`'s table (a copy, not a recomputation)."""
    out: dict[str, Any] = {}
    for r in summary.filter(pl.col("depth_band") == ALL).iter_rows(named=True):
        out[key(r["policy"], r["budget"])] = {
            "policy": r["policy"], "budget": r["budget"], "n_prompts": r["n_prompts"],
            **{m: {"value": r[m], "lo": r[f"{m}_lo"], "hi": r[f"{m}_hi"]} for m in METRICS}}
    return out


def key(policy: str, budget: float) -> str:
    """The summaries' key of one policy and budget: ``"snapkv@0.5"``."""
    return f"{policy}@{float(budget):g}"
