"""Stage ``sae-<mix>-s<seed>``: one TopK SAE on the ``collect`` stage's rows of the training files.

Training rows: block ``layer``'s output at positions ``≥ first_pos`` (the sink
excluded) of the ``fit`` and ``calibrate`` files; the ``evaluate`` files are never
seen. ``prefill-only`` draws every batch from prefill rows, ``hybrid`` a
``hybrid_decode_fraction`` share from the model's own greedy continuations (decode
rows) — :func:`trajscope.features.train.train_sae`, same steps and batch for both.
Writes the SAE in SAELens' format (``cfg.json`` + ``sae_weights.safetensors``;
the metadata names the model, its weights hash, the data and the sink treatment)
and ``training_log.csv``.
"""

from __future__ import annotations

import pathlib

import polars as pl
import torch
from safetensors import safe_open

from trajscope.features.train import TrainConfig, train_sae

TRAIN_PARTS = ("fit", "calibrate")


def layer_rows(src: pathlib.Path) -> tuple[torch.Tensor, pl.DataFrame]:
    """``acts [N, d_model]`` and the rows table of the ``collect`` stage."""
    with safe_open(str(src / "acts.safetensors"), framework="pt") as fh:
        acts = fh.get_tensor("acts")
    return acts, pl.read_parquet(src / "rows.parquet")


def pools(acts: torch.Tensor, rows: pl.DataFrame, parts=TRAIN_PARTS) -> tuple[torch.Tensor, torch.Tensor]:
    """Prefill and decode rows of the given parts."""
    part = rows["part"].is_in(list(parts)).to_numpy()
    dec = (rows["phase"] == "decode").to_numpy()
    return acts[torch.as_tensor(part & ~dec)], acts[torch.as_tensor(part & dec)]


def run(ctx, d: pathlib.Path, mix: str, seed: int) -> dict:
    c = ctx.cfg
    acts, rows = layer_rows(ctx.out / "collect")
    pre, dec = pools(acts, rows)
    frac = 0.0 if mix == "prefill-only" else c.hybrid_decode_fraction
    tc = TrainConfig(architecture="topk", d_sae=c.d_sae, k=c.k, decode_fraction=frac, n_tokens=c.sae_tokens,
                     batch_size=c.sae_batch, seed=seed, dead_after=40 * c.sae_batch, lr=1e-3, warmup_steps=30)
    meta = {**ctx.meta, "mix": mix, "seed": seed, "data": "stdlib source + pydoc topics + chat prompts (prefill); "
            "the model's greedy continuations (decode)", "train_parts": list(TRAIN_PARTS),
            "split_by": "source file", "n_train_prefill_rows": int(pre.shape[0]),
            "n_train_decode_rows": int(dec.shape[0])}
    torch.set_num_threads(c.threads)
    sae, curve = train_sae(pre, dec if frac > 0 else None, tc, layer=c.layer, metadata=meta,
                           log_csv=d / "training_log.csv")
    sae.save(str(d))
    last = curve.row(-1, named=True)
    return {"train_fvu_last_batch": last["fvu"], "l0": last["l0"], "n_prefill_rows": int(pre.shape[0]),
            "n_decode_rows": int(dec.shape[0])}
