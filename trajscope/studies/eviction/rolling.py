"""Greedy decode under rolling eviction: the cache is cut back to its budget after every step.

The rules (which entries stay after a cut) and their sources are in :mod:`trajscope.metrics.eviction_rolling`;
this module runs them on a model. After the shared prefill (its cache, as in
:meth:`~trajscope.model.ModelHandle.decode_on_cache`), the prompt is cut to ``B`` entries per head; then every
decode query attends to the kept entries plus its own key, under a per-head key mask over prompt *and*
generated positions, and the cache is cut again. H2O adds each step's attention row (the masked row: what the
query really used, 0 on hidden keys) to its scores before the cut; its prompt scores are every prefill
query's row summed (``rows_sum``, one extra prefill forward).

A budget that covers the prompt (``B ≥ P``) does not evict at all (the module docstring of
:mod:`~trajscope.metrics.eviction_rolling` says why), so the 1.0 column equals the full model exactly.
"""

from __future__ import annotations

from typing import Any

import torch

from trajscope.errors import TrajscopeError
from trajscope.metrics import eviction as ev
from trajscope.metrics import eviction_rolling as er


def prompt_scores(model: Any, ids: list[int]) -> torch.Tensor:
    """H2O's prompt scores: every prefill query's attention row summed, ``[L, H, P]``."""
    out = model.forward(ids, attention_rows=len(ids), rows_sum=True)
    return torch.stack([out.attn[layer][:, 0] for layer in sorted(out.attn)])


def first_cut(policy: str, P: int, budget: int, window: int, scores: torch.Tensor | None, L: int,
              H: int) -> torch.Tensor:
    """``[L, H, P]`` bool: the prompt entries that stay after prefill's cut."""
    if policy == "streamingllm_rolling":
        return er.streaming_kept(P, budget).expand(L, H, P).clone()
    if scores is None:
        raise TrajscopeError("Rolling H2O needs the prompt's accumulated attention (prompt_scores).")
    full = torch.ones(H, P, dtype=torch.bool)
    return torch.stack([er.h2o_evict(scores[layer], full, budget, window) for layer in range(L)])


def rolling_decode(model: Any, prompt_len: int, prefill: Any, n_new: int, policy: str, budget: float | int, *,
                   window: int = 32, scores: torch.Tensor | None = None,
                   full: list[int] | None = None) -> tuple[list[int], torch.Tensor, float]:
    """Greedy ``n_new`` tokens with the cache held at ``budget`` entries per head (prompt and generated).

    Args:
        prompt_len: P. ``prefill``: ``model.forward(prompt, return_cache=True)`` (its cache is copied, never changed).
        policy: ``"streamingllm_rolling"`` or ``"h2o_rolling"``. ``budget``: a fraction of P or a count
            (:func:`~trajscope.metrics.eviction.resolve_budget`).
        window: H2O's recent entries (``recent_size``). ``scores``: H2O's prompt scores (:func:`prompt_scores`).
        full: the full cache's greedy tokens, if already decoded (returned as they are when nothing is evicted).
    Returns:
        ``(tokens, kept, budget_tokens)``: the generated ids, the ``[L, H, P]`` prompt entries kept right after
        prefill's cut, and ``B``.
    Raises:
        TrajscopeError: unknown policy, or a budget not larger than what the policy always keeps.
    """
    if policy not in er.ROLLING:
        raise TrajscopeError(f"Unknown rolling policy '{policy}': choose {' or '.join(er.ROLLING)}.")
    P, L, H = int(prompt_len), model.n_layers, model.n_heads
    B = ev.resolve_budget(budget, P)
    if B >= P:  # no eviction: the full model, exactly
        toks = list(full) if full else model.decode_on_cache(P, prefill, n_new, None)[0]
        return toks, torch.ones(L, H, P, dtype=torch.bool), float(P)
    always = ev.SINKS if policy == "streamingllm_rolling" else window
    if B <= always:
        raise TrajscopeError(f"A budget of {B} tokens is not larger than the {always} entries '{policy}' always "
                             f"keeps; raise the budget or shrink the window.")
    h2o = policy == "h2o_rolling"
    N = P + n_new
    kept = torch.zeros(L, H, N, dtype=torch.bool)
    kept[:, :, :P] = first_cut(policy, P, B, window, scores, L, H)
    first = kept[:, :, :P].clone()
    acc = torch.zeros(L, H, N)
    if h2o:
        acc[:, :, :P] = scores.float()
    ids = [int(prefill.logits[-1].argmax())]
    cache = prefill.cache
    for t in range(n_new - 1):
        pos = P + t  # the query of token ids[-1]
        kept[:, :, pos] = True
        out = model.forward([ids[-1]], prompt_len=P, key_mask=kept[:, :, :pos + 1], past=cache, return_cache=True,
                            attention_rows=int(h2o))
        cache = out.cache
        if h2o:
            rows = torch.stack([out.attn[layer] for layer in sorted(out.attn)])  # [L, H, 1, pos + 1]
            acc[:, :, :pos + 1] = er.h2o_accumulate(acc[:, :, :pos], rows)
            for layer in range(L):
                kept[layer, :, :pos + 1] = er.h2o_evict(acc[layer, :, :pos + 1], kept[layer, :, :pos + 1], B, window)
        else:
            kept[:, :, :pos + 1] = er.streaming_kept(pos + 1, B)
        ids.append(int(out.logits[-1].argmax()))
    return ids, first, float(B)
