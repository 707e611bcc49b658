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

What a steered *text* does (the steering-success study, :mod:`trajscope.studies.steering_success`):

- the language criterion, from the text alone: French and English function words counted by
  :func:`language_counts`; the behaviour score :func:`french_score` = (fr − en) / max(1, fr + en);
  success :func:`is_french` = at least :data:`MIN_FRENCH_WORDS` French words and more French than
  English ones; or, for a vector planted toward tokens, :func:`token_share` (:func:`behaviour`);
- fluency: :func:`mean_nll`, the mean NLL per token of a text under teacher-forced logits (of the
  unsteered model), whose exponential is its perplexity.
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


# -- behaviour and fluency of a steered text (the steering-success study) ------------------------------------------

#: French function words of the language criterion (closed-class words, so topic words never count).
FRENCH_WORDS = frozenset(
    "le la les un une des du de et est sont je tu il elle nous vous ils elles que qui dans pour pas avec sur au "
    "aux ce cette ces mais ou donc très plus être avoir fait peut votre nos leur comme aussi bien".split())
#: English function words of the criterion.
ENGLISH_WORDS = frozenset(
    "the a an and is are i you he she we they that which in for not with on to this these but or so very more be "
    "have it its can your our their as also well of".split())
#: A text is French when it holds at least this many French function words (and more French than English ones).
MIN_FRENCH_WORDS = 3


def language_counts(text: str) -> tuple[int, int]:
    """(French, English) function-word counts of ``text``: lower-cased word tokens, an elided article
    (``l'huile``) counted as its word after the apostrophe."""
    import re

    words = [w.split("'")[-1] for w in re.findall(r"[a-zàâçéèêëîïôûùüÿœ']+", text.lower().replace("’", "'"))]
    return sum(w in FRENCH_WORDS for w in words), sum(w in ENGLISH_WORDS for w in words)


def french_score(text: str) -> float:
    """The behaviour score: ``(fr − en) / max(1, fr + en)`` over function words, in [−1, 1]
    (−1 all English, +1 all French, 0 for a text with neither)."""
    fr, en = language_counts(text)
    return (fr - en) / max(1, fr + en)


def is_french(text: str) -> bool:
    """The success criterion: at least :data:`MIN_FRENCH_WORDS` French function words and more French than
    English ones."""
    fr, en = language_counts(text)
    return fr >= MIN_FRENCH_WORDS and fr > en


def token_share(token_ids: list[int], targets: list[int]) -> float:
    """Share of ``token_ids`` that are one of ``targets`` (0.0 for no tokens): the behaviour score of a
    vector planted toward tokens."""
    return sum(t in set(targets) for t in token_ids) / len(token_ids) if token_ids else 0.0


def behaviour(text: str, token_ids: list[int], targets: list[int] | None = None) -> tuple[float, bool]:
    """``(score, success)`` of a generated text under the study's criterion.

    Without ``targets`` the criterion is the language one (:func:`french_score`, :func:`is_french`); with
    ``targets`` the score is :func:`token_share` and success is a share of at least one half.
    """
    if targets:
        share = token_share(token_ids, targets)
        return share, share >= 0.5
    return french_score(text), is_french(text)


def mean_nll(logits: torch.Tensor, targets: list[int]) -> float:
    """Mean negative log-likelihood (nats/token) of ``targets`` under teacher-forced ``logits``; its exponential is
    the perplexity.

    Args:
        logits: ``[n, vocab]``, row i the next-token logits that predict ``targets[i]``.
        targets: n ≥ 1 token ids.
    """
    if len(targets) < 1 or logits.shape[0] != len(targets):
        raise ValueError(f"{logits.shape[0]} logit rows for {len(targets)} targets")
    lp = torch.log_softmax(logits.double(), -1)
    return float(-lp.gather(-1, torch.tensor(list(targets))[:, None]).mean())
