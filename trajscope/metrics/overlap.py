"""Feature overlap between prefill and decode: do the same SAE features fire?

Definitions (DESIGN.md, "Feature overlap prefill vs decode"), for SAE codes
``F_pre [n_pre, d_sae]`` and ``F_dec [n_dec, d_sae]`` (a feature is *active* on a
row when its activation is > 0):

- activation count ``c_i`` and frequency ``ν_i = c_i / n`` of feature i over a set.
- ``jaccard(A, B) = |A ∩ B| / |A ∪ B|`` of two feature sets (1 when both are empty).
  The report compares the top-k features by frequency in prefill with those in
  decode (:func:`topk_by_frequency`); :func:`row_topk_sets` gives per-position
  top-k active sets for step-by-step comparisons.
- ``spearman``: Spearman rank correlation of the two frequency vectors (Pearson
  correlation of their ranks, ties given their average rank).
- ``rate_ratio_i = ν̃_dec,i / ν̃_pre,i`` with add-α smoothing
  ``ν̃ = (c + α) / (n + 2α)`` (α = 0.5, Jeffreys), so features never seen on one
  side get a finite ratio; reported as ``log2``.
- ``frequency_kl = KL(q_dec ‖ q_pre)`` of the activation counts normalised into
  distributions over features, ``q_i = (c_i + α) / Σ_j (c_j + α)``, in nats.
- appear / vanish: features with count 0 in prefill and ≥ ``min_count`` in decode
  (appear after the prompt ends), and the reverse (vanish).

Every one of these moves with sample size alone (a 48-row set has fewer active
features than a 12,000-row set, so its top-k set is noisier and more features look
absent). :func:`matched_overlap` therefore reads each prefill-vs-decode number against
a **matched-n null** (:func:`trajscope.stats.matched_null`): two prompt-disjoint
prefill samples of the same n rows. The observed side is computed at the same n
(prefill sample a, the same draws as the null's, against n decode rows), so observed
and null differ only in where the second sample comes from. The dead / dense feature
fractions of a sample (density 0 / > 1%) get the same treatment.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import torch

from trajscope.stats import matched_null

ALPHA = 0.5
NULL_METRICS = ("jaccard_topk", "spearman", "frequency_kl", "mean_abs_log2_rate_ratio", "n_appear", "n_vanish",
                "dead", "dense")


def activation_counts(f: torch.Tensor) -> np.ndarray:
    """Rows on which each feature is active: ``[n, d_sae] → [d_sae]`` int64."""
    return (f > 0).sum(0).cpu().numpy().astype(np.int64)


def jaccard(a: set | np.ndarray | list, b: set | np.ndarray | list) -> float:
    """``|A ∩ B| / |A ∪ B|``; 1.0 when both sets are empty."""
    a, b = set(np.asarray(list(a)).tolist()), set(np.asarray(list(b)).tolist())
    union = a | b
    return 1.0 if not union else len(a & b) / len(union)


def topk_by_frequency(counts: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` most frequently active features (ties by lower index; zero counts excluded)."""
    order = np.lexsort((np.arange(counts.size), -counts))
    return order[:k][counts[order[:k]] > 0]


def row_topk_sets(f: torch.Tensor, k: int) -> list[set[int]]:
    """Per row, the set of the ``k`` largest *active* features: ``[n, d_sae]`` → n sets."""
    vals, idx = torch.topk(f, min(k, f.shape[-1]), dim=-1)
    return [set(i[v > 0].tolist()) for v, i in zip(vals, idx)]


