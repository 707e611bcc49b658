"""SAE reproducibility across seeds and per-phase metrics of the prepare build, on tiny random SAEs."""

from __future__ import annotations

import numpy as np
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


def test_paired_fvu_difference_over_files():
    from trajscope.prepare.sae_eval_stage import paired_ratio_diff

    rng = np.random.default_rng(0)
    files = np.repeat([f"f{i}" for i in range(12)], 20)
    den = rng.uniform(1, 2, files.size) * np.repeat(rng.uniform(0.5, 3, 12), 20)  # files differ a lot
    num = 0.3 * den * rng.uniform(0.8, 1.2, files.size)
    same = paired_ratio_diff((num, den, files), (num, den, files), n_boot=200)
    assert same["estimate"] == 0 and same["lo"] == 0 and same["hi"] == 0 and same["n_files"] == 12
    half = paired_ratio_diff((num, den, files), (0.5 * num, den, files), n_boot=200)
    ratio = num.sum() / den.sum()
    assert abs(half["estimate"] - 0.5 * ratio) < 1e-12 and 0 < half["lo"] < half["estimate"] < half["hi"]
    # paired over files: a per-file shift common to both ratios cancels, so the interval stays narrow
    assert half["hi"] - half["lo"] < 0.2 * half["estimate"]


def test_reproducibility_by_step_reads_both_seeds_snapshots(tmp_path):
    from safetensors.torch import save_file

    from trajscope.prepare.sae_eval_stage import reproducibility_by_step

    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 16, generator=g)
    for mix in ("prefill-only", "hybrid"):
        for seed, mats in ((0, {0: torch.randn(64, 16, generator=g), 100: w}),
                           (1, {0: torch.randn(64, 16, generator=g), 100: w[torch.randperm(64, generator=g)]})):
            (tmp_path / f"sae-{mix}-s{seed}").mkdir()
            if mix == "prefill-only":
                save_file({f"W_dec_step{k}": v.half() for k, v in mats.items()},
                          str(tmp_path / f"sae-{mix}-s{seed}" / "decoder_snapshots.safetensors"))
    rows = reproducibility_by_step(tmp_path, (0, 1), 0.9)
    assert [(r["mix"], r["step"]) for r in rows] == [("prefill-only", 0), ("prefill-only", 100)]
    assert rows[0]["share_0to1"] < 0.1 and rows[1]["share_0to1"] == 1.0 == rows[1]["share_1to0"]
