"""What every serving study shares: activation deltas, provenance, the floor comparison, intervals.

- :func:`deltas` compares two sets of activations of the same positions (``{layer: [T, d]}``)
  and returns, per layer and position, the L2 distance ``‖b − a‖``, the relative L2
  ``‖b − a‖ / ‖a‖`` (``a`` is the reference) and the cosine similarity. Every study's
  long table is built from it, so the columns mean the same thing everywhere.
- :class:`Provenance` is the serving configuration a row was produced under (batch size,
  padding side, dtype, device, TF32, deterministic algorithms, chunk size, prefix-cache use
  and computed/reused counts); ``with_columns`` stamps it on a frame.
- :func:`against_floor` joins a study's rows with the per-layer determinism floor
  (:func:`trajscope.studies.determinism.floor_by_layer`) and flags the deltas that exceed it;
  :func:`summarize` reduces a long table to one row per group with a percentile-bootstrap
  interval over prompts (:func:`bootstrap_ci`, through :func:`trajscope.stats.cluster_bootstrap`).
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any, Sequence

import numpy as np
import polars as pl
import torch

from trajscope.errors import TrajscopeError

DELTA_COLUMNS = ("l2", "rel_l2", "cos")
_EPS = 1e-12


def deltas(a: dict[int, torch.Tensor], b: dict[int, torch.Tensor]) -> dict[str, list]:
    """L2, relative L2 and cosine between two activation sets, per layer and position.

    Args:
        a: the reference, ``{layer: [T, d]}``.
        b: the same layers and positions computed another way.
    Returns:
        Columns ``layer``, ``pos`` (0..T−1), ``l2`` = ‖b−a‖, ``rel_l2`` = ‖b−a‖/‖a‖, ``cos`` =
        cos(a, b); one entry per (layer, position), layers in ascending order.
    """
    out: dict[str, list] = {"layer": [], "pos": [], "l2": [], "rel_l2": [], "cos": []}
    for layer in sorted(a):
        x, y = a[layer].double(), b[layer].double()
        if x.shape != y.shape:
            raise TrajscopeError(f"Layer {layer}: cannot compare activations of shapes {tuple(x.shape)} and {tuple(y.shape)}.")
        diff = (y - x).norm(dim=-1)
        nx, ny = x.norm(dim=-1), y.norm(dim=-1)
        out["layer"] += [layer] * x.shape[0]
        out["pos"] += list(range(x.shape[0]))
        out["l2"] += diff.tolist()
        out["rel_l2"] += (diff / nx.clamp_min(_EPS)).tolist()
        out["cos"] += ((x * y).sum(-1) / (nx * ny).clamp_min(_EPS)).clamp(-1, 1).tolist()
    return out


def delta_frame(a: dict[int, torch.Tensor], b: dict[int, torch.Tensor], *, logits_a: torch.Tensor | None = None,
                logits_b: torch.Tensor | None = None, **const: Any) -> pl.DataFrame:
    """:func:`deltas` as a frame, with constant columns ``const`` and, given both logits
    (``[T, vocab]``), the greedy (argmax) next token of each side and whether they differ."""
    d = deltas(a, b)
    df = pl.DataFrame(d, schema={"layer": pl.Int16, "pos": pl.Int32, "l2": pl.Float64, "rel_l2": pl.Float64,
                                 "cos": pl.Float64})
    if logits_a is not None and logits_b is not None:
        ga, gb = logits_a.argmax(-1).tolist(), logits_b.argmax(-1).tolist()
        n_layers = len(a)
        df = df.with_columns(greedy_ref=pl.Series(ga * n_layers, dtype=pl.Int32),
                             greedy=pl.Series(gb * n_layers, dtype=pl.Int32))
        df = df.with_columns(greedy_diverged=pl.col("greedy") != pl.col("greedy_ref"))
    return df.with_columns([pl.lit(v).alias(k) for k, v in const.items()]).select(
        [*const, *[c for c in df.columns if c not in const]])


@dataclasses.dataclass(frozen=True)
class Provenance:
    """The serving configuration activations were produced under (recorded on every row).

    Attributes:
        dtype, device: the model's parameter dtype and device.
        tf32: TF32 allowed in CUDA matmuls; deterministic: ``torch.use_deterministic_algorithms``.
        threads: CPU intra-op threads (``torch.get_num_threads``; it changes CPU reduction splits).
        batch_size: sequences per forward (1 = alone); padding_side: ``left`` / ``right``.
        chunk: prefill chunk size in tokens (0 = one monolithic pass).
        prefix_cache: whether a cached prefix's KV was reused.
    """

    dtype: str = "float32"
    device: str = "cpu"
    tf32: bool = False
    deterministic: bool = False
    threads: int = 1
    batch_size: int = 1
    padding_side: str = "right"
    chunk: int = 0
    prefix_cache: bool = False

    @classmethod
    def of(cls, model: Any, **kw: Any) -> "Provenance":
        """The provenance of ``model`` under torch's current numerics, with ``kw`` overrides."""
        base = dict(dtype=model.dtype, device=model.device, tf32=bool(torch.backends.cuda.matmul.allow_tf32),
                    deterministic=torch.are_deterministic_algorithms_enabled(), threads=torch.get_num_threads())
        return cls(**{**base, **kw})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Provenance":
        return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d})

    def with_columns(self, df: pl.DataFrame) -> pl.DataFrame:
        """``df`` with one constant column per field (existing columns of the same name win)."""
        return df.with_columns([pl.lit(v).alias(k) for k, v in self.to_dict().items() if k not in df.columns])


