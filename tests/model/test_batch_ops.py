"""The boundary's batch operations against independent Hugging Face references, per family.

:func:`~trajscope.model.batch.greedy_batch` (padded batch, KV cache, own EOS per row) must give
each prompt the tokens of HF ``generate`` at batch 1; :func:`~trajscope.model.batch.forward_batch`'s
attention rows (each sequence's last queries over its real keys) and logits must equal HF's eager
``output_attentions`` and logits of the sequence alone; what ``greedy_batch`` reads while decoding
must equal that forward — for left and right padding and sequences of different lengths.
"""

from __future__ import annotations

import pytest
import torch

from tiny import FAMILIES, hf_reference
from trajscope.errors import TrajscopeError

PROMPTS = ["def fibonacci(n):\n    return n", "import os", "x = 1", "class A:\n    pass\n\n\nclass B"]


def hf_generate(model, ids, n, eos=None):
    with torch.no_grad():
        out = hf_reference(model).generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, eos_token_id=eos,
                                           pad_token_id=model.tokenizer.pad_token_id)
    return out[0].tolist()


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_batch_equals_hf_generate_per_prompt(tiny_models, family, side):
    model = tiny_models[family]
    seqs = [model.encode(p) for p in PROMPTS]
    got = model.greedy_batch(seqs, max_new_tokens=7, padding_side=side, stop_at_eos=False)
    assert got == [hf_generate(model, s, 7) for s in seqs]


@pytest.mark.parametrize("side", ["left", "right"])
def test_greedy_batch_stops_each_row_at_its_own_eos(tiny_models, side):
    from trajscope.model.batch import greedy_batch

    model = tiny_models["mistral"]
    seqs = [model.encode(p) for p in PROMPTS]
    free = model.greedy_batch(seqs, max_new_tokens=6, padding_side=side, stop_at_eos=False)
    eos = free[1][len(seqs[1]) + 1]  # prompt 1's second new token
    got = greedy_batch(model, seqs, max_new_tokens=6, padding_side=side, eos_token_id=eos)
    assert got == [hf_generate(model, s, 6, eos=eos) for s in seqs]
    assert len(got[1]) <= len(seqs[1]) + 2 and got[1][-1] == eos
    assert any(len(g) == len(s) + 6 for g, s in zip(got, seqs))  # the others went on


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("family", ["gpt2", "gpt_neox", "llama", "qwen2"])
def test_forward_batch_attention_rows_equal_hf_eager(tiny_models, family, side):
    model = tiny_models[family]
    seqs = [model.encode(p) for p in PROMPTS]
    want = [3, 1, len(seqs[2]), 5]
    lg = [2, 4, 1, len(seqs[3])]
    batch = model.forward_batch(seqs, padding_side=side, layers=[0], attention_rows=want, logits_rows=lg)
    for s, a, n_lg, r in zip(seqs, want, lg, batch):
        with torch.no_grad():
            ref = hf_reference(model)(torch.tensor([s]), output_attentions=True, use_cache=False)
        T = len(s)
        for layer in range(model.n_layers):
            assert r.attn[layer].shape == (model.n_heads, a, T)
            torch.testing.assert_close(r.attn[layer], ref.attentions[layer][0, :, T - a:].float(), atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(r.logits, ref.logits[0, T - n_lg:].float(), atol=1e-5, rtol=1e-4)


def test_batch_errors(tiny_models):
    model = tiny_models["gpt2"]
    with pytest.raises(TrajscopeError, match=r"^max_new_tokens must be a positive whole number"):
        model.greedy_batch([[1, 2]], max_new_tokens=0)
    with pytest.raises(TrajscopeError, match=r"^padding_side must be 'left' or 'right'"):
        model.greedy_batch([[1, 2]], max_new_tokens=2, padding_side="up")
    with pytest.raises(TrajscopeError, match=r"^A batch needs at least one sequence"):
        model.forward_batch([[1, 2], []])


def test_sliding_window_decodes_left_padded_only(tmp_path):
    import trajscope as ts
    from tiny import build_tiny_model

    model = ts.load_model(str(build_tiny_model(tmp_path, "mistral", sliding_window=4)), device="cpu")
    seqs = [model.encode(p) for p in PROMPTS]
    got = model.greedy_batch(seqs, max_new_tokens=6, padding_side="left", stop_at_eos=False)
    assert got == [model.generate_ids(s, max_new_tokens=6, stop_at_eos=False) for s in seqs]
    with pytest.raises(TrajscopeError, match=r"^Right padding puts pad columns inside this model's sliding attention"):
        model.greedy_batch(seqs, max_new_tokens=6, padding_side="right")


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_greedy_batch_reads_equal_a_teacher_forced_forward(tiny_models, family, side):
    """What the cached decode read equals one no-cache forward of the finished sequences (itself HF-checked)."""
    model = tiny_models[family]
    seqs = [model.encode(p) for p in PROMPTS]
    reads = [(2, 3), (1, 1), (len(seqs[2]), len(seqs[2])), (4, 2)]
    full, got = model.greedy_batch(seqs, max_new_tokens=5, padding_side=side, stop_at_eos=False, reads=reads)
    assert full == model.greedy_batch(seqs, max_new_tokens=5, padding_side=side, stop_at_eos=False)
    for s, f, (a, m), r in zip(seqs, full, reads, got):
        T, g = len(f) - 1, len(f) - len(s)
        ref = model.forward_batch([f[:-1]], layers=range(model.n_layers), attention_rows=[a + g - 1])[0]
        for layer in range(model.n_layers):
            torch.testing.assert_close(r.resid[layer], ref.resid[layer], atol=1e-5, rtol=1e-4)
            assert r.attn[layer].shape == (model.n_heads, a + g - 1, T)
            torch.testing.assert_close(r.attn[layer], ref.attn[layer], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(r.logits, ref.logits[T - (m + g - 1):], atol=1e-5, rtol=1e-4)
