"""How well a monitor detects a shift: run-level AUROC, a threshold at a fixed false-positive rate, time-to-detect.

A *monitor* gives every decode step a score (higher: more alarming) and every run a *run score*, the
max of its step scores over steps ``s ≥ k`` (k: the step the shift starts). Three measures, one
function each:

- **AUROC** (:func:`auroc`): the probability that a shifted run's score exceeds a clean run's, ties
  counting one half (the Mann–Whitney U statistic divided by ``n_pos × n_neg``; equal to
  scikit-learn's ``roc_auc_score``). 0.5 is chance. :func:`auroc_interval` adds a percentile
  bootstrap over prompts (each prompt's clean and shifted runs travel together;
  :func:`trajscope.stats.cluster_bootstrap`); :func:`auroc_difference` compares two monitors on the
  same runs with a paired bootstrap.
- **A threshold at a fixed false-positive rate** (:func:`fit_threshold`): the conformal order
  statistic of clean runs' run scores (:func:`trajscope.conformal.calibrate_max`), so that a new clean
  run exchangeable with the fitting runs is flagged with probability ≤ ``fpr``. The realised rate on
  held-out clean runs (other prompts, other files) is :func:`false_positive_rate` (Wilson interval).
- **Time-to-detect** (:func:`detect_step`, :func:`time_to_detect`): steps from k to the first step
  whose score exceeds the threshold (0: detected at step k). A run never detected is *censored* at
  its last step, and the median comes from the Kaplan–Meier estimate
  (:func:`trajscope.survival.km_median`), so undetected runs pull the median up instead of being
  dropped.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from trajscope.errors import TrajscopeError
from trajscope.stats import Interval, binomial_interval, cluster_bootstrap


def _ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks of ``x`` with ties given their mean rank (mid-ranks)."""
    order = np.argsort(x, kind="stable")
    xs = x[order]
    ranks = np.empty(x.size, dtype=np.float64)
    starts = np.flatnonzero(np.r_[True, xs[1:] != xs[:-1]])
    ends = np.r_[starts[1:], x.size]
    for a, b in zip(starts, ends):
        ranks[order[a:b]] = (a + b + 1) / 2.0  # mean of ranks a+1 .. b
    return ranks


