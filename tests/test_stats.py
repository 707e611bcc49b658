"""trajscope.stats against known answers: coverage of a known mean, a null that centres on the truth,
trajectory-level false alarms at their target, and honest splits."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from trajscope import stats
from trajscope.errors import TrajscopeError


def clustered(rng, n_clusters=20, per=8, mu=1.0):
    """Values with a shared random effect per cluster (so rows of one cluster are correlated)."""
    eff = rng.normal(0, 1.0, n_clusters)
    vals = np.concatenate([mu + e + rng.normal(0, 0.5, per) for e in eff])
    return vals, np.repeat(np.arange(n_clusters), per)


def test_cluster_bootstrap_covers_the_true_mean_at_its_level():
    rng = np.random.default_rng(0)
    reps, level = 300, 0.9
    hits = 0
    for i in range(reps):
        v, c = clustered(rng)
        iv = stats.cluster_bootstrap(v, c, level=level, n_boot=300, seed=i)
        hits += iv.lo <= 1.0 <= iv.hi
    rate = hits / reps
    se = np.sqrt(level * (1 - level) / reps)
    # percentile cluster bootstrap with 20 clusters under-covers slightly; allow 3 SE below, 2 above
    assert level - 3 * se - 0.03 <= rate <= level + 2 * se, rate


def test_ignoring_clusters_would_under_cover():
    """Control: treating correlated rows as independent gives intervals far too narrow."""
    rng = np.random.default_rng(1)
    hits = 0
    for i in range(100):
        v, _ = clustered(rng)
        iv = stats.cluster_bootstrap(v, None, level=0.9, n_boot=200, seed=i)
        hits += iv.lo <= 1.0 <= iv.hi
    assert hits / 100 < 0.7


def test_bootstrap_statistic_path_and_frame():
    rng = np.random.default_rng(2)
    v, c = clustered(rng)
    fast = stats.cluster_bootstrap(v, c, n_boot=400, seed=3)
    slow = stats.cluster_bootstrap(v, c, statistic=np.mean, n_boot=400, seed=3)
    assert fast.estimate == pytest.approx(slow.estimate) and abs(fast.lo - slow.lo) < 1e-9
    df = pl.DataFrame({"g": ["a"] * 80 + ["b"] * 80, "x": v, "run_id": c})
    out = stats.bootstrap_frame(df, "x", by=["g"], n_boot=200)
    assert out.columns == ["g", "x", "x_lo", "x_hi", "n", "n_clusters"] and (out["x_lo"] <= out["x"]).all()
    assert str(fast).count("[") == 1


def _jaccard_topk(a, b, k=10):
    ca, cb = (a > 0).sum(0), (b > 0).sum(0)
    ta, tb = set(np.argsort(-ca, kind="stable")[:k]), set(np.argsort(-cb, kind="stable")[:k])
    return len(ta & tb) / len(ta | tb)


def test_matched_null_centres_on_the_overlap_of_two_samples_of_one_distribution():
    rng = np.random.default_rng(4)
    rates = rng.uniform(0.01, 0.3, 60)
    draw = lambda n: (rng.random((n, 60)) < rates).astype(float)  # noqa: E731
    reference, other = draw(2000), draw(150)
    observed = _jaccard_topk(draw(150), other)
    null = stats.matched_null(reference, 150, _jaccard_topk, n_resamples=200, seed=5)
    assert null.contains(observed) and abs(null.mean - observed) < 0.25
    shifted = (rng.random((150, 60)) < rates[::-1]).astype(float)  # a different distribution falls outside
    assert not null.contains(_jaccard_topk(draw(150), shifted))
    with pytest.raises(TrajscopeError, match="use n ≤ 1000"):
        stats.matched_null(reference, 1500, _jaccard_topk)


def test_trajectory_calibration_keeps_held_out_false_alarms_at_target():
    rng = np.random.default_rng(6)
    target = 0.05
    run = lambda: rng.normal(0, 1, size=(60, 6)).ravel()  # noqa: E731  a prefill-like run: 60 steps × 6 layers
    thr = stats.calibrate_max([run() for _ in range(400)], target)
    rate, se = stats.false_alarm_rate([run() for _ in range(2000)], thr)
    assert abs(rate - target) <= 2 * se + 0.01, (rate, se)
    per_step_thr = float(np.quantile(rng.normal(0, 1, 100_000), 1 - target))  # the uncorrected rule
    naive, _ = stats.false_alarm_rate([run() for _ in range(500)], per_step_thr)
    assert naive > 0.9  # a per-(step, layer) threshold flags almost every prefill-like run
    with pytest.raises(TrajscopeError, match="calibration runs"):
        stats.calibrate_max([run() for _ in range(5)], 0.01)


def test_split_ids_are_disjoint_complete_and_order_free():
    ids = [f"p{i}" for i in range(20)]
    a = stats.split_ids(ids, seed=1)
    b = stats.split_ids(list(reversed(ids)), seed=1)
    assert a == {k: sorted(v, key=ids.index) for k, v in b.items()} or a == b
    flat = [x for v in a.values() for x in v]
    assert sorted(flat) == sorted(ids) and len(flat) == len(set(flat))
    assert [len(a[k]) for k in ("fit", "calibrate", "evaluate")] == [10, 5, 5]
    with pytest.raises(TrajscopeError, match="sum to 1"):
        stats.split_ids(ids, fractions=(0.5, 0.2, 0.2))
    with pytest.raises(TrajscopeError, match="at least one"):
        stats.split_ids(["a", "b"])


def test_wilson_interval():
    lo, hi = stats.binomial_interval(5, 100)
    assert 0.02 < lo < 0.05 < hi < 0.12
    assert stats.binomial_interval(0, 10)[0] == pytest.approx(0.0, abs=1e-12)
