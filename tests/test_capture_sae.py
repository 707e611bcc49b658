"""An SAE attached to capture: the features table and per-position error against a plain encode."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import torch

import trajscope as ts
from trajscope.sae.model import SAE, SAEConfig


@pytest.fixture(scope="module")
def sae():
    return SAE(SAEConfig(architecture="topk", d_in=32, d_sae=128, k=8, hook_name="blocks.1.hook_resid_post"), seed=3)


def test_features_table_matches_a_plain_encode(tiny_models, sae):
    model = tiny_models["llama"]
    traj = ts.capture(model, "def f(x):\n    return x", max_new_tokens=6, stop_at_eos=False,
                      residual_layers=[1], sae=sae, sae_top_k=5)
    x = traj.residual(1)
    with torch.no_grad():
        f = sae.encode(x)
        x_hat = sae.decode(f)
    feats = traj.features.sort("pos", pl.col("value"), descending=[False, True])
    for pos in range(x.shape[0]):
        row = feats.filter(pl.col("pos") == pos)
        want = torch.topk(f[pos], 5)
        n = int((want.values > 0).sum())
        assert row["feature"].to_list() == want.indices[:n].tolist()
        np.testing.assert_allclose(row["value"].to_numpy(), want.values[:n].numpy(), rtol=1e-5)
    rel = ((x - x_hat).pow(2).sum(-1) / x.pow(2).sum(-1)).numpy()
    tok = traj.tokens.sort("pos")
    np.testing.assert_allclose(tok["sae_rel_err"].to_numpy()[:-1], rel, rtol=1e-4)
    assert tok["sae_l0"].to_list()[:-1] == (f > 0).sum(-1).tolist()
    assert set(feats["phase"]) == {"prefill", "decode"} and traj.meta["sae"]["layer"] == 1


def test_sae_that_does_not_fit(tiny_models):
    wide = SAE(SAEConfig(architecture="topk", d_in=256, d_sae=512, k=8, hook_name="blocks.1.hook_resid_post"))
    with pytest.raises(ts.TrajscopeError, match="256-wide"):
        ts.capture(tiny_models["llama"], "x = 1", max_new_tokens=2, sae=wide)
    deep = SAE(SAEConfig(architecture="topk", d_in=32, d_sae=64, k=8, hook_name="blocks.9.hook_resid_post"))
    with pytest.raises(ts.TrajscopeError, match="reads layer 9"):
        ts.capture(tiny_models["llama"], "x = 1", max_new_tokens=2, sae=deep)


def test_sae_on_another_device_is_copied_there_and_left_in_place(sae):
    """A capture on a GPU encodes with a copy of the SAE on the model's device (an SAE on the CPU made every CUDA
    capture with an SAE fail); the caller's SAE stays where it was. "meta" stands in for the other device here."""
    from trajscope.capture.attachments import on_device

    assert on_device(sae, "cpu") is sae
    moved = on_device(sae, "meta")
    assert moved is not sae and all(p.device.type == "meta" for p in moved.parameters())
    assert all(p.device.type == "cpu" for p in sae.parameters())


def test_the_device_copy_is_reused_until_the_sae_changes(sae):
    """Each capture on another device used to deep-copy the SAE again; the copy is now kept, and made anew once
    a parameter changes in place."""
    from trajscope.capture.attachments import on_device

    first = on_device(sae, "meta")
    assert on_device(sae, "meta") is first
    with torch.no_grad():
        next(sae.parameters()).mul_(1.0)
    again = on_device(sae, "meta")
    assert again is not first and on_device(sae, "meta") is again
