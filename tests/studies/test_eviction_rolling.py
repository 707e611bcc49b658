"""Rolling eviction (StreamingLLM, H2O held at their budget during decode) against the reference rules.

- On a toy attention, the kept sets after every pass equal a few-line re-implementation of
  mit-han-lab/streaming-llm ``StartRecentKVCache.__call__`` and FMInference/H2O
  ``H2OKVCache_LayerWise`` (``_update_hh_score`` and ``__call__``), run on a physical cache of positions.
- On a tiny Llama, rolling StreamingLLM's greedy tokens equal Hugging Face's greedy decode on a cache that is
  physically cut to the first 4 and last ``B − 4`` entries after every step (RoPE positions continuing).
- A budget covering prompt and answer (or 1.0) equals the full run exactly.
"""

from __future__ import annotations

import pytest
import torch

from tiny import hf_reference
from trajscope.errors import TrajscopeError
from trajscope.metrics import eviction_rolling as er
from trajscope.studies.eviction import rolling

PROMPT = "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n"


def toy_logits(H, N, seed):
    return torch.randn(H, N, N, generator=torch.Generator().manual_seed(seed)) * 2


def ref_h2o(Z, P, steps, hh_size, recent):
    """H2OKVCache_LayerWise on a physical cache: per head, the cached positions and their hh scores."""
    H = Z.shape[0]
    causal = torch.ones(P, P).tril().bool()
    attn = Z[:, :P, :P].masked_fill(~causal, float("-inf")).softmax(-1)[None]  # [1, H, P, P]
    hh = attn.sum(0).sum(1)  # _update_hh_score, first call
    cache = torch.arange(P).repeat(H, 1)
    out = []
    for t in range(steps + 1):
        if t:  # a decode query at position P + t - 1 over the cache plus its own key
            q = P + t - 1
            cache = torch.cat([cache, torch.full((H, 1), q)], 1)
            w = torch.stack([Z[h, q, cache[h]].softmax(-1) for h in range(H)])[None, :, None]  # [1, H, 1, C+1]
            new = w.sum(0).sum(1)
            new[:, :-1] += hh
            hh = new
        seq_len = cache.shape[1]
        if seq_len > hh_size + recent:  # __call__
            keep_topk = torch.topk(hh[:, :seq_len - recent], hh_size, dim=-1).indices.sort().values
            keep_recent = torch.arange(seq_len - recent, seq_len).repeat(H, 1)
            mask = torch.zeros(hh.shape, dtype=torch.bool).scatter(-1, torch.cat([keep_topk, keep_recent], -1), 1)
            cache, hh = cache[mask].view(H, -1), hh[mask].view(H, -1)
        out.append([set(cache[h].tolist()) for h in range(H)])
    return out


def ours_h2o(Z, P, steps, B, recent):
    H = Z.shape[0]
    causal = torch.ones(P, P).tril().bool()
    rows = Z[:, :P, :P].masked_fill(~causal, float("-inf")).softmax(-1)  # [H, P, P]
    scores = er.h2o_accumulate(torch.zeros(H, 0), rows)
    kept = er.h2o_evict(scores, torch.ones(H, P, dtype=torch.bool), B, recent)
    out = [kept]
    for t in range(1, steps + 1):
        q = P + t - 1
        kept = torch.cat([kept, torch.ones(H, 1, dtype=torch.bool)], 1)
        row = Z[:, q, :q + 1].masked_fill(~kept, float("-inf")).softmax(-1)[:, None]  # the masked row, 0 on hidden
        scores = er.h2o_accumulate(scores, row)
        kept = er.h2o_evict(scores, kept, B, recent)
        out.append(kept)
    return [[set(torch.nonzero(k[h]).reshape(-1).tolist()) for h in range(H)] for k in out]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("B, recent", [(10, 4), (16, 8), (7, 2)])
def test_h2o_rolling_kept_sets_equal_the_reference_cache_at_every_step(seed, B, recent):
    Z = toy_logits(3, 40, seed)
    ref = ref_h2o(Z, 24, 12, B - recent, recent)
    got = ours_h2o(Z, 24, 12, B, recent)
    assert got == ref
    assert all(len(s) == B for step in got for s in step)
    assert got[-1][0] != set(range(24 + 12 - B, 24 + 12))  # heavy hitters are not just the newest entries


