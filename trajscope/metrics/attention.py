"""Attention telemetry over decode steps, and phase jumps of the attended region.

The ``attention`` table (see :mod:`trajscope.trajectory`) has one row per query
position × layer × head. Step 0 (prefill) holds all P prompt queries; to put
prefill on the same footing as a decode step, the functions here take the *last*
prompt query (pos P − 1) as "the query of step 0": it is the row whose output
produced the first generated token, exactly as the single query of decode step
s produces token P + s.

Phase jump (DESIGN.md): the top-attended region of a head at step s is the set
of its top-k attended key positions (``top_pos``, k = 8 by default). The head
*jumps* at step s when that set shares less than ``threshold`` (0.5) Jaccard
similarity with the set at step s − 1:

    J(s) = |T_s ∩ T_{s−1}| / |T_s ∪ T_{s−1}|,   jump(s) = J(s) < threshold.

J is undefined at step 0 (null, never a jump).

On small or noisy models most decode steps pass that fixed threshold, so a
marker on every jump carries no information. A *sharp* jump is a jump whose J is
also an outlier for the run itself: below ``median − 3·MAD`` of the decode steps'
J (MAD scaled by 1.4826, so 3 MAD ≈ 3 s.d. for Gaussian J; floored at 0.05). The app marks sharp
jumps and draws J itself as a curve.
"""

from __future__ import annotations

import polars as pl

TELEMETRY_FIELDS = ("entropy", "entropy_norm", "prefix_mass", "generated_mass", "sink_mass", "sink4_mass",
                    "self_mass")
JUMP_THRESHOLD = 0.5


def step_queries(attention: pl.DataFrame) -> pl.DataFrame:
    """One query row per step × layer × head: the last prompt query for step 0, the decode query otherwise.

    Args:
        attention: the ``attention`` table (columns step, pos, layer, head, …), eager or lazy.
    Returns:
        The same columns, ``n_steps × n_layers × n_heads`` rows, sorted by layer, head, step
        (a LazyFrame for a lazy input).
    """
    last0 = pl.col("pos").filter(pl.col("step") == 0).max()
    keep = (pl.col("step") > 0) | (pl.col("pos") == last0)
    return attention.filter(keep).sort("layer", "head", "step")


def region_jumps(attention: pl.DataFrame, threshold: float = JUMP_THRESHOLD) -> pl.DataFrame:
    """Top-k Jaccard between consecutive steps, per layer × head, and the phase-jump flag.

    Args:
        attention: the ``attention`` table (needs step, pos, layer, head, top_pos), eager or lazy.
        threshold: a step is a jump when its Jaccard with the previous step is below this.
    Returns:
        Frame with columns ``step, layer, head, jaccard (Float64, null at step 0), jump (Boolean)``;
        one row per step × layer × head, sorted by layer, head, step.
    """
    lazy = isinstance(attention, pl.LazyFrame)
    q = step_queries(attention.lazy()).select("step", "layer", "head", "top_pos")
    prev = pl.col("top_pos").shift(1).over("layer", "head")
    q = q.with_columns(prev.alias("_prev"))
    inter = pl.col("top_pos").list.set_intersection(pl.col("_prev")).list.len()
    union = pl.col("top_pos").list.set_union(pl.col("_prev")).list.len()
    jac = pl.when(pl.col("_prev").is_null()).then(None).when(union == 0).then(1.0).otherwise(inter / union)
    out = q.with_columns(jac.cast(pl.Float64).alias("jaccard"))
    out = out.with_columns((pl.col("jaccard") < threshold).fill_null(False).alias("jump")).select(
        "step", "layer", "head", "jaccard", "jump")
    return out if lazy else out.collect()


def step_telemetry(attention: pl.DataFrame, layer: int | None = None, head: int | None = None,
                   threshold: float = JUMP_THRESHOLD) -> pl.DataFrame:
    """Per-step attention telemetry for one head, a layer's mean over heads, or the mean over everything.

    Args:
        attention: the ``attention`` table.
        layer: a layer index, or None to average over all layers.
        head: a head index, or None to average over the heads (of ``layer``, or of all layers).
        threshold: phase-jump threshold on the top-k Jaccard (see module docstring).
    Returns:
        One row per step: ``step``, the mean of each of :data:`TELEMETRY_FIELDS`, ``jaccard`` (mean over
        the selected heads), ``jump_rate`` (fraction of selected heads that jump) and ``jump``
        (``jump_rate ≥ 0.5``: the selected head jumps, or most of the selected heads do), and
        ``sharp_jump`` (a jump whose ``jaccard`` is below :func:`sharp_cutoff` of the run's steps).
    """
    lazy = isinstance(attention, pl.LazyFrame)
    attention = attention.lazy()
    q = step_queries(attention)
    jumps = region_jumps(attention, threshold)
    if layer is not None:
        q, jumps = q.filter(pl.col("layer") == layer), jumps.filter(pl.col("layer") == layer)
    if head is not None:
        q, jumps = q.filter(pl.col("head") == head), jumps.filter(pl.col("head") == head)
    tele = q.group_by("step").agg(*[pl.col(f).mean() for f in TELEMETRY_FIELDS])
    jj = jumps.group_by("step").agg(pl.col("jaccard").mean(), pl.col("jump").cast(pl.Float64).mean().alias("jump_rate"))
    out = tele.join(jj, on="step", how="left").sort("step")
    out = out.with_columns((pl.col("jump_rate") >= 0.5).fill_null(False).alias("jump"))
    out = out.with_columns((pl.col("jump") & (pl.col("jaccard") < sharp_cutoff(pl.col("jaccard")))).fill_null(False)
                           .alias("sharp_jump"))
    return out if lazy else out.collect()


MAD_FLOOR = 0.05


def sharp_cutoff(jaccard: pl.Expr, k: float = 3.0) -> pl.Expr:
    """``median − k · max(1.4826 · MAD, 0.05)`` of the non-null ``jaccard`` values (a robust low-outlier
    cut-off; the floor, about the resolution of top-8 Jaccard, keeps a run of identical J from flagging
    every small dip)."""
    med = jaccard.drop_nulls().median()
    mad = pl.max_horizontal((jaccard.drop_nulls() - med).abs().median() * 1.4826, pl.lit(MAD_FLOOR))
    return med - k * mad