def against_floor(df: pl.DataFrame, floor: pl.DataFrame | None, dtype: str | None = None) -> pl.DataFrame:
    """``df`` with ``floor_rel_l2`` (the determinism floor of its layer) and ``above_floor``.

    Args:
        df: a long delta table with ``layer`` and ``rel_l2`` (and usually ``dtype``).
        floor: :func:`trajscope.studies.determinism.floor_by_layer` output (``dtype``, ``layer``,
            ``floor_rel_l2``); None leaves the columns null.
        dtype: compare every row with this dtype's floor; default: each row with the floor of its
            own ``dtype`` column.
    Raises:
        TrajscopeError: when the floor has no rows for a dtype that ``df`` needs.
    """
    df = df.drop([c for c in ("floor_rel_l2", "above_floor") if c in df.columns])
    if floor is None:
        return df.with_columns(floor_rel_l2=pl.lit(None, pl.Float64), above_floor=pl.lit(None, pl.Boolean))
    f = floor.select("dtype", pl.col("layer").cast(pl.Int16), "floor_rel_l2")
    if dtype is not None or "dtype" not in df.columns:
        dt = dtype or f["dtype"][0]
        f = f.filter(pl.col("dtype") == dt).drop("dtype")
        need, on = {dt}, ["layer"]
    else:
        need, on = set(df["dtype"].unique()), ["dtype", "layer"]
    missing = need - set(floor["dtype"].unique())
    if missing:
        raise TrajscopeError(f"The determinism floor has no rows for dtype {', '.join(sorted(missing))}; "
                             "measure it in that dtype first.")
    out = df.with_columns(pl.col("layer").cast(pl.Int16)).join(f, on=on, how="left")
    return out.with_columns(above_floor=pl.col("rel_l2") > pl.col("floor_rel_l2"))


def bootstrap_ci(values: Sequence[float], *, n_boot: int = 2000, level: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """Percentile-bootstrap interval of the mean of ``values`` (one value per prompt, so each prompt is
    its own cluster): :func:`trajscope.stats.cluster_bootstrap`. Non-finite values are left out;
    ``(nan, nan)`` for fewer than two values.
    """
    from trajscope.stats import cluster_bootstrap

    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if v.size < 2:
        return float("nan"), float("nan")
    iv = cluster_bootstrap(v, None, level=level, n_boot=n_boot, seed=seed)
    return iv.lo, iv.hi


def summarize(df: pl.DataFrame, by: Sequence[str]) -> pl.DataFrame:
    """One row per group ``by``: mean / p95 / max relative L2, min cosine, the share of positions
    above the floor and of greedy divergences, and a 95 % bootstrap interval over prompts of
    the mean relative L2 (each prompt's mean first, so long prompts do not dominate).
    """
    by = list(by)
    has_floor = "above_floor" in df.columns and df["above_floor"].null_count() < df.height
    aggs = [pl.len().alias("n"), pl.col("prompt_id").n_unique().alias("n_prompts"),
            pl.col("rel_l2").mean().alias("rel_l2_mean"), pl.col("rel_l2").quantile(0.95).alias("rel_l2_p95"),
            pl.col("rel_l2").max().alias("rel_l2_max"), pl.col("l2").max().alias("l2_max"),
            pl.col("cos").min().alias("cos_min")]
    if "floor_rel_l2" in df.columns:
        aggs.append(pl.col("floor_rel_l2").first().alias("floor_rel_l2"))
    if has_floor:
        aggs.append(pl.col("above_floor").cast(pl.Float64).mean().alias("frac_above_floor"))
    if "greedy_diverged" in df.columns:
        aggs.append(pl.col("greedy_diverged").cast(pl.Float64).mean().alias("frac_greedy_diverged"))
    out = df.group_by(by, maintain_order=True).agg(aggs)
    per_prompt = df.group_by([*by, "prompt_id"], maintain_order=True).agg(pl.col("rel_l2").mean().alias("m"))
    cis = {tuple(k): bootstrap_ci(g["m"].to_list()) for k, g in per_prompt.group_by(by, maintain_order=True)}
    keys = out.select(by).rows()
    return out.with_columns(rel_l2_mean_lo=pl.Series([cis[k][0] for k in keys]),
                            rel_l2_mean_hi=pl.Series([cis[k][1] for k in keys]))


def write_table(df: pl.DataFrame, path: str | pathlib.Path, table: str) -> pathlib.Path:
    """Write ``df`` as Parquet with trajscope's schema metadata (table name ``table``)."""
    from trajscope.trajectory import parquet_metadata

    p = pathlib.Path(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        df.write_parquet(p, metadata=parquet_metadata(table))
    except OSError as exc:
        raise TrajscopeError(f"Cannot write '{p}': {exc.strerror or exc}.") from exc
    return p
