"""The drift study's headline numbers: computed by :func:`headline` only, read by everything else.

The numbers (each a dict ``value, lo, hi, n_prompts, n_clusters``; ``lo``/``hi`` are None when
fewer than two resampling units exist):

- ``decode_flagged``: share of decode (position × layer) cells whose drift score is above its
  layer's calibrated threshold (the profile's per-position threshold at its ``fpr``);
- ``prefill_flagged``: the same share over prefill positions 1..P−1 (position 0, the attention
  sink, is left out as the profile leaves it out) — on held-out prompts, the realised
  false-positive rate, to read against the nominal one;
- ``decode_minus_continuation``: decode minus teacher-forced human continuation, same prompt,
  position and layer (present only when continuation rows exist): the part of the decode share
  due to reading self-generated text rather than to position.

Each share pools every layer's cells; the interval is a 95 % percentile bootstrap over resampling
units (prompts, or their source files) with every unit's cells moving together
(:func:`trajscope.stats.cluster_bootstrap`). The study's ``run`` and the app card's run scoring
call :func:`headline`; the report section, the card and the written marker read its output from
the :class:`~trajscope.studies.registry.Result`. :func:`lines` words them for display.
"""

from __future__ import annotations

import math
from typing import Any

import polars as pl

from trajscope.interval_text import format_interval

LABELS = {
    "decode_flagged": "Decode cells flagged (position × layer above the layer's threshold)",
    "prefill_flagged": "Prefill cells flagged (positions 1..P−1: the realised false-positive rate)",
    "decode_minus_continuation": "Decode minus human continuation, flagged share at matched positions",
}


def _clean(v: float) -> float | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def _share(values: pl.DataFrame, column: str, cluster: str, n_boot: int, seed: int) -> dict[str, Any] | None:
    from trajscope.stats import cluster_bootstrap

    if values.height == 0:
        return None
    iv = cluster_bootstrap(values[column].cast(pl.Float64).to_numpy(), values[cluster].to_list(), n_boot=n_boot,
                           seed=seed)
    return {"value": float(iv.estimate), "lo": _clean(iv.lo), "hi": _clean(iv.hi),
            "n_prompts": int(values["prompt_id"].n_unique()), "n_clusters": int(iv.n_clusters)}


def headline(rows: pl.DataFrame, *, cluster: str = "prompt_id", n_boot: int = 1000, seed: int = 0) -> dict[str, Any]:
    """The study's headline numbers from scored rows (the one place they are computed).

    Args:
        rows: one row per prompt × regime × position × layer with ``prompt_id``, ``regime`` (``prefill``,
            ``decode``, ``continuation``), ``pos``, ``layer``, ``flagged`` and the ``cluster`` column
            (:func:`trajscope.studies.drift.regimes.regime_rows` output, or a run's scored table).
        cluster: the resampling unit's column.
        n_boot, seed: the bootstrap's resamples and seed.
    Returns:
        ``{name: {"value", "lo", "hi", "n_prompts", "n_clusters"}}`` for the names in :data:`LABELS` that the
        rows support.
    """
    out: dict[str, Any] = {}
    for name, regime in (("decode_flagged", "decode"), ("prefill_flagged", "prefill")):
        s = _share(rows.filter((pl.col("regime") == regime) & (pl.col("pos") > 0)), "flagged", cluster, n_boot, seed)
        if s is not None:
            out[name] = s
    key = ["prompt_id", "pos", "layer"]
    dec = rows.filter(pl.col("regime") == "decode").select(list(dict.fromkeys([*key, cluster, "flagged"])))
    cont = rows.filter(pl.col("regime") == "continuation").select(*key, pl.col("flagged").alias("_cont"))
    paired = dec.join(cont, on=key).with_columns(
        (pl.col("flagged").cast(pl.Float64) - pl.col("_cont").cast(pl.Float64)).alias("gap"))
    gap = _share(paired, "gap", cluster, n_boot, seed)
    if gap is not None:
        out["decode_minus_continuation"] = gap
    return out


def lines(summaries: dict[str, Any]) -> list[tuple[str, str]]:
    """``(label, "value [lo, hi] (n prompts)")`` for each headline number in ``summaries`` (display only)."""
    out = []
    for name, label in LABELS.items():
        s = summaries.get(name)
        if not isinstance(s, dict):
            continue
        text = format_interval(s.get("value"), s.get("lo"), s.get("hi"), 4, n_clusters=s.get("n_clusters"))
        n = s.get("n_prompts")
        out.append((label, f"{text} (n = {n} prompt{'' if n == 1 else 's'})"))
    return out
