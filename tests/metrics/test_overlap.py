"""Feature-overlap metrics against hand computation and SciPy."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.stats
import torch

from trajscope.metrics import overlap as ov


def test_jaccard_by_hand():
    assert ov.jaccard({1, 2, 3}, {2, 3, 4, 5}) == pytest.approx(2 / 5)
    assert ov.jaccard([], []) == 1.0
    assert ov.jaccard(np.array([7]), [8]) == 0.0


def test_topk_sets_and_frequency_topk():
    f = torch.tensor([[0.0, 3.0, 1.0, 0.0], [2.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    assert ov.row_topk_sets(f, 2) == [{1, 2}, {0}, set()]
    counts = np.array([5, 0, 5, 2, 9])
    assert ov.topk_by_frequency(counts, 3).tolist() == [4, 0, 2]
    assert ov.topk_by_frequency(np.array([1, 0, 0]), 3).tolist() == [0]


def test_spearman_matches_scipy_with_ties():
    rng = np.random.default_rng(0)
    a = rng.integers(0, 5, 40).astype(float)
    b = a + rng.integers(0, 3, 40)
    assert ov.spearman(a, b) == pytest.approx(scipy.stats.spearmanr(a, b).statistic)
    assert np.isnan(ov.spearman(np.ones(5), np.arange(5.0)))


def test_frequency_kl_matches_scipy_entropy():
    cp, cq = np.array([10, 0, 3, 7]), np.array([1, 4, 4, 0])
    p, q = (cp + 0.5) / (cp + 0.5).sum(), (cq + 0.5) / (cq + 0.5).sum()
    assert ov.frequency_kl(cp, cq) == pytest.approx(scipy.stats.entropy(p, q))
    assert ov.frequency_kl(cp, cp) == pytest.approx(0.0, abs=1e-12)


def test_rate_ratio_and_appear_vanish():
    c_pre, c_dec = np.array([0, 10, 6, 4]), np.array([8, 10, 0, 4])
    lr = ov.log2_rate_ratio(c_dec, 20, c_pre, 10)
    assert lr[0] == pytest.approx(np.log2((8.5 / 21) / (0.5 / 11)))
    assert lr[1] == pytest.approx(np.log2((10.5 / 21) / (10.5 / 11)))
    appear, vanish = ov.appear_vanish(c_pre, c_dec, min_count=5)
    assert appear.tolist() == [0] and vanish.tolist() == [2]


def test_overlap_summary_on_fixed_codes():
    f_pre = torch.tensor([[1.0, 0.0, 0.0, 2.0], [1.0, 0.5, 0.0, 0.0]])
    f_dec = torch.tensor([[0.0, 0.0, 1.0, 2.0], [0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 3.0, 1.0]])
    s = ov.overlap_summary(f_pre, f_dec, k=2, min_count=2)
    # counts pre [2,1,0,1] -> top2 {0, 1}; dec [0,0,3,2] -> top2 {2, 3}
    assert s["jaccard_topk"] == 0.0
    assert (s["n_appear"], s["n_vanish"]) == (1, 1)
    assert s["spearman"] == pytest.approx(scipy.stats.spearmanr([1, .5, 0, .5], [0, 0, 1, 2 / 3]).statistic)
    table = ov.feature_table(f_pre, f_dec, min_count=2)
    assert table["appears"].to_list() == [False, False, True, False]
