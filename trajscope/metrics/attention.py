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

On small or noisy models most decode steps pass that fixed threshold (about 95%
of steps on the sample runs), so a marker on every jump carries no information.
A *sharp* jump is calibrated against a null instead: **the same run's prefill**.
The prefill pass computes attention rows for consecutive prompt queries (the
last ``prefill_rows`` of them, 32 by default); consecutive queries i − 1, i there
are exactly what consecutive decode steps are (queries one position apart), read
while the model reads the prompt. For each such pair the same statistic as at a
decode step is computed over the same heads: J̄ (mean Jaccard over the selected
heads) and the fixed-rule jump flag. The cut-off c is the largest value for which

    rate = fraction of prefill pairs with (jump and J̄ < c)  ≤  alpha  (0.05),

and a decode step is a sharp jump when it jumps and J̄(s) < c. So on the null the
rule fires at ``rate`` (at most ``alpha``; below it only where J̄ takes few
values), and the rate is stated with the result (:func:`jump_null`, and the
``sharp_cutoff`` / ``sharp_null_rate`` / ``sharp_null_n`` columns of
:func:`step_telemetry`). Decode steps firing far more often than ``rate`` is the
finding: decode's attended region moves more than prefill's. With fewer than
:data:`MIN_NULL_PAIRS` prefill pairs there is no null and no sharp jump
(``sharp_cutoff`` null). Why not shuffled decode steps: a lasting switch of region
puts its two regimes side by side in most shuffled pairs, so the null would
contain the very jump it is meant to reveal.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

TELEMETRY_FIELDS = ("entropy", "entropy_norm", "prefix_mass", "generated_mass", "sink_mass", "sink4_mass",
                    "self_mass")
JUMP_THRESHOLD = 0.5
SHARP_ALPHA = 0.05  # the sharp-jump rule's firing rate on its null, at most
MIN_NULL_PAIRS = 8  # fewer prefill query pairs than this: no null, no sharp jump


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
    out = q.with_columns(_jaccard(pl.col("top_pos"), pl.col("_prev")).alias("jaccard"))
    out = out.with_columns((pl.col("jaccard") < threshold).fill_null(False).alias("jump")).select(
        "step", "layer", "head", "jaccard", "jump")
    return out if lazy else out.collect()


def _jaccard(top: pl.Expr, prev: pl.Expr) -> pl.Expr:
    """|A ∩ B| / |A ∪ B| of two list columns (1 for two empty sets, null where ``prev`` is null)."""
    inter = top.list.set_intersection(prev).list.len()
    union = top.list.set_union(prev).list.len()
    return pl.when(prev.is_null()).then(None).when(union == 0).then(1.0).otherwise(inter / union).cast(pl.Float64)


def _select(frame, layer: int | None, head: int | None):
    if layer is not None:
        frame = frame.filter(pl.col("layer") == layer)
    if head is not None:
        frame = frame.filter(pl.col("head") == head)
    return frame


def prefill_pairs(attention: pl.DataFrame, layer: int | None = None, head: int | None = None,
                  threshold: float = JUMP_THRESHOLD) -> pl.DataFrame:
    """The null of the sharp-jump rule: consecutive prefill queries (pos − 1, pos) scored like a decode step.

    Args:
        attention: the ``attention`` table (step, pos, layer, head, top_pos), eager or lazy.
        layer, head: the selection, as in :func:`step_telemetry`.
    Returns:
        One row per pair of consecutive computed prompt queries (eager): ``pos`` (the later query),
        ``jaccard`` (mean over the selected heads) and ``jump`` (``jump_rate ≥ 0.5`` over them).
    """
    pre = _select(attention.lazy().filter(pl.col("step") == 0), layer, head).select("pos", "layer", "head", "top_pos")
    pre = pre.sort("layer", "head", "pos")
    prev_pos = pl.col("pos").shift(1).over("layer", "head")
    prev = pl.when(prev_pos == pl.col("pos") - 1).then(pl.col("top_pos").shift(1).over("layer", "head"))
    pairs = pre.with_columns(_jaccard(pl.col("top_pos"), prev).alias("jaccard")).drop_nulls("jaccard")
    out = pairs.group_by("pos").agg(pl.col("jaccard").mean(),
                                    ((pl.col("jaccard") < threshold).cast(pl.Float64).mean() >= 0.5).alias("jump"))
    return out.sort("pos").collect()


