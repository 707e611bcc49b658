"""The model boundary's forwards against independent Hugging Face references, per family.

Key masks are checked against an HF forward given an explicit 4-D attention mask
(``[1, 1, q, k]``, 0 where visible and the dtype minimum where hidden — HF's own
format, which it passes through unchanged); chunked prefill, prefix reuse and
batches against one plain no-cache forward; masked greedy decode against HF
``generate`` when nothing is masked.
"""

from __future__ import annotations

import pytest
import torch

from tiny import FAMILIES, hf_reference
from trajscope.errors import TrajscopeError

PROMPT = "def fibonacci(n):\n    return n"


def hf_forward(model, ids, mask4d=None):
    """Logits and every block output of a no-cache HF forward (hidden_states[l + 1] = block l)."""
    with torch.no_grad():
        out = hf_reference(model)(torch.tensor([ids]), attention_mask=mask4d, output_hidden_states=True,
                                   use_cache=False)
    return out.logits[0].float(), [h[0].float() for h in out.hidden_states[1:]]


def hidden_mask(T, hide, mask_from, dtype=torch.float32):
    """``[1, 1, T, T]`` additive mask: causal, and queries ≥ mask_from do not see keys in ``hide``."""
    allowed = torch.ones(T, T).tril().bool()
    rows = torch.arange(T) >= mask_from
    for k in hide:
        allowed[rows, k] = False
    m = torch.zeros(T, T, dtype=dtype)
    m.masked_fill_(~allowed, torch.finfo(dtype).min)
    return m[None, None]


@pytest.mark.parametrize("family", FAMILIES)
def test_key_mask_equals_hf_explicit_4d_mask(tiny_models, family):
    model = tiny_models[family]
    ids = model.encode(PROMPT + " + fib(n - 1)")
    P = len(ids) - 5
    hide = [2, 3, P - 2]
    keep = torch.ones(len(ids), dtype=torch.bool)
    keep[hide] = False
    got = model.forward(ids, prompt_len=P, key_mask=keep, layers=range(model.n_layers))
    ref_logits, ref_hidden = hf_forward(model, ids, hidden_mask(len(ids), hide, P))
    torch.testing.assert_close(got.logits, ref_logits, atol=1e-5, rtol=1e-4)
    for layer in range(model.n_layers - 1):  # the last hidden state is after the final norm in HF
        torch.testing.assert_close(got.resid[layer], ref_hidden[layer], atol=1e-5, rtol=1e-4)
    plain = model.forward(ids)
    assert not torch.allclose(plain.logits[P:], got.logits[P:], atol=1e-4)  # the mask changed decode rows
    torch.testing.assert_close(plain.logits[:P], got.logits[:P], atol=1e-6, rtol=1e-6)  # and not prefill rows


def test_per_head_key_mask_hides_only_that_head(tiny_models):
    model = tiny_models["llama"]
    ids = model.encode(PROMPT)
    P = len(ids) - 3
    km = torch.ones(model.n_layers, model.n_heads, len(ids), dtype=torch.bool)
    km[0, 1, :P - 1] = False  # head 1 of layer 0 sees only the last prompt key and generated ones
    a = model.forward(ids, prompt_len=P, key_mask=km, layers=[0]).resid[0]
    b = model.forward(ids, prompt_len=P, layers=[0]).resid[0]
    torch.testing.assert_close(a[:P], b[:P], atol=1e-6, rtol=1e-5)  # prefill rows: unmasked
    assert not torch.allclose(a[P:], b[P:], atol=1e-4)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_masked_decode_with_nothing_masked_equals_greedy_generate(tiny_models, family):
    model = tiny_models[family]
    ids = model.encode(PROMPT)
    full = model.generate_ids(ids, max_new_tokens=8, stop_at_eos=False)
    keep = torch.ones(model.n_layers, model.n_heads, len(ids), dtype=torch.bool)
    assert model.masked_decode(ids, 8, keep) == full


def test_masked_decode_equals_teacher_forced_masked_forward(tiny_models):
    """Free-running masked decode (KV cache) and the no-cache masked forward agree step by step."""
    model = tiny_models["qwen2"]
    ids = model.encode(PROMPT)
    P = len(ids)
    keep = torch.ones(P, dtype=torch.bool)
    keep[1:P - 3] = False
    out = model.masked_decode(ids, 6, keep)
    forced = model.forward(out[:-1], prompt_len=P, key_mask=keep).logits
    assert forced[P - 1:].argmax(-1).tolist() == out[P:]


