"""capture() against independent references: HF generate, a no-cache full forward, NumPy/SciPy.

The bug class this guards against: hook shapes collapsing under the KV cache
(TransformerLens #500) — activations of generated tokens must equal what a
full-sequence forward without cache computes, at every layer and position.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import scipy.stats
import torch
from polars.testing import assert_frame_equal

import trajscope as ts
from trajscope.model import ModelHandle
from trajscope.capture import chunks
from tiny import FAMILIES, hf_reference

PROMPT = "def fibonacci(n):\n    "


def hf_greedy(model: ModelHandle, prompt: str, n: int, **kw) -> list[int]:
    hf = hf_reference(model)
    ids = model.tokenizer(prompt, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = hf.generate(ids, max_new_tokens=n, do_sample=False, pad_token_id=model.tokenizer.pad_token_id, **kw)
    return out[0].tolist()


def full_forward(model: ModelHandle, token_ids: list[int]):
    """No-cache forward over the whole sequence with HF's own outputs."""
    with torch.no_grad():
        return hf_reference(model)(torch.tensor([token_ids]), output_hidden_states=True,
                                    output_attentions=True, use_cache=False)


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_tokens_equal_hf_generate(tiny_models, family):
    model = tiny_models[family]
    traj = ts.capture(model, PROMPT, max_new_tokens=12, stop_at_eos=False)
    assert traj.token_ids == hf_greedy(model, PROMPT, 12, eos_token_id=None)
    assert traj.meta["n_generated"] == 12 and traj.n_steps == 12


def test_greedy_tokens_equal_hf_generate_on_sample_model(sample_model):
    traj = ts.capture(sample_model, PROMPT, max_new_tokens=24)
    assert traj.token_ids == hf_greedy(sample_model, PROMPT, 24)


def test_sampled_tokens_are_seeded_and_equal_hf_sampling(sample_model):
    a = ts.capture(sample_model, PROMPT, max_new_tokens=16, temperature=1.0, seed=7, stop_at_eos=False)
    b = ts.capture(sample_model, PROMPT, max_new_tokens=16, temperature=1.0, seed=7, stop_at_eos=False)
    c = ts.capture(sample_model, PROMPT, max_new_tokens=16, temperature=1.0, seed=8, stop_at_eos=False)
    assert a.token_ids == b.token_ids
    assert a.token_ids != c.token_ids
    torch.manual_seed(7)
    ids = sample_model.tokenizer(PROMPT, return_tensors="pt")["input_ids"]
    ref = hf_reference(sample_model).generate(ids, max_new_tokens=16, do_sample=True, temperature=1.0,
                                               top_k=0, top_p=1.0, eos_token_id=None,
                                               pad_token_id=sample_model.tokenizer.pad_token_id)
    assert a.token_ids == ref[0].tolist()


@pytest.mark.parametrize("family", FAMILIES)
def test_residuals_and_attention_rows_equal_no_cache_forward(tiny_models, family):
    model = tiny_models[family]
    traj = ts.capture(model, PROMPT, max_new_tokens=10, stop_at_eos=False,
                      residual_layers="all", attention_layers="all")
    computed = traj.token_ids[:-1]  # the last token was produced, never fed back
    ref = full_forward(model, computed)
    L = model.n_layers
    for layer in range(L):
        got = traj.residual(layer)
        assert got.shape == (len(computed), model.d_model)
        want = ref.hidden_states[layer + 1][0]
        if layer == L - 1:  # HF applies the final norm to its last hidden state
            norm = dict(hf_reference(model).named_modules())[model.family.final_norm]
            got = norm(got)
        rel = (got - want).norm(dim=-1) / want.norm(dim=-1).clamp_min(1e-12)
        assert rel.max().item() < 1e-4, (layer, rel.max().item())
        rows = traj.attention_rows(layer)
        assert rows.shape == (model.n_heads, len(computed), len(computed))
        torch.testing.assert_close(rows, ref.attentions[layer][0].float(), atol=1e-5, rtol=0)


