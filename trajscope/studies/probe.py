"""Linear probes on hidden states, with a held-out split, a shuffled-label control and intervals.

The compaction study asks whether a fact that only a masked turn stated can still be
*read* from later hidden states. "Read" means: a linear map fitted on some sessions
predicts the fact's class on other sessions (a disjoint, held-out split) better than
chance. Two baselines keep that honest:

- *chance*: the accuracy of always answering the training split's most common class
  (``majority``) and ``1 / n_classes``;
- *shuffled labels*: the same probe fitted on the training split with its labels
  permuted; it must stay at chance (a probe that beats chance on shuffled labels means
  the split leaks, not that the states carry the fact).

The probe is a ridge classifier (one-hot targets, closed form in the kernel form
``W = Xᵀ (X Xᵀ + λ I)⁻¹ Y`` on standardised features), with λ chosen by exact
leave-one-out accuracy on the training split — deterministic and fast for the few
hundred sessions a study has. Accuracy intervals are percentile bootstraps over
held-out sessions (one 0/1 value per session); :func:`bootstrap_interval` is a local
stand-in for :func:`trajscope.stats.cluster_bootstrap` with the same meaning, so an
integrator can swap it.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np
import torch

from trajscope.errors import TrajscopeError

LAMBDAS = (1e-2, 1e-1, 1.0, 10.0, 100.0, 1000.0)


def bootstrap_interval(values: Sequence[float] | np.ndarray, *, level: float = 0.95, n_boot: int = 1000,
                       seed: int = 0) -> tuple[float, float, float]:
    """Mean of ``values`` (one per session) and its percentile-bootstrap interval.

    :func:`trajscope.stats.cluster_bootstrap` with each value its own cluster (one per session).
    Returns ``(mean, lo, hi)``; ``lo``/``hi`` are NaN for fewer than 2 values.
    """
    from trajscope.stats import cluster_bootstrap

    v = np.asarray(values, dtype=np.float64).reshape(-1)
    if v.size == 0:
        return float("nan"), float("nan"), float("nan")
    iv = cluster_bootstrap(v, None, level=level, n_boot=n_boot, seed=seed)
    return iv.estimate, iv.lo, iv.hi


def split_sessions(n: int, test_fraction: float = 0.3, seed: int = 0,
                   min_per_split: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """A seeded disjoint split of ``n`` sessions: ``(train_idx, test_idx)``, sorted index arrays.

    Raises:
        TrajscopeError: when either side would hold fewer than ``min_per_split`` sessions.
    """
    if not 0 < test_fraction < 1:
        raise TrajscopeError(f"The held-out fraction must be between 0 and 1, not {test_fraction}.")
    n_test = int(round(n * test_fraction))
    if n_test < min_per_split or n - n_test < min_per_split:
        need = int(np.ceil(min_per_split / min(test_fraction, 1 - test_fraction)))
        raise TrajscopeError(f"{n} sessions are too few to hold out {test_fraction:.0%} for the probe (each split "
                             f"needs at least {min_per_split}); give at least {need} sessions or turn the probe off.")
    perm = np.random.default_rng(seed).permutation(n)
    return np.sort(perm[n_test:]), np.sort(perm[:n_test])


@dataclasses.dataclass
class RidgeProbe:
    """A fitted ridge classifier.

    Attributes:
        mean, scale: ``[d]`` standardisation of the training features.
        weight: ``[d, n_classes]``; bias: ``[n_classes]``.
        classes: ``[n_classes]`` the label values, in column order.
        lam: the chosen ridge penalty; loo_accuracy: its leave-one-out accuracy on the training split.
    """

    mean: torch.Tensor
    scale: torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor
    classes: torch.Tensor
    lam: float
    loo_accuracy: float

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """Predicted labels ``[n]`` of features ``x [n, d]``."""
        z = (x.double() - self.mean) / self.scale
        return self.classes[(z @ self.weight + self.bias).argmax(1)]


def fit_ridge_probe(x: torch.Tensor, y: Sequence[int] | torch.Tensor, lambdas: Sequence[float] = LAMBDAS) -> RidgeProbe:
    """Fit a ridge classifier on ``x [n, d]`` and labels ``y [n]``; λ by exact leave-one-out accuracy.

    Leave-one-out predictions come from the hat matrix: with ``H = K (K + λI)⁻¹`` (``K = Z Zᵀ`` of the
    centred, standardised features and centred one-hot targets ``Yc``),
    ``ŷ₋ᵢ = (ŷᵢ − Hᵢᵢ Ycᵢ) / (1 − Hᵢᵢ)`` (the intercept's own leave-one-out effect is ignored:
    a small approximation for n ≫ 1).
    """
    x = torch.as_tensor(x).double()
    y = torch.as_tensor(y).long()
    if x.dim() != 2 or x.shape[0] != y.shape[0] or x.shape[0] < 2:
        raise TrajscopeError(f"A probe needs features [n, d] and n labels with n ≥ 2; got {tuple(x.shape)} and "
                             f"{tuple(y.shape)}.")
    classes, yi = torch.unique(y, return_inverse=True)
    mean = x.mean(0)
    scale = x.std(0).clamp_min(1e-8)
    z = (x - mean) / scale
    onehot = torch.nn.functional.one_hot(yi, len(classes)).double()
    ybar = onehot.mean(0)
    yc = onehot - ybar
    k = z @ z.T
    eye = torch.eye(len(y), dtype=torch.float64)
    best = None
    for lam in lambdas:
        alpha = torch.linalg.solve(k + lam * eye, yc)  # [n, c]
        fitted = k @ alpha
        h = torch.diagonal(k @ torch.linalg.solve(k + lam * eye, eye))
        loo = (fitted - h[:, None] * yc) / (1 - h[:, None]).clamp_min(1e-12)
        acc = float((loo.argmax(1) == yi).double().mean())
        if best is None or acc > best[1] + 1e-12:
            best = (lam, acc, alpha)
    lam, acc, alpha = best
    weight = z.T @ alpha
    return RidgeProbe(mean, scale, weight, ybar, classes, float(lam), acc)


@dataclasses.dataclass
class ProbeScore:
    """Held-out accuracy of one probe with its interval, and the baselines it is judged against."""

    accuracy: float
    lo: float
    hi: float
    majority: float
    chance: float
    n_train: int
    n_test: int
    lam: float
    correct: np.ndarray = dataclasses.field(repr=False)


def score_probe(x: torch.Tensor, y: Sequence[int] | torch.Tensor, train_idx: np.ndarray, test_idx: np.ndarray, *,
                shuffle: bool = False, x_test: torch.Tensor | None = None, seed: int = 0, level: float = 0.95,
                n_boot: int = 1000) -> ProbeScore:
    """Fit on ``x[train_idx]`` (labels permuted when ``shuffle``) and score on held-out sessions.

    Args:
        x: ``[n, d]`` features of every session (one row per session).
        y: ``[n]`` labels.
        train_idx, test_idx: a disjoint split from :func:`split_sessions`.
        shuffle: the shuffled-label control (the training labels are permuted with ``seed``).
        x_test: features to score instead of ``x`` (transfer: fitted under one setup, read under another).
    Returns:
        :class:`ProbeScore`: accuracy with a percentile-bootstrap interval over held-out sessions.
    """
    y = torch.as_tensor(y).long()
    ytr = y[train_idx]
    if shuffle:
        ytr = ytr[torch.from_numpy(np.random.default_rng(seed + 1).permutation(len(train_idx)))]
    probe = fit_ridge_probe(x[train_idx], ytr)
    xt = (x if x_test is None else x_test)[test_idx]
    correct = (probe.predict(xt) == y[test_idx]).double().numpy()
    acc, lo, hi = bootstrap_interval(correct, level=level, n_boot=n_boot, seed=seed)
    vals, counts = torch.unique(y[train_idx], return_counts=True)
    majority = float((y[test_idx] == vals[counts.argmax()]).double().mean())
    return ProbeScore(acc, lo, hi, majority, 1.0 / len(vals), len(train_idx), len(test_idx), probe.lam, correct)
