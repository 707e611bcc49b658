"""SAE report controls with known answers: exact resampled metrics, seed spread, differences, matched-n nulls,
phase-pure groups and position bins."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import torch

from trajscope.metrics import overlap as ov
from trajscope.metrics import sae_eval as ev
from trajscope.metrics import sae_intervals as si
from trajscope.metrics.bands import position_bin


def _rows(n_prompts=6, per=20, d=5, d_sae=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    codes = np.repeat(np.arange(n_prompts), per)
    x = torch.randn(codes.size, d, generator=g, dtype=torch.float64) + 1.0
    x_hat = x + 0.3 * torch.randn(codes.size, d, generator=g, dtype=torch.float64)
    f = torch.relu(torch.randn(codes.size, d_sae, generator=g, dtype=torch.float64) - 1.0)
    kl = np.abs(np.random.default_rng(seed).normal(size=codes.size))
    kl[::7] = np.nan  # missing spliced values (the last position of a sequence)
    return codes, x, x_hat, f, kl


def test_resampled_metrics_equal_a_direct_computation_on_the_concatenated_rows():
    codes, x, x_hat, f, kl = _rows()
    s = si.group_sums(codes, 6, x, x_hat, f, kl=kl, ce=kl * 2)
    pick = np.array([0, 0, 3, 5, 5, 5])  # a bootstrap draw: prompts repeated
    rows = np.concatenate([np.flatnonzero(codes == p) for p in pick])
    want = ev.reconstruction_stats(x[rows], x_hat[rows], f[rows])
    got = si.metrics_from_sums(s, pick)
    for m in ("fvu", "fvu_uncentred", "mse", "cos", "l0", "dead", "dense"):
        assert got[m] == pytest.approx(want[m], rel=1e-9, abs=1e-12), m
    assert got["kl"] == pytest.approx(np.nanmean(kl[rows]))
    assert got["ce_increase"] == pytest.approx(2 * np.nanmean(kl[rows]))


def test_intervals_cover_the_value_and_shrink_with_more_prompts():
    rows_small = si.interval_rows({("a", 0): si.group_sums(*_rows(n_prompts=6)[:1], 6, *_rows(n_prompts=6)[1:4])},
                                  ["fvu"], n_boot=300)
    codes, x, x_hat, f, _ = _rows(n_prompts=60)
    rows_big = si.interval_rows({("a", 0): si.group_sums(codes, 60, x, x_hat, f)}, ["fvu"], n_boot=300)
    for r in (rows_small[0], rows_big[0]):
        assert r["lo"] < r["value"] < r["hi"]
    assert rows_big[0]["hi"] - rows_big[0]["lo"] < rows_small[0]["hi"] - rows_small[0]["lo"]
    assert rows_big[0]["n_prompts"] == 60 and rows_big[0]["n"] == 60 * 20


def _mix(scale: float, seed: int) -> si.GroupSums:
    codes, x, _, f, _ = _rows(n_prompts=30, seed=100)  # same rows for every SAE, like one harvest
    noise = torch.randn(x.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return si.group_sums(codes, 30, x, x + scale * noise, f)


def test_seed_spread_and_the_verdict_on_differences():
    sums = {("base", s): _mix(0.30, s) for s in (1, 2, 3)}
    sums |= {("same", s): _mix(0.30, s) for s in (4, 5, 6)}  # same recipe, other seeds
    sums |= {("worse", s): _mix(0.60, s) for s in (7, 8, 9)}  # 4x the error
    seeds = si.seed_summary(sums, ["fvu"], n_boot=300)
    by = {r["sae"]: r for r in seeds}
    per_seed = [si.metrics_from_sums(sums[("base", s)])["fvu"] for s in (1, 2, 3)]
    assert by["base"]["n_seeds"] == 3 and by["base"]["value"] == pytest.approx(np.mean(per_seed))
    assert by["base"]["seed_range"] == pytest.approx(max(per_seed) - min(per_seed)) and by["base"]["seed_range"] > 0
    assert by["base"]["seed_sd"] == pytest.approx(np.std(per_seed, ddof=1))
    diffs = {r["sae"]: r for r in si.mix_differences(sums, seeds, "base", ["fvu"], n_boot=300)}
    assert diffs["worse"]["verdict"] == "beyond noise" and diffs["worse"]["diff_lo"] > 0
    assert diffs["worse"]["diff"] == pytest.approx(by["worse"]["value"] - by["base"]["value"])
    assert diffs["same"]["verdict"] == "within noise"
    assert diffs["same"]["seed_floor"] == pytest.approx(max(by["same"]["seed_range"], by["base"]["seed_range"]))


def _codes(n_rows: int, n_feat: int, rate: np.ndarray, seed: int) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    return torch.tensor((rng.random((n_rows, n_feat)) < rate) * rng.random((n_rows, n_feat)))


def test_matched_null_of_one_distribution_centres_on_the_observed_overlap():
    n_feat = 200
    rate = np.random.default_rng(0).uniform(0.002, 0.2, n_feat)
    f_pre = _codes(2400, n_feat, rate, 1)
    clusters = np.repeat(np.arange(40), 60)
    f_dec = _codes(150, n_feat, rate, 2)  # same distribution, fewer rows (like decode steps 1-4)
    got = {r["metric"]: r for r in ov.matched_overlap(f_pre, clusters, f_dec, k=32, n_resamples=200)}
    j = got["jaccard_topk"]
    assert j["n_matched"] == 150 and j["null_lo"] <= j["observed"] <= j["null_hi"] and not j["outside_null"]
    assert j["observed"] == pytest.approx(j["null_mean"], abs=0.05)
    assert got["spearman"]["observed"] == pytest.approx(got["spearman"]["null_mean"], abs=0.05)
    assert got["dead"]["observed"] == pytest.approx(got["dead"]["null_mean"], abs=0.03)
    shifted = _codes(150, n_feat, np.roll(rate, 60), 3)  # other features fire: a real difference
    s = {r["metric"]: r for r in ov.matched_overlap(f_pre, clusters, shifted, k=32, n_resamples=200)}
    assert s["jaccard_topk"]["outside_null"] and s["jaccard_topk"]["observed"] < s["jaccard_topk"]["null_lo"]


def test_matched_n_is_capped_by_the_prefill_prompts_and_small_sets_get_no_null():
    rate = np.full(50, 0.1)
    f_pre = _codes(300, 50, rate, 0)
    clusters = np.repeat(np.arange(10), 30)
    big = ov.matched_overlap(f_pre, clusters, _codes(1000, 50, rate, 1), k=8, n_resamples=20)
    assert big[0]["n_matched"] == ov.max_matched_n(clusters) == (300 - 30 + 1) // 2
    tiny = ov.matched_overlap(f_pre[:20], clusters[:20], _codes(50, 50, rate, 1), k=8, n_resamples=20)
    assert all(np.isnan(r["null_mean"]) and "no null" in r["note"] for r in tiny)


def test_groups_are_phase_pure_and_position_bins_match_across_phases():
    pos = list(range(0, 40)) + list(range(40, 300)) + list(range(0, 70)) + list(range(70, 100))
    phase = ["prefill"] * 40 + ["decode"] * 260 + ["prefill"] * 70 + ["decode"] * 30
    step = [0] * 40 + list(range(1, 261)) + [0] * 70 + list(range(1, 31))
    rows = pl.DataFrame({"pos": pos, "phase": phase, "step": step,
                         "entropy": np.linspace(0, 5, len(pos))}).with_columns(
        pl.col("step").map_elements(ev.depth_band, return_dtype=pl.String).alias("depth_band"),
        pl.col("entropy").map_elements(ev.entropy_band, return_dtype=pl.String).alias("entropy_band"))
    groups = ev.report_groups(rows)
    for kind, phase_, label, expr in groups:
        sel = rows.filter(expr.fill_null(False))
        assert sel.height and set(sel["phase"]) == {phase_}, label
    bins = {label: rows.filter(expr) for kind, _, label, expr in groups if kind == "position_bin"}
    assert list(bins) == ["prefill pos 0-31", "prefill pos 32-63", "decode pos 32-63", "prefill pos 64-127",
                          "decode pos 64-127", "decode pos 128-255", "decode pos 256+"]
    assert bins["prefill pos 32-63"].height == 8 + 32 and bins["decode pos 32-63"].height == 24
    for label, sel in bins.items():
        assert {position_bin(p) for p in sel["pos"]} == {label.split(" pos ")[1]}
    ent = [(p, label) for kind, p, label, _ in groups if kind == "entropy_band"]
    assert {p for p, _ in ent} == {"prefill", "decode"} and all(label.startswith(p) for p, label in ent)
    assert [position_bin(p) for p in (0, 31, 32, 63, 64, 127, 128, 255, 256, 9999)] == [
        "0-31", "0-31", "32-63", "32-63", "64-127", "64-127", "128-255", "128-255", "256+", "256+"]
