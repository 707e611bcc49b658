"""Rolling KV eviction: the cache is held at its budget while tokens are generated (StreamingLLM, H2O).

The static policies of :mod:`trajscope.metrics.eviction` choose the kept prompt keys once, after prefill, and
every generated token stays. StreamingLLM and H2O, as their papers and code run them, instead hold the whole
cache — prompt and generated tokens — at ``B`` entries: after every forward pass (prefill, then each decode
step) the cache is cut back to ``B``. Reference code:

- StreamingLLM — mit-han-lab/streaming-llm ``streaming_llm/kv_cache.py``, ``StartRecentKVCache.__call__``:
  when the cache holds more than ``start_size + recent_size`` entries, keep the first ``start_size`` (4 sinks)
  and the last ``recent_size``. Here ``recent_size = B − 4`` (:func:`streaming_kept`).
- H2O — FMInference/H2O ``h2o_hf/utils_real_drop/modify_llama.py``, ``H2OKVCache_LayerWise``: each head's
  score of a cached key is the attention it received, summed over every query so far (prefill queries, then
  each decode query's row, ``_update_hh_score``); when the cache holds more than ``hh_size + recent_size``
  entries, keep the ``recent_size`` newest entries plus the ``hh_size`` best-scored among the rest
  (``__call__``), and the scores of the evicted keys go with them. Here ``recent_size = w`` and
  ``hh_size = B − w`` (:func:`h2o_evict`, :func:`h2o_accumulate`).

In both, a decode query attends to the ``B`` kept entries plus its own key (the cut happens after the
forward), and so does trajscope's rolling decode (:mod:`trajscope.studies.eviction.rolling`).

Deliberate differences, each for a stated reason:

- Evicted keys are hidden by a per-head key mask (:func:`trajscope.metrics.eviction.key_mask`), not removed;
  keys keep their original RoPE positions. streaming-llm's own Llama patch re-assigns positions inside the
  cache (``pos_shift``); H2O's ``utils_real_drop`` applies RoPE at the original positions as here.
- One kept set per query head (KVCache-Factory's ``query_head`` granularity). H2O's code keeps one per cached
  head and predates grouped-query attention; SmolLM2's 9 query heads share 3 key heads.
- ``recent_size = w`` and ``hh_size = B − w`` (as trajscope's static ``h2o`` and KVCache-Factory's
  ``H2OKVCluster``), not H2O's ``heavy_ratio`` / ``recent_ratio`` of the sequence length.
- Ties in the top-k go to the lower position (stable sort); ``torch.topk`` leaves them to the kernel.
- A budget that covers every prompt position (``B ≥ P``, e.g. 1.0) is "no eviction": nothing is cut during
  decode either, so that column is the full model exactly (the reference caches would cut the generated
  tokens once ``P + t`` exceeds ``B``).
"""

from __future__ import annotations

import torch

from trajscope.metrics.eviction import SINKS

ROLLING = ("streamingllm_rolling", "h2o_rolling")


def streaming_kept(n_keys: int, budget: int, sinks: int = SINKS) -> torch.Tensor:
    """``[n_keys]`` bool: StreamingLLM's cache after a cut to ``budget`` entries (the first ``sinks`` and the
    last ``budget − sinks``); everything when ``n_keys ≤ budget``."""
    kept = torch.zeros(n_keys, dtype=torch.bool)
    if n_keys <= budget:
        kept[:] = True
        return kept
    kept[:sinks] = True
    kept[n_keys - (budget - sinks):] = True
    return kept


def h2o_accumulate(scores: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """H2O's ``_update_hh_score``: ``scores [..., K_old]`` plus this pass's attention ``rows [..., n, K]`` summed
    over its ``n`` queries (``K ≥ K_old``; new keys start at their own column's sum). Evicted keys' rows are 0."""
    out = rows.float().sum(-2)
    out[..., : scores.shape[-1]] += scores.float()
    return out


def h2o_evict(scores: torch.Tensor, kept: torch.Tensor, budget: int, recent: int) -> torch.Tensor:
    """H2O's cut (``H2OKVCache_LayerWise.__call__``) of each head's cache to ``budget`` entries.

    Args:
        scores: ``[H, K]`` accumulated attention per head and key position.
        kept: ``[H, K]`` bool, the cache before the cut (its entries in position order are the cache).
        budget: entries after the cut. ``recent``: the newest kept entries that always stay.
    Returns:
        ``[H, K]`` bool: per head the ``recent`` newest kept entries plus the ``budget − recent`` best-scored
        among the others (ties by lower position); ``kept`` itself when a head holds ≤ ``budget``.
    """
    out = kept.clone()
    for h in range(kept.shape[0]):
        idx = torch.nonzero(kept[h]).reshape(-1)
        if idx.numel() <= budget:
            continue
        cand = idx[: idx.numel() - recent]
        order = torch.argsort(-scores[h, cand].float(), stable=True)[: budget - recent]
        row = torch.zeros_like(kept[h])
        row[idx[idx.numel() - recent:]] = True
        row[cand[order]] = True
        out[h] = row
    return out
