"""Attention rows without eager attention: the forward keeps SDPA, rows come from q and K.

trajscope registers an attention implementation, ``"trajscope_rows"``, with
Hugging Face's ``AttentionInterface``. Every attention module of a model loaded
with it (:func:`trajscope.load_model`'s default ``attn="rows"``) computes its
output with the model's fast kernel (``sdpa_attention_forward``, unchanged) and,
beside it, the attention probabilities of only the query rows trajscope reads:

- at a decode step (one query), that query's row;
- at prefill, the last ``n`` query rows (``n`` = :func:`prefill_rows`' setting:
  the window that eviction policies and telemetry use), or every row when the
  setting is None — computed in chunks of query rows, so memory stays
  ``O(H · chunk · k)`` instead of ``O(H · P²)``.

A row is ``softmax(q · Kᵀ · scaling + mask)`` over the keys the query sees, in
float32, from the post-RoPE query and the cached post-RoPE keys the module hands
the kernel (so RoPE, GQA/MQA head sharing (keys repeated per query head) and the
model's own mask — causal, sliding window, padding — are all accounted for). The
rows are returned where eager attention returns its weights, as
``[batch, heads, rows, keys]``: the generation trace reads them unchanged. At a
decode step, and with an explicit per-head mask (the key-mask forward), the
output itself is computed from the same probabilities (``probs · V``, as eager
attention does) instead of by a second pass of SDPA over the keys: at one query
SDPA's CPU kernel is this same math, and the output agrees with it to float
rounding (about 1e-7 relative in float32; tests hold it to the eager reference).

Within :func:`collect_rows` (a local generation trace), every call also appends
its rows to a list, in call order (layer 0 … L − 1 at each step), so the trace
takes a layer's rows from there once it has read the layer's block output,
instead of reading the attention module's output too: one nnsight read per
layer instead of two (``docs/capture_overhead.md``). NDIF and ``remote="local"``
runs serialise the trace, so they keep the module reads.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

ROWS_IMPL = "trajscope_rows"
DEFAULT_PREFILL_ROWS = 32
CHUNK = 256


def register() -> None:
    """Register ``"trajscope_rows"`` with transformers (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    if ROWS_IMPL not in AttentionInterface._global_mapping:
        AttentionInterface.register(ROWS_IMPL, rows_attention_forward)
    if ROWS_IMPL not in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping:
        ALL_MASK_ATTENTION_FUNCTIONS.register(ROWS_IMPL, sdpa_mask)


@contextlib.contextmanager
def prefill_rows(hf_config: Any, n: int | None) -> Iterator[None]:
    """Within the body, prefill computes the last ``n`` query rows (None: all); restored on exit."""
    old = getattr(hf_config, "_trajscope_prefill_rows", DEFAULT_PREFILL_ROWS)
    hf_config._trajscope_prefill_rows = n
    try:
        yield
    finally:
        hf_config._trajscope_prefill_rows = old


@contextlib.contextmanager
def collect_rows(hf_config: Any) -> Iterator[list]:
    """Within the body, each ``"trajscope_rows"`` call appends its rows (``[b, H, n, k]``) to the yielded
    list, in call order; restored on exit."""
    old = getattr(hf_config, "_trajscope_row_sink", None)
    sink: list = []
    hf_config._trajscope_row_sink = sink
    try:
        yield sink
    finally:
        hf_config._trajscope_row_sink = old


def attention_rows(query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None, scaling: float,
                   q_offset: int, chunk: int = CHUNK) -> torch.Tensor:
    """Attention probabilities of chosen query rows, in float32.

    Args:
        query: ``[b, H, n, d]`` the chosen (post-RoPE) query rows.
        key: ``[b, H_kv, k, d]`` all keys; query heads share key heads in groups of ``H / H_kv``.
        mask: None (plain causal), or the model's mask for these rows, ``[b, 1 or H, n, k]``: boolean
            (True = visible) or additive float.
        scaling: the score scale (usually ``d ** −0.5``).
        q_offset: the key index of the first chosen row (row r sees keys ``≤ q_offset + r`` when causal).
        chunk: rows per matmul.
    Returns:
        ``[b, H, n, k]`` float32; each row sums to 1 over its visible keys.
    """
    H, Hkv = query.shape[1], key.shape[1]
    k_f = key.float()
    if H != Hkv:
        k_f = k_f.repeat_interleave(H // Hkv, dim=1)
    n, k = query.shape[2], key.shape[2]
    out = []
    for s in range(0, n, chunk):
        q = query[:, :, s:s + chunk].float()
        scores = torch.matmul(q, k_f.transpose(-1, -2)) * scaling
        if mask is None and q_offset + s + q.shape[2] == k and q.shape[2] == 1:
            pass  # the newest query sees every cached key: nothing to hide
        elif mask is None:
            rows = torch.arange(q_offset + s, q_offset + s + q.shape[2], device=q.device)
            hide = torch.arange(k, device=q.device)[None, :] > rows[:, None]
            scores = scores.masked_fill(hide, float("-inf"))
        else:
            m = mask[:, :, s:s + chunk, :k]
            scores = scores.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else scores + m.float()
        out.append(torch.softmax(scores, dim=-1))
    return out[0] if len(out) == 1 else torch.cat(out, dim=2)


def rows_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                           attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                           **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The ``"trajscope_rows"`` attention: SDPA output plus the rows trajscope reads (module docstring)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    q_len, k_len = query.shape[2], key.shape[2]
    per_head = attention_mask is not None and attention_mask.dim() == 4 and attention_mask.shape[1] > 1
    sink = getattr(module.config, "_trajscope_row_sink", None)
    if q_len == 1 or per_head:  # the output from the row itself: one pass over the keys, not two
        rows = attention_rows(query, key, attention_mask, scaling, k_len - q_len)
        v = value.repeat_interleave(query.shape[1] // value.shape[1], dim=1) if value.shape[1] != query.shape[1] else value
        out = torch.matmul(rows.to(value.dtype), v).transpose(1, 2).contiguous()
    else:
        out, _ = sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                        **kwargs)
        want = getattr(module.config, "_trajscope_prefill_rows", DEFAULT_PREFILL_ROWS)
        n = q_len if want is None else max(1, min(q_len, int(want)))
        mask = None if attention_mask is None else attention_mask[:, :, q_len - n:, :]
        rows = attention_rows(query[:, :, q_len - n:], key, mask, scaling, k_len - n)
    if sink is not None:
        sink.append(rows)
    return out, rows