def test_attention_table_recomputed_from_rows(tiny_models):
    model = tiny_models["llama"]
    traj = ts.capture(model, PROMPT, max_new_tokens=8, stop_at_eos=False, attention_layers="all")
    P = traj.prompt_len
    att = traj.attention.sort("pos", "layer", "head")
    n_pos = len(traj.token_ids) - 1
    assert att.height == n_pos * model.n_layers * model.n_heads
    for row in att.iter_rows(named=True):
        a = traj.attention_rows(row["layer"])[row["head"], row["pos"], : row["pos"] + 1].double().numpy()
        nz = a[a > 0]
        ent = float(-(nz * np.log(nz)).sum())
        assert row["entropy"] == pytest.approx(ent, abs=1e-5)
        if row["pos"] > 0:
            assert row["entropy_norm"] == pytest.approx(ent / np.log(row["pos"] + 1), abs=1e-5)
        assert row["prefix_mass"] == pytest.approx(a[:P].sum(), abs=1e-5)
        assert row["generated_mass"] == pytest.approx(a[P:].sum(), abs=1e-5)
        assert row["sink_mass"] == pytest.approx(a[0], abs=1e-6)
        assert row["sink4_mass"] == pytest.approx(a[:4].sum(), abs=1e-5)
        assert row["self_mass"] == pytest.approx(a[row["pos"]], abs=1e-6)
        order = np.argsort(-a, kind="stable")[: min(8, row["pos"] + 1)]
        assert row["top_w"] == pytest.approx(a[order].tolist(), abs=1e-6)
        assert row["step"] == max(0, row["pos"] - P + 1)


def test_activation_table_recomputed_with_scipy(tiny_models):
    model = tiny_models["gpt2"]
    traj = ts.capture(model, PROMPT, max_new_tokens=6, stop_at_eos=False, residual_layers="all")
    act = traj.activations.sort("pos", "layer")
    for row in act.iter_rows(named=True):
        x = traj.residual(row["layer"])[row["pos"]].double().numpy()
        assert row["norm"] == pytest.approx(np.linalg.norm(x), rel=1e-5)
        assert row["mean"] == pytest.approx(x.mean(), abs=1e-5)
        assert row["var"] == pytest.approx(x.var(), rel=1e-4)
        assert row["kurtosis"] == pytest.approx(scipy.stats.kurtosis(x, fisher=True, bias=True), abs=1e-3)
        assert row["max_abs"] == pytest.approx(np.abs(x).max(), rel=1e-6)
        assert row["n_outliers"] == int((np.abs(x) > 6).sum())


def test_token_table_matches_full_forward_logits(sample_model):
    traj = ts.capture(sample_model, PROMPT, max_new_tokens=10)
    ids = traj.token_ids
    ref = full_forward(sample_model, ids)
    lp = torch.log_softmax(ref.logits[0].double(), -1)
    tok = traj.tokens.sort("pos")
    assert tok["logprob"][0] is None
    want_lp = lp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].numpy()
    np.testing.assert_allclose(tok["logprob"].to_numpy()[1:], want_lp, atol=2e-4)
    ent = -(lp.exp() * lp).sum(-1).numpy()[:-1]
    np.testing.assert_allclose(tok["entropy"].to_numpy()[:-1], ent, atol=2e-4)
    assert tok["entropy"][-1] is None
    top5 = lp[: len(ids) - 1].topk(5, -1).indices.tolist()
    assert tok["top_ids"].to_list()[:-1] == top5
    assert tok["phase"].to_list() == ["prefill"] * traj.prompt_len + ["decode"] * (len(ids) - traj.prompt_len)


@pytest.mark.parametrize("temperature", [float("nan"), float("inf"), -1.0])
def test_a_temperature_that_is_not_a_finite_number_from_zero_is_refused(temperature):
    # 'nan < 0' is False: a NaN temperature passed a '< 0' check and then ran greedy ('nan > 0' is False too)
    with pytest.raises(ts.TrajscopeError, match="^temperature must be a finite number ≥ 0"):
        ts.CaptureConfig(temperature=temperature)


