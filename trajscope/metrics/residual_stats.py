"""Residual statistics per vector: the one definition (DESIGN.md), in torch alone.

For a residual vector ``x`` (one position at one layer): L2 norm, mean,
population variance, excess kurtosis, max |x|, the count of outliers
``|x| > 6`` (the LLM.int8 rule) and the count of massive activations
``|x| > 100`` and ``|x| > 1000 × m``, where ``m`` is the reference median |x|
of the layer (Sun et al. 2024, "Massive activations in large language models";
DESIGN.md). Callers say which reference they have: a prefill profile passes the
layer's median over its prompt set; capture's prefill kernel pools the median
over every value of the layer's ``[P, d_model]`` block output (``pooled=True``:
the layer's median over the prompt); a decode step, which computes one position,
falls back to that vector's own median |x|. Pooling matters where a sink lives:
on SmolLM2-135M position 0 reaches |x| ≈ 25,000 with its own median |x| above 25,
so against its own median it never counts, while the layer's median over the
prompt is well under 1.

This module imports nothing but torch, because capture ships it by value to the
NDIF server (``nnsight.register``) and runs it inside the step.
"""

from __future__ import annotations

import torch

OUTLIER_ABS = 6.0
MASSIVE_ABS = 100.0
MASSIVE_RATIO = 1000.0
ACT_FIELDS = ("norm", "mean", "var", "kurtosis", "max_abs", "n_outliers", "n_massive")


def residual_stats(x: torch.Tensor, median_abs=None, dtype: torch.dtype = torch.float32,
                   pooled: bool = False) -> torch.Tensor:
    """Per-vector statistics of residual activations.

    Args:
        x: ``[..., d_model]``.
        median_abs: the reference median |x| for the massive rule (a scalar or ``[...]``); None uses
            each vector's own median |x|, or with ``pooled`` the median over all of ``x``.
        dtype: computation dtype (float32 in capture, float64 for profiles).
        pooled: with ``median_abs=None``, take the reference median over every value of ``x`` (one
            layer's positions × dimensions) instead of per vector.
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
