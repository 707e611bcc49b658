"""Per-step vs accumulated eviction damage: is a step hurt by its own query, or by the history it reads?

Evicting prompt keys can hurt decode step ``s`` in two ways. Its query may need an evicted key *now*; or the
tokens generated before it were themselves computed without the evicted keys, so the keys and values of that
history — which every later query reads — carry the damage forward. The masked re-run of the eviction study
mixes both. This module separates them, the same split that steering's "at step k" got, teacher-forced on the
full run's tokens so every arm sees the same tokens:

- **per-step** arm (:meth:`~trajscope.model.ModelHandle.per_step_logits`): at step ``s`` only the current query
  attends over the masked prompt; the generated history it reads was computed unmasked (the full run's cache).
- **accumulated** arm: the teacher-forced forward with every decode query masked (history computed under the
  mask too) — the study's ``kl_to_full``.

Per step: ``kl_per_step`` and ``kl_accumulated``, each KL(p_full ‖ p_arm) of the next-token distribution, and
``kl_carried = kl_accumulated − kl_per_step`` (the part the history carries). :func:`split_summary` gives each
with a prompt-clustered bootstrap interval; the carried part is the *paired* difference (both arms at the same
steps of the same prompts), so its interval is the one to read for "damage accumulates through generated tokens".
Step 0 (the prefill's own prediction) is the same in all arms and left out; at step 1 there is no generated
history yet, so the two arms are equal by construction.
"""

from __future__ import annotations

from typing import Any, Sequence

import polars as pl
import torch

from trajscope.metrics import eviction as ev
from trajscope.metrics.bands import depth_band_expr

METRICS = ("kl_per_step", "kl_accumulated", "kl_carried")


def _kl(full: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    lp, lq = full.float().log_softmax(-1), other.float().log_softmax(-1)
    return (lp.exp() * (lp - lq)).sum(-1).clamp_min(0.0)


def split_steps(model: Any, token_ids: Sequence[int], prompt_len: int, key_mask: torch.Tensor,
                full_logits: torch.Tensor | None = None) -> pl.DataFrame:
    """Per decode step ``s = 1 … T−1−P``: ``kl_per_step``, ``kl_accumulated`` and ``kl_carried``.

    Args:
        token_ids: the full run's prompt + continuation (T tokens), teacher-forced in every arm.
        prompt_len: P. ``key_mask``: ``[L, H, ≥T]`` keys decode queries may see (:func:`~trajscope.metrics.eviction.key_mask`).
        full_logits: ``model.forward(token_ids[:-1]).logits`` if already computed.
    Returns:
        ``step`` (Int32) and the three KL columns (Float64).
    """
    ids, P = list(token_ids), int(prompt_len)
    if full_logits is None:
        full_logits = model.forward(ids[:-1]).logits
    full = full_logits[P:]
    acc = model.forward(ids[:-1], prompt_len=P, key_mask=key_mask).logits[P:]
    per = model.per_step_logits(ids, P, key_mask)
    kl_per, kl_acc = _kl(full, per).double(), _kl(full, acc).double()
    return pl.DataFrame({"step": list(range(1, full.shape[0] + 1)), "kl_per_step": kl_per.tolist(),
                         "kl_accumulated": kl_acc.tolist(), "kl_carried": (kl_acc - kl_per).tolist()},
                        schema_overrides={"step": pl.Int32})


def split_frame(model: Any, token_ids: Sequence[int], prompt_len: int, sel: ev.Selection, run_id: str,
                full_logits: torch.Tensor | None = None) -> pl.DataFrame:
    """:func:`split_steps` for one policy's selection, tagged ``run_id, policy, budget`` (the ``eviction_split`` rows)."""
    out = split_steps(model, token_ids, prompt_len, ev.key_mask(sel, len(token_ids)), full_logits)
    return out.select(pl.lit(run_id).alias("run_id"), pl.lit(sel.policy).alias("policy"),
                      pl.lit(float(sel.budget)).alias("budget"), pl.all())


def split_summary(split: pl.DataFrame, level: float = 0.95, n_boot: int = 500, seed: int = 0) -> pl.DataFrame:
    """Per policy, budget and decode-depth band: the mean of each arm's KL and of the paired difference
    ``kl_carried``, each with a prompt-clustered bootstrap interval (``{metric}_lo`` / ``{metric}_hi``)."""
    from trajscope.stats import bootstrap_frame

    keys = ["policy", "budget", "depth_band"]
    df = split.with_columns(depth_band_expr(pl.col("step")).alias("depth_band"))
    out = None
    for metric in METRICS:
        part = bootstrap_frame(df, metric, keys, "run_id", level=level, n_boot=n_boot, seed=seed)
        out = part if out is None else out.join(part.drop("n", "n_clusters"), on=keys)
    return out.rename({"n_clusters": "n_prompts", "n": "n_rows"}).sort(keys)