def test_stops_at_eos(tiny_models):
    model = tiny_models["llama"]
    free = ts.capture(model, PROMPT, max_new_tokens=8, stop_at_eos=False)
    P = free.prompt_len
    eos = free.token_ids[P + 3]  # make the 4th generated token the EOS token
    old = model.eos_token_id
    try:
        model.tokenizer.eos_token = model.tokenizer.convert_ids_to_tokens(eos)
        traj = ts.capture(model, PROMPT, max_new_tokens=8)
    finally:
        model.tokenizer.eos_token = model.tokenizer.convert_ids_to_tokens(old)
    assert traj.meta["stop_reason"] == "eos"
    first_eos = free.token_ids.index(eos, P)
    assert traj.token_ids == free.token_ids[: first_eos + 1]
    assert traj.tokens["logprob"][-1] is not None


def test_streaming_callback_sees_every_step_and_partial(tiny_models):
    events = []
    traj = ts.capture(tiny_models["qwen2"], PROMPT, max_new_tokens=5, stop_at_eos=False, on_step=events.append)
    assert [e.step for e in events] == list(range(5))
    assert [e.pos for e in events] == [traj.prompt_len - 1 + s for s in range(5)]
    assert [e.token_id for e in events] == traj.token_ids[traj.prompt_len - 1: traj.prompt_len + 4]
    part = events[2].partial()
    assert part.meta["stop_reason"] == "running"
    assert part.token_ids == traj.token_ids[: traj.prompt_len + 2]


def test_cancel_keeps_finished_steps(tiny_models, tmp_path):
    checks = itertools.count()  # the stopping criterion asks once per step, after it
    events = []
    traj = ts.capture(tiny_models["llama"], PROMPT, max_new_tokens=20, stop_at_eos=False,
                      on_step=events.append, cancel=lambda: next(checks) >= 3, residual_layers=[0])
    assert traj.meta["stop_reason"] == "cancelled"
    assert traj.n_steps == 4 and traj.meta["n_generated"] == 4
    assert [e.step for e in events] == [0, 1, 2, 3]  # the steps kept since the last chunk are flushed
    assert traj.residual(0).shape[0] == traj.prompt_len + 3
    back = ts.Trajectory.load(traj.save(tmp_path / "cancelled"))
    assert back.token_ids == traj.token_ids


def test_remote_local_round_trip_matches_local(tiny_dirs):
    local = ts.load_model(str(tiny_dirs["llama"]), device="cpu")
    remote = ts.load_model(str(tiny_dirs["llama"]), device="cpu", remote="local")
    a = ts.capture(local, PROMPT, max_new_tokens=6, stop_at_eos=False, residual_layers=[1])
    events = []
    b = ts.capture(remote, PROMPT, max_new_tokens=6, stop_at_eos=False, residual_layers=[1], on_step=events.append)
    assert a.token_ids == b.token_ids
    torch.testing.assert_close(a.residual(1), b.residual(1))
    # locally a chunk's decode rows come from one product over the keys, remotely each row from its own
    # forward: the same math, summed in another order
    assert_frame_equal(a.attention.drop("run_id"), b.attention.drop("run_id"), check_exact=False, abs_tol=1e-6)
    assert [e.step for e in events] == list(range(6))
    assert b.meta["model"]["remote"] == "local"


def test_ctrl_c_keeps_finished_steps(tiny_models, monkeypatch):
    def on_step(ev):
        if ev.step == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(chunks, "MAX_CHUNK", 2)  # decode steps are reduced in pairs: (1, 2), (3, 4), …
    traj = ts.capture(tiny_models["gpt2"], PROMPT, max_new_tokens=20, stop_at_eos=False, on_step=on_step)
    assert traj.meta["stop_reason"] == "interrupted"
    assert traj.n_steps == 5  # steps 0..4: the interrupt came while step 3's chunk was handed on
    assert len(traj.token_ids) == traj.prompt_len + traj.n_steps - 1
    assert traj.tokens["entropy"].null_count() == 0
