"""Spliced forward: what an SAE's reconstruction error costs the model's next-token prediction.

For a token sequence, run the plain Hugging Face module twice over the full
sequence without a KV cache: once clean, once with a forward hook on block
``layer`` that replaces the block output ``x`` at every position by the SAE's
reconstruction ``x̂ = decode(encode(x))``. At each position t:

- ``kl[t] = KL(p_clean ‖ p_spliced) = Σ_v p_clean(v) (log p_clean(v) − log p_spliced(v))``;
- ``ce_increase[t] = −log p_spliced(y) + log p_clean(y)`` with ``y`` the token at t + 1
  (null at the last position).

This is the "spliced-in" loss of SAELens' evaluations, per position. The hook is
registered in a context manager and always removed. Pure torch on the HF
module (``ModelHandle.torch_module()``); no nnsight.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Sequence

import polars as pl
import torch

from trajscope.sae.model import SAE


def block_module(hf_model: torch.nn.Module, layer: int, blocks_path: str = "model.layers") -> torch.nn.Module:
    """Block ``layer`` of a Hugging Face causal LM (``blocks_path`` as in ``ModelHandle.family.blocks``)."""
    obj: Any = hf_model
    for part in blocks_path.split("."):
        obj = getattr(obj, part)
    return obj[layer]


@contextlib.contextmanager
def spliced(block: torch.nn.Module, sae: SAE) -> Iterator[None]:
    """Within the context, ``block``'s output is replaced by ``sae(output)``."""

    def hook(_mod: torch.nn.Module, _inp: Any, out: Any) -> Any:
        hidden = out[0] if isinstance(out, tuple) else out
        recon = sae(hidden.to(sae.W_enc.dtype)).to(hidden.dtype)
        return (recon, *out[1:]) if isinstance(out, tuple) else recon

    handle = block.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


@torch.no_grad()
def splice_sequence(hf_model: torch.nn.Module, token_ids: Sequence[int], layer: int, sae: SAE,
                    blocks_path: str = "model.layers") -> pl.DataFrame:
    """Per-position KL and CE increase of splicing ``sae`` in at ``layer`` for one sequence.

    Args:
        hf_model: the Hugging Face causal LM module.
        token_ids: the T token ids (prompt + continuation).
        layer: block index whose output is replaced.
        sae: an SAE whose ``d_in`` is the model width.
        blocks_path: attribute path of the block list.

    Returns:
        T rows: ``pos``, ``kl`` (nats), ``ce_increase`` (nats; null at the last position).
    """
    ids = torch.tensor([list(token_ids)], dtype=torch.long, device=next(hf_model.parameters()).device)
    block = block_module(hf_model, layer, blocks_path)
    clean = hf_model(input_ids=ids, use_cache=False).logits[0].float().log_softmax(-1)
    with spliced(block, sae):
        spl = hf_model(input_ids=ids, use_cache=False).logits[0].float().log_softmax(-1)
    kl = (clean.exp() * (clean - spl)).sum(-1)
    nxt = ids[0, 1:]
    ce = (clean[:-1].gather(-1, nxt[:, None]) - spl[:-1].gather(-1, nxt[:, None]))[:, 0]
    T = ids.shape[1]
    return pl.DataFrame({"pos": list(range(T)), "kl": kl.double().cpu().numpy(),
                         "ce_increase": [*ce.double().cpu().tolist(), None]},
                        schema_overrides={"ce_increase": pl.Float64})


def splice_rows(hf_model: torch.nn.Module, sequences: pl.DataFrame, rows: pl.DataFrame, layer: int, sae: SAE,
                blocks_path: str = "model.layers", progress: Any = None) -> pl.DataFrame:
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
        frames.append(splice_sequence(hf_model, ids, layer, sae, blocks_path).with_columns(pl.lit(seq).alias("seq")))
        if progress is not None:
            progress(n, seqs.height)
    per_pos = pl.concat(frames)
    out = wanted.join(per_pos, on=["seq", "pos"], how="left").sort("_i")
    return out.select("seq", "pos", "kl", "ce_increase")
