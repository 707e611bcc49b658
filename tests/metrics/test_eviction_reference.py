"""Each policy's kept set equals a small re-implementation of its reference code on fixed attention.

The re-implementations below follow KVCache-Factory ``pyramidkv/pyramidkv_utils.py`` (``SnapKVCluster``,
``PyramidKVCluster``, ``H2OKVCluster``) and Lookahead_Q-Cache ``SnapKVCluster.update_kv_LAQ`` statement by
statement, from query and key vectors, with one stated change: ``torch.topk`` leaves ties to the kernel, so the
re-implementation breaks them by lower position, as trajscope does (max pooling makes ties common).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from trajscope.metrics import eviction as ev

L, H, P, D = 3, 2, 48, 8


def qk(seed: int, n_extra: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(L, H, P + n_extra, D, generator=g) * 1.5
    k = torch.randn(L, H, P + n_extra, D, generator=g) * 1.5
    return q, k


def causal_attention(q, k):
    """[L, H, T, T] softmax(q kᵀ / √d) with a causal mask (what the model's prefill attention is)."""
    T = q.shape[-2]
    s = q @ k.transpose(-1, -2) / math.sqrt(D)
    s = s.masked_fill(torch.ones(T, T).triu(1).bool(), float("-inf"))
    return s.softmax(-1)


def stable_topk(scores: torch.Tensor, n: int) -> torch.Tensor:
    return torch.argsort(-scores, dim=-1, stable=True)[..., :n]


def ref_window_cache(q, k, w, kernel, pooling):
    """``update_kv``'s scoring: window queries, window-block causal mask, softmax, sum, pool (one layer)."""
    attn = q[..., -w:, :] @ k.transpose(-1, -2) / math.sqrt(D)
    mask = torch.full((w, w), torch.finfo(attn.dtype).min)
    cond = torch.arange(w)
    mask.masked_fill_(cond < (cond + 1).view(w, 1), 0)
    attn[:, -w:, -w:] += mask[None]
    attn = F.softmax(attn, dim=-1, dtype=torch.float32)
    s = attn[:, -w:, :-w].sum(dim=-2)
    pool = F.avg_pool1d if pooling == "avgpool" else F.max_pool1d
    return pool(s, kernel_size=kernel, padding=kernel // 2, stride=1)


def ref_kept(cache, capacity, w):
    keep = torch.zeros(cache.shape[0], P, dtype=torch.bool)
    keep.scatter_(1, stable_topk(cache, capacity), True)
    keep[:, P - w:] = True
    return keep


def ref_snapkv(q, k, B, w, kernel=5, pooling="avgpool"):
    return torch.stack([ref_kept(ref_window_cache(q[layer], k[layer], w, kernel, pooling), B - w, w)
                        for layer in range(L)])


def ref_pyramid_capacity(B, w, q_len, layer, n_layers, beta=20):
    """``PyramidKVCluster.update_kv``'s capacity, verbatim integer arithmetic."""
    min_num = (B - w) // beta
    max_num = (B - w) * 2 - min_num
    if max_num >= q_len - w:
        max_num = q_len - w
        min_num = (B - w) * 2 - max_num
    steps = (max_num - min_num) // (n_layers - 1)
    cap = max_num - layer * steps
    if q_len < B:
        return q_len - w
    if q_len < (B - w) * 2:
        return B - w
    return cap


def ref_h2o(attn, B, w):
    s = attn[..., :, :-w].sum(dim=-2)  # every prompt query
    return torch.stack([ref_kept(s[layer], B - w, w) for layer in range(L)])


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("B, w", [(12, 4), (20, 8), (30, 6)])
def test_snapkv_h2o_streamingllm_equal_the_reference(seed, B, w):
    q, k = qk(seed)
    attn = causal_attention(q, k)
    assert torch.equal(ev.select("snapkv", attn, B, window=w).mask, ref_snapkv(q, k, B, w))
    assert torch.equal(ev.select("snapkv", attn, B, window=w, pooling=("max", 7)).mask,
                       ref_snapkv(q, k, B, w, 7, "maxpool"))
    assert torch.equal(ev.select("h2o", attn, B, window=w).mask, ref_h2o(attn, B, w))
    sl = ev.select("streamingllm", attn, B, window=w).mask  # mit-han-lab/streaming-llm: 4 sinks + recent
    assert sl[0, 0].nonzero().reshape(-1).tolist() == list(range(4)) + list(range(P - (B - 4), P))


@pytest.mark.parametrize("B, w", [(12, 4), (20, 8), (30, 6), (40, 4)])
def test_pyramidkv_code_schedule_equals_the_reference(B, w):
    q, k = qk(7)
    attn = causal_attention(q, k)
    sel = ev.select("pyramidkv", attn, B, window=w, beta=20)
    caps = [ref_pyramid_capacity(B, w, P, layer, L) for layer in range(L)]
    assert ev.pyramid_code_capacities(B, w, P, L) == caps
    for layer in range(L):
        ref = ref_kept(ref_window_cache(q[layer], k[layer], w, 5, "avgpool"), caps[layer], w)
        assert torch.equal(sel.mask[layer], ref)
    assert sel.budget_tokens == pytest.approx(w + sum(caps) / L)


def test_pyramidkv_code_overspends_and_goes_uniform_where_the_paper_does_not():
    # B − w = 32, P = 200, L = 4: the code floors steps → [63, 43, 23, 3], mean 33 > 32
    assert ev.pyramid_code_capacities(40, 8, 200, 4) == [63, 43, 23, 3]
    assert sum(ev.pyramid_budgets(32, 4, beta=20)) == 4 * 32  # the paper's line spends exactly L · c
    # P < 2 (B − w): uniform B − w on every layer (SnapKV), not a pyramid
    assert ev.pyramid_code_capacities(120, 8, 200, 4) == [112] * 4
    q, k = qk(3)
    paper = ev.select("pyramidkv", causal_attention(q, k), 20, window=4, schedule="paper")
    assert paper.mask.sum((1, 2)).tolist() == [H * b for b in
                                              ev._capped([4 + c for c in ev.pyramid_budgets(16, L, 20)], P)]


def ref_laq(q_window, q_draft, k_prompt, B, w):
    """``SnapKVCluster.update_kv_LAQ`` (stage 2) on one layer: queries = last w prompt + m draft queries,
    keys = the full prompt cache, lower-triangular mask on the last (w+m) key columns, max pool 7."""
    qs = torch.cat([q_window, q_draft], dim=-2)
    n = qs.shape[-2]
    attn = qs @ k_prompt.transpose(-1, -2) / math.sqrt(D)
    mask = torch.full((n, n), torch.finfo(attn.dtype).min)
    cond = torch.arange(n)
    mask.masked_fill_(cond < (cond + 1).view(n, 1), 0)
    attn[:, -n:, -n:] += mask[None]
    attn = F.softmax(attn, dim=-1, dtype=torch.float32)
    s = attn[:, -n:, :-w].sum(dim=-2)
    return ref_kept(F.max_pool1d(s, kernel_size=7, padding=3, stride=1), B - w, w)


@pytest.mark.parametrize("seed", [0, 5])
@pytest.mark.parametrize("B, w, m", [(16, 4, 4), (24, 8, 8), (20, 6, 3)])
def test_lookahead_equals_laq_stage_two(seed, B, w, m):
    q, k = qk(seed, n_extra=m)  # m draft tokens after the prompt
    attn = causal_attention(q, k)
    prefill = attn[:, :, :P, :P]
    draft_rows = attn[:, :, P:, :]  # over prompt + draft keys: the selection renormalises over prompt keys
    sel = ev.select("lookahead", prefill, B, window=w, query_rows=draft_rows)
    for layer in range(L):
        ref = ref_laq(q[layer, :, P - w:P], q[layer, :, P:], k[layer, :, :P], B, w)
        assert torch.equal(sel.mask[layer], ref)
    # true positions differ from the reference's block mask somewhere
    pos = ev.select("lookahead", prefill, B, window=w, query_rows=draft_rows, laq_mask="positions")
    assert pos.mask.sum() == sel.mask.sum()


@pytest.mark.parametrize("policy", ev.POLICIES)
def test_budget_one_keeps_everything(policy):
    q, k = qk(1, n_extra=4)
    attn = causal_attention(q, k)
    sel = ev.select(policy, attn[:, :, :P, :P], 1.0, window=8, query_rows=attn[:, :, P:, :])
    assert bool(sel.mask.all()) and sel.budget_tokens == P
