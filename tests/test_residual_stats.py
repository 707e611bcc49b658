"""The residual statistics kernel: equal to the unfused definition bit for bit, and to NumPy/SciPy.

``_unfused`` is :func:`residual_stats` as it stood before its passes were fused (commit 2011b0a):
each statistic computed on its own, in the words of the definition. The fused kernel must give
the same bits for every input, including NaN, a sink row, per-vector and reference medians, float64
and leading batch dimensions. SciPy's ``kurtosis`` and NumPy's moments check the definition itself.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.stats
import torch

from trajscope.metrics.residual_stats import (
    ACT_FIELDS,
    MASSIVE_ABS,
    MASSIVE_RATIO,
    OUTLIER_ABS,
    residual_stats,
)


def _unfused(x, median_abs=None, dtype=torch.float32, pooled=False):
    x = x.to(dtype)
    mean = x.mean(-1)
    centred = x - mean.unsqueeze(-1)
    c2 = centred * centred
    var = c2.mean(-1)
    m4 = (c2 * c2).mean(-1)
    kurt = torch.where(var > 0, m4 / var.pow(2).clamp_min(1e-30) - 3.0, torch.zeros_like(var))
    ax = x.abs()
    max_abs = ax.amax(-1)
    n_out = (ax > OUTLIER_ABS).sum(-1).to(dtype)
    big = ax > MASSIVE_ABS
    if bool(big.any()):
        if median_abs is None and pooled:
            med = ax.reshape(-1).median()
        elif median_abs is None:
            med = ax.median(-1).values.unsqueeze(-1)
        else:
            med = torch.as_tensor(median_abs, dtype=dtype, device=x.device)
            med = med.unsqueeze(-1) if med.dim() > 0 else med
        n_massive = (big & (ax > MASSIVE_RATIO * med)).sum(-1).to(dtype)
    else:
        n_massive = torch.zeros_like(max_abs)
    norm = (x * x).sum(-1).sqrt()
    return torch.stack([norm, mean, var, kurt, max_abs, n_out, n_massive], dim=-1)


def _block(shape, seed, sink=True, dtype=torch.float32):
    """A residual-like block: heavy-tailed values, a sink row with |x| ≈ 25,000, a few massive dims."""
    torch.manual_seed(seed)
    x = torch.distributions.StudentT(3.0).sample(shape) if seed % 2 else torch.randn(shape)
    x = (x * 0.8).to(dtype)
    if sink:
        x[..., 0, :] = 30.0
        x[..., 0, 3] = -25_000.0
        x[..., 1:, 7] = 150.0  # > 100 everywhere: counts against a small reference median only
    return x


CASES = [
    {},
    {"pooled": True},
    {"median_abs": 0.05},
    {"median_abs": 0.05, "dtype": torch.float64},
    {"pooled": True, "dtype": torch.float64},
]


@pytest.mark.parametrize("shape", [(577,), (5, 64), (300, 576), (3, 40, 96)])
@pytest.mark.parametrize("kw", CASES, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()) or "own")
@pytest.mark.parametrize("sink", [True, False])
def test_fused_equals_the_unfused_definition_bit_for_bit(shape, kw, sink):
    x = _block(shape, seed=len(shape) + 2 * shape[-1], sink=sink and len(shape) > 1)
    if len(shape) == 1:
        x[5] = 250.0 if sink else 1.0
    assert torch.equal(residual_stats(x, **kw), _unfused(x, **kw))


def test_fused_equals_unfused_with_a_reference_median_per_vector_and_broadcast():
    x = _block((4, 50, 64), seed=3)
    med = torch.rand(4, 50) * 0.2
    assert torch.equal(residual_stats(x, median_abs=med), _unfused(x, median_abs=med))
    med_b = torch.rand(4, 1) * 0.2  # broadcast over positions
    assert torch.equal(residual_stats(x, median_abs=med_b), _unfused(x, median_abs=med_b))
    assert residual_stats(x, median_abs=med)[..., ACT_FIELDS.index("n_massive")].sum() > 0


def test_fused_equals_unfused_on_nan_inf_constant_and_half_inputs():
    x = _block((20, 64), seed=5)
    x[2, 4] = float("nan")
    x[3, :] = 1.5  # constant vector: var 0, kurtosis 0
    x[4, 9] = float("inf")
    x[5, 1] = float("nan")
    x[5, 2] = 500.0  # a NaN beside a massive value in one vector
    for kw in CASES:
        a, b = residual_stats(x, **kw), _unfused(x, **kw)
        assert torch.equal(a.nan_to_num(7.0, 8.0, 9.0), b.nan_to_num(7.0, 8.0, 9.0)), kw
    h = _block((30, 64), seed=7).to(torch.bfloat16)
    assert torch.equal(residual_stats(h, pooled=True), _unfused(h, pooled=True))


def test_fused_runs_on_tensors_that_require_grad():
    x = _block((6, 32), seed=9).requires_grad_(True)
    assert torch.equal(residual_stats(x, pooled=True), _unfused(x.detach(), pooled=True))


def test_statistics_match_numpy_and_scipy():
    """The definition itself, in float64, against an independent computation of each statistic."""
    x = _block((200, 576), seed=11)
    med = float(np.median(np.abs(x.numpy().astype(np.float64))))
    got = residual_stats(x, median_abs=med, dtype=torch.float64).numpy()
    a = x.numpy().astype(np.float64)
    want = np.stack([
        np.linalg.norm(a, axis=-1), a.mean(-1), a.var(-1),
        scipy.stats.kurtosis(a, axis=-1, fisher=True, bias=True), np.abs(a).max(-1),
        (np.abs(a) > 6).sum(-1), ((np.abs(a) > 100) & (np.abs(a) > 1000 * med)).sum(-1),
    ], axis=-1)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-9)
    assert want[:, -1].sum() > 0 and want[:, -2].sum() > 0  # the counts are exercised
    # float32 (capture's dtype): within float32 rounding of the same numbers
    got32 = residual_stats(x, median_abs=med).numpy()
    np.testing.assert_allclose(got32[:, [0, 2, 4, 5, 6]], want[:, [0, 2, 4, 5, 6]], rtol=2e-5)
    np.testing.assert_allclose(got32[1:, 3], want[1:, 3], rtol=1e-3, atol=1e-3)  # kurtosis: 4th powers
    np.testing.assert_allclose(got32[:, 1], want[:, 1], atol=1e-3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_fused_equals_unfused_on_cuda():
    x = _block((3, 200, 576), seed=13).cuda()
    for kw in CASES:
        assert torch.equal(residual_stats(x, **kw), _unfused(x, **kw)), kw