@pytest.mark.parametrize("family", FAMILIES)
def test_chunked_prefill_and_prefix_reuse_match_one_pass(tiny_models, family):
    model = tiny_models[family]
    ids = model.encode(PROMPT + " * 2")
    one = model.forward(ids, layers=[0, 1])
    same = model.prefill_chunks(ids, len(ids) + 3, layers=[0, 1])
    assert torch.equal(same.logits, one.logits) and torch.equal(same.resid[1], one.resid[1])
    for c in (1, 3):
        ch = model.prefill_chunks(ids, c, layers=[1])
        torch.testing.assert_close(ch.resid[1], one.resid[1], atol=1e-5, rtol=1e-4)
    cut = 5
    cache = model.prefix_cache(ids[:cut])
    suffix = model.forward(ids[cut:], past=cache, layers=[0])
    ref_logits, ref = hf_forward(model, ids)  # ref[0]: block 0's output (HF's last entry is after the final norm)
    torch.testing.assert_close(suffix.resid[0], ref[0][cut:], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(suffix.logits, ref_logits[cut:], atol=1e-5, rtol=1e-4)
    again = model.forward(ids[cut:], past=cache, layers=[0])  # the cache was not consumed
    torch.testing.assert_close(again.resid[0], suffix.resid[0], atol=0, rtol=0)


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_batched_forward_equals_one_at_a_time(tiny_models, family, side):
    model = tiny_models[family]
    seqs = [model.encode(t) for t in (PROMPT, "import os", "class A:\n    pass\n\n\nclass B")]
    batch = model.forward_batch(seqs, padding_side=side, layers=[1])
    for s, r in zip(seqs, batch):
        one = model.forward(s, layers=[1])
        assert r.logits.shape == one.logits.shape
        torch.testing.assert_close(r.resid[1], one.resid[1], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(r.logits, one.logits, atol=1e-5, rtol=1e-4)


def test_clear_errors(tiny_models):
    model = tiny_models["llama"]
    with pytest.raises(TrajscopeError, match="chunk size"):
        model.prefill_chunks([1, 2, 3], 0)
    with pytest.raises(TrajscopeError, match="padding_side"):
        model.forward_batch([[1, 2]], padding_side="middle")
    with pytest.raises(TrajscopeError, match="key mask"):
        model.forward([1, 2, 3], key_mask=torch.ones(3, 2, 3, dtype=torch.bool))
    with pytest.raises(TrajscopeError, match="out of range"):
        model.read_residuals(["x"], 9)


def _overlaps(model, monkeypatch, lock_on: bool) -> bool:
    """Run two forwards on one handle from two threads; did they overlap in time?"""
    import contextlib
    import threading
    import time

    import trajscope.model.forward as fw

    spans = []
    real = fw.forward

    def timed(*a, **k):
        t0 = time.monotonic()
        time.sleep(0.05)  # widen the window in which an unlocked second caller would enter
        out = real(*a, **k)
        spans.append((t0, time.monotonic()))
        return out

    monkeypatch.setattr(fw, "forward", timed)
    if not lock_on:
        monkeypatch.setattr(model, "lock", contextlib.nullcontext())
    threads = [threading.Thread(target=model.forward, args=(model.encode(p),)) for p in ("import os", "class A:")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    (a0, a1), (b0, b1) = sorted(spans)
    return b0 < a1


def test_concurrent_model_operations_on_one_handle_never_overlap(tiny_models, monkeypatch):
    assert not _overlaps(tiny_models["gpt2"], monkeypatch, lock_on=True)


def test_the_overlap_check_sees_an_unlocked_handle(tiny_models, monkeypatch):
    """Control: with the lock replaced by a no-op, the same two forwards do overlap."""
    assert _overlaps(tiny_models["gpt_neox"], monkeypatch, lock_on=False)


def test_masked_decode_from_an_earlier_position_equals_the_masked_forward(tiny_models):
    """mask_from inside the prompt (compaction): prompt queries after it are masked too."""
    model = tiny_models["mistral"]
    ids = model.encode(PROMPT + " + fib(n - 1)")
    P, start = len(ids), len(ids) - 4
    keep = torch.ones(P, dtype=torch.bool)
    keep[2:6] = False
    out = model.masked_decode(ids, 5, keep, mask_from=start)
    forced = model.forward(out[:-1], key_mask=keep, mask_from=start, layers=[0])
    assert forced.logits[P - 1:].argmax(-1).tolist() == out[P:]
    _, ref = hf_forward(model, out[:-1], hidden_mask(len(out) - 1, range(2, 6), start))
    torch.testing.assert_close(forced.resid[0], ref[0], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("family", ["gpt2", "qwen2"])
def test_forward_returns_attention_rows_of_the_last_queries(tiny_models, tiny_eager, family):
    ids = tiny_models[family].encode(PROMPT)
    got = tiny_models[family].forward(ids, attention_rows=3).attn
    ref = tiny_eager[family].forward(ids, attention_rows=3).attn
    with torch.no_grad():
        eager = hf_reference(tiny_models[family])(torch.tensor([ids]), output_attentions=True).attentions
    for layer in range(2):
        assert got[layer].shape == (4, 3, len(ids))
        torch.testing.assert_close(got[layer], eager[layer][0, :, -3:].float(), atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(ref[layer], got[layer], atol=1e-5, rtol=1e-4)


def test_forward_rows_sum_is_the_sum_of_every_query_row_as_hf_computes_it(tiny_models):
    """H2O's accumulated attention: ``rows_sum`` equals HF eager attention summed over every query."""
    model = tiny_models["llama"]
    ids = model.encode(PROMPT)
    got = model.forward(ids, attention_rows=len(ids), rows_sum=True).attn
    with torch.no_grad():
        eager = hf_reference(model)(torch.tensor([ids]), output_attentions=True).attentions
    for layer in range(model.n_layers):
        assert got[layer].shape == (model.n_heads, 1, len(ids))
        torch.testing.assert_close(got[layer][:, 0], eager[layer][0].float().sum(1), atol=1e-5, rtol=1e-4)
