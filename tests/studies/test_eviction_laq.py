"""LAQ's draft is a greedy generation on the compressed cache: checked against Hugging Face on a cache that is
physically compressed (the kept keys and values gathered, as the reference code's ``update_kv`` does), with
RoPE positions continuing after the prompt; and the rows it scores with are over every prompt key."""

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
