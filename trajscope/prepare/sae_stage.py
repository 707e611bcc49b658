"""Stage ``sae-<mix>-s<seed>``: one TopK SAE on the ``collect`` stage's rows of the training files.

Training rows: block ``layer``'s output at positions ``≥ first_pos`` (the sink
excluded) of the ``fit`` and ``calibrate`` files of the ``collect`` stage, plus the
rows of the ``harvest-prefill`` and ``harvest-decode`` stages where they ran (training
source files only, :mod:`.harvest_stage`); the ``evaluate`` files are never seen. Rows
holding a massive activation are left out (:func:`drop_massive`). ``prefill-only`` draws every batch from prefill rows, ``hybrid`` a
``hybrid_decode_fraction`` share from the model's own greedy continuations (decode
rows) — :func:`trajscope.features.train.train_sae`, same steps and batch for both.
Writes the SAE in SAELens' format (``cfg.json`` + ``sae_weights.safetensors``;
the metadata names the model, its weights hash, the data and the sink treatment)
and ``training_log.csv``; with ``sae_snapshot_every`` (a multiple of the log interval)
also ``decoder_snapshots.safetensors``, the decoder every that many steps, so the
share of features that reproduce across seeds can be followed through training.
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


def drop_massive(x: torch.Tensor, seed: int = 0) -> tuple[torch.Tensor, int]:
    """``x`` without the rows that hold a massive activation (the one rule, :mod:`trajscope.metrics.residual_stats`,
    against the median |x| of up to 4,096 rows of ``x``), and how many rows were dropped.

    Past position 0, a window's position 1 sometimes takes the sink's role (|x| ≈ 24,000 at layer 15 on
    SmolLM2, one row in ~10,000 yet half of a pool's sum of squares): one such row in a batch outweighs
    the others in the MSE, so training leaves them out as it leaves out position 0.
    """
    from trajscope.metrics.residual_stats import ACT_FIELDS, residual_stats

    if x.shape[0] == 0:
        return x, 0
    pick = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(seed))[:4096]
    med = x[pick].abs().reshape(-1).median()
    massive = torch.cat([residual_stats(x[i:i + 65536], median_abs=med)[:, ACT_FIELDS.index("n_massive")] > 0
                         for i in range(0, x.shape[0], 65536)])
    return x[~massive], int(massive.sum())


def harvest_pools(out: pathlib.Path) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """Prefill and decode rows of the finished ``harvest-*`` stages (float32; empty when none ran)."""
    pre, dec, info = [], [], {}
    for name in ("harvest-prefill", "harvest-decode"):
        src = out / name
        if not (src / "DONE.json").is_file():
            continue
        acts, rows = layer_rows(src)
        p, q = pools(acts.float(), rows, parts=("train",))
        pre.append(p)
        dec.append(q)
        info[name] = {"prefill_rows": int(p.shape[0]), "decode_rows": int(q.shape[0]),
                      "groups": int(rows["group"].n_unique())}
    return torch.cat(pre) if pre else None, torch.cat(dec) if dec else None, info


def run(ctx, d: pathlib.Path, mix: str, seed: int) -> dict:
    c = ctx.cfg
    acts, rows = layer_rows(ctx.out / "collect")
    pre, dec = pools(acts, rows)
    h_pre, h_dec, h_info = harvest_pools(ctx.out)
    pre = pre if h_pre is None else torch.cat([pre, h_pre])
    dec = dec if h_dec is None else torch.cat([dec, h_dec])
    (pre, n_pre_massive), (dec, n_dec_massive) = drop_massive(pre), drop_massive(dec)
    frac = 0.0 if mix == "prefill-only" else c.hybrid_decode_fraction
    tc = TrainConfig(architecture="topk", d_sae=c.d_sae, k=c.k, decode_fraction=frac, n_tokens=c.sae_tokens,
                     batch_size=c.sae_batch, seed=seed, dead_after=c.sae_dead_after, lr=c.sae_lr,
                     warmup_steps=c.sae_warmup_steps, log_every=c.sae_log_every)
    meta = {**ctx.meta, "mix": mix, "seed": seed, "data": "stdlib source + pydoc topics + chat prompts (prefill); "
            "the model's greedy continuations (decode)", "train_parts": list(TRAIN_PARTS),
            "split_by": "source file", "n_train_prefill_rows": int(pre.shape[0]),
            "n_train_decode_rows": int(dec.shape[0]), "harvest": h_info,
            "massive_rows_dropped": {"prefill": n_pre_massive, "decode": n_dec_massive}}
    torch.set_num_threads(c.threads)
    snaps: dict[str, torch.Tensor] = {}

    def snapshot(step: int, sae) -> None:
        if c.sae_snapshot_every and (step % c.sae_snapshot_every == 0 or step == tc.n_steps - 1):
            snaps[f"W_dec_step{step}"] = sae.W_dec.detach().half().clone()

    sae, curve = train_sae(pre, dec if frac > 0 else None, tc, layer=c.layer, metadata=meta,
                           log_csv=d / "training_log.csv", on_log=snapshot)
    if snaps:
        from safetensors.torch import save_file

        save_file(snaps, str(d / "decoder_snapshots.safetensors"))
    sae.save(str(d))
    last = curve.row(-1, named=True)
    return {"train_fvu_last_batch": last["fvu"], "l0": last["l0"], "n_prefill_rows": int(pre.shape[0]),
            "n_decode_rows": int(dec.shape[0]), "massive_rows_dropped": n_pre_massive + n_dec_massive}
