"""Intervals, nulls and held-out splits: how sure is a number, and compared with what?

Every summary number trajscope reports (a drift score, an SAE FVU, a feature
overlap, a steering KL) is computed from rows that are not independent: the
positions and steps of one prompt share that prompt. This module owns the three
tools that keep those numbers honest; reports call them instead of writing their
own.

- **Prompt-clustered bootstrap** (:func:`cluster_bootstrap`, :func:`bootstrap_frame`).
  Resample whole clusters (prompts) with replacement, recompute the statistic,
  and report the percentile interval of the resampled statistics. Resampling rows
  instead of prompts would pretend that 200 decode steps of one prompt are 200
  independent observations and give intervals far too narrow.
- **Matched-n null** (:func:`matched_null`). Overlap and count metrics (Jaccard of
  top-k feature sets, Spearman of frequencies, appear/vanish, dead/dense) move with
  sample size alone: two prefill samples of 50 rows each overlap less than two of
  5,000. The null draws two *disjoint* samples of the same size n from a reference
  set (prefill rows), evaluates the metric on them, and repeats; a prefill-vs-decode
  number is read against the "prefill vs prefill" spread at the same n.
- **Held-out splits and trajectory-level calibration** (:func:`split_ids`,
  :func:`calibrate_max`, :func:`false_alarm_rate`, :func:`binomial_interval`).
  Profile fitting, threshold calibration and evaluation use disjoint prompt sets.
  A trajectory-level flag fires when a run's largest per-(step, layer) score
  exceeds a threshold; the threshold is the conformal order statistic of the
  calibration runs' maxima, so on exchangeable held-out prefill-like runs the
  false-alarm rate is at most the target (and equal to it when (n+1)·target is an
  integer and scores are continuous).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from statistics import NormalDist
from typing import Any

import numpy as np
import polars as pl

from trajscope.errors import TrajscopeError

__all__ = ["Interval", "NullSummary", "cluster_bootstrap", "bootstrap_frame", "matched_null", "split_ids",
           "calibrate_max", "false_alarm_rate", "binomial_interval", "kaplan_meier", "km_median"]

_CHUNK_CELLS = 2_000_000  # resample-draw matrix cells held in memory at once


@dataclass(frozen=True)
class Interval:
    """A point estimate with a two-sided interval at ``level``.

    ``n_clusters`` is the number of independent units behind it (prompts, or trials
    for :func:`binomial_interval`); ``n_boot`` the bootstrap resamples, 0 for a
    closed-form interval. ``lo``/``hi`` are NaN when fewer than 2 clusters exist.
    """

    estimate: float
    lo: float
    hi: float
    level: float
    n_clusters: int
    n_boot: int

    def fmt(self, digits: int = 3) -> str:
        """``"0.123 [0.101, 0.150]"`` with ``digits`` decimals."""
        return f"{self.estimate:.{digits}f} [{self.lo:.{digits}f}, {self.hi:.{digits}f}]"

    def __str__(self) -> str:
        return self.fmt(3)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of the fields (JSON-friendly)."""
        return asdict(self)


@dataclass(frozen=True, eq=False)
class NullSummary:
    """The spread of a metric over prefill-vs-prefill resamples of matched size ``n``.

    ``samples`` holds the metric of every resample, shape ``[n_resamples]``;
    ``lo``/``hi`` are its central ``level`` quantiles.
    """

    mean: float
    lo: float
    hi: float
    level: float
    n: int
    n_resamples: int
    samples: np.ndarray = field(repr=False)

    def to_dict(self) -> dict[str, Any]:
        """The summary without ``samples`` (JSON-friendly)."""
        return {k: v for k, v in asdict(self).items() if k != "samples"}

    def __str__(self) -> str:
        return f"null(n={self.n}) {self.mean:.3f} [{self.lo:.3f}, {self.hi:.3f}]"


def _check_level(level: float) -> None:
    if not 0 < level < 1:
        raise TrajscopeError(f"level must be between 0 and 1 (e.g. 0.95), not {level}.")


def _quantiles(x: np.ndarray, level: float) -> tuple[float, float]:
    a = (1 - level) / 2
    lo, hi = np.quantile(x, [a, 1 - a])
    return float(lo), float(hi)


