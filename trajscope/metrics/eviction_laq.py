"""Lookahead Q-Cache (LAQ) scores: the prompt keys that a greedy draft's queries and the window's queries attend to.

LAQ (Lookahead Q-Cache, 2025; reference code noforit/Lookahead_Q-Cache) scores prompt keys in two stages:

1. **Stage 1** (``pyramidkv/llama_model.py``, ``select_KV_lookahead_stage``): compress the prompt cache with
   SnapKV (``SnapKVCluster.update_kv``) at the same budget, with max pooling, kernel 7.
2. **Draft**: the first token is the full prefill's greedy choice; the next ``m − 1`` are generated greedily on
   the compressed cache (``LlamaForCausalLM_forward_LAQ``: ``get_softmax_max_tokenid``, at most
   ``lookahead_size`` tokens, stopping early at EOS). The queries of the ``m`` draft tokens, at positions
   ``P … P+m−1``, are kept.
3. **Stage 2** (``SnapKVCluster.update_kv_LAQ``): the last ``w`` prompt queries plus the ``m`` draft queries
   attend to the **full** prompt keys only — a softmax over the P prompt keys, so a draft query's row is
   renormalised over prompt keys — the rows are summed over the ``w + m`` queries for the keys before the
   window, max-pooled (kernel 7, ``F.max_pool1d``), and the top ``B − w`` are kept with the window.

:func:`laq_scores` is stage 2 on attention rows; the study (:mod:`trajscope.studies.eviction.queries`) runs
stages 1 and 2's draft through the model boundary.

The reference masks the ``(w + m) × (w + m)`` block of the last ``w + m`` prompt keys lower-triangularly, as
SnapKV masks its window: query ``i`` of the block sees prompt keys ``≤ P − (w + m) + i``. For the window queries
that hides the ``m`` keys just before each of them (which a causal mask would show), and the draft query ``k``
does not see the last ``m − 1 − k`` prompt keys. ``mask="reference"`` (default) reproduces that; ``mask="positions"``
masks by true positions (a window query sees keys up to itself, a draft query every prompt key). Because a
softmax over a subset of keys is the full softmax restricted and renormalised, both are computed here from rows
over all visible prompt keys, exactly.

Deliberate differences: the stage-1 window is a parameter (the reference scripts use 32 for stage 1 and 8 for
stage 2; the study uses its one ``window`` for both unless told otherwise); EOS does not stop the draft (its
length is always ``m``); per-head selection is per query head, as the reference's query-head cache is.
"""

from __future__ import annotations

import torch

from trajscope.errors import TrajscopeError

KERNEL = 7
LAQ_MASKS = ("reference", "positions")


def renormalise(rows: torch.Tensor, P: int) -> torch.Tensor:
    """Rows restricted to the ``P`` prompt keys and renormalised to sum to 1 (a softmax over prompt keys only)."""
    r = rows[..., :P].float()
    return r / r.sum(-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)


def laq_scores(window_rows: torch.Tensor, draft_rows: torch.Tensor, mask: str = "reference") -> torch.Tensor:
    """LAQ's stage-2 score of every prompt key, before pooling.

    Args:
        window_rows: ``[..., w, P]`` prefill attention rows of the last ``w`` prompt queries (causal).
        draft_rows: ``[..., m, ≥P]`` rows of the ``m`` draft queries over keys whose first ``P`` are the prompt's,
            computed with every prompt key visible (not the compressed cache's mask).
        mask: ``"reference"`` (the code's block mask) or ``"positions"`` (true positions); module docstring.
    Returns:
        ``[..., P]``: the sum over the ``w + m`` queries of their rows over prompt keys, each renormalised over the
        prompt keys it sees.
    """
    if mask not in LAQ_MASKS:
        raise TrajscopeError(f"Unknown LAQ mask '{mask}': choose 'reference' or 'positions'.")
    P, w, m = window_rows.shape[-1], window_rows.shape[-2], draft_rows.shape[-2]
    n = w + m
    if n > P:
        raise TrajscopeError(f"LAQ scores w + m = {n} queries against {P} prompt keys; use w + m ≤ {P}.")
    rows = torch.cat([window_rows[..., :P].float(), draft_rows[..., :P].float()], dim=-2)
    if mask == "reference":
        limit = torch.arange(P - n, P)  # query i of the block sees keys ≤ P − n + i
    else:
        limit = torch.cat([torch.arange(P - w, P), torch.full((m,), P - 1)])
    visible = torch.arange(P)[None, :] <= limit[:, None]
    return renormalise(rows * visible, P).sum(-2)
