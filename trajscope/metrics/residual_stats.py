"""Residual statistics per vector: the one definition (DESIGN.md), in torch alone.

For a residual vector ``x`` (one position at one layer): L2 norm, mean,
population variance, excess kurtosis, max |x|, the count of outliers
``|x| > 6`` (the LLM.int8 rule) and the count of massive activations
``|x| > 100`` and ``|x| > 1000 × m``, where ``m`` is the reference median |x|
of the layer. Callers say which reference they have: a prefill profile passes
the layer's median over its prompt set; capture's kernels, which see a step or
a chunk of steps at a time, pass nothing and the vector's own median |x| stands in.

This module imports nothing but torch, because capture ships it by value to the
NDIF server (``nnsight.register``) and runs it inside the step.
"""

from __future__ import annotations

import torch

OUTLIER_ABS = 6.0
MASSIVE_ABS = 100.0
MASSIVE_RATIO = 1000.0
ACT_FIELDS = ("norm", "mean", "var", "kurtosis", "max_abs", "n_outliers", "n_massive")


def residual_stats(x: torch.Tensor, median_abs=None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Per-vector statistics of residual activations.

    Args:
        x: ``[..., d_model]``.
        median_abs: the reference median |x| for the massive rule (a scalar or ``[...]``); None uses
            each vector's own median |x|.
        dtype: computation dtype (float32 in capture, float64 for profiles).
    Returns:
        ``[..., 7]`` in ACT_FIELDS order (counts stored as floats).
    """
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
    if bool(big.any()):  # the median only matters where some |x| passes the absolute bar
        if median_abs is None:
            med = ax.median(-1).values.unsqueeze(-1)
        else:
            med = torch.as_tensor(median_abs, dtype=dtype, device=x.device)
            med = med.unsqueeze(-1) if med.dim() > 0 else med
        n_massive = (big & (ax > MASSIVE_RATIO * med)).sum(-1).to(dtype)
    else:
        n_massive = torch.zeros_like(max_abs)
    norm = (x * x).sum(-1).sqrt()
    return torch.stack([norm, mean, var, kurt, max_abs, n_out, n_massive], dim=-1)