@pytest.mark.parametrize("B", [6, 11, 20])
def test_streaming_rolling_kept_sets_equal_start_recent_kv_cache(B):
    start, recent = 4, B - 4
    cache = torch.arange(30)
    for n in range(30, 45):
        seq_len = cache.shape[0]
        if seq_len > start + recent:  # StartRecentKVCache.__call__ on a cache of positions
            cache = torch.cat([cache[:start], cache[seq_len - recent:]])
        assert set(torch.nonzero(er.streaming_kept(n, B)).reshape(-1).tolist()) == set(cache.tolist())
        cache = torch.cat([cache, torch.tensor([n])])


def hf_streaming_greedy(model, ids, B, n_new):
    """HF greedy decode with the cache physically cut to 4 sinks + the last B − 4 entries after every pass."""
    from transformers import DynamicCache

    hf = hf_reference(model)
    P = len(ids)

    def cut(cache):
        out = DynamicCache()
        for layer in range(model.n_layers):
            k, v = cache.layers[layer].keys, cache.layers[layer].values
            n = k.shape[2]
            if n > B:
                idx = torch.cat([torch.arange(4), torch.arange(n - (B - 4), n)])
                k, v = k[:, :, idx], v[:, :, idx]
            out.update(k, v, layer)
        return out

    with torch.no_grad():
        out = hf(torch.tensor([ids]), use_cache=True)
        cache, toks = cut(out.past_key_values), [int(out.logits[0, -1].argmax())]
        for t in range(n_new - 1):
            step = hf(torch.tensor([[toks[-1]]]), past_key_values=cache, position_ids=torch.tensor([[P + t]]),
                      use_cache=True)
            cache = cut(step.past_key_values)
            toks.append(int(step.logits[0, -1].argmax()))
    return toks


@pytest.mark.parametrize("B", [8, 14])
def test_rolling_streamingllm_equals_hf_greedy_on_a_physically_cut_cache(tiny_models, B):
    model = tiny_models["llama"]
    ids = model.encode(PROMPT)
    pre = model.forward(ids, return_cache=True)
    toks, first, b = rolling.rolling_decode(model, len(ids), pre, 10, "streamingllm_rolling", B)
    assert b == B and int(first[0, 0].sum()) == B
    assert toks == hf_streaming_greedy(model, ids, B, 10)
    assert toks != model.decode_on_cache(len(ids), pre, 10, None)[0]  # the cut changes the answer here


@pytest.mark.parametrize("policy", er.ROLLING)
def test_rolling_with_a_budget_covering_prompt_and_answer_equals_the_full_run(tiny_models, policy):
    model = tiny_models["llama"]
    ids = model.encode(PROMPT)
    P, n = len(ids), 8
    pre = model.forward(ids, return_cache=True)
    full, _ = model.decode_on_cache(P, pre, n, None)
    scores = rolling.prompt_scores(model, ids)
    for budget in (1.0, P + n):
        toks, first, _ = rolling.rolling_decode(model, P, pre, n, policy, budget, window=4, scores=scores)
        assert toks == full and bool(first.all())
    # the cache itself is never changed: a second call gives the same tokens
    assert rolling.rolling_decode(model, P, pre, n, policy, 1.0, window=4, scores=scores)[0] == full


def test_rolling_h2o_holds_its_budget_and_refuses_a_budget_within_the_window(tiny_models):
    model = tiny_models["llama"]
    ids = model.encode(PROMPT)
    pre = model.forward(ids, return_cache=True)
    scores = rolling.prompt_scores(model, ids)
    toks, first, b = rolling.rolling_decode(model, len(ids), pre, 6, "h2o_rolling", 12, window=4, scores=scores)
    assert len(toks) == 6 and b == 12 and bool((first.sum(-1) == 12).all())
    with pytest.raises(TrajscopeError, match="not larger than the 4"):
        rolling.rolling_decode(model, len(ids), pre, 6, "h2o_rolling", 4, window=4, scores=scores)
