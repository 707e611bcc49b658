"""Chunked vs monolithic prefill: does prefilling in chunks change the prompt's activations?

Serving stacks split long prompts into chunks of ``c`` tokens, each run through the KV cache
of the previous ones (vLLM / SGLang chunked prefill). Mathematically the result equals one
pass; numerically each chunk's attention and matmuls have other shapes. With ``c ≥`` the
prompt length it is one pass and must be bitwise identical.

:func:`chunked_prefill_study` columns: ``prompt_id``, ``chunk``, ``layer``, ``pos``,
``chunk_index`` (``pos // chunk``), ``pos_in_chunk``, ``l2``, ``rel_l2``, ``cos`` (the
monolithic pass is the reference), ``greedy_ref``, ``greedy``, ``greedy_diverged``, and
provenance columns.
"""

from __future__ import annotations

from typing import Any, Sequence

import polars as pl

from trajscope.errors import TrajscopeError
from trajscope.studies.common import Provenance, delta_frame

DEFAULT_CHUNKS = (1, 4, 16, 64)


def check_chunks(chunks: Sequence[int]) -> list[int]:
    """The chunk sizes as ints; one clear error for an empty list or a size ≤ 0."""
    out = []
    for c in chunks:
        if isinstance(c, bool) or int(c) != c or int(c) <= 0:
            raise TrajscopeError(f"Chunk sizes must be positive whole numbers of tokens; got {c!r}.")
        out.append(int(c))
    if not out:
        raise TrajscopeError("Give at least one chunk size.")
    return sorted(set(out))


def chunked_prefill_study(model: Any, prompts: Sequence[tuple[str, list[int]]], *,
                          chunks: Sequence[int] = DEFAULT_CHUNKS, layers: Sequence[int] | None = None,
                          progress: Any = None) -> pl.DataFrame:
    """Each prompt prefilled in chunks of each size vs in one pass; deltas per layer and position.

    Args:
        model: a local :class:`~trajscope.model.ModelHandle`.
        prompts: ``(prompt_id, token ids)`` pairs.
        chunks: chunk sizes in tokens (each > 0).
        layers: blocks to compare (default all).
        progress: optional callable ``(done, total)``.
    """
    sizes = check_chunks(chunks)
    layers = list(range(model.n_layers)) if layers is None else [int(x) for x in layers]
    frames = []
    for n, (pid, ids) in enumerate(prompts):
        mono = model.forward(ids, layers=layers)
        for c in sizes:
            out = model.prefill_chunks(ids, c, layers=layers)
            df = delta_frame(mono.resid, out.resid, logits_a=mono.logits, logits_b=out.logits, prompt_id=pid, chunk=c)
            df = df.with_columns(chunk_index=pl.col("pos") // c, pos_in_chunk=pl.col("pos") % c)
            frames.append(Provenance.of(model, chunk=c).with_columns(df))
        if progress is not None:
            progress(n + 1, len(prompts))
    return pl.concat(frames, how="vertical_relaxed")
