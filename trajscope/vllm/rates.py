"""SAE feature firing rates of served requests, and their KL divergence against a baseline window.

A server sees requests one after another. For one SAE at one layer, :class:`RateWindows`
keeps two windows of finished requests:

- the **baseline window**: the first ``baseline_requests`` finished requests that used the SAE
  (default 16, ``$TRAJSCOPE_VLLM_BASELINE_REQUESTS``). It is frozen once full and never moves;
- the **current window**: the last ``window_requests`` finished requests after the baseline
  (default 16, ``$TRAJSCOPE_VLLM_WINDOW_REQUESTS``), a sliding window.

Only **decode positions** count (step ≥ 1, the positions the drift probe scores too): prompt
positions vary with the prompts' lengths, and a prefix-cache hit skips some of them. A feature
*fires* at a position when it is among the position's recorded top-k features with a value > 0
(the run's ``features`` table). A window's **firing rate** of feature f is the fraction of the
window's decode positions at which f fires.

The **KL** compares the distributions of firings over features, ``p_f = (c_f + α) / (Σc + α·F)``
in the current window and ``q_f`` likewise in the baseline (``c_f``: f's firings in the window,
``F``: the SAE's width, ``α = 0.5``: additive smoothing so that a feature unseen in one window
gives a finite value): ``KL(p ‖ q) = Σ_f p_f ln(p_f / q_f)`` in nats. It is 0 when the two windows
fire features in the same proportions and grows as the current window's mix moves away from the
baseline's. With windows of a few requests it is noisy (a window of n positions draws its counts
from a few hundred firings), so compare it against its own values between baseline-like windows
before alerting on it.

Plain numpy, no vLLM: :mod:`trajscope.vllm.metrics` exports the values to Prometheus.
"""

from __future__ import annotations

import collections
import dataclasses
import os

import numpy as np

from trajscope.errors import TrajscopeError

ALPHA = 0.5
ENV_BASELINE = "TRAJSCOPE_VLLM_BASELINE_REQUESTS"
ENV_WINDOW = "TRAJSCOPE_VLLM_WINDOW_REQUESTS"
DEFAULT_REQUESTS = 16


def smoothed_kl(counts_p: np.ndarray, counts_q: np.ndarray, alpha: float = ALPHA) -> float:
    """``KL(p ‖ q)`` in nats between two count vectors over the same F features, each smoothed by ``alpha``.

    Args:
        counts_p, counts_q: ``[F]`` non-negative firing counts.
    Returns:
        The divergence (0 for proportional counts).
    """
    p = np.asarray(counts_p, dtype=np.float64) + alpha
    q = np.asarray(counts_q, dtype=np.float64) + alpha
    if p.shape != q.shape or p.ndim != 1:
        raise ValueError(f"count vectors must have the same length, not {p.shape} and {q.shape}")
    p /= p.sum()
    q /= q.sum()
    return float(np.sum(p * (np.log(p) - np.log(q))))


@dataclasses.dataclass
class Window:
    """Firing counts over the decode positions of some requests."""

    counts: np.ndarray
    positions: int = 0
    requests: int = 0

    @property
    def rates(self) -> np.ndarray:
        """``[F]`` fraction of the window's decode positions at which each feature fired (zeros when empty)."""
        return self.counts / max(self.positions, 1)


def request_counts(features: np.ndarray, n_features: int) -> np.ndarray:
    """``[F]`` firings of one request: ``features`` holds the feature id of every (position, feature) firing."""
    return np.bincount(np.asarray(features, dtype=np.int64), minlength=n_features)[:n_features].astype(np.int64)


class RateWindows:
    """The baseline and current windows of one SAE (see the module docstring).

    Args:
        n_features: the SAE's width F.
        baseline_requests, window_requests: window sizes in requests (default: the environment, else 16).
    """

    def __init__(self, n_features: int, baseline_requests: int | None = None, window_requests: int | None = None):
        self.n_features = int(n_features)
        self.baseline_requests = _size(baseline_requests, ENV_BASELINE)
        self.window_requests = _size(window_requests, ENV_WINDOW)
        self.baseline = Window(np.zeros(self.n_features, np.int64))
        self._recent: collections.deque[tuple[np.ndarray, int]] = collections.deque(maxlen=self.window_requests)

    @property
    def frozen(self) -> bool:
        """Whether the baseline window is full."""
        return self.baseline.requests >= self.baseline_requests

    def add(self, counts: np.ndarray, positions: int) -> None:
        """One finished request: its ``[F]`` firing counts over its ``positions`` decode positions."""
        counts = np.asarray(counts, dtype=np.int64)
        if not self.frozen:
            self.baseline.counts += counts
            self.baseline.positions += int(positions)
            self.baseline.requests += 1
        else:
            self._recent.append((counts, int(positions)))

    @property
    def current(self) -> Window:
        """The current window (empty until the baseline is frozen and a request has followed it)."""
        w = Window(np.zeros(self.n_features, np.int64))
        for c, n in self._recent:
            w.counts += c
            w.positions += n
            w.requests += 1
        return w

    def kl(self) -> float | None:
        """``KL(current ‖ baseline)`` (:func:`smoothed_kl`), or None while the current window is empty."""
        cur = self.current
        if cur.requests == 0:
            return None
        return smoothed_kl(cur.counts, self.baseline.counts)

    def top_baseline(self, n: int) -> list[int]:
        """The ``n`` features the baseline fired most often (ties by feature id); empty until it is frozen."""
        if not self.frozen:
            return []
        order = np.lexsort((np.arange(self.n_features), -self.baseline.counts))
        return [int(f) for f in order[:n] if self.baseline.counts[f] > 0]


def _size(value: int | None, env: str) -> int:
    if value is None:
        raw = os.environ.get(env)
        try:
            value = int(raw) if raw else DEFAULT_REQUESTS
        except ValueError:
            raise TrajscopeError(f"{env} must be a whole number of requests, not {raw!r}.") from None
    if value < 1:
        raise TrajscopeError(f"A rate window holds at least one request, not {value}.")
    return int(value)
