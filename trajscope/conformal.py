"""Trajectory-level flags calibrated on held-out runs: a conformal threshold on a run's largest score.

A trajectory-level flag fires when a run's largest per-(step, layer) score exceeds a
threshold. :func:`calibrate_max` takes the threshold as the conformal order statistic
of the calibration runs' maxima, so on exchangeable held-out prefill-like runs the
false-alarm rate is at most the target (and equal to it when (n+1)·target is an
integer and scores are continuous). :func:`false_alarm_rate` measures it on other
held-out runs. Calibration runs are disjoint from the fit and evaluate prompts
(:func:`trajscope.stats.split_ids`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from trajscope.errors import TrajscopeError


def _run_maxima(scores_by_run: Sequence[Any]) -> np.ndarray:
    """Per run, the max over all its scores: ``[n_runs]``."""
    if len(scores_by_run) == 0:
        raise TrajscopeError("No runs given: pass one array of per-(step, layer) scores per run.")
    maxima = np.empty(len(scores_by_run))
    for i, run in enumerate(scores_by_run):
        s = np.asarray(run, dtype=np.float64)
        if s.size == 0:
            raise TrajscopeError(f"Run {i} has no scores; drop empty runs before calibrating.")
        if np.isnan(s).any():
            raise TrajscopeError(f"Run {i} has NaN scores; drop or fill them before calibrating.")
        maxima[i] = s.max()
    return maxima


def calibrate_max(scores_by_run: Sequence[Any], target_rate: float) -> float:
    """Threshold on a run's max score so that prefill-like runs are flagged at most ``target_rate`` of the time.

    A run is flagged when ``max(scores) > threshold``. The threshold is the
    ``ceil((n+1)(1 − target_rate))``-th smallest of the n calibration maxima (the
    conformal "higher" order statistic): for a new run exchangeable with the
    calibration runs, P(flag) ≤ target_rate, with equality when (n+1)·target_rate
    is an integer and there are no ties. Use runs disjoint from those that fit the
    profile and from those that evaluate (:func:`trajscope.stats.split_ids`).

    Args:
        scores_by_run: one array per calibration run, any shape (e.g. ``[steps, layers]``).
        target_rate: false-alarm rate wanted, in (0, 1).

    Returns:
        The threshold (float).
    """
    if not 0 < target_rate < 1:
        raise TrajscopeError(f"target_rate must be between 0 and 1 (e.g. 0.05), not {target_rate}.")
    maxima = np.sort(_run_maxima(scores_by_run))
    n = maxima.size
    k = math.ceil(round((n + 1) * (1 - target_rate), 9))
    if k > n:
        need = math.ceil(round((1 - target_rate) / target_rate, 9))
        raise TrajscopeError(f"target_rate {target_rate} needs at least {need} calibration runs but got {n}; "
                             f"add runs or raise the target rate.")
    return float(maxima[k - 1])


def false_alarm_rate(scores_by_run: Sequence[Any], threshold: float) -> tuple[float, float]:
    """Fraction of runs whose max score exceeds ``threshold``, with its binomial standard error.

    Args:
        scores_by_run: one array of scores per held-out (prefill-like) run.
        threshold: from :func:`calibrate_max`.

    Returns:
        ``(rate, se)`` with ``se = sqrt(rate (1 − rate) / n_runs)``;
        :func:`trajscope.stats.binomial_interval` gives a Wilson interval instead.
    """
    flagged = _run_maxima(scores_by_run) > threshold
    p = float(flagged.mean())
    return p, math.sqrt(p * (1 - p) / flagged.size)