def auroc(scores: Any, labels: Any) -> float:
    """Area under the ROC curve of ``scores`` for the positive class (``labels`` True / 1).

    Args:
        scores: ``[n]`` numbers (higher: more likely positive).
        labels: ``[n]`` booleans or 0/1 (positive = shifted run).
    Returns:
        ``(Σ ranks of positives − n_pos (n_pos + 1) / 2) / (n_pos n_neg)``, with mid-ranks for ties.
    """
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    y = np.asarray(labels).reshape(-1).astype(bool)
    if s.shape != y.shape:
        raise TrajscopeError(f"auroc needs one label per score ({s.size} scores, {y.size} labels).")
    if np.isnan(s).any():
        raise TrajscopeError("auroc got NaN scores; drop those runs first.")
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if n_pos == 0 or n_neg == 0:
        raise TrajscopeError(f"auroc needs both classes (got {n_pos} shifted and {n_neg} clean runs).")
    r = _ranks(s)
    return float((r[y].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def auroc_interval(scores: Any, labels: Any, clusters: Any, *, level: float = 0.95, n_boot: int = 1000,
                   seed: int = 0) -> Interval:
    """:func:`auroc` with a percentile bootstrap over ``clusters`` (prompts): each resample draws prompts with
    replacement and keeps all their runs. Give every prompt a run of each class (the study pairs a clean
    and a shifted run per prompt), so that every resample has both; a resample without one class has no
    AUROC, and the interval is then NaN.

    Returns:
        :class:`~trajscope.stats.Interval` (``n_clusters``: prompts).
    """
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    y = np.asarray(labels).reshape(-1).astype(bool)
    estimate = auroc(s, y)

    def stat(rows: np.ndarray) -> float:
        idx = rows.astype(np.int64)
        yy = y[idx]
        return auroc(s[idx], yy) if yy.any() and not yy.all() else np.nan

    iv = cluster_bootstrap(np.arange(s.size, dtype=np.float64), clusters, stat, level=level, n_boot=n_boot,
                           seed=seed)
    return Interval(estimate, iv.lo, iv.hi, level, iv.n_clusters, n_boot)


def auroc_difference(scores_a: Any, scores_b: Any, labels: Any, clusters: Any, *, level: float = 0.95,
                     n_boot: int = 1000, seed: int = 0) -> Interval:
    """``AUROC(a) − AUROC(b)`` of two monitors scored on the same runs, with a paired bootstrap over prompts
    (one resample of prompts serves both AUROCs, so what the runs share cancels).

    Args:
        scores_a, scores_b: ``[n]`` run scores of the two monitors, row i the same run in both.
        labels: ``[n]`` shifted (True) or clean; clusters: ``[n]`` prompt ids.
    """
    a = np.asarray(scores_a, dtype=np.float64).reshape(-1)
    b = np.asarray(scores_b, dtype=np.float64).reshape(-1)
    y = np.asarray(labels).reshape(-1).astype(bool)
    if a.shape != b.shape:
        raise TrajscopeError(f"auroc_difference needs both monitors on the same runs ({a.size} vs {b.size} scores).")
    estimate = auroc(a, y) - auroc(b, y)

    def stat(rows: np.ndarray) -> float:
        idx = rows.astype(np.int64)
        yy = y[idx]
        return auroc(a[idx], yy) - auroc(b[idx], yy) if yy.any() and not yy.all() else np.nan

    iv = cluster_bootstrap(np.arange(a.size, dtype=np.float64), clusters, stat, level=level, n_boot=n_boot,
                           seed=seed)
    return Interval(estimate, iv.lo, iv.hi, level, iv.n_clusters, n_boot)


def fit_threshold(clean_run_scores: Sequence[float], fpr: float) -> float:
    """Threshold on a run score so that clean runs are flagged (score > threshold) at rate ≤ ``fpr``.

    Args:
        clean_run_scores: run scores of clean decode runs (the fitting prompts only).
        fpr: the false-positive rate wanted, e.g. 0.05 (needs at least ``ceil((1 − fpr) / fpr)`` runs).
    """
    from trajscope.conformal import calibrate_max

    return calibrate_max([np.asarray([v]) for v in clean_run_scores], fpr)


def false_positive_rate(clean_run_scores: Sequence[float], threshold: float, level: float = 0.95) -> Interval:
    """Share of clean runs whose run score exceeds ``threshold``, with its Wilson interval (n = runs)."""
    v = np.asarray(clean_run_scores, dtype=np.float64)
    if v.size == 0:
        raise TrajscopeError("No clean runs to measure a false-positive rate on.")
    return binomial_interval(int((v > threshold).sum()), int(v.size), level)


def detect_step(steps: Sequence[int], scores: Sequence[float], threshold: float, start_step: int) -> int | None:
    """The first step ``≥ start_step`` whose score exceeds ``threshold``; None when there is none."""
    for s, v in sorted(zip(steps, scores)):
        if s >= start_step and v > threshold:
            return int(s)
    return None


def time_to_detect(detected_at: Sequence[int | None], last_steps: Sequence[int], start_step: int,
                   level: float = 0.95) -> Interval:
    """Kaplan–Meier median of steps from ``start_step`` to detection, runs never detected censored.

    Args:
        detected_at: per run, :func:`detect_step` (None: not detected).
        last_steps: per run, its last scored step (the censoring time of an undetected run is
            ``last − start_step``).
    Returns:
        :class:`~trajscope.stats.Interval`; ``inf`` where the median (or a bound) is never reached.
    """
    from trajscope.survival import km_median

    if len(detected_at) != len(last_steps) or not detected_at:
        raise TrajscopeError("time_to_detect needs one last step per run, and at least one run.")
    times = [(d if d is not None else last) - start_step for d, last in zip(detected_at, last_steps)]
    events = [d is not None for d in detected_at]
    return km_median(times, events, level)