def rank_average(x: np.ndarray) -> np.ndarray:
    """Ranks 1..n with ties given their average rank."""
    x = np.asarray(x, dtype=np.float64)
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(x.size, dtype=np.float64)
    sx = x[order]
    i = 0
    while i < x.size:
        j = i
        while j + 1 < x.size and sx[j + 1] == sx[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman rank correlation (NaN when either side is constant)."""
    ra, rb = rank_average(a), rank_average(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    den = np.sqrt((ra ** 2).sum() * (rb ** 2).sum())
    return float((ra * rb).sum() / den) if den > 0 else float("nan")


def log2_rate_ratio(c_dec: np.ndarray, n_dec: int, c_pre: np.ndarray, n_pre: int, alpha: float = ALPHA) -> np.ndarray:
    """``log2`` of the smoothed activation-rate ratio decode / prefill per feature: ``[d_sae]``."""
    r_dec = (c_dec + alpha) / (n_dec + 2 * alpha)
    r_pre = (c_pre + alpha) / (n_pre + 2 * alpha)
    return np.log2(r_dec / r_pre)


def frequency_kl(c_p: np.ndarray, c_q: np.ndarray, alpha: float = ALPHA) -> float:
    """``KL(q_p ‖ q_q)`` (nats) of smoothed, normalised activation counts."""
    p = (c_p + alpha) / (c_p + alpha).sum()
    q = (c_q + alpha) / (c_q + alpha).sum()
    return float((p * np.log(p / q)).sum())


def appear_vanish(c_pre: np.ndarray, c_dec: np.ndarray, min_count: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """(features that appear after the prompt, features that vanish): index arrays."""
    appear = np.nonzero((c_pre == 0) & (c_dec >= min_count))[0]
    vanish = np.nonzero((c_dec == 0) & (c_pre >= min_count))[0]
    return appear, vanish


def overlap_summary(f_pre: torch.Tensor, f_dec: torch.Tensor, k: int = 64, min_count: int = 5) -> dict[str, float]:
    """All overlap numbers for one prefill set and one decode set.

    Args:
        f_pre: ``[n_pre, d_sae]`` codes on prefill rows; f_dec: ``[n_dec, d_sae]`` on decode rows.
        k: size of the top-by-frequency sets compared with Jaccard.
        min_count: activations needed to count a feature as appearing / vanishing.

    Returns:
        ``n_pre, n_dec, jaccard_topk, spearman, frequency_kl, mean_abs_log2_rate_ratio,
        n_appear, n_vanish``.
    """
    c_pre, c_dec = activation_counts(f_pre), activation_counts(f_dec)
    appear, vanish = appear_vanish(c_pre, c_dec, min_count)
    lr = log2_rate_ratio(c_dec, f_dec.shape[0], c_pre, f_pre.shape[0])
    used = (c_pre + c_dec) > 0
    return {
        "n_pre": int(f_pre.shape[0]), "n_dec": int(f_dec.shape[0]),
        "jaccard_topk": jaccard(topk_by_frequency(c_pre, k), topk_by_frequency(c_dec, k)),
        "spearman": spearman(c_pre / max(1, f_pre.shape[0]), c_dec / max(1, f_dec.shape[0])),
        "frequency_kl": frequency_kl(c_dec, c_pre),
        "mean_abs_log2_rate_ratio": float(np.abs(lr[used]).mean()) if used.any() else float("nan"),
        "n_appear": int(appear.size), "n_vanish": int(vanish.size),
    }


def feature_table(f_pre: torch.Tensor, f_dec: torch.Tensor, min_count: int = 5) -> pl.DataFrame:
    """One row per feature: counts, frequencies, ``log2_rate_ratio``, and ``appears`` / ``vanishes`` flags."""
    c_pre, c_dec = activation_counts(f_pre), activation_counts(f_dec)
    appear, vanish = appear_vanish(c_pre, c_dec, min_count)
    d = c_pre.size
    flags_a, flags_v = np.zeros(d, bool), np.zeros(d, bool)
    flags_a[appear], flags_v[vanish] = True, True
    return pl.DataFrame({
        "feature": np.arange(d), "count_prefill": c_pre, "count_decode": c_dec,
        "freq_prefill": c_pre / max(1, f_pre.shape[0]), "freq_decode": c_dec / max(1, f_dec.shape[0]),
        "log2_rate_ratio": log2_rate_ratio(c_dec, f_dec.shape[0], c_pre, f_pre.shape[0]),
        "appears": flags_a, "vanishes": flags_v,
    })


def max_matched_n(clusters: np.ndarray) -> int:
    """Largest n at which :func:`trajscope.stats.matched_null` can draw two prompt-disjoint samples of n rows."""
    sizes = np.unique(np.asarray(clusters), return_counts=True)[1]
    return int((sizes.sum() - sizes.max() + 1) // 2) if sizes.size else 0


def _with_counts(f_a: torch.Tensor, f_b: torch.Tensor, k: int, min_count: int) -> dict[str, float]:
    s = overlap_summary(f_a, f_b, k=k, min_count=min_count)
    dens = (f_b > 0).double().mean(0)
    return {**s, "dead": float((dens == 0).double().mean()), "dense": float((dens > 0.01).double().mean())}


def matched_overlap(f_pre: torch.Tensor, pre_clusters: np.ndarray, f_dec: torch.Tensor, *, k: int = 64,
                    min_count: int = 5, n_resamples: int = 200, level: float = 0.95, seed: int = 0,
                    min_n: int = 16) -> list[dict]:
    """Each overlap / count metric of prefill vs decode beside its matched-n prefill-vs-prefill null.

    ``n = min(n_dec, max_matched_n(pre_clusters))``. Each of ``n_resamples`` draws deals
    prompt-disjoint prefill samples a and b of n rows (:func:`trajscope.stats.matched_null`);
    the null is ``metric(a, b)`` and the observed value ``metric(a, d)`` with d = the decode rows
    (n of them drawn without replacement when there are more). Same seed, same a.

    Args:
        f_pre: ``[n_pre, d_sae]`` prefill codes; pre_clusters: ``[n_pre]`` prompt ids.
        f_dec: ``[n_dec, d_sae]`` decode codes.
        k, min_count: as in :func:`overlap_summary`.
        n_resamples, level, seed: draws, quantile level, seed.
        min_n: below this many matched rows no null is drawn (NaN, ``note`` says why).

    Returns:
        One dict per metric of :data:`NULL_METRICS`: ``metric, n_pre, n_dec, n_matched``,
        ``observed_all`` (all prefill vs all decode rows), ``observed, observed_lo, observed_hi``
        (mean and central quantiles over draws at n), ``null_mean, null_lo, null_hi``,
        ``outside_null`` (observed mean outside the null's interval) and ``note``.
    """
    n_pre, n_dec = int(f_pre.shape[0]), int(f_dec.shape[0])
    full = _with_counts(f_pre, f_dec, k, min_count) if n_pre and n_dec else {m: float("nan") for m in NULL_METRICS}
    n = min(n_dec, max_matched_n(pre_clusters)) if n_pre else 0
    base = {"n_pre": n_pre, "n_dec": n_dec, "n_matched": n}
    if n < min_n:
        note = f"no null: {n} matched rows (< {min_n}); too few prefill prompts or decode rows"
        return [{"metric": m, **base, "observed_all": full[m], **dict.fromkeys(
            ("observed", "observed_lo", "observed_hi", "null_mean", "null_lo", "null_hi"), float("nan")),
            "outside_null": False, "note": note} for m in NULL_METRICS]
    rng = np.random.default_rng(seed + 1)
    null_draws: list[dict] = []
    obs_draws: list[dict] = []

    def null_metric(a: torch.Tensor, b: torch.Tensor) -> float:
        null_draws.append(_with_counts(a, b, k, min_count))
        return null_draws[-1]["jaccard_topk"]

    def obs_metric(a: torch.Tensor, _b: torch.Tensor) -> float:
        d = f_dec if n == n_dec else f_dec[torch.as_tensor(np.sort(rng.choice(n_dec, n, replace=False)))]
        obs_draws.append(_with_counts(a, d, k, min_count))
        return obs_draws[-1]["jaccard_topk"]

    for fn in (null_metric, obs_metric):
        matched_null(f_pre, n, fn, n_resamples=n_resamples, level=level, clusters=pre_clusters, seed=seed)
    q = ((1 - level) / 2, 1 - (1 - level) / 2)
    out = []
    for m in NULL_METRICS:
        nv = np.array([d[m] for d in null_draws])
        ov = np.array([d[m] for d in obs_draws])
        (nlo, nhi), (olo, ohi) = np.nanquantile(nv, q), np.nanquantile(ov, q)
        obs = float(np.nanmean(ov))
        out.append({"metric": m, **base, "observed_all": full[m], "observed": obs, "observed_lo": float(olo),
                    "observed_hi": float(ohi), "null_mean": float(np.nanmean(nv)), "null_lo": float(nlo),
                    "null_hi": float(nhi), "outside_null": bool(obs < nlo or obs > nhi),
                    "note": f"{n_resamples} prompt-disjoint prefill draws of {n} rows"})
    return out
