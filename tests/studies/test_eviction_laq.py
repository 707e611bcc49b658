"""LAQ's draft is a greedy generation on the compressed cache: checked against Hugging Face on a cache that is
physically compressed (the kept keys and values gathered, as the reference code's ``update_kv`` does), with
RoPE positions continuing after the prompt; with one kept set per head (the studies' default), against HF given each
layer's per-head 4-D mask; and the rows it scores with are over every prompt key. DapQ pseudo queries: m rows at
P … P+m−1."""

from __future__ import annotations

import pytest
import torch

from tiny import hf_reference
from trajscope.metrics import eviction as ev
from trajscope.studies.eviction import queries as eq

PROMPT = "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n"


def hf_greedy_on_compressed(model, ids, keep, m):
    """Greedy tokens from an HF model whose prompt cache holds only the kept positions of each layer."""
    from transformers import DynamicCache

    hf = hf_reference(model)
    P = len(ids)
    with torch.no_grad():
        out = hf(torch.tensor([ids]), use_cache=True)
        full = out.past_key_values
        cache = DynamicCache()
        for layer in range(model.n_layers):
            pos = keep[layer].nonzero().reshape(-1)
            cache.update(full.layers[layer].keys[:, :, pos], full.layers[layer].values[:, :, pos], layer)
        toks = [int(out.logits[0, -1].argmax())]
        for t in range(m - 1):
            step = hf(torch.tensor([[toks[-1]]]), past_key_values=cache, position_ids=torch.tensor([[P + t]]),
                      use_cache=True)
            toks.append(int(step.logits[0, -1].argmax()))
    return toks


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("budget", [0.3, 0.6])
def test_laq_draft_equals_hf_greedy_on_the_compressed_cache(tiny_models, family, budget):
    model = tiny_models[family]
    ids = model.encode(PROMPT)
    P, m, w = len(ids), 6, 4
    prefill = model.forward(ids, return_cache=True, attention_rows=w)
    rows = torch.stack([prefill.attn[layer] for layer in range(model.n_layers)])  # [L, H, w, P]
    stage1 = ev.select("snapkv", rows, budget, window=w, per_head=False, pooling=("max", 7))
    assert not bool(stage1.mask.all())
    draft, qrows = eq.laq_rows(model, ids, prefill, rows, budget, window=w, m=m, per_head=False)
    keep = stage1.mask[:, 0]  # shared by a layer's heads: one physical cache per layer
    assert draft == hf_greedy_on_compressed(model, ids, keep, m)
    # and not what the full cache drafts (else the test could not tell them apart)
    full_draft, _ = model.decode_on_cache(P, prefill, m, None)
    assert draft != full_draft or budget > 0.5
    # the rows score every prompt key (hidden ones included) and sum to 1 over prompt + draft keys
    assert qrows.shape == (model.n_layers, model.n_heads, m, P)
    assert bool((qrows[:, :, :, ~keep[0]] > 0).all())
    assert bool((qrows.sum(-1) <= 1 + 1e-5).all())


def hf_greedy_with_per_head_masks(model, ids, keep, m):
    """Greedy tokens from an HF eager model re-reading prompt + draft each step, where every layer's decode queries
    get that layer's own 4-D additive mask ``[1, H, T, T]``: causal, and prompt keys limited to ``keep[layer, head]``.

    One HF ``attention_mask`` is shared by all layers, so each attention module's ``attention_mask`` argument is
    replaced by its layer's mask in a forward pre-hook; nothing of trajscope's forward is used.
    """
    hf = hf_reference(model)
    attns = [block.self_attn for block in hf.model.layers]  # llama-style families
    assert len(attns) == model.n_layers
    P, L, H = len(ids), model.n_layers, model.n_heads
    toks: list[int] = []
    for _ in range(m):
        seq = list(ids) + toks
        T = len(seq)
        masks = []
        for layer in range(L):
            allowed = torch.ones(H, T, T).tril().bool()
            allowed[:, P:, :P] &= keep[layer][:, None, :]
            masks.append(torch.zeros(H, T, T).masked_fill(~allowed, torch.finfo(torch.float32).min)[None])

        def hook_for(mask):
            def hook(module, args, kwargs):
                kwargs["attention_mask"] = mask
                return args, kwargs
            return hook

        handles = [a.register_forward_pre_hook(hook_for(masks[i]), with_kwargs=True) for i, a in enumerate(attns)]
        try:
            with torch.no_grad():
                logits = hf(torch.tensor([seq]), use_cache=False).logits[0, -1]
        finally:
            for h in handles:
                h.remove()
        toks.append(int(logits.argmax()))
    return toks


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("budget", [0.3, 0.6])
def test_laq_per_head_draft_equals_hf_greedy_with_the_same_4d_masks(tiny_models, family, budget):
    """The studies' default (one kept set per head): the draft equals HF eager greedy decoding given, layer by layer,
    the same per-head 4-D mask over the prompt keys."""
    model = tiny_models[family]
    ids = model.encode(PROMPT)
    m, w = 6, 4
    prefill = model.forward(ids, return_cache=True, attention_rows=w)
    rows = torch.stack([prefill.attn[layer] for layer in range(model.n_layers)])
    stage1 = ev.select("snapkv", rows, budget, window=w, per_head=True, pooling=("max", 7))
    keep = stage1.mask  # [L, H, P]
    assert not bool((keep == keep[:, :1]).all()), "the heads' kept sets must differ, else this is the per-layer test"
    draft, _ = eq.laq_rows(model, ids, prefill, rows, budget, window=w, m=m, per_head=True)
    assert draft == hf_greedy_with_per_head_masks(model, ids, keep, m)
    # controls: nothing hidden gives the full cache's draft, which this draft is not; heads' masks swapped give
    # another draft (so the check reads each head's own mask)
    full_draft, _ = model.decode_on_cache(len(ids), prefill, m, None)
    assert draft != full_draft
    assert hf_greedy_with_per_head_masks(model, ids, torch.ones_like(keep), m) == full_draft
    assert hf_greedy_with_per_head_masks(model, ids, keep.flip(1), m) != draft


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_pseudo_queries_are_exactly_m_at_future_positions(tiny_models, family):
    """DapQ-style pseudo queries: the last m prompt tokens again at positions P … P+m−1, m of them whatever the
    window, their rows over the prompt keys as an HF eager forward of prompt + repeat gives them."""
    from trajscope.errors import TrajscopeError

    model = tiny_models[family]
    ids = model.encode(PROMPT)
    P, m = len(ids), 9  # more than the windows the studies use (4): m rows, not min(m, w)
    got = eq.pseudo_rows(model, ids, m)
    assert got.shape == (model.n_layers, model.n_heads, m, P)
    seq = list(ids) + list(ids[P - m:])
    with torch.no_grad():
        ref = hf_reference(model)(torch.tensor([seq]), output_attentions=True, use_cache=False).attentions
    want = torch.stack([a[0, :, P:, :P] for a in ref])
    torch.testing.assert_close(got, want.float(), atol=1e-5, rtol=1e-4)
    # the cached path (the needle study's) gives the same rows
    prefill = model.forward(ids, return_cache=True)
    torch.testing.assert_close(eq.pseudo_rows(model, ids, m, prefill=prefill), got, atol=1e-6, rtol=1e-5)
    with pytest.raises(TrajscopeError, match="must be in 1"):
        eq.pseudo_rows(model, ids, P + 1)
