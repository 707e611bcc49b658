"""Prefill reference profile, drift statistics against NumPy/SciPy, calibration, probe, errors."""

from __future__ import annotations

import random

import numpy as np
import polars as pl
import pytest
import scipy.stats
import torch
from scipy.spatial import distance

import trajscope as ts
from trajscope.metrics.bands import depth_band_expr
from trajscope.metrics.profile_drift import profile_drift_by_group, profile_drift_table, gaussian_kl
from trajscope.profile import DriftProbe, ReferenceProfile, profile_from_residuals
from trajscope.studies.drift.build import build_profile

WORDS = ["def", "x", "=", "(", ")", "return", "if", "for", "in", "self", ":", "1", "'a'", "None", "import", "os"]


def random_prompts(n: int, seed: int, length: int = 24) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(length)) for _ in range(n)]


@pytest.fixture(scope="module")
def profile(tiny_models) -> ReferenceProfile:
    return build_profile(tiny_models["llama"], random_prompts(40, seed=0), fpr=0.05, progress=False)


def test_profile_moments_match_numpy(tiny_models, profile):
    prompts = random_prompts(40, seed=0)
    order = np.random.default_rng(0).permutation(40)
    fit = order[int(round(40 * 0.3)):]
    xs = []
    for i in fit:
        t = ts.capture(tiny_models["llama"], prompts[i], max_new_tokens=1, residual_layers=[1])
        xs.append(t.residual(1)[1: t.prompt_len].double().numpy())
    x = np.concatenate(xs)
    np.testing.assert_allclose(profile.mean[1].numpy(), x.mean(0), atol=1e-9)
    np.testing.assert_allclose(profile.var[1].numpy(), x.var(0, ddof=1), rtol=1e-7)
    assert float(profile.median_abs[1]) == pytest.approx(np.median(np.abs(x)), rel=1e-6)


def test_drift_statistics_match_scipy(tiny_models, profile):
    traj = ts.capture(tiny_models["llama"], "def f(x):\n    return x", max_new_tokens=8, stop_at_eos=False,
                      residual_layers="all")
    table = profile_drift_table(traj, profile).filter(pl.col("layer") == 1).sort("pos")
    x = traj.residual(1).double().numpy()
    mu, var = profile.mean[1].numpy(), profile.var[1].numpy()
    VI = np.diag(1.0 / var)
    for row in table.iter_rows(named=True):
        v = x[row["pos"]]
        assert row["score"] == pytest.approx(distance.mahalanobis(v, mu, VI) / np.sqrt(len(v)), rel=1e-9)
        assert row["mean_shift"] == pytest.approx(np.mean((v - mu) / np.sqrt(var)), rel=1e-9)
        assert row["kurtosis"] == pytest.approx(scipy.stats.kurtosis(v, fisher=True, bias=True), rel=1e-7)
        assert row["cosine_centroid"] == pytest.approx(1 - distance.cosine(v, mu), rel=1e-9)
        assert row["outlier_rate"] == pytest.approx(np.mean(np.abs(v) > 6))
        assert row["flagged"] == (row["score"] > float(profile.threshold[1]))
    assert table["depth_band"].to_list()[: traj.prompt_len] == ["prefill"] * traj.prompt_len


def test_gaussian_kl_matches_monte_carlo():
    rng = np.random.default_rng(1)
    mu_g, sd_g, mu_r, sd_r = 0.3, 1.7, -0.2, 0.9
    s = rng.normal(mu_g, sd_g, size=400_000)
    mc = np.mean(scipy.stats.norm.logpdf(s, mu_g, sd_g) - scipy.stats.norm.logpdf(s, mu_r, sd_r))
    kl = gaussian_kl(torch.tensor([mu_g]), torch.tensor([sd_g ** 2]), torch.tensor([mu_r]), torch.tensor([sd_r ** 2]))
    assert float(kl) == pytest.approx(mc, rel=0.02)


def test_calibrated_false_positive_rate(tiny_models):
    """Fresh prefill positions of the same prompt distribution are flagged at ≈ the target rate."""
    model = tiny_models["llama"]
    res = []
    for prompt in random_prompts(80, seed=2):
        t = ts.capture(model, prompt, max_new_tokens=1, residual_layers="all")
        res.append({layer: t.residual(layer)[1: t.prompt_len] for layer in range(model.n_layers)})
    fpr = 0.05
    prof = profile_from_residuals(res[:50], fpr=fpr, heldout_fraction=0.4)
    fresh = torch.cat([r[1] for r in res[50:]])
    flagged = (prof.score(1, fresh) > prof.threshold[1]).double()
    n = fresh.shape[0]
    rate = float(flagged.mean())
    # binomial sampling error of the fresh set plus that of the threshold's quantile estimate
    n_cal = sum(res[i][1].shape[0] for i in range(50)) * 0.4
    se = np.sqrt(fpr * (1 - fpr) * (1 / n + 1 / n_cal))
    assert abs(rate - fpr) < 4 * se, (rate, se, n)


