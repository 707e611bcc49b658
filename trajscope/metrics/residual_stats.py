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
on SmolLM2-135M (a 47-token chat prompt) position 0 reaches |x| ≈ 25,000 in layers
11–27 with its own median |x| of 48–55, so against its own median it never counts
(25,000 < 1000 × 48), while the layer's median over the prompt is 1.9–10.8 there
(0.7–14.4 over all 30 layers, rising with depth), and it counts in each of them.

At prefill the kernel runs on every layer's ``[P, d_model]`` block, so it is written for few passes:
one ``[..., d]`` temporary is reused for the centred values, their squares and fourth powers, |x|,
the outlier comparison and x²; a count is a comparison written into that float buffer and summed
(a bool tensor's sum would copy the block to int64); and the massive rule, with its median, looks
only at the vectors whose max |x| passes the absolute bar. Every statistic is computed by the same
torch operation on the same values as the definition written out one statistic at a time, so the
results are the same bits (``tests/test_residual_stats.py``).

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
    with torch.no_grad():  # statistics, never differentiated; out= and in-place need it under autograd
        return _stats(x.to(dtype), median_abs, dtype, pooled)


def _stats(x, median_abs, dtype, pooled):
    """:func:`residual_stats` on ``x`` already in ``dtype``: one ``[..., d]`` temporary, reused."""
    mean = x.mean(-1)
    buf = x - mean.unsqueeze(-1)  # the one [..., d] temporary: centred values, then c², c⁴, |x|, ...
    c2 = buf.mul_(buf)
    var = c2.mean(-1)
    m4 = c2.mul_(c2).mean(-1)
    kurt = torch.where(var > 0, m4 / var.pow(2).clamp_min(1e-30) - 3.0, torch.zeros_like(var))
    ax = torch.abs(x, out=buf)
    max_abs = ax.amax(-1)
    # a comparison written into a float buffer and summed is exact (counts ≤ d) and avoids a bool
    # tensor, whose sum goes through an int64 copy of the whole block
    n_out = torch.gt(ax, OUTLIER_ABS, out=buf).sum(-1)
    norm = torch.mul(x, x, out=buf).sum(-1).sqrt()
    n_massive = _n_massive(x, max_abs, median_abs, dtype, pooled)
    return torch.stack([norm, mean, var, kurt, max_abs, n_out, n_massive], dim=-1)


def _n_massive(x, max_abs, median_abs, dtype, pooled):
    """The count of ``|x| > MASSIVE_ABS`` and ``|x| > MASSIVE_RATIO × m`` per vector.

    Only a vector whose max |x| passes the absolute bar (or is NaN) can count, so the comparison
    runs on those vectors alone (at prefill: the sink and a few others among P), picked by index
    with one host sync (``nonzero``), as many as the unfused rule's ``any``; the reference median is
    the same element as over the whole of ``x``. Off the CPU, :func:`_n_massive_dense`: the same counts with
    no host sync.
    """
    if x.device.type != "cpu":
        return _n_massive_dense(x, median_abs, dtype, pooled)
    d = x.shape[-1]
    flat_max = max_abs.reshape(-1)
    idx = (~(flat_max <= MASSIVE_ABS)).nonzero().squeeze(-1)  # > the bar, or NaN
    n_massive = torch.zeros_like(flat_max)
    if idx.numel() == 0:  # the median only matters where some |x| passes the absolute bar
        return n_massive.reshape(max_abs.shape)
    ax = x.reshape(-1, d).index_select(0, idx).abs()  # [k, d]
    bar = _massive_bar(ax, median_abs, max_abs.shape, dtype, pooled, whole=x, idx=idx)
    counts = torch.gt(ax, bar, out=ax).sum(-1)
    return n_massive.index_copy_(0, idx, counts).reshape(max_abs.shape)


def _n_massive_dense(x, median_abs, dtype, pooled):
    """:func:`_n_massive` over every vector, with no host sync (a GPU compares the whole block at once, and a
    sync would stop the host queueing the forward's next kernels). The same counts: a vector whose max |x|
    is at most the absolute bar counts nothing either way, and each reference median is the same element.
    """
    ax = x.abs()
    bar = _massive_bar(ax, median_abs, x.shape[:-1], dtype, pooled)
    return torch.gt(ax, bar, out=ax).sum(-1)


def _massive_bar(ax, median_abs, shape, dtype, pooled, whole=None, idx=None):
    """The massive rule's bar per vector: |x| > 100 and |x| > 1000 × m  ⟺  |x| > max(100, 1000 × m) (a NaN m
    fails both ways).

    Args:
        ax: |x| of the vectors compared, ``[k, d]`` (the block's vectors ``idx``) or the whole block.
        median_abs: the caller's reference median (scalar or per vector, broadcast to ``shape``), or None.
        shape: the block's vector shape (``x.shape[:-1]``).
        pooled: with ``median_abs=None``, m is the median |x| over the whole block (``whole``, else ``ax``).
        whole: the whole block, when ``ax`` holds only some of its vectors.
        idx: which of the block's vectors (flattened) ``ax``'s rows are; None: all, in order.
    Returns:
        a tensor that broadcasts against ``ax``.
    """
    if median_abs is None and pooled:
        med = (ax if whole is None else whole.abs()).reshape(-1).median()
    elif median_abs is None:
        med = ax.median(-1).values.unsqueeze(-1)
    else:
        med = torch.as_tensor(median_abs, dtype=dtype, device=ax.device)
        if med.dim() > 0:
            med = torch.broadcast_to(med, shape)
            med = (med if idx is None else med.reshape(-1).index_select(0, idx)).unsqueeze(-1)
    return torch.maximum(MASSIVE_RATIO * med, torch.tensor(MASSIVE_ABS, dtype=dtype, device=ax.device))
