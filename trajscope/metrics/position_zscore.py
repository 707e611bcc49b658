"""Same-run z-score by position: how far a token's residual statistic sits from the run's own prefill.

For one layer, the reference profile is the mean and standard deviation of a
statistic (default: the residual L2 ``norm`` from the ``activations`` table)
over the prompt (prefill) positions of the same run. The drift of position p is
the z-score ``(x_p − mean_prefill) / std_prefill``. This is a per-token triage
signal, not a claim about the joint geometry of the residual stream.
"""

from __future__ import annotations

import polars as pl


def position_zscore(activations: pl.DataFrame, layer: int | None = None, stat: str = "norm") -> pl.DataFrame:
    """z-score of ``stat`` at every position against the prefill positions of the same layer.

    Args:
        activations: the ``activations`` table (pos, layer, phase and ``stat`` columns).
        layer: a layer index, or None to average the z-scores over layers.
        stat: an activation statistic column (``norm``, ``var``, ``kurtosis``, ``max_abs``…).
    Returns:
        One row per position: ``pos``, ``drift`` (Float64; null when prefill has < 2 positions).
    """
    df = activations if layer is None else activations.filter(pl.col("layer") == layer)
    x = pl.col(stat).cast(pl.Float64)
    ref = df.filter(pl.col("phase") == "prefill").group_by("layer").agg(x.mean().alias("_m"), x.std().alias("_s"))
    z = df.join(ref, on="layer", how="left").with_columns(
        pl.when(pl.col("_s") > 0).then((x - pl.col("_m")) / pl.col("_s")).otherwise(None).alias("drift"))
    return z.group_by("pos").agg(pl.col("drift").mean()).sort("pos")
