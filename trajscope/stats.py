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
- **Held-out splits** (:func:`split_ids`, also by group: source file) and rates
  (:func:`binomial_interval`). Profile fitting, threshold calibration and
  evaluation use disjoint prompt sets; the trajectory-level threshold calibrated
  on them lives in :mod:`trajscope.conformal`.
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
from trajscope.interval_text import format_interval

__all__ = ["Interval", "NullSummary", "cluster_bootstrap", "bootstrap_frame", "matched_null", "split_ids",
           "binomial_interval"]

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

    def fmt(self, digits: int = 3, unit: str = "prompt") -> str:
        """``"0.123 [0.101, 0.150]"`` with ``digits`` decimals; ``"0.123 (one prompt: no interval)"`` from one
        cluster (:func:`format_interval`)."""
        return format_interval(self.estimate, self.lo, self.hi, digits, n_clusters=self.n_clusters, unit=unit)

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
              names: Sequence[str] = ("fit", "calibrate", "evaluate"), seed: int = 0, groups: Any = None) -> dict[str, list]:
    """Deterministic disjoint split of ids (prompts) into named parts, e.g. fit / calibrate / evaluate.

    The distinct ids are sorted, then shuffled with ``seed``, so membership does not
    depend on input order or duplicates. Part sizes follow ``fractions`` (largest
    remainder rounding); every part gets at least one id, taken from the largest part.

    Args:
        ids: sequence of sortable ids (list, numpy array or Polars Series).
        fractions: one positive fraction per part, summing to 1.
        names: part names, distinct, as many as ``fractions``.
        seed: seed of the shuffle. ``groups``: optional key per distinct id (source file); groups split, ids follow.

    Returns:
        ``{name: sorted list of ids}`` in ``names`` order; the parts cover all distinct ids.
    """
    ids = ids.to_list() if hasattr(ids, "to_list") else ids.tolist() if isinstance(ids, np.ndarray) else list(ids)
    if groups is not None:  # split the distinct groups; each id joins its group's part
        group_of = dict(zip(ids, groups.to_list() if hasattr(groups, "to_list") else list(groups), strict=True))
        part = {g: n for n, gs in split_ids(list(group_of.values()), fractions, names, seed).items() for g in gs}
        return {n: sorted(i for i, g in group_of.items() if part[g] == n) for n in names}
    fractions, names = [float(f) for f in fractions], list(names)
    if len(fractions) != len(names) or len(set(names)) != len(names):
        raise TrajscopeError(f"split_ids needs one distinct name per fraction (got names {names} "
                             f"for {len(fractions)} fractions).")
    if any(f <= 0 for f in fractions) or abs(sum(fractions) - 1) > 1e-6:
        raise TrajscopeError(f"split_ids fractions must be positive and sum to 1, e.g. (0.5, 0.25, 0.25); "
                             f"got {tuple(fractions)} (sum {sum(fractions):.4g}).")
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