def _cluster_codes(values: Any, clusters: Any) -> tuple[np.ndarray, np.ndarray, int]:
    """Validated float values ``[n]`` and cluster codes ``[n]`` in 0..C-1 (sorted label order)."""
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 1:
        raise TrajscopeError(f"values must be a 1-D array, not shape {v.shape}.")
    if v.size == 0:
        raise TrajscopeError("No values to bootstrap: the input is empty.")
    if np.isnan(v).any():
        raise TrajscopeError("values contain NaN; drop or fill them before bootstrapping.")
    if clusters is None:
        return v, np.arange(v.size), v.size
    c = np.asarray(clusters)
    if c.shape != v.shape:
        raise TrajscopeError(f"clusters must have one label per value ({v.size}), not shape {c.shape}.")
    try:
        labels, codes = np.unique(c, return_inverse=True)
    except TypeError as e:
        raise TrajscopeError("Cluster labels must be sortable and of one type (all str or all int).") from e
    return v, codes.reshape(-1), labels.size


def _draw_chunks(rng: np.random.Generator, n_boot: int, n_clusters: int):
    """Yield ``[chunk, C]`` arrays of resampled cluster indices, ``n_boot`` rows in all."""
    chunk = max(1, min(n_boot, _CHUNK_CELLS // max(1, n_clusters)))
    done = 0
    while done < n_boot:
        m = min(chunk, n_boot - done)
        yield rng.integers(0, n_clusters, size=(m, n_clusters))
        done += m


def cluster_bootstrap(values: Any, clusters: Any = None, statistic: Callable[[np.ndarray], float] = np.mean, *,
                      level: float = 0.95, n_boot: int = 1000, seed: int = 0) -> Interval:
    """Percentile interval of ``statistic(values)`` from resampling clusters with replacement.

    Each resample draws C clusters (C = number of distinct labels) with replacement
    and evaluates ``statistic`` on the concatenation of their rows, so rows of one
    prompt always travel together. With ``statistic=np.mean`` (the default) a fast
    path computes each resample as Σ cluster sums / Σ cluster sizes of the drawn
    clusters (cost ``n_boot × C``, independent of the number of rows).

    Args:
        values: ``[n]`` numbers (no NaN).
        clusters: ``[n]`` labels (prompt ids); ``None`` makes every row its own cluster.
        statistic: function of a 1-D array of resampled values → float.
        level: coverage of the two-sided interval.
        n_boot: number of resamples.
        seed: seed of the resampling; same inputs and seed give the same interval,
            whatever the row order.

    Returns:
        :class:`Interval` with ``estimate = statistic(values)``; ``lo``/``hi`` are NaN
        when there are fewer than 2 clusters (no between-prompt spread to measure).
    """
    _check_level(level)
    if n_boot < 1:
        raise TrajscopeError(f"n_boot must be at least 1, not {n_boot}.")
    v, codes, n_cl = _cluster_codes(values, clusters)
    estimate = float(statistic(v))
    if n_cl < 2:
        return Interval(estimate, math.nan, math.nan, level, n_cl, n_boot)
    rng = np.random.default_rng(seed)
    boot = np.empty(n_boot)
    done = 0
    if statistic is np.mean:
        sums = np.bincount(codes, weights=v, minlength=n_cl)
        sizes = np.bincount(codes, minlength=n_cl).astype(np.float64)
        for idx in _draw_chunks(rng, n_boot, n_cl):
            boot[done:done + len(idx)] = sums[idx].sum(1) / sizes[idx].sum(1)
            done += len(idx)
    else:
        order = np.argsort(codes, kind="stable")
        sizes = np.bincount(codes, minlength=n_cl)
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        for idx in _draw_chunks(rng, n_boot, n_cl):
            for row in idx:
                lens = sizes[row]
                offsets = np.repeat(np.cumsum(lens) - lens, lens)
                rows = np.repeat(starts[row], lens) + np.arange(lens.sum()) - offsets
                boot[done] = statistic(v[order[rows]])
                done += 1
    lo, hi = _quantiles(boot, level)
    return Interval(estimate, lo, hi, level, n_cl, n_boot)


def bootstrap_frame(df: pl.DataFrame | pl.LazyFrame, value: str, by: Sequence[str] = (),
                    cluster: str | None = "prompt_id", *, level: float = 0.95, n_boot: int = 1000,
                    seed: int = 0) -> pl.DataFrame:
    """Per group, the mean of ``value`` with its prompt-clustered bootstrap interval.

    Null values of ``value`` are dropped first. Every group uses the same ``seed``,
    so a group's interval does not depend on which other groups are present.

    Args:
        df: long-format table with ``value``, the ``by`` columns and ``cluster``.
        value: numeric column to summarise.
        by: grouping columns (e.g. ``("layer", "depth_band")``); ``()`` for one overall row.
        cluster: column naming the resampling unit; ``None`` resamples rows.
        level, n_boot, seed: as in :func:`cluster_bootstrap`.

    Returns:
        ``pl.DataFrame`` with columns ``[*by, value, value_lo, value_hi, n, n_clusters]``
        (``n`` = rows), sorted by ``by``; one row per group.
    """
    by = [by] if isinstance(by, str) else list(by)
    if isinstance(df, pl.LazyFrame):
        df = df.select([*by, value, *([cluster] if cluster else [])]).collect()
    missing = [c for c in [*by, value, *([cluster] if cluster else [])] if c not in df.columns]
    if missing:
        raise TrajscopeError(f"bootstrap_frame: columns {missing} are not in the table (it has {df.columns}).")
    df = df.filter(pl.col(value).is_not_null())
    if df.height == 0:
        raise TrajscopeError(f"bootstrap_frame: column {value!r} has no non-null values.")
    groups = df.partition_by(by, as_dict=True, maintain_order=True) if by else {(): df}
    rows = []
    for key, g in groups.items():
        iv = cluster_bootstrap(g[value].to_numpy(), g[cluster].to_numpy() if cluster else None,
                               level=level, n_boot=n_boot, seed=seed)
        rows.append({**dict(zip(by, key)), value: iv.estimate, f"{value}_lo": iv.lo, f"{value}_hi": iv.hi,
                     "n": g.height, "n_clusters": iv.n_clusters})
    schema = {**{c: df.schema[c] for c in by}, value: pl.Float64, f"{value}_lo": pl.Float64,
              f"{value}_hi": pl.Float64, "n": pl.Int64, "n_clusters": pl.Int64}
    out = pl.DataFrame(rows, schema=schema)
    return out.sort(by) if by else out


def _take(reference: Any, rows: np.ndarray) -> Any:
    """Rows of a numpy array or torch tensor (kept as its own type)."""
    if hasattr(reference, "index_select"):  # torch.Tensor, without importing torch here
        import torch
        return reference[torch.as_tensor(rows, device=reference.device)]
    return reference[rows]


def matched_null(reference_rows: Any, n: int, metric: Callable[[Any, Any], float], *, n_resamples: int = 200,
                 level: float = 0.95, clusters: Any = None, seed: int = 0) -> NullSummary:
    """The metric a prefill-vs-prefill comparison of the same size ``n`` would show.

    Each resample splits the reference into two disjoint samples ``a`` and ``b`` of
    ``n`` rows each and records ``metric(a, b)``. With ``clusters``, whole clusters
    (prompts) are dealt in random order: ``a`` takes clusters until it holds ``n``
    rows (the last one cut to fit, its remaining rows discarded), then ``b`` does
    the same from the clusters left, so ``a`` and ``b`` never share a prompt.

    Args:
        reference_rows: ``[N, ...]`` numpy array or torch tensor; rows are the first axis.
        n: rows per side; use the size of the decode sample being compared.
        metric: ``metric(a, b) -> float`` on two ``[n, ...]`` slices of the reference's type.
        n_resamples: number of (a, b) pairs.
        level: coverage of the central ``[lo, hi]`` quantiles.
        clusters: optional ``[N]`` labels (prompt ids) for cluster-disjoint sides.
        seed: seed of the draws.

    Returns:
        :class:`NullSummary` (mean, lo, hi, samples ``[n_resamples]``).
    """
    _check_level(level)
    total = len(reference_rows)
    if total == 0:
        raise TrajscopeError("matched_null: the reference set is empty; pass prefill rows to resample.")
    if n < 1 or n_resamples < 1:
        raise TrajscopeError(f"matched_null needs n ≥ 1 and n_resamples ≥ 1 (got {n} and {n_resamples}).")
    if 2 * n > total:
        raise TrajscopeError(f"matched_null needs 2·n = {2 * n} reference rows for two disjoint samples but has "
                             f"{total}; use a smaller n (at most {total // 2}) or a larger reference set.")
    rng = np.random.default_rng(seed)
    if clusters is not None:
        c = np.asarray(clusters)
        if c.shape != (total,):
            raise TrajscopeError(f"clusters must have one label per reference row ({total}), not shape {c.shape}.")
        _, codes = np.unique(c, return_inverse=True)
        codes = codes.reshape(-1)
        sizes = np.bincount(codes)
        members = np.split(np.argsort(codes, kind="stable"), np.cumsum(sizes)[:-1])
        largest = int(sizes.max())
        if 2 * n + largest - 1 > total:
            raise TrajscopeError(f"matched_null with clusters needs 2·n + (largest cluster − 1) = "
                                 f"{2 * n + largest - 1} rows but the reference has {total}; use a smaller n "
                                 f"(at most {(total - largest + 1) // 2}).")
    samples = np.empty(n_resamples)
    for r in range(n_resamples):
        if clusters is None:
            perm = rng.permutation(total)
            a_rows, b_rows = perm[:n], perm[n:2 * n]
        else:
            order = rng.permutation(len(members))
            dealt = np.concatenate([members[k] for k in order])
            bounds = np.cumsum(sizes[order])
            a_rows = dealt[:n]
            start = int(bounds[np.searchsorted(bounds, n)])  # b starts at the first cluster boundary ≥ n
            b_rows = dealt[start:start + n]
        samples[r] = float(metric(_take(reference_rows, a_rows), _take(reference_rows, b_rows)))
    lo, hi = _quantiles(samples, level)
    return NullSummary(float(samples.mean()), lo, hi, level, n, n_resamples, samples)


def split_ids(ids: Any, fractions: Sequence[float] = (0.5, 0.25, 0.25),
              names: Sequence[str] = ("fit", "calibrate", "evaluate"), seed: int = 0) -> dict[str, list]:
    """Deterministic disjoint split of ids (prompts) into named parts, e.g. fit / calibrate / evaluate.

    The distinct ids are sorted, then shuffled with ``seed``, so membership does not
    depend on input order or duplicates. Part sizes follow ``fractions`` (largest
    remainder rounding); every part gets at least one id, taken from the largest part.

    Args:
        ids: sequence of sortable ids (list, numpy array or Polars Series).
        fractions: one positive fraction per part, summing to 1.
        names: part names, distinct, as many as ``fractions``.
        seed: seed of the shuffle.

    Returns:
        ``{name: sorted list of ids}`` in ``names`` order; the parts cover all distinct ids.
    """
    fractions, names = [float(f) for f in fractions], list(names)
    if len(fractions) != len(names) or len(set(names)) != len(names):
        raise TrajscopeError(f"split_ids needs one distinct name per fraction (got names {names} "
                             f"for {len(fractions)} fractions).")
    if any(f <= 0 for f in fractions) or abs(sum(fractions) - 1) > 1e-6:
        raise TrajscopeError(f"split_ids fractions must be positive and sum to 1, e.g. (0.5, 0.25, 0.25); "
                             f"got {tuple(fractions)} (sum {sum(fractions):.4g}).")
    ids = ids.to_list() if hasattr(ids, "to_list") else ids.tolist() if isinstance(ids, np.ndarray) else list(ids)
    try:
        unique = sorted(set(ids))
    except TypeError as e:
        raise TrajscopeError("split_ids needs ids of one sortable type (all str or all int).") from e
    if len(unique) < len(names):
        raise TrajscopeError(f"split_ids needs at least {len(names)} distinct ids (one per part {names}) "
                             f"but got {len(unique)}; add prompts or use fewer parts.")
    exact = np.array(fractions) * len(unique)
    sizes = np.floor(exact).astype(int)
    for i in np.argsort(-(exact - sizes), kind="stable")[: len(unique) - sizes.sum()]:
        sizes[i] += 1
    for i in np.flatnonzero(sizes == 0):
        sizes[np.argmax(sizes)] -= 1
        sizes[i] = 1
    perm = np.random.default_rng(seed).permutation(len(unique))
    cuts = np.concatenate([[0], np.cumsum(sizes)])
    return {name: sorted(unique[j] for j in perm[cuts[i]:cuts[i + 1]]) for i, name in enumerate(names)}


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
    profile and from those that evaluate (:func:`split_ids`).

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
        :func:`binomial_interval` gives a Wilson interval instead.
    """
    flagged = _run_maxima(scores_by_run) > threshold
    p = float(flagged.mean())
    return p, math.sqrt(p * (1 - p) / flagged.size)


def binomial_interval(k: int, n: int, level: float = 0.95) -> Interval:
    """Wilson score interval for ``k`` successes in ``n`` trials.

    Returns:
        :class:`Interval` with ``estimate = k / n``, ``n_clusters = n`` and ``n_boot = 0``.
    """
    _check_level(level)
    if n < 1 or not 0 <= k <= n:
        raise TrajscopeError(f"binomial_interval needs 0 ≤ k ≤ n and n ≥ 1 (got k={k}, n={n}).")
    z = NormalDist().inv_cdf(1 - (1 - level) / 2)
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return Interval(p, max(0.0, centre - half), min(1.0, centre + half), level, n, 0)


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
