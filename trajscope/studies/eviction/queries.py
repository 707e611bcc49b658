"""The queries that query-scored eviction policies score with.

Greedy decoding on an evicted cache from a shared prefill is the model boundary's
(:meth:`~trajscope.model.ModelHandle.decode_on_cache`).

- :func:`laq_rows`: LAQ's draft (Lookahead Q-Cache; :mod:`trajscope.metrics.eviction_laq` cites the reference
  code): SnapKV with max pooling (kernel 7) compresses the prompt at the budget, ``m`` tokens are drafted greedily
  on that cache (the first from the full prefill), and the draft queries' rows over the full prompt keys are what
  LAQ's stage 2 scores with.
- :func:`pseudo_rows`: DapQ-style position-aware pseudo queries: the last ``m`` prompt tokens appended again, at
  positions ``P … P+m−1`` (exactly ``m`` of them), their rows over the prompt keys.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from trajscope.errors import TrajscopeError
from trajscope.metrics import eviction as ev
from trajscope.metrics.eviction_laq import KERNEL


def laq_rows(model: Any, prompt_ids: Sequence[int], prefill: Any, prefill_rows: torch.Tensor, budget: float | int,
             *, window: int, m: int, per_head: bool = True,
             draft_window: int | None = None) -> tuple[list[int], torch.Tensor]:
    """LAQ's draft on the SnapKV-compressed cache and its queries' rows over the full prompt keys.

    Args:
        prefill: the prompt's forward with its cache (``model.forward(prompt, return_cache=True)``).
        prefill_rows: ``[L, H, n, P]`` the last ``n ≥ draft_window`` prompt queries' rows (stage 1's scores).
        budget: the budget of stage 1 (LAQ compresses to the same budget it will keep).
        window: stage 2's window; ``draft_window``: stage 1's (default: the same).
        m: draft length (``lookahead_size``).
    Returns:
        ``(draft_ids, rows)``: the ``m`` draft tokens and ``[L, H, m, P]`` rows to pass as ``query_rows`` to
        :func:`~trajscope.metrics.eviction.select` with ``"lookahead"``.
    """
    P = len(prompt_ids)
    stage1 = ev.select("snapkv", prefill_rows, budget, window=draft_window or window, per_head=per_head,
                       pooling=("max", KERNEL))
    return model.decode_on_cache(P, prefill, m, ev.key_mask(stage1, P + m), rows=True)


def pseudo_rows(model: Any, prompt_ids: Sequence[int], m: int, prefill: Any = None) -> torch.Tensor:
    """``[L, H, m, P]``: rows over the prompt keys of the last ``m`` prompt tokens placed again at ``P … P+m−1``.

    With ``prefill`` (the prompt's forward with ``return_cache=True``) the m tokens run on a copy of its cache
    instead of re-reading the prompt.
    """
    ids = list(prompt_ids)
    P = len(ids)
    if not 1 <= m <= P:
        raise TrajscopeError(f"Pseudo queries repeat the last m prompt tokens; m = {m} must be in 1..{P}.")
    if prefill is not None:
        out = model.forward(ids[P - m:], past=prefill.cache, attention_rows=m).attn
    else:
        out = model.forward(ids + ids[P - m:], attention_rows=m).attn
    return torch.stack([out[layer][:, :, :P] for layer in sorted(out)])
