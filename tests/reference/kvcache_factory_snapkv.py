"""KVCache-Factory's SnapKV selection, vendored for tests only (never imported by trajscope).

Source: github.com/Zefan-Cai/KVCache-Factory, commit c97f9d706d63d1b56e980f8b81b2a924c21162b3,
``pyramidkv/pyramidkv_utils.py``, ``SnapKVCluster.update_kv`` (its query-head path: the default
``kv_cache_granularity="query_head"``, where ``maybe_repeat_kv_before_cache`` has already repeated the KV
heads to the query heads, so ``_gqa_groups`` is 1). MIT License, Copyright (c) 2024 Zefan Cai; the license text
is reproduced at the end of this docstring.

The scoring and selection lines below are the reference's, verbatim, in their order. What is left out: the
``q_len < max_capacity_prompt`` early return is kept; the ``merge`` branch and the gather of key/value states
are replaced by returning what they gather with: the ``indices`` of the kept prefix positions and the window,
so a test can compare kept *sets* (the cache the reference builds is ``key_states[..., indices]`` followed by
the last ``window_size`` positions).

MIT License

Copyright (c) 2024 Zefan Cai

Permission is hereby granted, free of charge, to any person obtaining a copy of this software and associated
documentation files (the "Software"), to deal in the Software without restriction, including without limitation
the rights to use, copy, modify, merge, publish, distribute, sublicense, and/or sell copies of the Software, and to
permit persons to whom the Software is furnished to do so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in all copies or substantial portions of
the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED, INCLUDING BUT NOT LIMITED TO THE
WARRANTIES OF MERCHANTABILITY, FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE AUTHORS
OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR
OTHERWISE, ARISING FROM, OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE SOFTWARE.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def snapkv_kept(key_states, query_states, window_size, max_capacity_prompt, kernel_size=5, pooling="avgpool"):
    """``SnapKVCluster.update_kv``'s kept positions: ``[bsz, num_heads, P]`` bool (True = in the cache)."""
    assert key_states.shape[-2] == query_states.shape[-2]
    bsz, num_heads, q_len, head_dim = query_states.shape
    kept = torch.ones(bsz, num_heads, q_len, dtype=torch.bool)
    if q_len < max_capacity_prompt:
        return kept
    # --- verbatim from update_kv ---
    attn_weights = torch.matmul(query_states[..., -window_size:, :], key_states.transpose(2, 3)) / math.sqrt(head_dim)
    mask = torch.full((window_size, window_size), torch.finfo(attn_weights.dtype).min, device=attn_weights.device)
    mask_cond = torch.arange(mask.size(-1), device=attn_weights.device)
    mask.masked_fill_(mask_cond < (mask_cond + 1).view(mask.size(-1), 1), 0)
    mask = mask.to(attn_weights.device)
    attention_mask = mask[None, None, :, :]

    attn_weights[:, :, -window_size:, -window_size:] += attention_mask

    attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query_states.dtype)
    attn_weights_sum = attn_weights[:, :, -window_size:, : -window_size].sum(dim=-2)
    if pooling == 'avgpool':
        attn_cache = F.avg_pool1d(attn_weights_sum, kernel_size=kernel_size, padding=kernel_size // 2, stride=1)
    elif pooling == 'maxpool':
        attn_cache = F.max_pool1d(attn_weights_sum, kernel_size=kernel_size, padding=kernel_size // 2, stride=1)
    else:
        raise ValueError('Pooling method not supported')
    indices = attn_cache.topk(max_capacity_prompt - window_size, dim=-1).indices
    # --- end verbatim: the cache is key_states[:, :, :-window_size].gather(indices) + the last window_size ---
    kept = torch.zeros(bsz, num_heads, q_len, dtype=torch.bool)
    kept[..., :-window_size].scatter_(-1, indices, True)
    kept[..., -window_size:] = True
    return kept
