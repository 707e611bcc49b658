"""Statistics every trajscope finding carries: intervals, matched nulls, held-out splits, calibrated flags.

A number about decode drift is a claim about a model; it needs its uncertainty and
its control. This module owns the few tools that every report uses:

- :func:`cluster_bootstrap` / :func:`bootstrap_frame`: percentile intervals from a
  bootstrap that resamples **clusters** (prompts) with replacement, because steps of
  one trajectory are not independent. :class:`Interval` prints as ``0.123 [0.101, 0.150]``.
- :func:`matched_null`: what an overlap or count metric would read for two samples
  drawn from the **same** reference (e.g. prefill vs prefill) at the sample size of
  the comparison — the null a prefill-vs-decode number is read against.
- :func:`split_ids`: deterministic, disjoint held-out splits (fit / calibrate / evaluate).
- :func:`calibrate_max` and :func:`false_alarm_rate`: trajectory-level flags. A
  trajectory's statistic is its maximum score over steps and layers; the threshold is
  the conformal ``⌈(n+1)(1−α)⌉``-th smallest maximum of calibration runs, so a fresh
  exchangeable run is flagged with probability ≤ α; the false-alarm rate is then
  measured on held-out runs with its binomial standard error (:func:`binomial_interval`
  gives Wilson's interval).

Pure NumPy/Polars; no model, no UI.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Hashable, Sequence

import numpy as np
import polars as pl

from trajscope.errors import TrajscopeError


@dataclasses.dataclass(frozen=True)
class Interval:
    """An estimate with its percentile interval.

    Attributes:
        estimate: the statistic on the full sample.
        lo, hi: the interval's ends.
        level: coverage asked for (e.g. 0.95).
        n_clusters: clusters (prompts) in the sample; n_boot: resamples.
    """

    estimate: float
    lo: float
    hi: float
    level: float
    n_clusters: int
    n_boot: int

    def fmt(self, digits: int = 3) -> str:
        return f"{self.estimate:.{digits}f} [{self.lo:.{digits}f}, {self.hi:.{digits}f}]"

    def __str__(self) -> str:
        return self.fmt()

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _groups(values: np.ndarray, clusters: Sequence[Hashable]) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    labels = np.asarray(list(clusters), dtype=object)
    if len(labels) != len(values):
        raise TrajscopeError(f"{len(values)} values but {len(labels)} cluster labels; give one label per value.")
    if len(values) == 0:
        raise TrajscopeError("No values to summarise: the sample is empty.")
    _, inverse = np.unique(labels.astype(str), return_inverse=True)
    k = int(inverse.max()) + 1
    sums = np.bincount(inverse, weights=values, minlength=k)
    counts = np.bincount(inverse, minlength=k).astype(float)
    members = [np.flatnonzero(inverse == c) for c in range(k)] if k else []
    return sums, counts, members


def cluster_bootstrap(values: Sequence[float], clusters: Sequence[Hashable] | None = None,
                      statistic: Callable[[np.ndarray], float] | None = None, *, level: float = 0.95,
                      n_boot: int = 1000, seed: int = 0) -> Interval:
    """Percentile interval of ``statistic`` (default: the mean) under a cluster bootstrap.

    Args:
        values: ``[n]`` observations (NaNs are dropped with their labels).
        clusters: ``[n]`` cluster labels (e.g. prompt ids); None treats every value as its own cluster.
        statistic: a function of the resampled values (concatenated); None is the mean, computed in a
            vectorised fast path from per-cluster sums and counts.
        level: coverage, in (0, 1).
        n_boot: resamples.
    Returns:
        An :class:`Interval`.
    """
    if not 0 < level < 1:
        raise TrajscopeError(f"The interval level must be in (0, 1), not {level}.")
    v = np.asarray(values, dtype=float)
    labels = np.arange(len(v)) if clusters is None else np.asarray(list(clusters), dtype=object)
    keep = ~np.isnan(v)
    v, labels = v[keep], labels[keep]
    sums, counts, members = _groups(v, labels)
    k = len(sums)
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, k, size=(n_boot, k))
    if statistic is None:
        est = float(v.mean())
        weights = np.apply_along_axis(np.bincount, 1, draws, minlength=k)  # [n_boot, k] times each cluster is drawn
        boot = (weights @ sums) / np.maximum(weights @ counts, 1e-300)
    else:
        est = float(statistic(v))
        boot = np.array([statistic(np.concatenate([v[members[c]] for c in row])) for row in draws])
    a = (1 - level) / 2
    lo, hi = np.quantile(boot, [a, 1 - a])
    return Interval(est, float(lo), float(hi), level, k, n_boot)


def bootstrap_frame(df: pl.DataFrame, value: str, by: Sequence[str] = (), cluster: str = "run_id", *,
                    level: float = 0.95, n_boot: int = 1000, seed: int = 0) -> pl.DataFrame:
    """Per group of ``by``: the mean of ``value`` with its cluster-bootstrap interval.

    Returns:
        ``[*by, value, {value}_lo, {value}_hi, n, n_clusters]``.
    """
    if value not in df.columns or cluster not in df.columns:
        raise TrajscopeError(f"bootstrap_frame needs the columns '{value}' and '{cluster}'; the frame has "
                             f"{', '.join(df.columns)}.")
    rows = []
    groups = df.group_by(list(by), maintain_order=True) if by else [((), df)]
    for key, part in groups:
        vals = part[value].cast(pl.Float64).to_numpy()
        iv = cluster_bootstrap(vals, part[cluster].to_list(), level=level, n_boot=n_boot, seed=seed)
        key = key if isinstance(key, tuple) else (key,)
        rows.append({**dict(zip(by, key)), value: iv.estimate, f"{value}_lo": iv.lo, f"{value}_hi": iv.hi,
                     "n": part.height, "n_clusters": iv.n_clusters})
    return pl.DataFrame(rows)


@dataclasses.dataclass(frozen=True)
class NullSummary:
    """A metric's distribution between two same-size samples of one reference set.

    Attributes:
        mean, lo, hi: mean and central ``level`` interval of the resampled metric.
        n: the matched sample size; samples: every resampled value.
    """

    mean: float
    lo: float
    hi: float
    n: int
    samples: np.ndarray

    def contains(self, x: float) -> bool:
        return self.lo <= x <= self.hi


def matched_null(reference: Any, n: int, metric: Callable[[Any, Any], float], *, n_resamples: int = 200,
                 level: float = 0.95, seed: int = 0, clusters: Sequence[Hashable] | None = None) -> NullSummary:
    """The null of ``metric(a, b)`` for two disjoint size-``n`` samples of ``reference`` (rows = first axis).

    With ``clusters``, the halves are split by cluster (whole prompts to each side) and then cut to ``n`` rows.

    Raises:
        TrajscopeError: when the reference has fewer than ``2 n`` rows.
    """
    N = len(reference)
    if n < 1 or 2 * n > N:
        raise TrajscopeError(f"A matched null needs two disjoint samples of {n} rows, but the reference has {N}; "
                             f"use n ≤ {N // 2}.")
    rng = np.random.default_rng(seed)
    out = np.empty(n_resamples)
    labels = None if clusters is None else np.asarray(list(clusters), dtype=object).astype(str)
    for i in range(n_resamples):
        if labels is None:
            idx = rng.permutation(N)
            a, b = idx[:n], idx[n:2 * n]
        else:
            uniq = rng.permutation(np.unique(labels))
            half = set(uniq[: len(uniq) // 2].tolist())
            side = np.array([lab in half for lab in labels])
            a, b = rng.permutation(np.flatnonzero(side))[:n], rng.permutation(np.flatnonzero(~side))[:n]
            if len(a) < n or len(b) < n:
                raise TrajscopeError(f"Split by cluster, one side has fewer than {n} rows; use a smaller n.")
        out[i] = metric(reference[a], reference[b])
    q = (1 - level) / 2
    return NullSummary(float(out.mean()), float(np.quantile(out, q)), float(np.quantile(out, 1 - q)), n, out)


def split_ids(ids: Sequence[Hashable], fractions: Sequence[float] = (0.5, 0.25, 0.25),
              names: Sequence[str] = ("fit", "calibrate", "evaluate"), seed: int = 0) -> dict[str, list]:
    """Deterministic disjoint splits of ``ids`` (membership does not depend on the input order).

    Raises:
        TrajscopeError: fractions that do not sum to 1, names of another length, or too few ids for
        every part to get one.
    """
    if len(fractions) != len(names):
        raise TrajscopeError(f"{len(fractions)} fractions but {len(names)} split names.")
    if any(f <= 0 for f in fractions) or not math.isclose(sum(fractions), 1.0, abs_tol=1e-9):
        raise TrajscopeError(f"Split fractions must be positive and sum to 1, not {list(fractions)}.")
    uniq = sorted({str(i): i for i in ids}.items())
    if len(uniq) < len(names):
        raise TrajscopeError(f"{len(uniq)} distinct ids cannot fill {len(names)} held-out splits; "
                             f"each needs at least one.")
    order = np.random.default_rng(seed).permutation(len(uniq))
    bounds = np.round(np.cumsum(fractions) * len(uniq)).astype(int)
    bounds = np.maximum(bounds, np.arange(1, len(names) + 1))
    bounds[-1] = len(uniq)
    out, start = {}, 0
    for name, end in zip(names, bounds):
        end = max(end, start + 1)
        out[name] = [uniq[j][1] for j in sorted(order[start:end])]
        start = end
    return out


def calibrate_max(scores_by_run: Sequence[Sequence[float]], target_rate: float) -> float:
    """Trajectory-level threshold: the conformal ``⌈(n+1)(1−α)⌉``-th smallest of the runs' maximum scores.

    A fresh run exchangeable with the calibration runs has ``max > threshold`` with probability ≤ α.

    Raises:
        TrajscopeError: too few calibration runs for ``target_rate`` (need ``n ≥ 1/α − 1``).
    """
    maxima = np.sort([float(np.max(s)) for s in scores_by_run if len(s)])
    n = len(maxima)
    rank = math.ceil((n + 1) * (1 - target_rate))
    if not 0 < target_rate < 1 or rank > n:
        raise TrajscopeError(f"{n} calibration runs cannot calibrate a false-alarm rate of {target_rate}; "
                             f"need at least {math.ceil(1 / target_rate) - 1}.")
    return float(maxima[rank - 1])


def false_alarm_rate(scores_by_run: Sequence[Sequence[float]], threshold: float) -> tuple[float, float]:
    """Share of runs whose maximum score passes ``threshold``, and its binomial standard error."""
    flags = np.array([float(np.max(s)) > threshold for s in scores_by_run if len(s)])
    if len(flags) == 0:
        raise TrajscopeError("No runs to measure a false-alarm rate on.")
    p = float(flags.mean())
    return p, math.sqrt(max(p * (1 - p), 1e-12) / len(flags))


def binomial_interval(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a proportion ``k / n``."""
    if n <= 0:
        raise TrajscopeError("A proportion needs at least one trial.")
    from statistics import NormalDist

    z = NormalDist().inv_cdf(1 - (1 - level) / 2)
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)
