"""Residual drift of decode positions against a prefill :class:`~trajscope.profile.ReferenceProfile`.

Per position and layer (:func:`profile_drift_table`):

- ``score``: diagonal Mahalanobis distance to the prefill mean ÷ √d (≈ 1 in
  distribution), ``flagged`` when above the profile's calibrated threshold;
- ``mean_shift``: standardized mean shift, mean over dimensions of (x_d − μ_d)/σ_d;
- ``var_ratio``: the position's variance across dimensions ÷ the prefill mean of it;
- ``kurtosis``: excess kurtosis across dimensions; ``outlier_rate``: share of |x| > 6;
- ``cosine_centroid``: cosine similarity to the prefill mean vector.

Per group of positions (:func:`profile_drift_by_group`: decode-depth band or
next-token-entropy band, as :mod:`trajscope.metrics.bands` defines them) and layer: the means of those, the flagged fraction,
and the **per-dimension Gaussian KL** KL(N(μ_g, σ_g²) ‖ N(μ_ref, σ_ref²)) summed
over dimensions plus its top dimensions. That KL fits each dimension separately:
it is a triage proxy for where to look, not a claim about the joint geometry.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import polars as pl
import torch

from trajscope import positions
from trajscope.metrics.bands import DEPTH_ORDER, ENTROPY_ORDER, depth_band_expr, entropy_band_expr
from trajscope.profile import SCALAR_STATS, ReferenceProfile, position_stats


def profile_drift_table(traj, profile: ReferenceProfile, layers: Sequence[int] | None = None) -> pl.DataFrame:
    """Drift of every computed position at each layer.

    Args:
        traj: a :class:`~trajscope.trajectory.Trajectory` captured with ``residual_layers`` covering ``layers``.
        profile: the prefill reference (same model width and depth).
        layers: default all layers the trajectory kept.
    Returns:
        One row per position × layer: run_id, pos, step, phase, layer, score, flagged, mean_shift,
        var_ratio, kurtosis, outlier_rate, cosine_centroid, depth_band, entropy_band.
    """
    profile.check_model(traj.meta["model"]["n_layers"], traj.meta["model"]["d_model"], traj.meta["model"]["model_id"])
    if layers is None:
        layers = sorted(int(k.split(".")[1]) for k in traj.tensors if k.startswith("residual."))
    parts = []
    for layer in layers:
        x = traj.residual(layer).double()
        mu, sd = profile.mean[layer], profile.var[layer].clamp_min(1e-12).sqrt()
        st = position_stats(x, profile.median_abs[layer])
        score = profile.score(layer, x)
        var_i = SCALAR_STATS.index("var")
        parts.append(pl.DataFrame({
            "pos": np.arange(x.shape[0], dtype=np.int32), "layer": np.full(x.shape[0], layer, dtype=np.int16),
            "score": score.numpy(), "flagged": (score > profile.threshold[layer]).numpy(),
            "mean_shift": ((x - mu) / sd).mean(-1).numpy(),
            "var_ratio": (st["var"] / profile.stat_mean[layer, var_i]).numpy(),
            "kurtosis": st["kurtosis"].numpy(), "outlier_rate": st["outlier_rate"].numpy(),
            "cosine_centroid": ((x @ mu) / (x.norm(dim=-1) * mu.norm()).clamp_min(1e-300)).numpy(),
        }))
    tok = traj.tokens.select("pos", "step", "phase", "entropy")
    return (pl.concat(parts).join(tok, on="pos", how="left")
            .with_columns(pl.lit(traj.run_id).alias("run_id"), depth_band_expr(pl.col("step")).alias("depth_band"),
                          entropy_band_expr(pl.col("entropy")).alias("entropy_band"))
            .select("run_id", "pos", "step", "phase", "layer", "score", "flagged", "mean_shift", "var_ratio",
                    "kurtosis", "outlier_rate", "cosine_centroid", "depth_band", "entropy_band"))


def gaussian_kl(mu_g: torch.Tensor, var_g: torch.Tensor, mu_r: torch.Tensor, var_r: torch.Tensor) -> torch.Tensor:
    """Per-dimension KL(N(μ_g, σ_g²) ‖ N(μ_r, σ_r²)) in nats: ``[d]``."""
    var_g, var_r = var_g.clamp_min(1e-12), var_r.clamp_min(1e-12)
    return 0.5 * (torch.log(var_r / var_g) + (var_g + (mu_g - mu_r).pow(2)) / var_r - 1.0)


def profile_drift_by_group(trajs: Sequence, profile: ReferenceProfile, by: str = "depth_band", top_dims: int = 5,
                   skip_first: bool = positions.SKIP_SINK, min_kl_positions: int = 8) -> pl.DataFrame:
    """Drift summarised per group (``depth_band`` or ``entropy_band``) × layer over many runs.

    Args:
        trajs: trajectories captured with ``residual_layers="all"``.
        profile: the prefill reference.
        by: ``"depth_band"`` or ``"entropy_band"``.
        skip_first: leave position 0 out, as the profile did.
        min_kl_positions: groups with fewer positions get no KL (a variance fitted on a handful
            of vectors is too noisy to compare).
    Returns:
        One row per group × layer: n_positions, mean of score / mean_shift / var_ratio / kurtosis /
        outlier_rate / cosine_centroid, flagged_frac, kl_sum (per-dimension Gaussian KL, summed; null for
        groups under ``min_kl_positions``), top_dims (list), top_dims_kl (list).
    """
    tables, vectors = [], {}
    for traj in trajs:
        t = profile_drift_table(traj, profile)
        t = t.filter(pl.col("pos") >= positions.first_reference_pos(skip_first))
        t = t.filter(pl.col(by).is_not_null())
        tables.append(t)
        for (layer, group), sub in t.group_by("layer", by):
            x = traj.residual(int(layer))[torch.from_numpy(sub["pos"].to_numpy().astype(np.int64))]
            vectors.setdefault((int(layer), group), []).append(x.double())
    if not tables:
        return pl.DataFrame()
    rows = pl.concat(tables)
    agg = rows.group_by(by, "layer").agg(
        pl.len().alias("n_positions"),
        *[pl.col(c).mean() for c in ("score", "mean_shift", "var_ratio", "kurtosis", "outlier_rate", "cosine_centroid")],
        pl.col("flagged").mean().alias("flagged_frac"),
    )
    kl_rows = []
    for (layer, group), xs in vectors.items():
        x = torch.cat(xs)
        if x.shape[0] < max(2, min_kl_positions):
            kl_rows.append({by: group, "layer": layer, "kl_sum": None, "top_dims": [], "top_dims_kl": []})
            continue
        kl = gaussian_kl(x.mean(0), x.var(0, unbiased=True), profile.mean[layer], profile.var[layer])
        top = kl.topk(min(top_dims, kl.numel()))
        kl_rows.append({by: group, "layer": layer, "kl_sum": float(kl.sum()), "top_dims": top.indices.tolist(),
                        "top_dims_kl": top.values.tolist()})
    kl_df = pl.DataFrame(kl_rows, schema={by: pl.String, "layer": pl.Int16, "kl_sum": pl.Float64,
                                          "top_dims": pl.List(pl.Int64), "top_dims_kl": pl.List(pl.Float64)})
    order = list(DEPTH_ORDER) if by == "depth_band" else list(ENTROPY_ORDER)
    return (agg.join(kl_df, on=[by, "layer"], how="left")
            .with_columns(pl.col(by).replace_strict({g: i for i, g in enumerate(order)}, default=99).alias("_o"))
            .sort("_o", "layer").drop("_o"))
