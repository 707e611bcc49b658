"""k-sparse probing pieces against scikit-learn: AUROC, balanced accuracy, and SAEBench's top-k by mean difference."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import balanced_accuracy_score, roc_auc_score

from trajscope.metrics import sae_probing as SP


def _data(n=400, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.random(n) < 0.3
    s = rng.normal(size=n) + 1.2 * y
    s[:40] = np.round(s[:40])  # ties
    files = rng.integers(0, 7, n).astype(str)
    return s, y, files


def test_auroc_equals_sklearn_and_its_interval_holds_it():
    s, y, files = _data()
    got = SP.auroc(s, y, files, n_boot=300)
    assert got["value"] == pytest.approx(roc_auc_score(y, s), abs=1e-12)
    assert got["lo"] < got["value"] < got["hi"] and got["n_files"] == 7
    assert got["n_pos"] == int(y.sum())


def test_auroc_draw_equals_sklearn_on_the_resampled_rows():
    """One bootstrap draw (files a, a, b) is the AUROC of those rows stacked, as scikit-learn computes it."""
    s, y, files = _data(120, 1)
    keep = ["0", "0", "3"]
    rows = np.concatenate([np.flatnonzero(files == f) for f in keep])
    want = roc_auc_score(y[rows], s[rows])
    labels, codes = np.unique(files, return_inverse=True)
    d = np.zeros(labels.size)
    for f in keep:
        d[list(labels).index(f)] += 1
    w = d[codes]
    assert roc_auc_score(y, s, sample_weight=w) == pytest.approx(want)
    # the module's own formula with the same counts
    import trajscope.metrics.sae_probing as mod

    real = mod._draws
    mod._draws = lambda k, n_boot, seed: d[None, :]
    try:
        out = SP.auroc(s, y, files, n_boot=1)
    finally:
        mod._draws = real
    assert out["lo"] == pytest.approx(want) and out["hi"] == pytest.approx(want)


def test_balanced_accuracy_equals_sklearn():
    s, y, files = _data()
    got = SP.balanced_accuracy(s > 0.5, y, files, n_boot=200)
    assert got["value"] == pytest.approx(balanced_accuracy_score(y, s > 0.5))
    assert got["lo"] <= got["value"] <= got["hi"]


def test_top_k_mean_diff_and_balanced_rows():
    rng = np.random.default_rng(0)
    X = rng.random((200, 10))
    y = np.arange(200) < 50
    X[y, 7] += 3.0
    X[~y, 2] += 2.0
    X[y, 4] += 1.0
    assert SP.top_k_mean_diff(X, y, 3).tolist() == [7, 2, 4]
    rows = SP.balanced_rows(y, seed=0)
    assert y[rows].sum() == 50 and (~y[rows]).sum() == 50 and len(set(rows)) == 100
    probe = SP.fit_probe(X[rows][:, [7]], y[rows])
    assert probe.C == 1.0 and probe.max_iter == 1000 and probe.penalty in ("l2", "deprecated")  # L2: the default
    assert getattr(probe, "l1_ratio", None) in (None, 0, 0.0)


def test_file_boot_draw_is_the_ratio_over_the_resampled_rows():
    """One draw (files a, a, c) of :class:`FileBoot` is Σnum / Σden over those files' rows stacked."""
    rng = np.random.default_rng(2)
    files = rng.choice(["a", "b", "c"], 50)
    num, den = rng.random(50), rng.random(50) + 0.5
    fb = SP.FileBoot(files, n_boot=1, seed=0)
    fb.__dict__["D"] = np.array([[2.0, 0.0, 1.0]])  # the draw a, a, c (labels sorted)
    rows = np.concatenate([np.flatnonzero(files == f) for f in ("a", "a", "c")])
    point, boot = fb.ratio(num, den)
    assert point == pytest.approx(num.sum() / den.sum()) and boot[0] == pytest.approx(num[rows].sum() / den[rows].sum())
    assert fb.counts(num > 0.5).tolist() == [float(((files == f) & (num > 0.5)).sum()) for f in ("a", "b", "c")]
    assert SP.FileBoot(files, n_boot=40, seed=1).D.sum(1).tolist() == [3.0] * 40  # k files per resample


def test_the_sae_bench_core_draws_its_files_through_file_boot(monkeypatch):
    """The SAE bench's FVU interval comes from the same draws: fixing them (files a, a, b) makes the interval
    the FVU of those rows stacked, centred on the group's mean."""
    import polars as pl
    import torch

    from trajscope.studies.sae_bench import core

    n, d = 30, 4
    g = torch.Generator().manual_seed(0)
    x, xh = torch.randn(n, d, generator=g), torch.randn(n, d, generator=g)
    files = np.array(["a", "b", "c"] * 10)
    rows = pl.DataFrame({"file": files, "kind": ["code"] * n, "phase": ["prefill"] * n, "segment": ["code"] * n,
                         "prompt_id": files})
    monkeypatch.setattr(SP, "_draws", lambda k, n_boot, seed: np.array([[2.0, 1.0, 0.0]]))
    table, _ = core.core_tables(x, rows, {("m", 0): (xh, torch.ones(n, 3))}, None, n_boot=1, seed=0)
    r = table.filter((pl.col("kind") == "all") & (pl.col("segment") == "all")).row(0, named=True)
    x64, xh64 = x.double().numpy(), xh.double().numpy()
    err, cen = ((x64 - xh64) ** 2).sum(1), ((x64 - x64.mean(0)) ** 2).sum(1)
    stack = np.concatenate([np.flatnonzero(files == f) for f in ("a", "a", "b")])
    assert r["fvu"] == pytest.approx(err.sum() / cen.sum())
    assert r["fvu_lo"] == pytest.approx(err[stack].sum() / cen[stack].sum()) == pytest.approx(r["fvu_hi"])