@dataclass(frozen=True)
class JumpNull:
    """The sharp-jump rule's calibration on its null (the run's own prefill; module docstring).

    Attributes:
        cutoff: a step is a sharp jump when it jumps and its J̄ is below this (None: no null, none fire).
        rate: the fraction of null pairs on which the rule fires (≤ ``alpha``; None without a null).
        alpha: the rate asked for.
        n: null pairs (consecutive computed prompt queries).
    """

    cutoff: float | None
    rate: float | None
    alpha: float
    n: int


def null_cutoff(jaccard: np.ndarray, jump: np.ndarray, alpha: float = SHARP_ALPHA) -> tuple[float, float]:
    """The largest cut-off c with ``mean(jump & (jaccard < c)) ≤ alpha``, and that rate.

    Args:
        jaccard: ``[n]`` null J̄ values; jump: ``[n]`` bool, the fixed rule's flag on them.
    Returns:
        ``(c, rate)``; c is one of the values (or +inf when even the largest keeps the rate ≤ alpha).
    """
    jaccard, jump = np.asarray(jaccard, dtype=np.float64), np.asarray(jump, dtype=bool)
    cands = np.append(np.unique(jaccard), np.inf)
    rates = np.array([np.mean(jump & (jaccard < c)) for c in cands])
    i = int(np.nonzero(rates <= alpha)[0].max())
    return float(cands[i]), float(rates[i])


def jump_null(attention: pl.DataFrame, layer: int | None = None, head: int | None = None,
              alpha: float = SHARP_ALPHA, threshold: float = JUMP_THRESHOLD) -> JumpNull:
    """Calibrate the sharp-jump rule on the run's prefill (:func:`prefill_pairs`) for a selection of heads.

    Args:
        attention: the ``attention`` table, eager or lazy (only its step-0 rows are read).
        layer, head: the selection, as in :func:`step_telemetry`.
        alpha: the firing rate asked for on the null.
    Returns:
        :class:`JumpNull`: the cut-off and the rate at which the rule fires on the null.
    """
    pairs = prefill_pairs(attention, layer, head, threshold)
    if pairs.height < MIN_NULL_PAIRS:
        return JumpNull(None, None, alpha, pairs.height)
    cutoff, rate = null_cutoff(pairs["jaccard"].to_numpy(), pairs["jump"].to_numpy(), alpha)
    return JumpNull(cutoff, rate, alpha, pairs.height)


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
        ``sharp_jump`` (a jump whose ``jaccard`` is below the cut-off calibrated on the run's prefill, see
        the module docstring), and the calibration, constant over rows: ``sharp_cutoff`` (null without a
        null), ``sharp_null_rate`` (the rule's firing rate on the null) and ``sharp_null_n`` (null pairs).
    """
    lazy = isinstance(attention, pl.LazyFrame)
    attention = attention.lazy()
    q = _select(step_queries(attention), layer, head)
    jumps = _select(region_jumps(attention, threshold), layer, head)
    null = jump_null(attention, layer, head, threshold=threshold)
    tele = q.group_by("step").agg(*[pl.col(f).mean() for f in TELEMETRY_FIELDS])
    jj = jumps.group_by("step").agg(pl.col("jaccard").mean(), pl.col("jump").cast(pl.Float64).mean().alias("jump_rate"))
    out = tele.join(jj, on="step", how="left").sort("step")
    out = out.with_columns((pl.col("jump_rate") >= 0.5).fill_null(False).alias("jump"))
    cutoff = pl.lit(null.cutoff, dtype=pl.Float64)
    out = out.with_columns((pl.col("jump") & (pl.col("jaccard") < cutoff)).fill_null(False).alias("sharp_jump"),
                           cutoff.alias("sharp_cutoff"), pl.lit(null.rate, dtype=pl.Float64).alias("sharp_null_rate"),
                           pl.lit(null.n, dtype=pl.Int64).alias("sharp_null_n"))
    return out if lazy else out.collect()
