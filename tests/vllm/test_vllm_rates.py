"""Feature firing rates and their KL against a baseline window, without vLLM (default suite).

The KL is checked against SciPy's ``entropy(p, q)`` on distributions smoothed here by hand, and the
windows against counts summed by hand.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import entropy

from trajscope.errors import TrajscopeError
from trajscope.vllm.rates import RateWindows, request_counts, smoothed_kl


def test_smoothed_kl_matches_scipy_on_hand_smoothed_distributions():
    rng = np.random.default_rng(0)
    p, q = rng.integers(0, 20, 50), rng.integers(0, 20, 50)
    p[3] = 0  # a feature one window never fired
    ps, qs = (p + 0.5) / (p + 0.5).sum(), (q + 0.5) / (q + 0.5).sum()
    assert smoothed_kl(p, q) == pytest.approx(entropy(ps, qs), rel=1e-12)
    assert smoothed_kl(p, 3 * p) == pytest.approx(entropy((p + .5) / (p + .5).sum(), (3 * p + .5) / (3 * p + .5).sum()))
    assert smoothed_kl(p, p) == 0.0
    with pytest.raises(ValueError):
        smoothed_kl(p, q[:10])


def test_request_counts_bins_firings_by_feature():
    assert request_counts(np.array([2, 2, 0, 5]), 6).tolist() == [1, 0, 2, 0, 0, 1]


def test_baseline_freezes_after_n_requests_and_the_current_window_slides():
    w = RateWindows(4, baseline_requests=2, window_requests=2)
    reqs = [([1, 0, 0, 0], 2), ([0, 3, 0, 0], 3), ([0, 0, 4, 0], 4), ([0, 0, 0, 5], 5), ([6, 0, 0, 0], 6)]
    assert w.kl() is None
    for c, n in reqs[:2]:
        w.add(np.array(c), n)
    assert w.frozen and w.baseline.counts.tolist() == [1, 3, 0, 0] and w.baseline.positions == 5
    assert w.kl() is None and w.current.requests == 0  # nothing after the baseline yet
    assert w.top_baseline(3) == [1, 0]  # most frequent first; features the baseline never fired are left out
    for c, n in reqs[2:]:
        w.add(np.array(c), n)
    cur = w.current  # the last two requests only
    assert cur.counts.tolist() == [6, 0, 0, 5] and cur.positions == 11 and cur.requests == 2
    np.testing.assert_allclose(cur.rates, [6 / 11, 0, 0, 5 / 11])
    np.testing.assert_allclose(w.baseline.rates, [1 / 5, 3 / 5, 0, 0])
    assert w.baseline.counts.tolist() == [1, 3, 0, 0]  # frozen
    assert w.kl() == pytest.approx(entropy(np.array([6.5, .5, .5, 5.5]) / 13, np.array([1.5, 3.5, .5, .5]) / 6))


def test_window_sizes_come_from_the_environment_and_bad_ones_get_one_sentence(monkeypatch):
    monkeypatch.setenv("TRAJSCOPE_VLLM_BASELINE_REQUESTS", "3")
    monkeypatch.delenv("TRAJSCOPE_VLLM_WINDOW_REQUESTS", raising=False)
    w = RateWindows(2)
    assert (w.baseline_requests, w.window_requests) == (3, 16)
    monkeypatch.setenv("TRAJSCOPE_VLLM_WINDOW_REQUESTS", "many")
    with pytest.raises(TrajscopeError, match="^TRAJSCOPE_VLLM_WINDOW_REQUESTS must be a whole number"):
        RateWindows(2)
    with pytest.raises(TrajscopeError, match="^A rate window holds at least one request"):
        RateWindows(2, baseline_requests=0)
