"""Steering effect by decode step, and its decay with the depth at which steering starts.

Definitions (DESIGN.md, "Steering effect at step s"). For a vector switched on at
start depth k, compared with the unsteered base run from the same prompt:

- ``kl_to_base`` = KL(p_base ‖ p_steered) of the next-token distribution at step
  s, both computed teacher-forced on the *base* tokens, so the number measures the
  intervention and not the divergence of the two texts;
- ``target_logit_delta`` = mean over target tokens of (steered − base) logit;
- ``projection`` = residual at the steered layer · unit direction (steered,
  teacher-forced), and ``projection_base`` the same without steering;
- ``token_changed`` = the free-running steered run produced a different token at
  step s than the base run (null once either run has ended).

Decay (:func:`decay_summary`): per (start depth, strength), over an equal window
of steered steps for every depth — the onset effect, the accumulated effect, the
same absolute steps under a vector switched on at step 1, changed tokens and the
half-life, each with a prompt-clustered bootstrap interval.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import torch

from trajscope import positions


def kl_divergence(base_logits: torch.Tensor, steered_logits: torch.Tensor) -> torch.Tensor:
    """KL(p_base ‖ p_steered) per row, in nats.

    Args:
        base_logits, steered_logits: ``[n, vocab]``.
    Returns:
        ``[n]`` float64.
    """
    lp = torch.log_softmax(base_logits.double(), -1)
    lq = torch.log_softmax(steered_logits.double(), -1)
    return (lp.exp() * (lp - lq)).sum(-1)


def step_effects(base_logits: torch.Tensor, steered_logits: torch.Tensor, resid_base: torch.Tensor,
                 resid_steered: torch.Tensor, unit: torch.Tensor, base_tokens: list[int],
                 steered_tokens: list[int], prompt_len: int, targets: list[int] | None = None) -> pl.DataFrame:
    """Per decode step effects of one steered run against its base run.

    Args:
        base_logits, steered_logits: ``[T, vocab]`` teacher-forced logits on the base tokens
            (row p predicts the token at p + 1).
        resid_base, resid_steered: ``[T, d_model]`` at the steered layer.
        unit: ``[d_model]`` unit steering direction.
        base_tokens, steered_tokens: the two free-running sequences (prompt included).
        prompt_len: P.
        targets: token ids whose logit change is tracked.
    Returns:
        One row per step ``s = 0 .. T − P`` whose query is the last prompt token or a
        generated one (``pos = max(P − 1, P + s − 1)``; step 0 is the prefill's last query, which
        produces the first generated token): step, pos, kl_to_base, target_logit_delta,
        projection, projection_base, token_changed (of the token that step produces).
    """
    T = base_logits.shape[0]
    pos = np.arange(prompt_len - 1, T)
    step = positions.query_step(pos, prompt_len)
    kl = kl_divergence(base_logits[pos], steered_logits[pos]).numpy()
    if targets:
        idx = torch.tensor(targets)
        delta = (steered_logits[pos][:, idx] - base_logits[pos][:, idx]).double().mean(-1).numpy()
    else:
        delta = np.full(len(pos), np.nan)
    u = unit.double()
    proj = (resid_steered[pos].double() @ u).numpy()
    proj_base = (resid_base[pos].double() @ u).numpy()
    changed = [None if p + 1 >= min(len(base_tokens), len(steered_tokens)) else
               bool(base_tokens[p + 1] != steered_tokens[p + 1]) for p in pos]
    return pl.DataFrame({
        "step": step.astype(np.int32), "pos": pos.astype(np.int32), "kl_to_base": kl,
        "target_logit_delta": delta, "projection": proj, "projection_base": proj_base,
        "token_changed": pl.Series(changed, dtype=pl.Boolean),
    }).with_columns(pl.col("target_logit_delta").fill_nan(None))


def decay_summary(steps: pl.DataFrame, window: int = 10, level: float = 0.95, n_boot: int = 500) -> pl.DataFrame:
    """Onset and accumulated effect per start depth, over **equal windows**, with intervals across prompts.

    Every start depth k is summarised over the same number of steered steps, ``k … k + window − 1``
    (runs too short to hold the whole window are left out and counted in ``n_short``), so depths are
    compared at equal exposure:

    - ``onset_kl``: KL at the first steered step (the vector's immediate effect);
    - ``effect``: mean KL over the window (immediate plus accumulated);
    - ``end_kl``: KL at the window's last step;
    - ``from_step1_kl``: over the *same absolute steps*, the KL of a vector switched on at step 1 (when the
      sweep has depth 1) — equal steering time against equal depth: if it is higher than ``effect``, what
      looked like decay with depth is accumulation;
    - ``changed_frac``: share of the window's steps whose free-running token changed;
    - ``half_life``: steps after onset until KL first falls below half of its onset value (null if never).

    Args:
        steps: the sweep's per-step table (run_id, start_step, strength, step, kl_to_base, token_changed,
            and ``prompt_idx`` for clustering; without it each run is its own cluster).
        window: steered steps per summary.
        level, n_boot: the prompt-clustered bootstrap of :mod:`trajscope.stats`.
    Returns:
        One row per (start_step, strength): n_runs, n_prompts, n_short, steps_counted, and for ``effect``,
        ``onset_kl``, ``from_step1_kl`` and ``changed_frac`` the mean with ``_lo`` / ``_hi``;
        ``effect_mean`` / ``effect_std`` / ``onset_kl_mean`` (the app's names), ``end_kl_mean``,
        ``half_life_median``.
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
    )
    half = on.sort("since").group_by("run_id", "start_step", "strength").agg(
        pl.col("since").filter(pl.col("kl_to_base") < pl.col("kl_to_base").first() / 2).min().alias("half_life"))
    per_run = per_run.join(half, on=["run_id", "start_step", "strength"], how="left")
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
        row.update(effect_mean=row["effect"], effect_std=part["effect"].std(), onset_kl_mean=row["onset_kl"],
                   end_kl_mean=part["end_kl"].mean(), half_life_median=part["half_life"].median())
        rows.append(row)
    for (k, strength), part in short.group_by("start_step", "strength", maintain_order=True):
        if not any(r["start_step"] == k and r["strength"] == strength for r in rows):
            rows.append({"start_step": k, "strength": strength, "n_runs": 0, "n_prompts": 0,
                         "n_short": part.height, "steps_counted": window})
    if not rows:
        return pl.DataFrame(schema={"start_step": pl.Int64, "strength": pl.Float64, "n_runs": pl.Int64})
    return pl.DataFrame(rows, infer_schema_length=None).sort("strength", "start_step")
