"""SAE reproducibility across seeds and per-phase metrics of the prepare build, on tiny random SAEs."""

from __future__ import annotations

import polars as pl
import pytest
import torch

from trajscope.prepare.sae_eval_stage import recon_rows, reproducibility
from tests.sae.sae_helpers import acts, tiny_sae


def test_a_permuted_copy_reproduces_and_a_fresh_seed_does_not():
    a = tiny_sae(d_in=16, d_sae=32, k=4, seed=0)
    b = tiny_sae(d_in=16, d_sae=32, k=4, seed=0)
    with torch.no_grad():
        perm = torch.randperm(32, generator=torch.Generator().manual_seed(1))
        b.W_dec.copy_(a.W_dec[perm])
        b.W_enc.copy_(a.W_enc[:, perm])
        b.b_enc.copy_(a.b_enc[perm])
    other = tiny_sae(d_in=16, d_sae=32, k=4, seed=7)
    saes = {("prefill-only", 0): a, ("prefill-only", 1): b, ("hybrid", 0): a, ("hybrid", 1): other}
    rows = {(r["mix"], r["seed"]): r for r in reproducibility(saes, acts(64, 16), 0.9)}
    assert rows[("prefill-only", 0)]["share"] == 1.0 and rows[("prefill-only", 1)]["share"] == 1.0
    assert rows[("hybrid", 0)]["share"] < 0.2


def test_recon_rows_by_phase_and_fvu_of_a_perfect_reconstruction():
    sae = tiny_sae(d_in=8, d_sae=16, k=3, seed=0)
    x = acts(40, 8)
    rows = pl.DataFrame({"phase": ["prefill"] * 30 + ["decode"] * 10, "group": [f"f{i % 5}" for i in range(40)]})
    out = recon_rows({("prefill-only", 0): sae}, x, rows, n_boot=50)
    assert [r["phase"] for r in out] == ["prefill", "decode"] and [r["n_rows"] for r in out] == [30, 10]
    xh = sae.reconstruct(x[:30])[0].detach().double()
    expected = float((x[:30].double() - xh).pow(2).sum() / (x[:30].double() - x[:30].double().mean(0)).pow(2).sum())
    assert out[0]["fvu"] == pytest.approx(expected, rel=1e-6)
    assert out[0]["explained_variance"] == pytest.approx(1 - expected)
    assert out[0]["l0"] <= 3
