"""Batch composition: does a prompt's activation depend on who it is batched with?

A serving stack batches requests: a prompt shares its forward with neighbours of other
lengths, is padded on the left or right, and sits at some row of the batch. Mathematically
none of this changes its activations (padding is masked, position ids count real tokens);
numerically, matmul shapes and reduction orders change. :func:`batch_composition_study`
runs each prompt alone (batch 1) and co-batched under each condition:

- ``neighbours``: ``shorter`` (the prompt is the longest; no padding on its row),
  ``longer`` (it is padded), ``mixed`` (one of each, alternating), ``copies`` (identical
  copies of itself: a control with no padding and identical inputs);
- ``padding_side``: ``left`` / ``right``;
- ``slot``: the prompt's row, ``first`` or ``last``.

Columns of the deltas frame: ``prompt_id``, ``neighbours``, ``padding_side``, ``slot``,
``batch_size``, ``n_pad`` (padding tokens on the prompt's row), ``layer``, ``pos``, ``l2``,
``rel_l2``, ``cos`` (batch-1 is the reference), ``greedy_ref`` / ``greedy`` (argmax next
token alone / co-batched), ``greedy_diverged``, and provenance columns.

Columns of the bands frame (one row per prompt, layer and position): ``rel_spread`` =
sqrt(mean_c ‖x_c − x̄‖²) / ‖x̄‖ over the alone run and every condition (the variance band of
the prompt's activation across batch compositions), ``rel_l2_max`` over conditions and
``n_conditions``.
"""

from __future__ import annotations

from typing import Any, Sequence

import polars as pl
import torch

from trajscope.errors import TrajscopeError
from trajscope.studies.common import Provenance, delta_frame

NEIGHBOURS = ("shorter", "longer", "mixed", "copies")
SLOTS = ("first", "last")
SIDES = ("left", "right")


def pick_neighbours(target: int, lengths: Sequence[int], kind: str, k: int) -> list[int] | None:
    """Indices of ``k`` neighbours for prompt ``target`` of the given kind (None when the set has none).

    ``shorter``/``longer``: prompts strictly shorter/longer than the target, the most different
    in length first; ``mixed``: alternately the longest and the shortest other prompts (needs both);
    ``copies``: the target itself ``k`` times.
    """
    if kind not in NEIGHBOURS:
        raise TrajscopeError(f"Unknown neighbour kind '{kind}'; use one of {', '.join(NEIGHBOURS)}.")
    if kind == "copies":
        return [target] * k
    L = lengths[target]
    short = sorted((i for i, n in enumerate(lengths) if n < L), key=lambda i: lengths[i])
    long = sorted((i for i, n in enumerate(lengths) if n > L), key=lambda i: -lengths[i])
    if kind == "mixed":
        if not short or not long:
            return None
        pool = [x for pair in zip(long, short) for x in pair] + long[len(short):] + short[len(long):]
    else:
        pool = short if kind == "shorter" else long
    if not pool:
        return None
    return [pool[i % len(pool)] for i in range(k)]


def batch_composition_study(model: Any, prompts: Sequence[tuple[str, list[int]]], *, batch_size: int = 4,
                            neighbours: Sequence[str] = NEIGHBOURS, sides: Sequence[str] = SIDES,
                            slots: Sequence[str] = SLOTS, layers: Sequence[int] | None = None,
                            progress: Any = None) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Each prompt alone vs co-batched under every (neighbours, padding side, slot) condition.

    Args:
        model: a local :class:`~trajscope.model.ModelHandle`.
        prompts: ``(prompt_id, token ids)`` pairs; neighbours are drawn from the same set.
        batch_size: rows per batch (≥ 2).
        neighbours, sides, slots: the conditions to run (module docstring).
        layers: blocks to compare (default all).
        progress: optional callable ``(done, total)``.
    Returns:
        ``(deltas, bands)`` frames (columns in the module docstring).
    """
    if batch_size < 2:
        raise TrajscopeError(f"A batch-composition study needs batch_size of at least 2, not {batch_size}.")
    layers = list(range(model.n_layers)) if layers is None else [int(x) for x in layers]
    lengths = [len(ids) for _, ids in prompts]
    frames, bands = [], []
    for t, (pid, ids) in enumerate(prompts):
        alone = model.forward(ids, layers=layers)
        seen = [alone.resid]
        for kind in neighbours:
            others = pick_neighbours(t, lengths, kind, batch_size - 1)
            if others is None:
                continue
            for side in sides:
                for slot in slots:
                    if kind == "copies" and slot != slots[0]:
                        continue  # identical rows: the slot cannot matter, one is enough
                    rows = [t, *others] if slot == "first" else [*others, t]
                    me = 0 if slot == "first" else len(rows) - 1
                    out = model.forward_batch([prompts[i][1] for i in rows], padding_side=side, layers=layers)[me]
                    seen.append(out.resid)
                    prov = Provenance.of(model, batch_size=len(rows), padding_side=side)
                    df = delta_frame(alone.resid, out.resid, logits_a=alone.logits, logits_b=out.logits, prompt_id=pid,
                                     neighbours=kind, padding_side=side, slot=slot,
                                     n_pad=max(lengths[i] for i in rows) - len(ids))
                    frames.append(prov.with_columns(df))
        bands.append(_bands(pid, seen))
        if progress is not None:
            progress(t + 1, len(prompts))
    if not frames:
        raise TrajscopeError("No batch condition could be built; the prompt set needs prompts of different lengths.")
    return pl.concat(frames, how="vertical_relaxed"), pl.concat(bands)


def _bands(pid: str, runs: list[dict[int, torch.Tensor]]) -> pl.DataFrame:
    """Spread of one prompt's activations across runs, per layer and position."""
    cols: dict[str, list] = {"layer": [], "pos": [], "rel_spread": [], "rel_l2_max": []}
    for layer in sorted(runs[0]):
        x = torch.stack([r[layer].double() for r in runs])  # [C, T, d]
        mean = x.mean(0)
        norm = mean.norm(dim=-1).clamp_min(1e-12)
        spread = ((x - mean).pow(2).sum(-1).mean(0)).sqrt() / norm
        worst = (x - x[0]).norm(dim=-1).amax(0) / x[0].norm(dim=-1).clamp_min(1e-12)
        cols["layer"] += [layer] * x.shape[1]
        cols["pos"] += list(range(x.shape[1]))
        cols["rel_spread"] += spread.tolist()
        cols["rel_l2_max"] += worst.tolist()
    df = pl.DataFrame(cols, schema_overrides={"layer": pl.Int16, "pos": pl.Int32})
    return df.with_columns(prompt_id=pl.lit(pid), n_conditions=pl.lit(len(runs) - 1)).select(
        "prompt_id", "layer", "pos", "rel_spread", "rel_l2_max", "n_conditions")
