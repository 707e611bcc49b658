"""The TopK sparse training path (gathered pre-activations, embedding-bag decode) against the dense one."""

from __future__ import annotations

import pytest
import torch

from trajscope.features import train as tr
from trajscope.sae.model import SAE, SAEConfig


def _problem(n_dead: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    sae = SAE(SAEConfig(architecture="topk", d_in=24, d_sae=96, k=5), seed=seed)
    with torch.no_grad():
        sae.b_dec.normal_(generator=g)
        sae.b_enc.normal_(0, 0.1, generator=g)
    x = torch.randn(64, 24, generator=g) * 2 + 0.5
    dead = torch.zeros(96, dtype=torch.bool)
    dead[torch.randperm(96, generator=g)[:n_dead]] = True
    return sae, x, dead


def _grads(sae, x, cfg, dead, sparse):
    sae.zero_grad(set_to_none=True)
    mse, aux, _, x_hat, fired, l0 = tr.step_losses(sae, x, cfg, dead, sparse=sparse)
    (mse + cfg.aux_coefficient * aux).backward()
    grads = {n: p.grad.detach().clone() for n, p in sae.named_parameters()}
    return mse.detach(), aux.detach(), x_hat.detach(), fired, float(l0), grads


@pytest.mark.parametrize("n_dead", [0, 3, 40])
def test_sparse_path_gives_the_dense_losses_and_gradients(n_dead):
    sae, x, dead = _problem(n_dead)
    cfg = tr.TrainConfig(architecture="topk", d_sae=96, k=5, aux_k=8, aux_coefficient=0.5)
    dense = _grads(sae, x, cfg, dead, sparse=False)
    sparse = _grads(sae, x, cfg, dead, sparse=True)
    assert torch.allclose(sparse[0], dense[0], rtol=1e-5, atol=1e-6)
    assert torch.allclose(sparse[1], dense[1], rtol=1e-5, atol=1e-6)
    assert (float(dense[1]) > 0) == (n_dead > 0)  # the AuxK term is live exactly when features are dead
    assert torch.allclose(sparse[2], dense[2], atol=1e-5)
    assert torch.equal(sparse[3], dense[3]) and sparse[4] == dense[4]
    for name, g in dense[5].items():
        assert g.abs().max() > 0, name
        assert torch.allclose(sparse[5][name], g, rtol=1e-5, atol=1e-5), name


def test_training_takes_the_sparse_path_for_topk_only():
    sae, _, _ = _problem(0)
    assert tr._sparse_ok(sae, tr.TrainConfig(architecture="topk"))
    assert not tr._sparse_ok(sae, tr.TrainConfig(architecture="standard"))
    rescaled = SAE(SAEConfig(architecture="topk", d_in=24, d_sae=96, k=5, rescale_acts_by_decoder_norm=True))
    assert not tr._sparse_ok(rescaled, tr.TrainConfig(architecture="topk"))
