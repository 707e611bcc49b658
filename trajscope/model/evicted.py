"""Decoding with evicted prompt keys: from a shared prefill, and one step at a time over an unmasked history.

Two operations of the model boundary that KV-eviction studies need beside the key-mask forward of
:mod:`trajscope.model.forward` (whose ``key_mask`` semantics they share):

- :func:`decode_on_cache`: greedy decoding after a prefill that is already done (a long prompt is read once for
  many policies and budgets), every decode query seeing only the kept prompt keys;
- :func:`per_step_logits`: the **per-step** arm of eviction damage. At each decode step only the current query
  attends over the masked prompt; the generated history it reads (keys and values of positions ``P … p−1``) is
  the full run's, computed unmasked. Against the teacher-forced masked forward — the **accumulated** arm, where
  the history's states were computed under the mask too — it separates "the query needs an evicted key now" from
  "damage carried forward by generated tokens' states".
"""

from __future__ import annotations

import copy
from typing import Any, Sequence

import torch

from trajscope.model.forward import ForwardResult, forward


def decode_on_cache(model: Any, prompt_len: int, prefill: ForwardResult, n_new: int, key_mask: torch.Tensor | None,
                    *, rows: bool = False) -> tuple[list[int], torch.Tensor | None]:
    """Greedy decode after a prefill that is already done; decode queries see only the keys ``key_mask`` keeps.

    The prefill (``forward(prompt, return_cache=True)``) is shared by every caller, so a long prompt is read
    once for many key masks; its cache is copied, never changed. The first token is the prefill's greedy choice.

    Args:
        prompt_len: P. ``n_new``: tokens to generate (EOS does not stop it).
        key_mask: ``[L, H, ≥P]`` keys the decode queries may see (None: every key).
        rows: also return the rows of the ``n_new`` generated tokens' queries (one forward more than decoding
            needs) over the prompt keys — every prompt key, the hidden ones too (``attn="rows"``).
    Returns:
        ``(tokens, rows)``: the generated ids and, with ``rows``, ``[L, H, n_new, P]`` float32 (else None).
    """
    P = int(prompt_len)
    ids = [int(prefill.logits[-1].argmax())]
    got = []
    cache = copy.deepcopy(prefill.cache)
    for t in range(n_new - 1 + int(rows)):
        out = forward(model, [ids[-1]], prompt_len=P, key_mask=key_mask, past=cache, attention_rows=int(rows),
                      rows_unmasked=rows and key_mask is not None, _inplace=True)
        if rows:
            got.append(torch.stack([out.attn[layer][:, -1, :P] for layer in sorted(out.attn)]))
        if t < n_new - 1:
            ids.append(int(out.logits[-1].argmax()))
    return ids, (torch.stack(got, dim=2) if rows else None)


def per_step_logits(model: Any, token_ids: Sequence[int], prompt_len: int, key_mask: torch.Tensor) -> torch.Tensor:
    """Next-token logits of each decode query ``p = P … T−2`` when only that query sees the masked prompt.

    The full run's cache over ``token_ids[:-1]`` is built once (no mask); then, from the last query back to the
    first, the cache is cropped to positions ``< p`` and the query at ``p`` runs alone with the key mask (its own
    key and value join the cache and are cropped away at the next, earlier, query). So the history every query
    reads is exactly the full run's.

    Args:
        token_ids: prompt + continuation, ``T`` tokens (the continuation teacher-forced).
        prompt_len: P. ``key_mask``: ``[L, H, ≥T]`` keys decode queries may see.
    Returns:
        ``[T − 1 − P, vocab]`` float32: row ``s − 1`` is decode step ``s``'s next-token logits.
    """
    ids = list(token_ids)
    P = int(prompt_len)
    cache = forward(model, ids[:-1], return_cache=True).cache
    out = []
    for p in range(len(ids) - 2, P - 1, -1):
        cache.crop(p - cache.get_seq_length())  # a negative count removes the newest entries
        out.append(forward(model, [ids[p]], prompt_len=P, key_mask=key_mask, past=cache, _inplace=True).logits[-1])
    return torch.stack(out[::-1]) if out else torch.zeros(0, 0)
