"""Known-answer tests for trajscope.stats: coverage, nulls, calibration, splits.

Simulations are seeded and small (a few seconds in all). Each known-answer test
also checks that the wrong method (row bootstrap, mismatched n, step-level
calibration) fails the same check, so the check has the power to fail.
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest
import torch

from trajscope.conformal import calibrate_max, false_alarm_rate
from trajscope.errors import TrajscopeError
from trajscope.stats import Interval, binomial_interval, bootstrap_frame, cluster_bootstrap, matched_null, split_ids


def clustered_sample(rng: np.random.Generator, n_clusters: int = 40, mu: float = 0.5):
    """Rows ``mu + u_c + e`` with cluster effect u_c ~ N(0, 1), noise e ~ N(0, 1), 2–19 rows per cluster."""
    sizes = rng.integers(2, 20, size=n_clusters)
    clusters = np.repeat(np.arange(n_clusters), sizes)
    values = mu + rng.normal(size=n_clusters)[clusters] + rng.normal(size=clusters.size)
    return values, clusters


def coverage(n_rep: int, level: float, use_clusters: bool, mu: float = 0.5) -> float:
    hits = 0
    for rep in range(n_rep):
        values, clusters = clustered_sample(np.random.default_rng(rep), mu=mu)
        iv = cluster_bootstrap(values, clusters if use_clusters else None, level=level, n_boot=200, seed=rep)
        hits += iv.lo <= mu <= iv.hi
    return hits / n_rep


# --- bootstrap -------------------------------------------------------------------------------

def test_cluster_bootstrap_covers_true_mean_at_stated_rate():
    n_rep, level = 300, 0.90
    tol = 3 * math.sqrt(level * (1 - level) / n_rep)  # ≈ 0.052
    cov = coverage(n_rep, level, use_clusters=True)
    assert abs(cov - level) <= tol, f"cluster bootstrap coverage {cov:.3f} vs {level} ± {tol:.3f}"
    # Power: resampling rows ignores the shared prompt effect and covers far too rarely.
    naive = coverage(n_rep, level, use_clusters=False)
    assert naive < level - tol, f"row bootstrap coverage {naive:.3f} should fall well short of {level}"


def test_cluster_bootstrap_fast_mean_matches_generic_path_and_ignores_row_order():
    values, clusters = clustered_sample(np.random.default_rng(7))
    fast = cluster_bootstrap(values, clusters, n_boot=300, seed=3)
    generic = cluster_bootstrap(values, clusters, statistic=lambda v: float(np.mean(v)), n_boot=300, seed=3)
    assert fast.estimate == pytest.approx(values.mean())
    assert (fast.lo, fast.hi) == pytest.approx((generic.lo, generic.hi), abs=1e-12)
    perm = np.random.default_rng(1).permutation(values.size)
    shuffled = cluster_bootstrap(values[perm], clusters[perm], n_boot=300, seed=3)
    assert (shuffled.lo, shuffled.hi) == pytest.approx((fast.lo, fast.hi), abs=1e-12)
    assert fast.lo < fast.estimate < fast.hi and fast.n_clusters == 40 and fast.n_boot == 300


def test_cluster_bootstrap_other_statistic_and_single_cluster():
    values, clusters = clustered_sample(np.random.default_rng(2))
    med = cluster_bootstrap(values, clusters, statistic=np.median, n_boot=200)
    assert med.estimate == pytest.approx(np.median(values)) and med.lo < med.estimate < med.hi
    one = cluster_bootstrap([1.0, 2.0, 3.0], ["p0"] * 3)
    assert one.estimate == 2.0 and math.isnan(one.lo) and math.isnan(one.hi) and one.n_clusters == 1


def test_interval_formatting():
    iv = Interval(0.1234, 0.1011, 0.15, 0.95, 12, 1000)
    assert str(iv) == "0.123 [0.101, 0.150]"
    assert iv.fmt(2) == "0.12 [0.10, 0.15]"
    assert iv.to_dict() == {"estimate": 0.1234, "lo": 0.1011, "hi": 0.15, "level": 0.95, "n_clusters": 12,
                            "n_boot": 1000}


def test_bootstrap_frame_groups_match_direct_calls():
    rng = np.random.default_rng(4)
    frames = []
    for layer in (0, 1):
        values, clusters = clustered_sample(rng, n_clusters=15, mu=float(layer))
        frames.append(pl.DataFrame({"layer": layer, "prompt_id": [f"p{c}" for c in clusters], "fvu": values}))
    df = pl.concat(frames)
    out = bootstrap_frame(df.reverse(), "fvu", by=["layer"], n_boot=200, seed=5)
    assert out.columns == ["layer", "fvu", "fvu_lo", "fvu_hi", "n", "n_clusters"]
    assert out["layer"].to_list() == [0, 1]
    for row in out.iter_rows(named=True):
        g = df.filter(pl.col("layer") == row["layer"])
        iv = cluster_bootstrap(g["fvu"].to_numpy(), g["prompt_id"].to_numpy(), n_boot=200, seed=5)
        assert (row["fvu"], row["fvu_lo"], row["fvu_hi"]) == pytest.approx((iv.estimate, iv.lo, iv.hi))
        assert row["n"] == g.height and row["n_clusters"] == 15
    overall = bootstrap_frame(df.lazy(), "fvu", n_boot=200)
    assert overall.height == 1 and overall["n_clusters"][0] == 15  # p0..p14 shared by both layers


# --- matched-n null ---------------------------------------------------------------------------

D_FEATURES, TOP_K = 300, 20
RATES = 0.4 * np.arange(1, D_FEATURES + 1) ** -0.7


def feature_rows(rng: np.random.Generator, n: int) -> np.ndarray:
    """Binary SAE-like activations ``[n, d]``; feature i fires with probability RATES[i]."""
    return (rng.random((n, D_FEATURES)) < RATES).astype(np.float32)


def topk_jaccard(a, b) -> float:
    """Jaccard of the top-k features by activation frequency (independent of trajscope.metrics)."""
    ta = set(np.argsort(-np.asarray(a).sum(0), kind="stable")[:TOP_K].tolist())
    tb = set(np.argsort(-np.asarray(b).sum(0), kind="stable")[:TOP_K].tolist())
    return len(ta & tb) / len(ta | tb)


def test_matched_null_centres_on_overlap_of_two_samples_from_one_distribution():
    n = 150
    reference = feature_rows(np.random.default_rng(100), 3000)
    null = matched_null(reference, n, topk_jaccard, n_resamples=200, level=0.95, seed=1)
    observed = np.array([topk_jaccard(feature_rows(np.random.default_rng(s), n),
                                      feature_rows(np.random.default_rng(1000 + s), n)) for s in range(40)])
    assert null.lo <= observed[0] <= null.hi
    assert np.mean((observed >= null.lo) & (observed <= null.hi)) >= 0.85
    tol = 3 * math.sqrt(observed.var(ddof=1) / observed.size + null.samples.var(ddof=1) / null.n_resamples)
    assert abs(observed.mean() - null.mean) <= tol, (observed.mean(), null.mean, tol)
    # Power: a null at the wrong sample size (4n per side) sits clearly elsewhere.
    wrong = matched_null(reference, 4 * n, topk_jaccard, n_resamples=100, seed=1)
    assert abs(observed.mean() - wrong.mean) > 2 * tol, (observed.mean(), wrong.mean, tol)


def test_matched_null_disjoint_sides_torch_and_clusters():
    seen = []

    def record(a, b):
        seen.append((a, b))
        return float(len(set(a[:, 0].tolist()) & set(b[:, 0].tolist())))

    ids = torch.arange(40, dtype=torch.float64)
    ref = torch.stack([ids, ids * 2], 1)  # row i has id i
    null = matched_null(ref, 20, record, n_resamples=5)
    assert null.mean == 0.0 and len(seen) == 5
    assert all(isinstance(a, torch.Tensor) and a.shape == (20, 2) and b.shape == (20, 2) for a, b in seen)
    assert sum(len(set(a[:, 0].tolist()) | set(b[:, 0].tolist())) for a, b in seen) == 5 * 40

    prompts = np.repeat(np.arange(12), np.arange(1, 13))  # cluster k has k+1 rows: 78 rows
    ref_np = np.column_stack([prompts, np.arange(prompts.size)]).astype(float)
    seen.clear()
    null = matched_null(ref_np, 30, record, n_resamples=50, clusters=prompts, seed=3)
    assert null.mean == 0.0, "sides must never share a prompt"
    assert all(len(a) == len(b) == 30 for a, b in seen)
    assert len({tuple(sorted(set(a[:, 0].tolist()))) for a, _ in seen}) > 1  # clusters really are reshuffled
    diff = lambda a, b: float(a[:, 1].sum() - b[:, 1].sum())  # noqa: E731
    first, again = (matched_null(ref_np, 30, diff, clusters=prompts, n_resamples=20, seed=3) for _ in range(2))
    assert np.array_equal(first.samples, again.samples) and first.samples.std() > 0  # seeded, not constant


# --- trajectory-level calibration -----------------------------------------------------------

def prefill_like_runs(rng: np.random.Generator, n_runs: int, steps: int = 8, layers: int = 4) -> list[np.ndarray]:
    """Runs of i.i.d. per-(step, layer) scores with a per-run offset (runs are not all alike)."""
    return [rng.normal(size=(steps, layers)) + rng.normal(scale=0.5) for _ in range(n_runs)]


def test_calibrate_max_uses_the_conformal_order_statistic():
    runs = [np.array([[0.0, m]]) for m in [5, 3, 9, 1, 7, 2, 8, 4, 6]]  # maxima 1..9, n = 9
    assert calibrate_max(runs, 0.1) == 9.0   # ceil(10 · 0.9) = 9th smallest
    assert calibrate_max(runs, 0.2) == 8.0   # ceil(10 · 0.8) = 8th smallest
    assert calibrate_max(runs, 0.25) == 8.0  # ceil(7.5) = 8th, the conservative side
    assert false_alarm_rate(runs, 8.0) == pytest.approx((1 / 9, math.sqrt((1 / 9) * (8 / 9) / 9)))


def test_calibrate_max_false_alarm_rate_on_held_out_runs():
    target = 0.1
    # One split: calibration 999 runs ((n+1)·target integral, so the expected rate is exactly target).
    rng = np.random.default_rng(0)
    threshold = calibrate_max(prefill_like_runs(rng, 999), target)
    rate, se = false_alarm_rate(prefill_like_runs(rng, 1000), threshold)
    se_total = math.sqrt(se ** 2 + target * (1 - target) / 1001)  # + spread of the calibrated threshold
    assert abs(rate - target) <= 2 * se_total, (rate, se, se_total)
    # Averaged over seeds: the mean held-out rate is the target within its standard error (3 SE band).
    rates, step_level = [], []
    for seed in range(100):
        rng = np.random.default_rng(seed + 1)
        cal, held = prefill_like_runs(rng, 99), prefill_like_runs(rng, 100)
        rates.append(false_alarm_rate(held, calibrate_max(cal, target))[0])
        # Power: a per-score (step-level) quantile ignores the max over 32 scores per run.
        per_score = float(np.quantile(np.concatenate([r.ravel() for r in cal]), 1 - target))
        step_level.append(false_alarm_rate(held, per_score)[0])
    rates = np.array(rates)
    se_mean = rates.std(ddof=1) / math.sqrt(rates.size)
    assert abs(rates.mean() - target) <= 3 * se_mean, (rates.mean(), se_mean)
    assert np.mean(step_level) > 0.5


def test_binomial_interval_matches_scipy_wilson():
    from scipy.stats import binomtest
    for k, n, level in [(0, 10, 0.95), (5, 10, 0.95), (3, 40, 0.9), (40, 40, 0.99)]:
        iv = binomial_interval(k, n, level)
        ref = binomtest(k, n).proportion_ci(confidence_level=level, method="wilson")
        assert (iv.lo, iv.hi) == pytest.approx((ref.low, ref.high), abs=1e-9)
        assert iv.estimate == k / n and iv.n_clusters == n and iv.n_boot == 0


# --- held-out splits --------------------------------------------------------------------------

def test_split_ids_disjoint_complete_deterministic():
    ids = [f"prompt{i:03d}" for i in range(101)]
    parts = split_ids(ids, seed=4)
    assert list(parts) == ["fit", "calibrate", "evaluate"]
    assert [len(p) for p in parts.values()] == [51, 25, 25]
    flat = [i for p in parts.values() for i in p]
    assert sorted(flat) == ids and len(set(flat)) == len(flat)
    shuffled = list(reversed(ids)) + ids[:10]  # order and duplicates do not change membership
    assert split_ids(shuffled, seed=4) == parts
    assert split_ids(np.array(ids), seed=4) == parts
    assert split_ids(ids, seed=5) != parts
    tiny = split_ids([3, 1, 2], fractions=(0.9, 0.05, 0.05))
    assert sorted(len(p) for p in tiny.values()) == [1, 1, 1]
    two = split_ids(range(10), fractions=(0.7, 0.3), names=("fit", "evaluate"))
    assert [len(p) for p in two.values()] == [7, 3]


# --- errors -----------------------------------------------------------------------------------

@pytest.mark.parametrize("call, words", [
    (lambda: split_ids(range(10), fractions=(0.5, 0.3, 0.3)), "sum to 1"),
    (lambda: split_ids(range(10), fractions=(0.5, 0.5), names=("a", "b", "c")), "one distinct name"),
    (lambda: split_ids([1, 2]), "at least 3 distinct ids"),
    (lambda: split_ids([]), "at least 3 distinct ids"),
    (lambda: split_ids(["a", 1, 2]), "one sortable type"),
    (lambda: matched_null(np.zeros((10, 3)), 6, topk_jaccard), r"smaller n \(at most 5\)"),
    (lambda: matched_null(np.zeros((10, 3)), 4, topk_jaccard, clusters=[0] * 5 + [1] * 5), "smaller n"),
    (lambda: matched_null(np.zeros((0, 3)), 1, topk_jaccard), "empty"),
    (lambda: cluster_bootstrap([]), "empty"),
    (lambda: cluster_bootstrap([1.0, float("nan")]), "NaN"),
    (lambda: cluster_bootstrap([1.0, 2.0], [0]), "one label per value"),
    (lambda: cluster_bootstrap([1.0, 2.0], level=95), "between 0 and 1"),
    (lambda: calibrate_max([], 0.1), "No runs"),
    (lambda: calibrate_max([np.ones(3)] * 5, 0.1), "at least 9 calibration runs"),
    (lambda: calibrate_max([np.ones(3), np.array([])], 0.5), "no scores"),
    (lambda: bootstrap_frame(pl.DataFrame({"x": [1.0]}), "x", by=["layer"]), "not in the table"),
    (lambda: binomial_interval(5, 3), "0 ≤ k ≤ n"),
])
def test_bad_input_raises_one_helpful_sentence(call, words):
    with pytest.raises(TrajscopeError, match=words):
        call()


def test_kaplan_meier_by_hand():
    """times 1,2,2+,3,4+,5 (+ = censored): S = 5/6, 2/3, 4/9, 0 at t = 1, 2, 3, 5; Greenwood Σ d/(n(n−d)) =
    1/30, +1/20, +1/6. Median 3 (first S ≤ .5). log(−log) bands: at t = 1 the lower band is
    (5/6)^exp(1.96·√(1/30)/log(6/5)) = .27 ≤ .5 → the interval starts at 1; the upper band stays above .5 until
    S = 0 at t = 5 (at t = 3: (4/9)^exp(−1.96·.5/log(9/4)) = .785)."""
    from trajscope.survival import kaplan_meier, km_median

    times, events = [1, 2, 2, 3, 4, 5], [True, True, False, True, False, True]
    km = kaplan_meier(times, events)
    assert km["time"].to_list() == [1, 2, 3, 5] and km["at_risk"].to_list() == [6, 5, 3, 1]
    assert km["survival"].to_list() == pytest.approx([5 / 6, 2 / 3, 4 / 9, 0.0])
    assert km["var_log"].to_list()[:3] == pytest.approx([1 / 30, 1 / 30 + 1 / 20, 1 / 30 + 1 / 20 + 1 / 6])
    iv = km_median(times, events)
    assert (iv.estimate, iv.lo, iv.hi, iv.n_clusters) == (3.0, 1.0, 5.0, 6)
    # dropping the censored units (what a "median of observed divergences" does) moves the median earlier
    assert km_median([1, 2, 3, 5], [True] * 4).estimate == 2.0
    # a median that is never reached is infinite, not the last time seen
    assert km_median([3, 4, 5, 6], [True, False, False, False]).estimate == float("inf")
