"""SAE reconstruction quality, and how it drifts from prefill into decode.

Definitions (DESIGN.md, "SAE reconstruction"), over a set S of activation rows
``x ∈ R^d`` with reconstructions ``x̂`` and feature codes ``f ∈ R^{d_sae}``:

- ``fvu`` (fraction of variance unexplained, centred):
  ``Σ_S ‖x − x̂‖² / Σ_S ‖x − x̄_S‖²`` with ``x̄_S`` the mean of S. 0 is perfect, 1 is
  no better than predicting the set's mean.
- ``fvu_uncentred``: ``Σ_S ‖x − x̂‖² / Σ_S ‖x‖²``. SAELens' ``explained_variance``
  is close to ``1 − fvu_uncentred``; residual streams have a large mean, so the
  uncentred number looks much better than the centred one.
- ``mse``: ``Σ_S ‖x − x̂‖² / (|S|·d)`` (per element).
- ``cos``: mean over S of ``cos(x, x̂)``.
- ``l0``: mean over S of ``#{i : f_i > 0}``.
- ``dead`` / ``dense``: the fraction of features whose density (share of rows of S
  with ``f_i > 0``) is 0 / above 1%. Both depend on |S| (small sets look dead).
- ``kl``: mean over S of ``KL(p_clean ‖ p_spliced)`` of the next-token distribution,
  and ``ce_increase``: mean over S of ``−log p_spliced(next) + log p_clean(next)``,
  where ``p_spliced`` comes from the forward pass with the SAE's reconstruction
  replacing the block output at every position (:mod:`trajscope.features.splice`).

Grouping: ``prefill`` (all prompt positions) is the reference row; decode rows are
grouped by continuation (greedy / sampled), by exact step (1, 8, 50, 200), by depth band (:data:`DEPTH_BANDS`) and by
next-token-entropy band (:data:`ENTROPY_EDGES`, nats) crossed with phase, so a
decode band is compared with prefill positions of the same entropy. Position bins
(:data:`~trajscope.metrics.bands.POSITION_BINS`) are crossed with phase too: prefill
and decode rows at the same absolute positions, so depth is not read as position.
Every group belongs to one phase (its ``phase`` column); no group mixes the two.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import polars as pl
import torch

from trajscope.metrics.bands import (DEPTH_BANDS, DEPTH_STEPS, ENTROPY_EDGES, POSITION_ORDER,  # noqa: F401
                                     depth_band, entropy_band, position_bin_expr)

EARLY_POS = 16  # prefill positions before this are reported apart (attention-sink region)


def feature_density(f: torch.Tensor) -> torch.Tensor:
    """Share of rows on which each feature is active: ``[n, d_sae] → [d_sae]`` (float64)."""
    if f.shape[0] == 0:
        return torch.zeros(f.shape[-1], dtype=torch.float64)
    return (f > 0).double().mean(0)


def reconstruction_stats(x: torch.Tensor, x_hat: torch.Tensor, f: torch.Tensor) -> dict[str, float]:
    """FVU (centred and uncentred), MSE, cosine, L0, dead and dense fractions over a set of rows.

    Args:
        x: ``[n, d]`` activations; x_hat: ``[n, d]`` reconstructions; f: ``[n, d_sae]`` codes.

    Returns:
        ``n, fvu, fvu_uncentred, mse, cos, l0, dead, dense`` (floats; NaN where undefined, e.g. n = 0).
    """
    n, d = x.shape
    if n == 0:
        return {"n": 0, **{k: float("nan") for k in ("fvu", "fvu_uncentred", "mse", "cos", "l0", "dead", "dense")}}
    x, x_hat, f = x.detach().double(), x_hat.detach().double(), f.detach()
    err = (x - x_hat).pow(2).sum()
    centred = (x - x.mean(0, keepdim=True)).pow(2).sum()
    total = x.pow(2).sum()
    cos = torch.nn.functional.cosine_similarity(x, x_hat, dim=-1)
    dens = feature_density(f)
    return {
        "n": int(n),
        "fvu": float(err / centred) if centred > 0 else float("nan"),
        "fvu_uncentred": float(err / total) if total > 0 else float("nan"),
        "mse": float(err / (n * d)),
        "cos": float(cos.mean()),
        "l0": float((f > 0).sum(-1).double().mean()),
        "dead": float((dens == 0).double().mean()),
        "dense": float((dens > 0.01).double().mean()),
    }


def report_groups(rows: pl.DataFrame, steps: Sequence[int] = DEPTH_STEPS) -> list[tuple[str, str, str, pl.Expr]]:
    """The report's row groups as ``(kind, phase, label, filter expression)`` over a harvest's rows frame.

    ``rows`` needs ``phase``, ``step``, ``depth_band`` and ``entropy_band`` columns; with a
    ``source`` column, decode rows are also grouped by continuation (``greedy``, ``sample-0``…); with
    ``pos``, prefill rows are split at :data:`EARLY_POS` (the attention-sink region) and both phases
    are cut into the same absolute position bins (``position_bin``: ``prefill pos 0-31``,
    ``decode pos 0-31``, …; bins with no row of a phase are left out). Each group's rows are all
    of one ``phase`` (``prefill`` or ``decode``).
    """
    pre, dec = pl.col("phase") == "prefill", pl.col("phase") == "decode"
    groups: list[tuple[str, str, str, pl.Expr]] = [("phase", "prefill", "prefill", pre),
                                                   ("phase", "decode", "decode", dec)]
    if "pos" in rows.columns:  # position control: prompts are short, decode rows sit later in the context
        groups += [("position", "prefill", f"prefill pos<{EARLY_POS}", pre & (pl.col("pos") < EARLY_POS)),
                   ("position", "prefill", f"prefill pos>={EARLY_POS}", pre & (pl.col("pos") >= EARLY_POS))]
        present = rows.select(pl.col("phase"), position_bin_expr(pl.col("pos")).alias("b")).unique()
        for b in POSITION_ORDER:
            for phase, cond in (("prefill", pre), ("decode", dec)):
                if present.filter((pl.col("phase") == phase) & (pl.col("b") == b)).height:
                    groups.append(("position_bin", phase, f"{phase} pos {b}",
                                   cond & (position_bin_expr(pl.col("pos")) == b)))
    if "source" in rows.columns:  # greedy vs sampled continuations
        srcs = sorted(rows.filter(dec)["source"].unique().to_list())
        groups += [("source", "decode", f"decode {s}", dec & (pl.col("source") == s)) for s in srcs]
    groups += [("step", "decode", str(s), dec & (pl.col("step") == s)) for s in steps]
    bands = [b for b in rows.filter(dec)["depth_band"].unique().to_list() if b]
    order = [depth_band(lo) for lo, _ in DEPTH_BANDS]
    groups += [("depth_band", "decode", b, dec & (pl.col("depth_band") == b)) for b in order if b in bands]
    ent_order = [entropy_band(v) for v in (0.0, *ENTROPY_EDGES)]
    for phase in ("prefill", "decode"):  # one phase per group: never prefill and decode rows in one band
        ent = set(rows.filter(pl.col("phase") == phase)["entropy_band"].drop_nulls().to_list())
        groups += [("entropy_band", phase, f"{phase} H {b}", (pl.col("phase") == phase) & (pl.col("entropy_band") == b))
                   for b in ent_order if b in ent]
    return groups


def group_mask(rows: pl.DataFrame, expr: pl.Expr) -> torch.Tensor:
    """Boolean ``[N]`` mask of the rows a group expression selects (null counts as not selected)."""
    return torch.from_numpy(rows.select(expr.fill_null(False)).to_series().to_numpy().astype(bool))


def reconstruction_table(rows: pl.DataFrame, x: torch.Tensor, recons: Mapping[str, tuple[torch.Tensor, torch.Tensor]],
                splice: Mapping[str, pl.DataFrame] | None = None, steps: Sequence[int] = DEPTH_STEPS) -> pl.DataFrame:
    """Reconstruction metrics of several SAEs on the same rows, grouped by depth and entropy.

    Args:
        rows: tags of the N rows (``phase, step, depth_band, entropy_band``; harvest rows frame).
        x: ``[N, d]`` activations.
        recons: SAE name → (``x_hat [N, d]``, ``f [N, d_sae]``).
        splice: SAE name → frame of N rows with ``kl`` and ``ce_increase`` (null allowed),
            in the order of ``rows`` (from :func:`trajscope.features.splice.splice_rows`).
        steps: the exact decode steps to report.

    Returns:
        Long frame: ``sae, kind, phase, group, n`` and the metrics of :func:`reconstruction_stats`,
        plus ``kl`` and ``ce_increase`` when ``splice`` is given. ``kind`` is ``phase``, ``position``,
        ``position_bin``, ``source``, ``step``, ``depth_band`` or ``entropy_band`` (:func:`report_groups`);
        the ``kind == phase, group == prefill`` row is the reference. Point values only: the report's
        intervals come from :mod:`trajscope.metrics.sae_intervals`.
    """
    if rows.height != x.shape[0]:
        raise ValueError(f"rows has {rows.height} rows but x has {x.shape[0]}")
    out = []
    for kind, phase, label, expr in report_groups(rows, steps):
        mask = group_mask(rows, expr)
        for name, (x_hat, f) in recons.items():
            rec = {"sae": name, "kind": kind, "phase": phase, "group": label,
                   **reconstruction_stats(x[mask], x_hat[mask], f[mask])}
            if splice is not None and name in splice:
                sp = splice[name].filter(pl.Series(mask.numpy()))
                rec["kl"] = _mean(sp["kl"])
                rec["ce_increase"] = _mean(sp["ce_increase"])
            out.append(rec)
    return pl.DataFrame(out)


def _mean(s: pl.Series) -> float:
    s = s.drop_nulls()
    return float(s.mean()) if s.len() else float("nan")


def side_by_side(table: pl.DataFrame, metrics: Sequence[str] = ("fvu", "fvu_uncentred", "cos", "l0", "kl", "ce_increase")
                 ) -> pl.DataFrame:
    """Pivot :func:`reconstruction_table` so each SAE's metrics sit in adjacent columns (``{metric}[{sae}]``)."""
    metrics = [m for m in metrics if m in table.columns]
    saes = table["sae"].unique(maintain_order=True).to_list()
    base = table.filter(pl.col("sae") == saes[0]).select("kind", "group", "n")
    for sae in saes:
        part = table.filter(pl.col("sae") == sae).select(
            "kind", "group", *[pl.col(m).alias(f"{m}[{sae}]") for m in metrics])
        base = base.join(part, on=["kind", "group"], how="left", maintain_order="left")
    cols = ["kind", "group", "n"] + [f"{m}[{s}]" for m in metrics for s in saes]
    return base.select(cols)


def ratio_to_prefill(table: pl.DataFrame, metric: str = "fvu") -> pl.DataFrame:
    """``metric`` of every group divided by the same SAE's prefill reference value."""
    ref = table.filter((pl.col("kind") == "phase") & (pl.col("group") == "prefill")).select(
        "sae", pl.col(metric).alias("_ref"))
    return table.join(ref, on="sae").with_columns((pl.col(metric) / pl.col("_ref")).alias(f"{metric}_vs_prefill")
                                                  ).drop("_ref")

