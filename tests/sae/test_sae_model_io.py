"""SAE encode/decode against hand computation, and SAELens' on-disk format in both directions."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from sae_helpers import acts, tiny_sae

import trajscope as ts
from trajscope.errors import TrajscopeError
from trajscope.sae.io import config_to_saelens


def _numpy_encode(sae, x):
    W_enc, b_enc, b_dec = (sae.W_enc.detach().numpy().astype(np.float64), sae.b_enc.detach().numpy().astype(np.float64),
                           sae.b_dec.detach().numpy().astype(np.float64))
    h = (x.numpy().astype(np.float64) - b_dec) @ W_enc + b_enc
    if sae.cfg.architecture == "topk":
        out = np.zeros_like(h)
        for i, row in enumerate(h):
            top = np.argsort(-row)[: sae.cfg.k]
            out[i, top] = np.maximum(row[top], 0)
        return out
    return np.maximum(h, 0)


@pytest.mark.parametrize("arch", ["standard", "topk"])
def test_encode_decode_match_numpy(arch):
    sae, x = tiny_sae(arch), acts()
    f = sae.encode(x)
    np.testing.assert_allclose(f.detach().numpy(), _numpy_encode(sae, x), rtol=1e-5, atol=1e-5)
    x_hat = f.detach().numpy() @ sae.W_dec.detach().numpy() + sae.b_dec.detach().numpy()
    np.testing.assert_allclose(sae(x).detach().numpy(), x_hat, rtol=1e-5, atol=1e-5)
    if arch == "topk":
        assert int((f > 0).sum(-1).max()) <= 3


@pytest.mark.parametrize("arch", ["standard", "topk"])
def test_save_load_round_trip(tmp_path, arch):
    sae, x = tiny_sae(arch), acts()
    path = sae.save(str(tmp_path / "s"))
    cfg = json.loads((tmp_path / "s" / "cfg.json").read_text())
    assert cfg["architecture"] == arch and cfg["d_in"] == 8 and cfg["d_sae"] == 16
    assert cfg["metadata"]["hook_name"] == "blocks.1.hook_resid_post"
    back = ts.SAE.load(path)
    assert torch.equal(back.encode(x), sae.encode(x))
    assert back.cfg.layer == 1


def _write_saelens_dir(path, cfg: dict, d_in=8, d_sae=16, seed=0):
    """Write a directory exactly as SAELens' save_model does (the cfg.json of sae-lens 6.54 for these
    classes, weights as its state_dict), without importing SAELens."""
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    state = {"W_dec": torch.randn(d_sae, d_in, generator=g), "W_enc": torch.randn(d_in, d_sae, generator=g),
             "b_dec": torch.randn(d_in, generator=g), "b_enc": torch.randn(d_sae, generator=g)}
    path.mkdir()
    save_file(state, str(path / "sae_weights.safetensors"))
    (path / "cfg.json").write_text(json.dumps(cfg))
    return state


SAELENS_TOPK_CFG = {"d_in": 8, "d_sae": 16, "dtype": "float32", "device": "cpu", "apply_b_dec_to_input": True,
                    "normalize_activations": "none", "reshape_activations": "none",
                    "metadata": {"sae_lens_version": "6.54.12", "sae_lens_training_version": "6.54.12",
                                 "hook_name": "blocks.1.hook_resid_post"},
                    "k": 3, "rescale_acts_by_decoder_norm": False, "architecture": "topk"}


def test_reads_saelens_v6_layout_written_by_hand(tmp_path):
    state = _write_saelens_dir(tmp_path / "s", SAELENS_TOPK_CFG)
    sae = ts.SAE.load(str(tmp_path / "s"))
    assert sae.cfg.architecture == "topk" and sae.cfg.k == 3 and sae.cfg.layer == 1
    x = acts()
    h = (x - state["b_dec"]) @ state["W_enc"] + state["b_enc"]
    vals, idx = h.topk(3, dim=-1)
    want = torch.zeros_like(h).scatter_(-1, idx, vals.relu())
    torch.testing.assert_close(sae.encode(x), want)
    # what we would write back is SAELens' file, field for field
    assert config_to_saelens(sae.cfg) == SAELENS_TOPK_CFG


def test_reads_pre_v6_layout(tmp_path):
    old = {"d_in": 8, "d_sae": 16, "dtype": "torch.float32", "device": "cpu", "hook_point": "blocks.2.hook_resid_post",
           "activation_fn_str": "topk", "activation_fn_kwargs": {"k": 4}, "apply_b_dec_to_input": False,
           "normalize_activations": False, "model_name": "gpt2"}
    _write_saelens_dir(tmp_path / "s", old)
    sae = ts.SAE.load(str(tmp_path / "s"))
    assert (sae.cfg.architecture, sae.cfg.k, sae.cfg.layer, sae.cfg.apply_b_dec_to_input) == ("topk", 4, 2, False)
    assert sae.cfg.normalize_activations == "none" and sae.cfg.metadata["model_name"] == "gpt2"


@pytest.mark.parametrize("arch", ["standard", "topk"])
def test_saelens_loads_ours_and_encodes_identically(tmp_path, arch):
    sl = pytest.importorskip("sae_lens")
    sae, x = tiny_sae(arch), acts()
    sae.save(str(tmp_path / "s"))
    theirs = sl.SAE.load_from_disk(str(tmp_path / "s"))
    assert theirs.cfg.architecture() == arch
    assert theirs.cfg.metadata.hook_name == "blocks.1.hook_resid_post"
    with torch.no_grad():
        torch.testing.assert_close(theirs.encode(x), sae.encode(x), rtol=0, atol=0)
        torch.testing.assert_close(theirs.decode(theirs.encode(x)), sae(x), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("arch", ["standard", "topk"])
def test_we_load_saelens_saved_sae_and_encode_identically(tmp_path, arch):
    sl = pytest.importorskip("sae_lens")
    if arch == "topk":
        cfg = sl.TopKSAEConfig(d_in=8, d_sae=16, k=3)
        theirs = sl.TopKSAE(cfg)
    else:
        cfg = sl.StandardSAEConfig(d_in=8, d_sae=16)
        theirs = sl.StandardSAE(cfg)
    cfg.metadata.hook_name = "blocks.0.hook_resid_post"
    with torch.no_grad():
        for p in theirs.parameters():
            p.copy_(torch.randn_like(p))
    theirs.save_model(str(tmp_path / "s"))
    ours = ts.SAE.load(str(tmp_path / "s"))
    x = acts()
    assert ours.cfg.layer == 0
    with torch.no_grad():
        torch.testing.assert_close(ours.encode(x), theirs.encode(x), rtol=0, atol=0)
        torch.testing.assert_close(ours(x), theirs(x), rtol=1e-6, atol=1e-6)


def test_missing_cfg_json_is_one_clear_error(tmp_path):
    tiny_sae().save(str(tmp_path / "s"))
    (tmp_path / "s" / "cfg.json").unlink()
    with pytest.raises(TrajscopeError, match="has no cfg.json"):
        ts.SAE.load(str(tmp_path / "s"))
    with pytest.raises(TrajscopeError, match="No SAE directory"):
        ts.SAE.load(str(tmp_path / "nowhere"))


def test_unknown_architecture_is_one_clear_error(tmp_path):
    _write_saelens_dir(tmp_path / "s", {**SAELENS_TOPK_CFG, "architecture": "jumprelu"})
    with pytest.raises(TrajscopeError, match="Unknown SAE architecture 'jumprelu'"):
        ts.SAE.load(str(tmp_path / "s"))


def test_weights_disagreeing_with_cfg_is_one_clear_error(tmp_path):
    _write_saelens_dir(tmp_path / "s", {**SAELENS_TOPK_CFG, "d_sae": 32})
    with pytest.raises(TrajscopeError, match="'W_enc' is \\(8, 16\\) but cfg.json"):
        ts.SAE.load(str(tmp_path / "s"))


def test_wrong_width_or_layer_is_one_clear_error():
    sae = tiny_sae(d_in=8)
    with pytest.raises(TrajscopeError, match="reads 8-wide activations but the activations of layer 1 are 32-wide"):
        sae.check_input(torch.zeros(2, 32), layer=1)
    with pytest.raises(TrajscopeError, match="reads 8-wide"):
        sae.encode(torch.zeros(2, 32))
    with pytest.raises(TrajscopeError, match="trained on layer 1"):
        sae.check_input(torch.zeros(2, 8), layer=3)


def test_sae_features_for_capture_match_full_encode():
    from trajscope.sae import sae_features

    sae, x = tiny_sae("standard"), acts(n=5)
    out = sae_features(sae, x, k=4)
    f = sae.encode(x).detach()
    assert out["feature"].shape == (5, 4) and out["feature"].dtype == torch.int64
    for row in range(5):
        order = np.argsort(-f[row].numpy(), kind="stable")[:4]
        np.testing.assert_allclose(out["value"][row].numpy(), f[row].numpy()[order], rtol=1e-6)
    assert out["l0"].tolist() == (f > 0).sum(-1).tolist()
    x_hat = sae(x).detach()
    torch.testing.assert_close(out["sq_err"], ((x - x_hat) ** 2).sum(-1))
    torch.testing.assert_close(out["sq_norm"], (x ** 2).sum(-1))


def test_decode_uses_its_own_inputs_statistics_not_the_last_encode():
    """constant_norm_rescale: decoding x's code after encoding another input must still undo x's scale."""
    from trajscope.errors import TrajscopeError
    from trajscope.sae.model import SAE, SAEConfig

    sae = SAE(SAEConfig(architecture="topk", d_in=16, d_sae=64, k=8, normalize_activations="constant_norm_rescale"),
              seed=0)
    g = torch.Generator().manual_seed(0)
    x, other = torch.randn(3, 16, generator=g), 50 * torch.randn(3, 16, generator=g)
    x_hat, f = sae.reconstruct(x)
    sae.encode(other)  # the old code kept this input's scale and decoded x with it
    torch.testing.assert_close(sae.decode(f, stats=sae.input_stats(x)), x_hat)
    torch.testing.assert_close(sae(x), x_hat)
    with pytest.raises(TrajscopeError, match="statistics"):
        sae.decode(f)


@pytest.mark.parametrize("norm", ["none", "constant_norm_rescale", "layer_norm"])
@pytest.mark.parametrize("rescale", [False, True])
def test_topk_sae_features_sparse_decode_equals_the_dense_reconstruction(norm, rescale):
    """sae_features decodes a TopK code from its k active rows; the dense path (encode, decode over every
    feature) must give the same features, values, L0 and reconstruction error."""
    from trajscope.sae import sae_features
    from trajscope.sae.model import SAE, SAEConfig

    sae = SAE(SAEConfig(architecture="topk", d_in=16, d_sae=64, k=8, normalize_activations=norm,
                        rescale_acts_by_decoder_norm=rescale), seed=1)
    with torch.no_grad():
        sae.W_dec.mul_(torch.linspace(0.5, 2.0, 64)[:, None])  # unequal decoder norms, so the rescale matters
        sae.b_enc.normal_(0, 0.3)  # some rows with fewer than k active features
    x = acts(n=12, d=16) * 3
    out = sae_features(sae, x, k=5)
    x_hat, f = sae.reconstruct(x)
    value, feature = torch.topk(f, 5, dim=-1, sorted=True)
    torch.testing.assert_close(out["value"], value.float())
    active = value > 0
    assert torch.equal(out["feature"][active], feature[active])
    assert out["l0"].tolist() == (f > 0).sum(-1).tolist()
    torch.testing.assert_close(out["sq_err"], ((x - x_hat) ** 2).sum(-1), rtol=1e-5, atol=1e-6)
    vals, idx = torch.topk(sae.pre_acts(x, sae.input_stats(x)), 8, dim=-1)
    torch.testing.assert_close(sae.decode_sparse(idx, vals.relu(), sae.input_stats(x)), x_hat, rtol=1e-5, atol=1e-6)
