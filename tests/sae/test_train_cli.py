"""SAE training (budget, mixing, loss curve) and the harvest → train-sae → sae-drift CLI on a tiny model."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
import torch

import trajscope as ts
from trajscope.cli import main
from trajscope.errors import TrajscopeError
from trajscope.features import train as tr


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
        ("for i in range(10):\n    print(", "eval"), ("with open(path) as fh:\n    data =", "eval")])) + "\n")
    model = str(tiny_dirs["llama"])
    common = ["--model", model, "--prompts", str(prompts), "--layer", "1", "--quiet"]
    assert main(["harvest", *common, "--split", "train", "--max-new-tokens", "12", "--out", str(tmp_path / "ht")]) == 0
    assert main(["harvest", *common, "--split", "eval", "--max-new-tokens", "12", "--out", str(tmp_path / "he")]) == 0
    train = ["--d-sae", "64", "--k", "4", "--n-tokens", "4096", "--batch-size", "128", "--quiet"]
    assert main(["train-sae", "--harvest", str(tmp_path / "ht"), "--decode-fraction", "0", *train, "--seed", "0,1,2",
                 "--out", str(tmp_path / "pre-seed{seed}")]) == 0
    assert main(["train-sae", "--harvest", str(tmp_path / "ht"), "--decode-fraction", "0.5", *train, "--seed", "3",
                 "--out", str(tmp_path / "hyb")]) == 0
    pre_dirs = [tmp_path / f"pre-seed{s}" for s in (0, 1, 2)]
    for name, d, frac, seed in [("pre", d, "0", s) for s, d in enumerate(pre_dirs)] + [("hyb", tmp_path / "hyb", "0.5", 3)]:
        assert (d / "cfg.json").exists() and (d / "training_log.csv").exists()
        metrics = json.loads((d / "training_metrics.json").read_text())
        assert metrics["config"]["decode_fraction"] == float(frac) and metrics["tokens"] == 4096
        assert metrics["config"]["seed"] == seed
        assert ts.SAE.load(str(d)).cfg.metadata["sink_excluded"] is True  # position 0 left out of training
    w0, w1 = (ts.SAE.load(str(d)).W_enc.detach() for d in pre_dirs[:2])
    assert not torch.equal(w0, w1)  # the seeds really differ
    capsys.readouterr()
    assert main(["sae-drift", "--harvest", str(tmp_path / "he"), "--model", model, "--quiet", "--n-boot", "200",
                 "--n-null", "20", "--sae", "pre=" + ",".join(map(str, pre_dirs)), f"hyb={tmp_path / 'hyb'}",
                 "--out", str(tmp_path / "rep")]) == 0
    printed = capsys.readouterr().out
    assert "fvu:" in printed and "hyb − pre" in printed and "prefill-vs-prefill null" in printed
    assert printed.strip() == (tmp_path / "rep" / "sae-drift.txt").read_text().strip()
    table = pl.read_parquet(tmp_path / "rep" / "sae-drift.parquet")
    assert set(table["sae"].unique()) == {"pre", "hyb"} and set(table["seed"].unique()) == {0, 1, 2, 3}
    assert table["phase"].is_in(["prefill", "decode"]).all()
    from trajscope.metrics.sae_eval import reconstruction_stats
    from trajscope.features.harvest import Harvest

    he = Harvest.load(tmp_path / "he").where(pl.col("phase") == "prefill")
    for seed, d in enumerate(pre_dirs):  # the report's point values equal a direct computation, per seed
        h = ts.SAE.load(str(d))
        want = reconstruction_stats(he.acts, h(he.acts), h.encode(he.acts))
        got = {r["metric"]: r for r in table.filter((pl.col("group") == "prefill") & (pl.col("sae") == "pre")
                                                    & (pl.col("seed") == seed)).iter_rows(named=True)}
        assert got["fvu"]["value"] == pytest.approx(want["fvu"]) and got["l0"]["value"] == pytest.approx(want["l0"])
        assert got["fvu"]["lo"] <= got["fvu"]["value"] <= got["fvu"]["hi"] and got["kl"]["value"] >= 0
    seeds = pl.read_parquet(tmp_path / "rep" / "sae-drift_seeds.parquet").filter(
        (pl.col("group") == "prefill") & (pl.col("metric") == "fvu"))
    pre_row = seeds.filter(pl.col("sae") == "pre").row(0, named=True)
    per_seed = table.filter((pl.col("group") == "prefill") & (pl.col("sae") == "pre") & (pl.col("metric") == "fvu"))
    assert pre_row["n_seeds"] == 3 and pre_row["seed_range"] == pytest.approx(
        per_seed["value"].max() - per_seed["value"].min()) and pre_row["seed_range"] > 0
    assert pre_row["value"] == pytest.approx(per_seed["value"].mean())
    assert seeds.filter(pl.col("sae") == "hyb")["n_seeds"].to_list() == [1]
    diff = pl.read_parquet(tmp_path / "rep" / "sae-drift_diff.parquet").filter(
        (pl.col("group") == "prefill") & (pl.col("metric") == "fvu")).row(0, named=True)
    hyb_fvu = seeds.filter(pl.col("sae") == "hyb")["value"][0]
    assert diff["sae"] == "hyb" and diff["base"] == "pre" and diff["diff"] == pytest.approx(hyb_fvu - pre_row["value"])
    assert np.isnan(diff["seed_floor"]) and diff["verdict"] == "no seed floor"  # hyb has one seed: no floor
    overlap = pl.read_parquet(tmp_path / "rep" / "sae-drift_overlap.parquet")
    assert {"null_mean", "null_lo", "null_hi", "observed", "n_matched"} <= set(overlap.columns)
    assert (overlap["n_matched"] <= overlap["n_dec"]).all()


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


def test_several_seeds_need_a_seed_placeholder_and_valid_seeds(tmp_path, capsys):
    from trajscope.cli.sae import seed_list, seed_out_dirs

    assert seed_list("0,1, 2") == [0, 1, 2] and seed_out_dirs("a-{seed}", [1, 2]) == ["a-1", "a-2"]
    assert seed_out_dirs("a", [3]) == ["a"]
    for bad in ("1,1", "x", "-1"):
        with pytest.raises(TrajscopeError, match="--seed"):
            seed_list(bad)
    rc = main(["train-sae", "--harvest", str(tmp_path), "--seed", "0,1", "--out", str(tmp_path / "sae")])
    err = capsys.readouterr().err
    assert rc == 2 and "need '{seed}' in --out" in err and "Traceback" not in err
    rc = main(["sae-drift", "--harvest", str(tmp_path), "--no-splice", "--sae", f"a={tmp_path}", f"a={tmp_path}",
               "--out", str(tmp_path / "o")])
    assert rc == 2 and "is given twice" in capsys.readouterr().err
