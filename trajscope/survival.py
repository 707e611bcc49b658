"""Censored time-to-event: how long until something happens, when some runs never show it.

A run that never diverges from the full cache within its steps is *censored* at its last
step, not dropped: dropping it would pull the median towards early events. The Kaplan–Meier
product-limit estimate (:func:`kaplan_meier`) uses every run, and :func:`km_median` gives the
median time with the Brookmeyer–Crowley interval (log(−log) Greenwood bands, lifelines'
default).
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Any

import numpy as np
import polars as pl

from trajscope.errors import TrajscopeError
from trajscope.stats import Interval, _check_level


def kaplan_meier(times: Any, events: Any) -> pl.DataFrame:
    """Kaplan–Meier product-limit estimate of a survival curve with right-censored observations.

    Args:
        times: observed time of each unit (the event's, or the last time seen when censored).
        events: True where the event happened at ``times``, False where the unit was censored there.
    Returns:
        One row per distinct event time ``t``: ``at_risk`` (units with time ≥ t), ``events``, ``survival`` S(t),
        and ``var_log`` = Greenwood's Σ d / (n (n − d)) up to t (the variance of log S(t)).
    """
    t = np.asarray(times, dtype=float)
    e = np.asarray(events, dtype=bool)
    if t.shape != e.shape or t.size == 0:
        raise TrajscopeError("kaplan_meier needs as many event flags as times, and at least one unit.")
    rows, s, green = [], 1.0, 0.0
    for u in np.unique(t[e]):
        n = int((t >= u).sum())
        d = int(((t == u) & e).sum())
        s *= 1 - d / n
        green += d / (n * (n - d)) if n > d else math.inf
        rows.append({"time": float(u), "at_risk": n, "events": d, "survival": s, "var_log": green})
    return pl.DataFrame(rows, schema={"time": pl.Float64, "at_risk": pl.Int64, "events": pl.Int64,
                                      "survival": pl.Float64, "var_log": pl.Float64})


def km_median(times: Any, events: Any, level: float = 0.95) -> Interval:
    """Kaplan–Meier median time-to-event with the Brookmeyer–Crowley interval from log(−log) bands.

    The median is the first event time where S(t) ≤ 0.5. Pointwise bands use the log(−log S) transform with
    Greenwood's variance (lifelines' default "exponential Greenwood"): ``S^{exp(± z σ)}`` with ``σ = √Greenwood / |log S|``; the interval
    runs from the first time the lower band reaches 0.5 to the first time the upper band does. A bound that is
    never reached (too much censoring) is ``inf``; a median never reached is ``inf`` too.

    Returns:
        :class:`Interval` with ``n_clusters`` = units and ``n_boot = 0``.
    """
    _check_level(level)
    km = kaplan_meier(times, events)
    n = int(np.asarray(times).size)
    z = NormalDist().inv_cdf(1 - (1 - level) / 2)
    t, s, v = km["time"].to_numpy(), km["survival"].to_numpy(), km["var_log"].to_numpy()

    def first(mask: np.ndarray) -> float:
        idx = np.flatnonzero(mask)
        return float(t[idx[0]]) if idx.size else math.inf

    with np.errstate(divide="ignore", invalid="ignore"):
        sig = np.sqrt(v) / np.abs(np.log(s))  # σ of log(−log S)
        lower = np.where(s > 0, s ** np.exp(z * sig), 0.0)  # log(−log S) + zσ
        upper = np.where(s > 0, s ** np.exp(-z * sig), 0.0)
    lower = np.where(np.isfinite(lower), lower, 0.0)
    upper = np.where(np.isfinite(upper), upper, 0.0)
    return Interval(first(s <= 0.5), first(lower <= 0.5), first(upper <= 0.5), level, n, 0)
