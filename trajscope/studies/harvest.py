"""Activation harvest the way a serving stack produces it: batched, chunked or prefix-cached.

:func:`harvest_served` collects block outputs of every prompt position under one serving
configuration and records it on every row:

- ``batch_size`` > 1: prompts go through one padded batch forward (``padding_side`` left or
  right; position ids count real tokens, as the model boundary's ``forward_batch`` does) that
  **stops after the deepest harvested block** (:func:`trajscope.model.batch.batch_to_layer`): the blocks after it and
  the unembedding over every position (a ``[B, n, vocab]`` logits tensor) are never computed, and
  the block outputs equal ``forward_batch``'s exactly (tested); per-prompt results equal batch 1
  within the floor;
- ``chunk`` > 0: each prompt is prefilled through the KV cache ``chunk`` tokens at a time;
- ``prefix_cache`` = ``"warm"`` / ``"cold"``: leading tokens shared with the cache are reused
  (:func:`trajscope.studies.prefix_cache.plan_reuse`), so their activations are never
  produced; their rows say ``status = "reused"`` and have no activation (``act_row`` null).

Rows (one per prompt position): ``prompt_id``, ``pos``, ``token_id``, ``status`` (computed /
reused), ``act_row`` (index into ``acts[layer]``), ``n_computed`` and ``n_reused`` of the
prompt, and the :class:`~trajscope.studies.common.Provenance` columns (``dtype``, ``device``,
``tf32``, ``deterministic``, ``threads``, ``batch_size``, ``padding_side``, ``chunk``, ``prefix_cache``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import polars as pl
import torch

from trajscope.errors import TrajscopeError
from trajscope.model.batch import batch_to_layer
from trajscope.studies.common import Provenance
from trajscope.studies.prefix_cache import plan_reuse


@dataclasses.dataclass
class ServedHarvest:
    """Activations ``acts {layer: [N, d_model]}`` (computed positions only) and one row per position."""

    acts: dict[int, torch.Tensor]
    rows: pl.DataFrame
    provenance: Provenance

    def per_prompt(self, layer: int) -> dict[str, torch.Tensor]:
        """``{prompt_id: [n_computed, d_model]}`` at ``layer``, in position order."""
        comp = self.rows.filter(pl.col("status") == "computed")
        return {pid: self.acts[layer][g["act_row"].to_torch()] for (pid,), g in comp.group_by("prompt_id", maintain_order=True)}


def harvest_served(model: Any, prompts: Sequence[tuple[str, list[int]]], layers: Sequence[int], *, batch_size: int = 1,
                   padding_side: str = "right", chunk: int = 0, prefix_cache: str | None = None,
                   block: int = 1) -> ServedHarvest:
    """Harvest block outputs of ``layers`` at every computed position of every prompt.

    Args:
        model: a :class:`~trajscope.model.ModelHandle` (local).
        prompts: ``(prompt_id, token ids)`` pairs.
        layers: blocks to read.
        batch_size: prompts per forward (padded); > 1 only without ``chunk`` and ``prefix_cache``.
        padding_side: ``left`` or ``right`` (batches).
        chunk: prefill chunk size in tokens; 0 = one pass.
        prefix_cache: None, ``"warm"`` (the set's shared prefix pre-cached) or ``"cold"``.
        block: prefix-cache block size in tokens.
    Returns:
        A :class:`ServedHarvest` (rows as in the module docstring).
    """
    if batch_size < 1:
        raise TrajscopeError(f"The batch size must be at least 1, not {batch_size}.")
    if chunk < 0:
        raise TrajscopeError(f"The chunk size must be a positive number of tokens (or 0 for one pass), not {chunk}.")
    if prefix_cache not in (None, "warm", "cold"):
        raise TrajscopeError(f"prefix_cache must be 'warm', 'cold' or None, not {prefix_cache!r}.")
    if batch_size > 1 and (chunk or prefix_cache):
        raise TrajscopeError("Batched harvest runs whole prompts; use batch_size=1 with a chunk size or a prefix cache.")
    if chunk and prefix_cache:
        raise TrajscopeError("Choose either a chunk size or a prefix cache for one harvest, not both.")
    layers = [int(x) for x in layers]
    seqs = [ids for _, ids in prompts]
    reused = plan_reuse(seqs, warm=prefix_cache == "warm", block=block) if prefix_cache else [0] * len(seqs)
    prov = Provenance.of(model, batch_size=batch_size, padding_side=padding_side, chunk=chunk,
                         prefix_cache=bool(prefix_cache))
    results: list[dict[int, torch.Tensor]] = []
    caches: dict[tuple[int, ...], Any] = {}
    for start in range(0, len(seqs), batch_size):
        group = seqs[start:start + batch_size]
        if batch_size > 1:
            results += batch_to_layer(model, group, layers, padding_side=padding_side)
            continue
        ids, r = group[0], reused[start]
        if r:
            key = tuple(ids[:r])
            if key not in caches:
                caches[key] = model.prefix_cache(list(key))
            results.append(model.forward(ids[r:], past=caches[key], layers=layers).resid)
        elif chunk:
            results.append(model.prefill_chunks(ids, chunk, layers=layers).resid)
        else:
            results.append(model.forward(ids, layers=layers).resid)
    frames, next_row = [], 0
    for (pid, ids), r in zip(prompts, reused):
        n, comp = len(ids), len(ids) - r
        act = [None] * r + list(range(next_row, next_row + comp))
        next_row += comp
        frames.append(pl.DataFrame({
            "prompt_id": [pid] * n, "pos": list(range(n)), "token_id": ids,
            "status": ["reused"] * r + ["computed"] * comp, "act_row": act,
            "n_computed": [comp] * n, "n_reused": [r] * n,
        }, schema_overrides={"pos": pl.Int32, "token_id": pl.Int32, "act_row": pl.Int64}))
    acts = {layer: torch.cat([res[layer] for res in results]) for layer in layers}
    return ServedHarvest(acts, prov.with_columns(pl.concat(frames)), prov)
