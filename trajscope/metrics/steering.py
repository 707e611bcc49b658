"""Steering effect by decode step of one steered run against its base run.

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

The decay of these effects with start depth is the steering study's summary
(:func:`trajscope.studies.steering.summary.decay_summary`).
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