def test_probe_flags_decode_steps(tiny_models, profile):
    model = tiny_models["llama"]
    probe = DriftProbe(profile, layers=(1,), every=3)
    traj = ts.capture(model, "import os\n", max_new_tokens=10, stop_at_eos=False, residual_layers=[1], probe=probe)
    assert traj.probe["step"].to_list() == [3, 6, 9]
    expect = profile.score(1, traj.residual(1)[traj.probe["pos"].to_list()])
    np.testing.assert_allclose(traj.probe["score"].to_numpy(), expect.numpy(), rtol=1e-5)
    assert traj.meta["probe"]["n_probed"] == 3
    always = DriftProbe(profile, layers=(0,), every=1000, entropy_threshold=0.0)
    t2 = ts.capture(model, "import os\n", max_new_tokens=4, stop_at_eos=False, probe=always)
    assert t2.probe["step"].to_list() == [1, 2, 3]


def test_profile_round_trip_and_errors(tmp_path, tiny_models, profile):
    back = ReferenceProfile.load(profile.save(tmp_path / "p.safetensors"))
    torch.testing.assert_close(back.var, profile.var)
    assert back.info == profile.info
    with pytest.raises(ts.TrajscopeError, match="No profile at"):
        ReferenceProfile.load(tmp_path / "missing.safetensors")
    three_layers = ReferenceProfile(mean=torch.zeros(3, 32), var=torch.ones(3, 32), median_abs=torch.ones(3),
                                    stat_mean=torch.ones(3, 5), stat_std=torch.ones(3, 5), threshold=torch.ones(3),
                                    info={"model_id": "other"})
    with pytest.raises(ts.TrajscopeError, match="cannot score"):
        ts.capture(tiny_models["gpt2"], "x = 1", max_new_tokens=2, probe=DriftProbe(three_layers))
    with pytest.raises(ts.TrajscopeError, match="at least two prompts"):
        build_profile(tiny_models["llama"], ["only one"], progress=False)


def test_drift_by_group_bands(tiny_models, profile):
    trajs = [ts.capture(tiny_models["llama"], p, max_new_tokens=12, stop_at_eos=False, residual_layers="all")
             for p in random_prompts(3, seed=5)]
    g = profile_drift_by_group(trajs, profile)
    assert g["depth_band"].unique(maintain_order=True).to_list() == ["prefill", "1-4", "5-16"]
    assert g.filter(pl.col("depth_band") == "1-4")["kl_sum"].null_count() == 0  # 12 positions
    few = profile_drift_by_group(trajs[:1], profile)
    assert few.filter(pl.col("depth_band") == "1-4")["kl_sum"].null_count() == 2  # 4 positions < 8: no KL
    assert g.filter(pl.col("depth_band") == "prefill")["kl_sum"].null_count() == 0
    steps = pl.DataFrame({"step": [0, 1, 4, 5, 16, 17, 64, 65, 256, 257]})
    assert steps.select(depth_band_expr(pl.col("step")).alias("band"))["band"].to_list() == [
        "prefill", "1-4", "1-4", "5-16", "5-16", "17-64", "17-64", "65-256", "65-256", "257+"]


def test_profile_and_drift_cli(tiny_dirs, tmp_path, capsys):
    import json

    from trajscope.cli import main

    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": p}) for p in random_prompts(6, seed=9, length=12)))
    model = str(tiny_dirs["llama"])
    assert main(["profile", "--model", model, "--prompts", str(prompts), "--fpr", "0.05",
                 "--out", str(tmp_path / "prof.safetensors")]) == 0
    assert main(["drift", "--model", model, "--prompts", str(prompts), "--profile", str(tmp_path / "prof.safetensors"),
                 "--max-new-tokens", "10", "--no-eos", "--out", str(tmp_path / "drift")]) == 0
    out = capsys.readouterr().out
    assert "by absolute position bin x regime" in out and "no prompt has a 'continuation'" in out
    by_depth = pl.read_parquet(tmp_path / "drift" / "drift_by_depth.parquet")
    assert set(by_depth["depth_band"]) == {"prefill", "1-4", "5-16"} and set(by_depth["layer"]) == {0, 1}
    assert set(by_depth["regime"]) == {"prefill", "decode"}  # no continuation in these prompts
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    other = str(tiny_dirs["gpt2"])
    for argv, fragment in [
        (["drift", "--model", model, "--prompts", str(prompts), "--profile", str(tmp_path / "none.safetensors")], "No profile at"),
        (["drift", "--model", model, "--prompts", str(empty)], "holds no prompts"),
    ]:
        assert main([*argv, "--out", str(tmp_path / "x")]) == 2
        assert fragment in capsys.readouterr().err
    ReferenceProfile(mean=torch.zeros(2, 16), var=torch.ones(2, 16), median_abs=torch.ones(2), stat_mean=torch.ones(2, 5),
                     stat_std=torch.ones(2, 5), threshold=torch.ones(2), info={"model_id": "narrow"}).save(tmp_path / "n.st")
    assert main(["drift", "--model", other, "--prompts", str(prompts), "--profile", str(tmp_path / "n.st"),
                 "--out", str(tmp_path / "x")]) == 2
    assert "width 16" in capsys.readouterr().err
