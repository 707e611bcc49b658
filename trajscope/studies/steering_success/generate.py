"""Batched steered decoding and teacher-forced scoring for the steering-success study, on one shared prefill.

Steering in this study starts at decode step ``k ≥ 1``, so the prompt (step 0) is never steered
and its forward is the same in every arm. :func:`prefill` runs it once per batch of prompts
(padded on the **left**, so the prompts' last tokens share a column and every later column
belongs to the same query step in every row; position ids count real tokens only) and keeps the
KV cache and the last prompt logits. Each arm then continues from a copy of that cache:

- :func:`steered_greedy`: greedy continuations of ``n_new`` tokens after an optional forced
  prefix (the base run's first ``k`` tokens, which a vector switched on at step ``k`` cannot
  change), every row running all ``n_new`` steps (no stop at EOS);
- :func:`continuation_logits`: teacher-forced logits that predict each token of given
  continuations (optionally steered).

Query steps follow :mod:`trajscope.positions`: the query at ``pos = P + s − 1`` is step ``s``. A
vector is applied with the same kernel and hooks as :func:`trajscope.model.forward.forward`, so each
row computes what it would at batch 1 within the floating-point floor of a different matmul shape
(tested against :func:`trajscope.capture`).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from typing import Any, Sequence

import torch

from trajscope.errors import TrajscopeError
from trajscope.model.batch import _padded
from trajscope.model.forward import _device, _hooks, steer_specs


@dataclasses.dataclass
class Prefilled:
    """One batch of prompts after the shared prefill.

    Attributes:
        rows: indices of the batch's prompts in the list given to :func:`prefill`.
        att: ``[B, n]`` attention mask of the left-padded prompts.
        cache: the KV cache after the prompts (copied, never changed, by each arm).
        last_logits: ``[B, vocab]`` next-token logits at each prompt's last token (step 0).
    """

    rows: list[int]
    att: torch.Tensor
    cache: Any
    last_logits: torch.Tensor

    @property
    def lens(self) -> torch.Tensor:
        return self.att.sum(-1)


def prefill(model: Any, prompts: Sequence[Sequence[int]], batch_size: int = 16, on_batch: Any = None) -> list[Prefilled]:
    """The unsteered prefill of ``prompts`` in batches of ``batch_size``."""
    hf = model._local("Batched steered decoding")
    dev = _device(hf)
    out = []
    for start in range(0, len(prompts), batch_size):
        rows = list(range(start, min(len(prompts), start + batch_size)))
        ids, att = _padded(model, [list(prompts[i]) for i in rows], "left")
        with torch.no_grad():
            res = hf(input_ids=ids.to(dev), attention_mask=att.to(dev),
                     position_ids=(att.cumsum(-1) - 1).clamp_min(0).to(dev), use_cache=True, logits_to_keep=1)
        out.append(Prefilled(rows, att, res.past_key_values, res.logits[:, -1].float().cpu()))
        if on_batch is not None:
            on_batch(len(rows))
    return out


@contextlib.contextmanager
def _steering(model: Any, hf: Any, vector: Any, steps: torch.Tensor):
    specs = steer_specs(model, [vector] if vector is not None else [])
    with _hooks(model, hf, steer=specs, steps=steps, layers=set(), splice=None, masks=None, grabbed={}):
        yield


def _check(vector: Any) -> None:
    if vector is not None and vector.start_step < 1:
        raise TrajscopeError("The steering-success study steers decode only (start_step ≥ 1); the prefill is shared.")


def _feed(model: Any, hf: Any, b: Prefilled, cache: Any, att: torch.Tensor, tokens: torch.Tensor, first_step: int,
          vector: Any) -> tuple[Any, torch.Tensor, Any]:
    """Run ``tokens [B, m]`` (query steps ``first_step …``) after ``cache``; returns (att, logits [B, m, V], cache)."""
    m = tokens.shape[1]
    dev = _device(hf)
    att = torch.cat([att, torch.ones(att.shape[0], m, dtype=att.dtype)], dim=1)
    pos = b.lens[:, None] + (first_step - 1) + torch.arange(m)[None, :]
    with _steering(model, hf, vector, torch.arange(first_step, first_step + m)):
        res = hf(input_ids=tokens.to(dev), attention_mask=att.to(dev), position_ids=pos.to(dev),
                 past_key_values=cache, use_cache=True)
    return att, res.logits.float().cpu(), res.past_key_values


def steered_greedy(model: Any, batches: list[Prefilled], vector: Any, n_new: int, *,
                   prefix: Sequence[Sequence[int]] | None = None, on_batch: Any = None) -> list[list[int]]:
    """Greedy continuations under ``vector`` (None: unsteered) from the shared prefill.

    Args:
        batches: :func:`prefill` of the prompts.
        vector: a :class:`~trajscope.steering.SteeringVector` with ``start_step ≥ 1``, or None.
        n_new: tokens to generate after the prefix (≥ 1).
        prefix: per prompt, forced continuation tokens (all of one length k: query steps 1 … k, steered
            where the vector is active).
        on_batch: called with the number of rows after each batch.
    Returns:
        Per prompt, ``prefix + new tokens`` (``k + n_new`` ids).
    """
    _check(vector)
    if n_new < 1:
        raise TrajscopeError(f"n_new must be at least 1, not {n_new}.")
    n_rows = sum(len(b.rows) for b in batches)
    prefix = [list(p) for p in prefix] if prefix is not None else [[] for _ in range(n_rows)]
    k = len(prefix[0]) if prefix else 0
    if len(prefix) != n_rows or any(len(p) != k for p in prefix):
        raise TrajscopeError("Every prompt needs a forced prefix of the same length.")
    hf = model._local("Batched steered decoding")
    out: list[list[int]] = [[] for _ in range(n_rows)]
    with torch.no_grad():
        for b in batches:
            cache, att = copy.deepcopy(b.cache), b.att
            gen = [list(prefix[i]) for i in b.rows]
            if k:
                att, logits, cache = _feed(model, hf, b, cache, att, torch.tensor([prefix[i] for i in b.rows]), 1, vector)
                nxt = logits[:, -1].argmax(-1)
            else:
                nxt = b.last_logits.argmax(-1)  # step 0: never steered
            for s in range(n_new):
                for g, t in zip(gen, nxt.tolist()):
                    g.append(int(t))
                if s == n_new - 1:
                    break
                att, logits, cache = _feed(model, hf, b, cache, att, nxt[:, None], k + s + 1, vector)
                nxt = logits[:, -1].argmax(-1)
            for i, g in zip(b.rows, gen):
                out[i] = g
            if on_batch is not None:
                on_batch(len(b.rows))
    return out


def continuation_logits(model: Any, batches: list[Prefilled], conts: Sequence[Sequence[int]], vector: Any = None, *,
                        on_batch: Any = None) -> list[torch.Tensor]:
    """Teacher-forced logits that predict each token of ``conts`` after the shared prefill.

    Args:
        batches: :func:`prefill` of the prompts.
        conts: one continuation per prompt, all of one length L ≥ 1.
        vector: steering by query step (``start_step ≥ 1``; None: the unsteered model).
    Returns:
        Per prompt a ``[L, vocab]`` float32 tensor: row j predicts ``conts[j]`` (the logits of query step j;
        row 0 is the prompt's last logits).
    """
    _check(vector)
    n_rows = sum(len(b.rows) for b in batches)
    L = len(conts[0]) if conts else 0
    if L < 1 or len(conts) != n_rows or any(len(c) != L for c in conts):
        raise TrajscopeError("Every prompt needs a continuation of the same, non-zero length.")
    hf = model._local("Batched teacher-forced forward")
    out: list[torch.Tensor] = [torch.empty(0)] * n_rows
    with torch.no_grad():
        for b in batches:
            parts = [b.last_logits[:, None]]
            if L > 1:
                toks = torch.tensor([list(conts[i][:L - 1]) for i in b.rows])
                parts.append(_feed(model, hf, b, copy.deepcopy(b.cache), b.att, toks, 1, vector)[1])
            logits = torch.cat(parts, dim=1)
            for j, i in enumerate(b.rows):
                out[i] = logits[j]
            if on_batch is not None:
                on_batch(len(b.rows))
    return out
