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
"""

from __future__ import annotations

import numpy as np
import polars as pl
import torch

ALPHA = 0.5


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
