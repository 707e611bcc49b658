"""Building a Trajectory's tables from capture's step records.

:func:`build_tables` turns the :class:`~trajscope.capture.record.StepRecord` s of
one run into the ``tokens``, ``attention`` and ``activations`` tables and the
kept tensors. Positions, steps and phases come from :mod:`trajscope.positions`:
``tokens.step`` is the *query step* of the position (0 for the prompt) and
``tokens.produced_at_step`` the step that produced a generated token (null for
prompt tokens), as ``docs/schema.md`` states. ``tokens.segment`` is the prompt's
segments as ``meta["prompt_segments"]`` records them (all ``user`` for a plain prompt)
followed by :func:`trajscope.positions.generated_segments` of the generated tokens.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import polars as pl
import torch

from trajscope import positions
from trajscope.capture.kernels import ACT_FIELDS, ATTN_FIELDS
from trajscope.capture.record import StepRecord


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().float().cpu().numpy() if t.is_floating_point() else t.detach().cpu().numpy()


def build_tables(meta: dict, recs: Sequence[StepRecord], token_ids: list[int], final_lp: torch.Tensor | None,
                 tokenizer: Any, res_layers: list[int], row_layers: list[int]) -> tuple[dict, dict]:
    """Turn per-step capture records into the three tables and the kept tensors.

    Args:
        meta: needs ``run_id`` and ``prompt_len``; reads ``prompt_segments`` and ``thinking_open`` when present.
        recs: step records in step order.
        token_ids: all ids (the consumed ones plus, when known, the last produced one).
        final_lp: ``[vocab]`` log-probabilities that produced the last token, or None.
    Returns:
        ``({"tokens": df, "attention": df, "activations": df}, tensors)``.
    """
    run_id, P = meta["run_id"], int(meta["prompt_len"])
    n_comp = sum(len(r.ids) for r in recs)
    T = len(token_ids)
    pos = np.arange(T)
    step = positions.query_step(pos, P)
    logprob = np.full(T, np.nan, dtype=np.float32)
    k_tok = int(meta.get("top_k_tokens", 5))
    entropy = np.full(T, np.nan, dtype=np.float32)
    top_ids = np.full((T, k_tok), -1, dtype=np.int64)
    top_lp = np.full((T, k_tok), np.nan, dtype=np.float32)
    has_dist = np.zeros(T, dtype=bool)  # positions whose next-token distribution was computed
    for r in recs:
        chosen = _np(r.chosen_lp).reshape(-1)
        start = r.lp_first_pos + 1 if r.step == 0 else r.first_pos  # prefill: tokens after each row's query
        logprob[start:start + len(chosen)] = chosen
        sl = slice(r.lp_first_pos, r.lp_first_pos + len(r.entropy))
        entropy[sl], top_ids[sl], top_lp[sl] = _np(r.entropy), _np(r.top_ids), _np(r.top_lp)
        has_dist[sl] = True
    if final_lp is not None and T > n_comp:
        logprob[T - 1] = float(final_lp[token_ids[-1]])
    texts = tokenizer.batch_decode([[i] for i in token_ids]) if T else []
    rows_with = np.flatnonzero(has_dist)
    flat_top = [int(i) for i in top_ids[rows_with].reshape(-1)]
    decoded = tokenizer.batch_decode([[i] for i in flat_top]) if flat_top else []
    top_texts_rows: list = [None] * T
    for j, i in enumerate(rows_with):
        top_texts_rows[i] = decoded[j * k_tok:(j + 1) * k_tok]
    segment = (positions.segments_from_runs(meta.get("prompt_segments"), min(P, T))
               + positions.generated_segments(texts[P:], bool(meta.get("thinking_open"))))
    tokens = pl.DataFrame({
        "run_id": [run_id] * T, "pos": pos.astype(np.int32), "step": step.astype(np.int32),
        "phase": positions.phases(pos, P), "segment": segment, "token_id": np.asarray(token_ids, dtype=np.int64),
        "text": texts, "logprob": logprob, "entropy": entropy,
        "top_ids": [list(map(int, r)) if has_dist[i] else None for i, r in enumerate(top_ids)],
        "top_texts": top_texts_rows,
        "top_logprobs": [list(map(float, r)) if has_dist[i] else None for i, r in enumerate(top_lp)],
    }, schema_overrides={"top_ids": pl.List(pl.Int64), "top_texts": pl.List(pl.String),
                         "top_logprobs": pl.List(pl.Float32)}).with_columns(
        pl.col("logprob", "entropy").fill_nan(None), positions.produced_at_step_expr(P))
    tokens = tokens.select("run_id", "pos", "step", "produced_at_step", *[c for c in tokens.columns
                                                                      if c not in ("run_id", "pos", "step", "produced_at_step")])

    attention = _attention_table(run_id, P, recs, int(meta.get("top_k_keys", 8)))
    activations = _activation_table(run_id, P, recs)
    tensors: dict[str, torch.Tensor] = {}
    for layer in res_layers:
        if recs:
            tensors[f"residual.{layer}"] = torch.cat([r.resid[layer].float().cpu() for r in recs])
    for layer in row_layers:
        if recs:
            tensors[f"attention.{layer}"] = _square_rows([r.rows[layer] for r in recs], recs, n_comp)
    return {"tokens": tokens, "attention": attention, "activations": activations}, tensors


def _square_rows(rows: list[torch.Tensor], recs: list[dict], n: int) -> torch.Tensor:
    """Place per-step rows ``[H, q, k]`` into one ``[H, n, n]`` query × key matrix."""
    H = rows[0].shape[0]
    out = torch.zeros(H, n, n, dtype=torch.float32)
    for r, rec in zip(rows, recs):
        q0, q, k = rec.attn_first_pos, r.shape[1], r.shape[2]
        out[:, q0:q0 + q, :k] = r.float().cpu()
    return out


def _attention_table(run_id: str, P: int, recs: list[dict], top_k: int) -> pl.DataFrame:
    cols: dict[str, list] = {c: [] for c in ("step", "pos", "layer", "head", "stats", "top_pos", "top_w")}
    for r in recs:
        st = _np(r.attn)  # [L, H, q, 7]
        L, H, q, _ = st.shape
        grid_q, grid_l, grid_h = np.meshgrid(np.arange(q), np.arange(L), np.arange(H), indexing="ij")
        cols["step"].append(np.full(q * L * H, r.step, dtype=np.int32))
        cols["pos"].append((r.attn_first_pos + grid_q).reshape(-1).astype(np.int32))
        cols["layer"].append(grid_l.reshape(-1).astype(np.int16))
        cols["head"].append(grid_h.reshape(-1).astype(np.int16))
        cols["stats"].append(st.transpose(2, 0, 1, 3).reshape(-1, st.shape[-1]))
        cols["top_pos"].append(_np(r.top_pos).transpose(2, 0, 1, 3).reshape(-1, top_k))
        cols["top_w"].append(_np(r.top_w).transpose(2, 0, 1, 3).reshape(-1, top_k))
    if not recs:
        return pl.DataFrame(schema={"run_id": pl.String, "step": pl.Int32, "pos": pl.Int32, "layer": pl.Int16,
                                    "head": pl.Int16, **{f: pl.Float32 for f in ATTN_FIELDS},
                                    "top_pos": pl.List(pl.Int32), "top_w": pl.List(pl.Float32)})
    stats = np.concatenate(cols["stats"]).astype(np.float32)
    n = len(stats)
    df = pl.DataFrame({
        "run_id": [run_id] * n, "step": np.concatenate(cols["step"]), "pos": np.concatenate(cols["pos"]),
        "layer": np.concatenate(cols["layer"]), "head": np.concatenate(cols["head"]),
        **{f: stats[:, i] for i, f in enumerate(ATTN_FIELDS)},
        "top_pos": np.concatenate(cols["top_pos"]).astype(np.int32),
        "top_w": np.concatenate(cols["top_w"]).astype(np.float32),
    })
    df = df.with_columns(pl.col("top_pos", "top_w").arr.to_list())
    keep = pl.col("top_pos").list.eval(pl.element() >= 0).list.sum()
    return df.with_columns(pl.col("top_pos").list.head(keep), pl.col("top_w").list.head(keep))


def _activation_table(run_id: str, P: int, recs: list[dict]) -> pl.DataFrame:
    parts = []
    for r in recs:
        st = _np(r.act)  # [L, q, 7]
        L, q, _ = st.shape
        grid_q, grid_l = np.meshgrid(np.arange(q), np.arange(L), indexing="ij")
        parts.append((r.first_pos + grid_q.reshape(-1), grid_l.reshape(-1), st.transpose(1, 0, 2).reshape(-1, 7)))
    if not parts:
        return pl.DataFrame(schema={"run_id": pl.String, "pos": pl.Int32, "step": pl.Int32, "phase": pl.String,
                                    "layer": pl.Int16, **{f: pl.Float32 for f in ACT_FIELDS}})
    pos = np.concatenate([p[0] for p in parts]).astype(np.int32)
    stats = np.concatenate([p[2] for p in parts]).astype(np.float32)
    df = pl.DataFrame({
        "run_id": [run_id] * len(pos), "pos": pos, "step": positions.query_step(pos, P).astype(np.int32),
        "phase": positions.phases(pos, P),
        "layer": np.concatenate([p[1] for p in parts]).astype(np.int16),
        **{f: stats[:, i] for i, f in enumerate(ACT_FIELDS)},
    })
    return df.with_columns(pl.col("n_outliers", "n_massive").cast(pl.Int32))
