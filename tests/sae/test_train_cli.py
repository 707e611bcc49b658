"""SAE training (budget, mixing, loss curve) and the harvest → train-sae → sae-drift CLI on a tiny model."""

from __future__ import annotations

import json

import polars as pl
import pytest
import torch

import trajscope as ts
from trajscope.cli import main
from trajscope.errors import TrajscopeError
from trajscope.sae import train as tr


def _synthetic(n, d=16, n_true=48, seed=0, shift=0.0):
    g = torch.Generator().manual_seed(seed)
    dirs = torch.randn(n_true, d, generator=torch.Generator().manual_seed(99))
    codes = (torch.rand(n, n_true, generator=g) < 0.06).float() * torch.rand(n, n_true, generator=g) * 3
    return codes @ dirs + 2.0 + shift


def test_batches_mix_decode_rows_at_the_requested_fraction():
    pre, dec = torch.zeros(50, 4), torch.ones(30, 4)
    b = tr._batch(pre, dec, 25, 100, torch.Generator().manual_seed(0))
    assert b.shape == (100, 4) and int(b[:, 0].sum()) == 25


@pytest.mark.parametrize("arch", ["topk", "standard"])
def test_training_reduces_error_and_writes_the_curve(tmp_path, arch):
    pre = _synthetic(4000)
    cfg = tr.TrainConfig(architecture=arch, d_sae=64, k=6, n_tokens=150 * 256, batch_size=256, log_every=10,
                         dead_after=5000, resample_every=50, l1_coefficient=1e-3, lr=3e-3)
    sae, curve = tr.train_sae(pre, None, cfg, layer=2, log_csv=tmp_path / "log.csv", progress=False)
    assert curve["fvu"][-1] < 0.5 * curve["fvu"][0]
    assert pl.read_csv(tmp_path / "log.csv").height == curve.height
    assert sae.cfg.hook_name == "blocks.2.hook_resid_post" and sae.cfg.metadata["training"]["d_sae"] == 64
    x = _synthetic(1000, seed=5)  # fresh rows from the same distribution, raw scale (scale was folded in)
    err = ((sae(x) - x) ** 2).sum() / ((x - x.mean(0)) ** 2).sum()
    assert float(err) < 0.5


def test_hybrid_needs_decode_rows():
    with pytest.raises(TrajscopeError, match="needs decode activations"):
        tr.train_sae(_synthetic(100), None, tr.TrainConfig(decode_fraction=0.5, d_sae=8, k=2), layer=0, progress=False)
    with pytest.raises(TrajscopeError, match="between 0 and 1"):
        tr.train_sae(_synthetic(100), None, tr.TrainConfig(decode_fraction=1.5), layer=0, progress=False)


def test_cli_harvest_train_and_drift(tmp_path, tiny_dirs, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"id": f"p{i}", "prompt": t, "split": s}) for i, (t, s) in enumerate([
        ("def add(a, b):\n    return", "train"), ("import os\nclass Foo:", "train"),
        ("for i in range(10):\n    print(", "eval")])) + "\n")
    model = str(tiny_dirs["llama"])
    common = ["--model", model, "--prompts", str(prompts), "--layer", "1", "--quiet"]
    assert main(["harvest", *common, "--split", "train", "--max-new-tokens", "12", "--out", str(tmp_path / "ht")]) == 0
    assert main(["harvest", *common, "--split", "eval", "--max-new-tokens", "12", "--out", str(tmp_path / "he")]) == 0
    for name, frac in (("pre", "0"), ("hyb", "0.5")):
        assert main(["train-sae", "--harvest", str(tmp_path / "ht"), "--decode-fraction", frac, "--d-sae", "64",
                     "--k", "4", "--n-tokens", "4096", "--batch-size", "128", "--quiet",
                     "--out", str(tmp_path / name)]) == 0
        assert (tmp_path / name / "cfg.json").exists() and (tmp_path / name / "training_log.csv").exists()
        metrics = json.loads((tmp_path / name / "training_metrics.json").read_text())
        assert metrics["config"]["decode_fraction"] == float(frac) and metrics["tokens"] == 4096
    capsys.readouterr()
    assert main(["sae-drift", "--harvest", str(tmp_path / "he"), "--model", model, "--quiet",
                 "--sae", f"pre={tmp_path / 'pre'}", f"hyb={tmp_path / 'hyb'}", "--out", str(tmp_path / "rep")]) == 0
    printed = capsys.readouterr().out
    assert "fvu[pre]" in printed and "fvu[hyb]" in printed and "jaccard_topk" in printed
    table = pl.read_parquet(tmp_path / "rep" / "sae_drift.parquet")
    assert set(table["sae"].unique()) == {"pre", "hyb"}
    ref = table.filter((pl.col("group") == "prefill") & (pl.col("sae") == "pre")).row(0, named=True)
    h = ts.SAE.load(str(tmp_path / "pre"))
    from trajscope.metrics.sae_eval import reconstruction_stats
    from trajscope.sae.harvest import Harvest

    he = Harvest.load(tmp_path / "he").where(pl.col("phase") == "prefill")
    want = reconstruction_stats(he.acts, h(he.acts), h.encode(he.acts))
    assert ref["fvu"] == pytest.approx(want["fvu"]) and ref["l0"] == pytest.approx(want["l0"])
    assert ref["kl"] >= 0
    assert pl.read_parquet(tmp_path / "rep" / "sae_overlap.parquet").height >= 4


def test_cli_errors_are_one_sentence(tmp_path, capsys, tiny_dirs):
    (tmp_path / "bad").mkdir()
    rc = main(["sae-drift", "--harvest", str(tmp_path / "bad"), "--sae", str(tmp_path / "bad"), "--no-splice",
               "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("trajscope: ") and "not a harvest directory" in err and "Traceback" not in err


def test_resampling_points_dead_features_at_badly_reconstructed_inputs():
    from sae_helpers import tiny_sae

    sae = tiny_sae("standard", d_in=4, d_sae=6)
    before = sae.W_dec.detach().clone()
    dead = torch.tensor([False, True, False, False, True, False])
    x = torch.tensor([[0.0, 0.0, 0.0, 0.0], [5.0, 0.0, 0.0, 0.0]])
    x_hat = torch.zeros_like(x)  # row 1 is the only one with error, so both dead features point at it
    n = tr._resample(sae, dead, x, x_hat, torch.Generator().manual_seed(0))
    assert n == 2
    want = (x[1] - sae.b_dec) / (x[1] - sae.b_dec).norm()
    torch.testing.assert_close(sae.W_dec[1].detach(), want.detach())
    torch.testing.assert_close(sae.W_dec[4].detach(), want.detach())
    assert torch.equal(sae.W_dec[~dead].detach(), before[~dead]) and float(sae.b_enc.detach()[1]) == 0.0
