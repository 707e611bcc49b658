"""Harvest tags and engines, and the spliced forward, on a tiny Llama built in the test session."""

from __future__ import annotations

import polars as pl
import pytest
import torch
from sae_helpers import tiny_sae

from trajscope.errors import TrajscopeError
from trajscope.features.harvest import Harvest, harvest
from trajscope.features.splice import splice_rows, splice_sequence

PROMPTS = [{"id": "a", "prompt": "def add(a, b):\n    return"}, {"id": "b", "prompt": "import os\nclass Foo:"}]


@pytest.fixture(scope="module")
def llama(tiny_models):
    return tiny_models["llama"]


@pytest.fixture(scope="module")
def harvested(llama):
    return harvest(llama, PROMPTS, 1, max_new_tokens=6, n_sampled=1, engine="capture")


def test_rows_are_tagged_by_the_design_vocabulary(llama, harvested):
    h = harvested
    P = {s["prompt_id"]: s["prompt_len"] for s in h.sequences.iter_rows(named=True)}
    assert h.acts.shape == (h.rows.height, llama.d_model)
    assert h.sequences.height == 4  # greedy + one sample per prompt
    for r in h.rows.iter_rows(named=True):
        p = P[r["prompt_id"]]
        assert r["phase"] == ("prefill" if r["pos"] < p else "decode")
        assert r["step"] == (0 if r["pos"] < p else r["pos"] - p + 1)
    # prefill rows once per prompt, decode rows per continuation (steps 1..5: 6 steps make 5 decode queries)
    counts = h.rows.group_by("prompt_id", "phase").len().sort("prompt_id", "phase")
    assert counts.filter(pl.col("phase") == "decode")["len"].to_list() == [10, 10]
    # position 0, the attention sink, is left out of the prefill rows (positions.SKIP_SINK) and recorded
    assert counts.filter(pl.col("phase") == "prefill")["len"].to_list() == [P["a"] - 1, P["b"] - 1]
    assert h.rows["pos"].min() == 1 and h.meta["sink_excluded"] is True and h.meta["sink_pos"] == 0
    assert h.rows.filter(pl.col("phase") == "decode")["step"].max() == 5
    assert set(h.rows["depth_band"].unique().to_list()) == {"prefill", "1-4", "5-16"}


def test_rows_hold_the_captured_residuals(llama, harvested):
    import trajscope as ts

    traj = ts.capture(llama, PROMPTS[0]["prompt"], max_new_tokens=6, temperature=0.0, seed=0, stop_at_eos=False,
                      residual_layers=[1])
    mine = harvested.where((pl.col("seq") == 0))
    torch.testing.assert_close(mine.acts, traj.residual(1)[mine.rows["pos"].to_list()])
    ent = traj.tokens.sort("pos")["entropy"].to_list()
    assert mine.rows["entropy"].to_list() == pytest.approx([ent[p] for p in mine.rows["pos"].to_list()])


def test_forward_engine_matches_capture(llama, harvested):
    fast = harvest(llama, PROMPTS, 1, max_new_tokens=6, n_sampled=1, engine="forward")
    assert fast.sequences["token_ids"].to_list() == harvested.sequences["token_ids"].to_list()
    assert fast.rows.drop("entropy").equals(harvested.rows.drop("entropy"))
    torch.testing.assert_close(fast.acts, harvested.acts, rtol=1e-4, atol=1e-5)


def test_save_load_and_prefill_only(tmp_path, llama, harvested):
    back = Harvest.load(harvested.save(tmp_path / "h"))
    assert torch.equal(back.acts, harvested.acts) and back.rows.equals(harvested.rows) and back.layer == 1
    pre = harvest(llama, PROMPTS, 1, max_new_tokens=0)
    assert set(pre.rows["phase"].to_list()) == {"prefill"} and pre.sequences.height == 2
    with pytest.raises(TrajscopeError, match="not a harvest directory"):
        Harvest.load(tmp_path / "nothing")
    with pytest.raises(TrajscopeError, match="out of range"):
        harvest(llama, PROMPTS, 7)


class _Identity(torch.nn.Module):
    """Stands in for an SAE that reconstructs perfectly."""

    def __init__(self, d):
        super().__init__()
        self.W_enc = torch.nn.Parameter(torch.zeros(d, 1))

    def forward(self, x):
        return x


def test_splice_is_zero_for_perfect_reconstruction_and_matches_manual_kl(tiny_dirs, llama, harvested):
    hf = llama.torch_module()
    hooks_before = {n: dict(m._forward_hooks) for n, m in hf.named_modules()}  # HF may install its own
    ids = harvested.sequences["token_ids"][0].to_list()
    zero = splice_sequence(llama, ids, 1, _Identity(llama.d_model))
    assert zero["kl"].abs().max() < 1e-6 and zero["ce_increase"].drop_nulls().abs().max() < 1e-5
    sae = tiny_sae("topk", d_in=llama.d_model, d_sae=64, k=4)
    got = splice_sequence(llama, ids, 1, sae)
    # an independent path: wrap the decoder layer's forward instead of registering a hook
    layer = hf.model.layers[1]
    orig = layer.forward

    def patched(*a, **k):
        out = orig(*a, **k)
        h = out[0] if isinstance(out, tuple) else out
        r = sae(h)
        return (r, *out[1:]) if isinstance(out, tuple) else r

    with torch.no_grad():
        t = torch.tensor([ids])
        clean = hf(input_ids=t, use_cache=False).logits[0].log_softmax(-1)
        layer.forward = patched
        try:
            spl = hf(input_ids=t, use_cache=False).logits[0].log_softmax(-1)
        finally:
            layer.forward = orig
    kl = torch.nn.functional.kl_div(spl, clean, log_target=True, reduction="none").sum(-1)
    assert got["kl"].to_list() == pytest.approx(kl.tolist(), rel=1e-4, abs=1e-6)
    ce = [float(clean[i, ids[i + 1]] - spl[i, ids[i + 1]]) for i in range(len(ids) - 1)]
    assert got["ce_increase"].to_list()[:-1] == pytest.approx(ce, rel=1e-4, abs=1e-6)
    assert float(got["kl"].mean()) > 0
    # our hooks are gone afterwards (hooks that HF installed itself, e.g. after output_hidden_states, stay)
    assert {n: dict(m._forward_hooks) for n, m in hf.named_modules()} == hooks_before
    rows = splice_rows(llama, harvested.sequences, harvested.rows, 1, sae)
    assert rows.height == harvested.rows.height and rows["kl"].null_count() == 0
