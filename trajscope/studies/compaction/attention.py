"""Attention mass from T3's queries onto the summary (and the other segments), per setup and layer.

Under compaction the summary is what stands in for the compacted turns T1 and T2. How much
T3's queries actually *read* it is the attention mass they put on the summary's keys: for
query row ``i`` of T3, head ``h`` and layer ``l``,

    mass_summary(l, h, i) = Σ_{j ∈ summary} a_{l,h,i,j},

with ``a`` the attention probabilities over the keys the query sees (rows sum to 1). The
same sums over sys, the masked turns T1∪T2 (zero by construction under A; absent under B,
whose context has no T1/T2) and T3 itself split each row into segments; the rows come from
the model boundary's forward (``ForwardResult.attn``, attention rows of the last queries,
computed from q and the cached K, so the forward keeps its fast kernel and the key mask of
setups A and D is applied to the rows exactly as to the output).

One row per session × setup × layer × T3 token: ``summary_mass`` (mean over heads),
``summary_mass_max`` (the head that reads the summary most), ``sys_mass``, ``masked_mass``
(null for B) and ``t3_mass`` (all means over heads).
"""

from __future__ import annotations

from typing import Mapping

import polars as pl
import torch

SEGMENT_COLUMNS = {"sys": "sys_mass", "summary": "summary_mass", "masked": "masked_mass", "t3": "t3_mass"}

SCHEMA = dict(session_id=pl.Utf8, setup=pl.Utf8, layer=pl.Int32, t3_index=pl.Int64, summary_mass=pl.Float64,
              summary_mass_max=pl.Float64, sys_mass=pl.Float64, masked_mass=pl.Float64, t3_mass=pl.Float64)


def segment_mass(rows: torch.Tensor, spans: list[tuple[int, int]]) -> torch.Tensor:
    """Attention mass of ``rows [H, n, K]`` on the union of key ``spans``: ``[H, n]`` (float64)."""
    keep = torch.zeros(rows.shape[-1], dtype=torch.bool)
    for a, b in spans:
        keep[a:b] = True
    return rows.double()[..., keep].sum(-1)


def attention_rows_table(session_id: str, setup: str, attn: Mapping[int, torch.Tensor],
                         spans: Mapping[str, list[tuple[int, int]]], layers: list[int]) -> pl.DataFrame:
    """The ``compaction_attention`` rows of one session and setup.

    Args:
        attn: ``{layer: [H, n_t3, K]}`` the attention rows of T3's queries (T3 = the last ``n_t3`` positions).
        spans: ``{"sys" | "summary" | "masked" | "t3": [(start, end), …]}`` key spans in this setup's
            context (``masked`` empty when the context has no T1/T2, as in B).
        layers: the layers to write (each must be in ``attn``).
    Returns:
        One row per layer × T3 token (module docstring for the columns).
    """
    frames = []
    for layer in layers:
        rows = attn[layer]
        n = rows.shape[1]
        cols: dict = {"t3_index": list(range(n))}
        for seg, col in SEGMENT_COLUMNS.items():
            if seg == "masked" and not spans.get("masked"):
                cols[col] = [None] * n
                continue
            m = segment_mass(rows, spans[seg])
            cols[col] = m.mean(0).tolist()
            if seg == "summary":
                cols["summary_mass_max"] = m.max(0).values.tolist()
        frames.append(pl.DataFrame(cols, schema={k: SCHEMA[k] for k in cols}).with_columns(
            session_id=pl.lit(session_id), setup=pl.lit(setup), layer=pl.lit(layer, pl.Int32)))
    return pl.concat(frames).select(list(SCHEMA))


def empty() -> pl.DataFrame:
    """An empty ``compaction_attention`` table with its schema."""
    return pl.DataFrame(schema=SCHEMA)
