"""k-sparse probing of SAE features (SAEBench's recipe), with file-clustered intervals.

SAEBench's sparse probing (adamkarvonen/SAEBench, ``sae_bench/evals/sparse_probing`` and its
``probe_training``) asks whether a concept lives in a few features: on a training set balanced by
subsampling the larger class, take the k features whose class means differ most in absolute value
(:func:`top_k_mean_diff`), fit scikit-learn's ``LogisticRegression`` (L2, ``C = 1``, ``max_iter =
1000``) on those k columns only, and score held-out rows. What this module does differently, and
why:

- SAEBench probes mean-pooled sequence activations of labelled texts; here every row is one token
  position with a token-level label (:mod:`trajscope.metrics.sae_code_labels`), so phases can be
  compared;
- SAEBench balances its test set by subsampling too; here every held-out row is kept and the
  accuracy is the *balanced* accuracy (the mean of the two per-class accuracies, which is what a
  subsampled balanced test set estimates), beside the AUROC of the probe's score;
- SAEBench's full-width baseline probe is a PyTorch probe trained on a GPU; the dense ceiling here is
  the same scikit-learn logistic regression on the standardised residual (all d_model dimensions);
- intervals: a percentile bootstrap over source files (every held-out row of a file travels with
  it), the whole probe fixed; :func:`auroc` / :func:`balanced_accuracy` return the exact estimate and
  the bootstrap from per-file sufficient statistics, so a draw costs O(files²). :class:`FileBoot` is that
  grouping (rows → file codes, per-file sums, the draws of files), shared with the SAE bench's core
  metrics (:mod:`trajscope.studies.sae_bench.core`).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np


def top_k_mean_diff(X: np.ndarray, y: np.ndarray, k: int) -> np.ndarray:
    """The ``k`` columns of ``X [n, d]`` with the largest ``|mean(X | y) − mean(X | ¬y)|`` (descending, ties by
    column index)."""
    y = np.asarray(y, dtype=bool)
    diff = np.abs(X[y].mean(0) - X[~y].mean(0))
    return np.argsort(-diff, kind="stable")[:k]


def balanced_rows(y: np.ndarray, seed: int) -> np.ndarray:
    """Row indices: every row of the smaller class and as many rows of the larger class, drawn without
    replacement with ``seed`` (sorted)."""
    y = np.asarray(y, dtype=bool)
    pos, neg = np.flatnonzero(y), np.flatnonzero(~y)
    small, big = (pos, neg) if pos.size <= neg.size else (neg, pos)
    rng = np.random.default_rng(seed)
    return np.sort(np.concatenate([small, rng.choice(big, size=small.size, replace=False)]))


def fit_probe(X: np.ndarray, y: np.ndarray, seed: int = 0) -> Any:
    """SAEBench's probe: ``LogisticRegression(penalty="l2", C=1.0, max_iter=1000)`` fitted on ``X, y``."""
    import warnings

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression

    probe = LogisticRegression(C=1.0, max_iter=1000, random_state=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        probe.fit(X, np.asarray(y, dtype=int))
    return probe


def _draws(k: int, n_boot: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.stack([np.bincount(rng.integers(0, k, k), minlength=k) for _ in range(n_boot)]).astype(np.float64)


class FileBoot:
    """Rows grouped by source file for a bootstrap over files from per-file sums.

    Args:
        files: ``[n]`` each row's source file.
        n_boot, seed: the draws; ``D`` is ``[n_boot, k]``, how often each of the ``k`` files (sorted) is drawn
            in each resample (files drawn with replacement, ``k`` per resample), made on first use.
    """

    def __init__(self, files: Any, n_boot: int, seed: int):
        self.labels, self.codes = np.unique(np.asarray(files), return_inverse=True)
        self.k = int(self.labels.size)
        self._n_boot, self._seed = n_boot, seed

    @functools.cached_property
    def D(self) -> np.ndarray:
        """``[n_boot, k]`` file counts of each resample."""
        return _draws(self.k, self._n_boot, self._seed)

    def sums(self, v: Any) -> np.ndarray:
        """``[k]`` per-file sums of ``v [n]``."""
        return np.bincount(self.codes, np.asarray(v, dtype=np.float64), minlength=self.k)

    def counts(self, mask: Any) -> np.ndarray:
        """``[k]`` per-file counts of the rows where ``mask [n]`` holds (float64)."""
        return np.bincount(self.codes[np.asarray(mask, dtype=bool)], minlength=self.k).astype(np.float64)

    def ratio(self, num: Any, den: Any) -> tuple[float, np.ndarray]:
        """Point ``Σnum / Σden`` and its ``[n_boot]`` bootstrap draws (ratios of the resampled files' sums)."""
        sn, sd = self.sums(num), self.sums(den)
        with np.errstate(invalid="ignore", divide="ignore"):
            return float(sn.sum() / sd.sum()), (self.D @ sn) / (self.D @ sd)


def _quantiles(boot: np.ndarray, level: float) -> tuple[float, float]:
    boot = boot[np.isfinite(boot)]
    if boot.size == 0:
        return float("nan"), float("nan")
    lo, hi = np.quantile(boot, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)


def auroc(scores: Any, y: Any, files: Any, *, n_boot: int = 1000, seed: int = 0,
          level: float = 0.95) -> dict[str, float]:
    """The AUROC of ``scores`` for labels ``y`` (ties count one half), with a bootstrap over ``files``.

    ``H[a, b]`` counts the (positive of file a, negative of file b) pairs the score orders correctly; a
    draw with file counts ``d`` gives ``dᵀHd / ((d·P)(d·N))``, the AUROC of the resampled rows.

    Returns:
        ``value``, ``lo``, ``hi``, ``n_files``, ``n_pos``, ``n_neg`` (``value`` NaN with one class only).
    """
    s, y = np.asarray(scores, dtype=np.float64), np.asarray(y, dtype=bool)
    fb = FileBoot(files, n_boot, seed)
    codes, k = fb.codes, fb.k
    H = np.zeros((k, k))
    neg_sorted = [np.sort(s[(codes == b) & ~y]) for b in range(k)]
    for a in range(k):
        sp = s[(codes == a) & y]
        for b in range(k):
            sn = neg_sorted[b]
            if sp.size and sn.size:
                below = np.searchsorted(sn, sp, side="left")
                upto = np.searchsorted(sn, sp, side="right")
                H[a, b] = float((below + 0.5 * (upto - below)).sum())
    P, N = fb.counts(y), fb.counts(~y)
    out = {"n_files": int(k), "n_pos": int(P.sum()), "n_neg": int(N.sum())}
    if P.sum() == 0 or N.sum() == 0:
        return {"value": float("nan"), "lo": float("nan"), "hi": float("nan"), **out}
    D = fb.D
    with np.errstate(invalid="ignore", divide="ignore"):
        boot = np.einsum("ia,ab,ib->i", D, H, D) / ((D @ P) * (D @ N))
    lo, hi = _quantiles(boot, level) if k > 1 else (float("nan"), float("nan"))
    return {"value": float(H.sum() / (P.sum() * N.sum())), "lo": lo, "hi": hi, **out}


def balanced_accuracy(pred: Any, y: Any, files: Any, *, n_boot: int = 1000, seed: int = 0,
                      level: float = 0.95) -> dict[str, float]:
    """``(TP/P + TN/N) / 2`` of Boolean predictions, with a bootstrap over ``files`` (same draws as
    :func:`auroc` for the same ``seed`` and files)."""
    p, y = np.asarray(pred, dtype=bool), np.asarray(y, dtype=bool)
    fb = FileBoot(files, n_boot, seed)
    k = fb.k
    tp, tn, P, N = fb.counts(y & p), fb.counts(~y & ~p), fb.counts(y), fb.counts(~y)
    if P.sum() == 0 or N.sum() == 0:
        return {"value": float("nan"), "lo": float("nan"), "hi": float("nan"), "n_files": int(k)}
    D = fb.D
    with np.errstate(invalid="ignore", divide="ignore"):
        boot = 0.5 * (D @ tp / (D @ P) + D @ tn / (D @ N))
    lo, hi = _quantiles(boot, level) if k > 1 else (float("nan"), float("nan"))
    return {"value": float(0.5 * (tp.sum() / P.sum() + tn.sum() / N.sum())), "lo": lo, "hi": hi, "n_files": int(k)}
