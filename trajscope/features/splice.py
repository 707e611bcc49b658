"""Spliced forward: what an SAE's reconstruction error costs the model's next-token prediction.

For a token sequence, run the model twice over the full sequence without a KV
cache, through the model boundary: once clean, once with block ``layer``'s
output ``x`` replaced at every position by the SAE's reconstruction
``x̂ = decode(encode(x))`` (:meth:`~trajscope.model.ModelHandle.forward` with
``splice=``). At each position t:

- ``kl[t] = KL(p_clean ‖ p_spliced) = Σ_v p_clean(v) (log p_clean(v) − log p_spliced(v))``;
- ``ce_increase[t] = −log p_spliced(y) + log p_clean(y)`` with ``y`` the token at t + 1
  (null at the last position).

This is the "spliced-in" loss of SAELens' evaluations, per position.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import polars as pl
import torch

from trajscope.sae.model import SAE


def reconstruct(sae: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    """The splice function of an SAE: hidden ``[..., d]`` → its reconstruction ``sae(hidden)`` (same dtype)."""
    def fn(hidden: torch.Tensor) -> torch.Tensor:
        dtype = sae.W_enc.dtype if hasattr(sae, "W_enc") else hidden.dtype
        return sae(hidden.to(dtype)).to(hidden.dtype)

    return fn


@torch.no_grad()
def splice_sequence(model: Any, token_ids: Sequence[int], layer: int, sae: SAE) -> pl.DataFrame:
    """Per-position KL and CE increase of splicing ``sae`` in at ``layer`` for one sequence.

    Args:
        model: a :class:`~trajscope.model.ModelHandle` (the splice is its ``forward(splice=...)``).
        token_ids: the T token ids (prompt + continuation).
        layer: block index whose output is replaced.
        sae: an SAE whose ``d_in`` is the model width.

    Returns:
        T rows: ``pos``, ``kl`` (nats), ``ce_increase`` (nats; null at the last position).
    """
    ids = list(token_ids)
    clean = model.forward(ids).logits.log_softmax(-1)
    spl = model.forward(ids, splice=(layer, reconstruct(sae))).logits.log_softmax(-1)
    kl = (clean.exp() * (clean - spl)).sum(-1)
    nxt = torch.tensor(ids[1:], dtype=torch.long)
    ce = (clean[:-1].gather(-1, nxt[:, None]) - spl[:-1].gather(-1, nxt[:, None]))[:, 0]
    T = len(ids)
    return pl.DataFrame({"pos": list(range(T)), "kl": kl.double().numpy(),
                         "ce_increase": [*ce.double().tolist(), None]},
                        schema_overrides={"ce_increase": pl.Float64})


def splice_rows(model: Any, sequences: pl.DataFrame, rows: pl.DataFrame, layer: int, sae: SAE,
                progress: Any = None) -> pl.DataFrame:
    """KL and CE increase at each harvest row (``seq``, ``pos``), in the order of ``rows``.

    Args:
        sequences: harvest sequences (``seq``, ``token_ids``).
        rows: harvest rows (``seq``, ``pos``).
        progress: optional callable ``(done, total)``.

    Returns:
        ``rows.height`` rows: ``seq``, ``pos``, ``kl``, ``ce_increase``.
    """
    wanted = rows.select("seq", "pos").with_row_index("_i")
    frames = []
    seqs = sequences.filter(pl.col("seq").is_in(wanted["seq"].unique().implode()))
    for n, (seq, ids) in enumerate(zip(seqs["seq"].to_list(), seqs["token_ids"].to_list()), 1):
        frames.append(splice_sequence(model, ids, layer, sae).with_columns(pl.lit(seq).alias("seq")))
        if progress is not None:
            progress(n, seqs.height)
    per_pos = pl.concat(frames)
    out = wanted.join(per_pos, on=["seq", "pos"], how="left").sort("_i")
    return out.select("seq", "pos", "kl", "ce_increase")
