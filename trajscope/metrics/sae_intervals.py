"""How sure is an SAE drift number? Prompt-clustered intervals and the seed-to-seed noise floor.

An SAE report number (the FVU of decode steps 1–4, a spliced CE increase) varies for
two reasons that have nothing to do with prefill vs decode:

- **which prompts were evaluated.** Rows of one prompt are not independent, so every
  number gets a prompt-clustered bootstrap interval (:func:`trajscope.stats.cluster_bootstrap`
  over the prompts that have rows in the group). The resampled statistic is computed
  exactly from per-prompt sufficient statistics (:class:`GroupSums`): for a multiset
  ``P`` of prompts, ``FVU = Σ_P err / (Σ_P ‖x‖² − ‖Σ_P x‖² / n_P)`` equals
  :func:`trajscope.metrics.sae_eval.reconstruction_stats` on the concatenated rows.
- **which training seed.** SAEs of one training mix trained with different seeds
  differ; the spread of a metric over seeds (min, max, SD) is the noise floor a
  difference between two mixes must clear. :func:`seed_summary` gives it per mix
  and :func:`mix_differences` sets each difference of seed means beside it, with a
  paired prompt-bootstrap interval of the difference (same prompts resampled for
  both mixes).

A difference is called ``beyond noise`` only when its interval excludes 0 **and**
its size exceeds the larger of the two mixes' seed ranges; otherwise ``within
noise`` (``no seed floor`` when a mix has one seed). With 3 seeds the range is a
rough floor, not a test.

``dead`` and ``dense`` (features with density 0 / > 1% in the group) get no bootstrap
interval (:data:`NO_BOOTSTRAP`): a resample repeats some prompts' rows and drops others,
which by itself changes how many features fire, so the percentile interval does not
even cover its own estimate. Their control is the matched-n null of
:func:`trajscope.metrics.overlap.matched_overlap`; their mix differences are judged
against the seed floor alone.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Mapping, Sequence

import numpy as np
import polars as pl
import torch

from trajscope.stats import cluster_bootstrap

METRICS = ("fvu", "fvu_uncentred", "mse", "cos", "l0", "dead", "dense", "kl", "ce_increase")
NO_BOOTSTRAP = ("dead", "dense")  # set-size statistics: read against the matched-n null instead


@dataclasses.dataclass(frozen=True)
class GroupSums:
    """Per-prompt sums of one row group under one SAE (C prompts that have rows in the group).

    Arrays (float64): ``n [C]`` rows, ``err [C]`` Σ‖x − x̂‖², ``sq [C]`` Σ‖x‖², ``sx [C, d]`` Σx,
    ``cos [C]`` Σcos(x, x̂), ``l0 [C]`` Σ active features, ``counts [C, d_sae]`` rows on which each
    feature is active, ``kl``/``ce [C]`` sums of the non-null spliced values and ``n_kl``/``n_ce [C]``
    their counts (zeros when there is no splice). ``d`` is the activation width.
    """

    n: np.ndarray
    err: np.ndarray
    sq: np.ndarray
    sx: np.ndarray
    cos: np.ndarray
    l0: np.ndarray
    counts: np.ndarray
    kl: np.ndarray
    n_kl: np.ndarray
    ce: np.ndarray
    n_ce: np.ndarray

    @property
    def n_prompts(self) -> int:
        return int(self.n.size)


def group_sums(codes: np.ndarray, n_prompts: int, x: torch.Tensor, x_hat: torch.Tensor, f: torch.Tensor,
               kl: np.ndarray | None = None, ce: np.ndarray | None = None) -> GroupSums:
    """Per-prompt sufficient statistics of a group's rows.

    Args:
        codes: ``[n]`` prompt code of each row, in ``0..n_prompts-1``.
        n_prompts: C, the number of prompts (every code below it should occur).
        x, x_hat: ``[n, d]`` activations and reconstructions; f: ``[n, d_sae]`` codes.
        kl, ce: optional ``[n]`` spliced KL / CE increase per row (NaN = missing).

    Returns:
        :class:`GroupSums` with arrays of C rows.
    """
    idx = torch.as_tensor(np.asarray(codes, dtype=np.int64))
    x, x_hat = x.detach().double(), x_hat.detach().double()

    def add(v: torch.Tensor) -> np.ndarray:
        out = torch.zeros((n_prompts, *v.shape[1:]), dtype=torch.float64)
        return out.index_add_(0, idx, v.double()).numpy()

    zero = np.zeros(n_prompts)

    def nan_sums(v: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        if v is None:
            return zero, zero
        v = np.asarray(v, dtype=np.float64)
        ok = ~np.isnan(v)
        return (np.bincount(codes[ok], weights=v[ok], minlength=n_prompts),
                np.bincount(codes[ok], minlength=n_prompts).astype(np.float64))

    kl_s, n_kl = nan_sums(kl)
    ce_s, n_ce = nan_sums(ce)
    active = (f.detach() > 0)
    return GroupSums(
        n=np.bincount(codes, minlength=n_prompts).astype(np.float64),
        err=add((x - x_hat).pow(2).sum(-1)), sq=add(x.pow(2).sum(-1)), sx=add(x),
        cos=add(torch.nn.functional.cosine_similarity(x, x_hat, dim=-1)),
        l0=add(active.sum(-1).double()), counts=add(active.double()),
        kl=kl_s, n_kl=n_kl, ce=ce_s, n_ce=n_ce)


def metrics_from_sums(s: GroupSums, pick: np.ndarray | None = None) -> dict[str, float]:
    """The metrics of :data:`METRICS` over the rows of the prompts in ``pick`` (repeats count twice).

    Args:
        s: per-prompt sums; pick: ``[m]`` prompt indices (``None`` = every prompt once).

    Returns:
        ``{metric: value}``; NaN where undefined (no rows, no spliced values).
    """
    if pick is None:
        pick = np.arange(s.n_prompts)
    pick = np.asarray(pick, dtype=np.int64)
    n = s.n[pick].sum()
    if n == 0:
        return {m: float("nan") for m in METRICS}
    err, sq = s.err[pick].sum(), s.sq[pick].sum()
    sx = s.sx[pick].sum(0)
    centred = sq - float(sx @ sx) / n
    dens = s.counts[pick].sum(0) / n
    n_kl, n_ce = s.n_kl[pick].sum(), s.n_ce[pick].sum()
    d = s.sx.shape[1]
    return {"fvu": err / centred if centred > 0 else float("nan"),
            "fvu_uncentred": err / sq if sq > 0 else float("nan"),
            "mse": err / (n * d), "cos": s.cos[pick].sum() / n, "l0": s.l0[pick].sum() / n,
            "dead": float((dens == 0).mean()), "dense": float((dens > 0.01).mean()),
            "kl": s.kl[pick].sum() / n_kl if n_kl else float("nan"),
            "ce_increase": s.ce[pick].sum() / n_ce if n_ce else float("nan")}


def _cached(fn: Callable[[np.ndarray], dict[str, float]]) -> Callable[[np.ndarray], dict[str, float]]:
    """Memoise a function of a prompt pick (the same seed draws the same picks for every metric)."""
    cache: dict[bytes, dict[str, float]] = {}

    def wrapped(pick: np.ndarray) -> dict[str, float]:
        key = np.asarray(pick, dtype=np.int64).tobytes()
        if key not in cache:
            cache[key] = fn(pick)
        return cache[key]
    return wrapped


def _intervals(stat: Callable[[np.ndarray], dict[str, float]], n_prompts: int, metrics: Sequence[str], *,
               n_boot: int, level: float, seed: int) -> dict[str, dict[str, float]]:
    """Per metric ``{value, lo, hi}``: the full-sample value and a prompt-bootstrap interval."""
    stat = _cached(stat)
    full = stat(np.arange(n_prompts))
    out = {}
    for m in metrics:
        if not np.isfinite(full[m]) or m in NO_BOOTSTRAP:
            out[m] = {"value": full[m], "lo": float("nan"), "hi": float("nan")}
            continue
        iv = cluster_bootstrap(np.arange(n_prompts), None, lambda p, m=m: stat(p)[m], level=level,
                               n_boot=n_boot, seed=seed)
        out[m] = {"value": full[m], "lo": iv.lo, "hi": iv.hi}  # NaN if some resample had no value
    return out


def interval_rows(sums: Mapping[tuple[str, int], GroupSums], metrics: Sequence[str] = METRICS, *,
                  n_boot: int = 1000, level: float = 0.95, seed: int = 0) -> list[dict]:
    """One row per (SAE replicate, metric): ``sae, seed, metric, value, lo, hi, n, n_prompts``.

    Args:
        sums: ``(mix name, seed)`` → :class:`GroupSums` of one group (same prompts for every key).
    """
    rows = []
    for (mix, seed_), s in sums.items():
        for m, r in _intervals(lambda p, s=s: metrics_from_sums(s, p), s.n_prompts, metrics,
                               n_boot=n_boot, level=level, seed=seed).items():
            rows.append({"sae": mix, "seed": seed_, "metric": m, **r, "n": int(s.n.sum()), "n_prompts": s.n_prompts})
    return rows


def seed_summary(sums: Mapping[tuple[str, int], GroupSums], metrics: Sequence[str] = METRICS, *,
                 n_boot: int = 1000, level: float = 0.95, seed: int = 0) -> list[dict]:
    """Per (mix, metric): the mean over seeds with its prompt-bootstrap interval, and the seed spread.

    Returns:
        rows ``sae, metric, n, n_prompts, n_seeds, value`` (seed mean), ``lo, hi`` (interval of the seed mean),
        ``seed_min, seed_max, seed_range, seed_sd`` (range and SD with ddof 1: NaN for one seed).
    """
    mixes: dict[str, list[GroupSums]] = {}
    for (mix, _), s in sums.items():
        mixes.setdefault(mix, []).append(s)
    rows = []
    for mix, reps in mixes.items():
        per_seed = np.array([[metrics_from_sums(s)[m] for m in metrics] for s in reps])
        ivs = _intervals(lambda p, reps=reps: _mean_dicts([metrics_from_sums(s, p) for s in reps]),
                         reps[0].n_prompts, metrics, n_boot=n_boot, level=level, seed=seed)
        for j, m in enumerate(metrics):
            v = per_seed[:, j]
            rows.append({"sae": mix, "metric": m, "n": int(reps[0].n.sum()), "n_prompts": reps[0].n_prompts,
                         "n_seeds": len(reps), **ivs[m],
                         "seed_min": float(np.min(v)), "seed_max": float(np.max(v)),
                         "seed_range": float(np.max(v) - np.min(v)) if len(v) > 1 else float("nan"),
                         "seed_sd": float(np.std(v, ddof=1)) if len(v) > 1 else float("nan")})
    return rows


def _mean_dicts(ds: list[dict[str, float]]) -> dict[str, float]:
    return {k: float(np.mean([d[k] for d in ds])) for k in ds[0]}


def mix_differences(sums: Mapping[tuple[str, int], GroupSums], seeds: Sequence[dict], base: str,
                    metrics: Sequence[str] = METRICS, *, n_boot: int = 1000, level: float = 0.95,
                    seed: int = 0) -> list[dict]:
    """Seed-mean difference (other mix − ``base``) per metric, with a paired prompt-bootstrap interval.

    Args:
        sums: as in :func:`seed_summary`.
        seeds: rows of :func:`seed_summary` for the same sums (give the seed ranges).
        base: the reference mix (e.g. ``prefill-only``).

    Returns:
        rows ``sae`` (the other mix), ``base, metric, diff, diff_lo, diff_hi, seed_floor``
        (larger seed range of the two mixes; NaN with one seed), ``verdict`` (``beyond noise`` /
        ``within noise`` / ``no seed floor``).
    """
    mixes: dict[str, list[GroupSums]] = {}
    for (mix, _), s in sums.items():
        mixes.setdefault(mix, []).append(s)
    if base not in mixes:
        return []
    rng = {(r["sae"], r["metric"]): r["seed_range"] for r in seeds}
    rows = []
    for mix, reps in mixes.items():
        if mix == base:
            continue

        def diff(p: np.ndarray, reps=reps) -> dict[str, float]:
            a = _mean_dicts([metrics_from_sums(s, p) for s in mixes[base]])
            b = _mean_dicts([metrics_from_sums(s, p) for s in reps])
            return {m: b[m] - a[m] for m in metrics}

        for m, r in _intervals(diff, reps[0].n_prompts, metrics, n_boot=n_boot, level=level, seed=seed).items():
            ranges = [rng.get((mix, m), float("nan")), rng.get((base, m), float("nan"))]
            floor = float(max(ranges)) if np.isfinite(ranges).all() else float("nan")
            excl0 = m in NO_BOOTSTRAP or (np.isfinite(r["lo"]) and (r["lo"] > 0 or r["hi"] < 0))
            beyond = bool(excl0 and abs(r["value"]) > floor)
            verdict = "no seed floor" if not np.isfinite(floor) else "beyond noise" if beyond else "within noise"
            rows.append({"sae": mix, "base": base, "metric": m, "diff": r["value"], "diff_lo": r["lo"],
                         "diff_hi": r["hi"], "seed_floor": floor, "verdict": verdict})
    return rows


def to_frame(rows: list[dict], keys: dict) -> pl.DataFrame:
    """Rows with the group's key columns (``kind, phase, group``) put first."""
    return pl.DataFrame([{**keys, **r} for r in rows]) if rows else pl.DataFrame()
