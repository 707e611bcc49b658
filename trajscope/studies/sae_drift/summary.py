"""The SAE drift study's headline numbers, computed in one place.

:func:`summarize` reads the study's tables (the seed summary, the mix differences and the
feature overlap of :func:`trajscope.features.reconstruction.reconstruction_report`) and returns
the summaries a :class:`~trajscope.studies.registry.Result` carries, each a dict with ``value``,
``lo``, ``hi`` (the 95 % prompt-clustered bootstrap interval) and its n:

- ``fvu prefill <mix>`` / ``fvu decode <mix>``: the centred fraction of variance unexplained
  (DESIGN.md: E‖x − x̂‖² / E‖x − E[x]‖²) on all prefill / all decode rows, seed mean over the
  mix's replicates, with ``seed_min`` / ``seed_max`` (the noise floor);
- ``fvu decode <mix> − <base>``: the paired difference on decode rows against the first mix,
  with ``seed_floor`` and ``verdict`` (``beyond noise`` when the interval excludes 0 and the
  difference exceeds both mixes' seed ranges);
- ``jaccard decode <mix>``: top-k feature-set overlap of prefill and decode rows at matched n
  (seed mean), beside the prefill-vs-prefill null (``null_mean``, ``null_lo``, ``null_hi``).

The report section, the written ``sae-drift_summary`` table and the result marker all hold
these dicts; nothing else computes them.
"""

from __future__ import annotations

import math
from typing import Any

import polars as pl


def _num(v: Any) -> float | None:
    if v is None:
        return None
    v = float(v)
    return None if math.isnan(v) else v


def summarize(seeds: pl.DataFrame, diffs: pl.DataFrame, overlap: pl.DataFrame) -> dict[str, dict[str, Any]]:
    """The headline numbers of one SAE drift Result (see the module docstring for the keys).

    Args:
        seeds: ``kind, phase, group, sae, metric, n_seeds, value, lo, hi, seed_min, seed_max…`` (plus ``n``,
            ``n_prompts``).
        diffs: ``kind, phase, group, sae, base, metric, diff, diff_lo, diff_hi, seed_floor, verdict``.
        overlap: ``sae, seed, decode_group, metric, observed, null_mean, null_lo, null_hi, outside_null…``.
    Returns:
        ``{name: {"value", "lo", "hi", …}}`` in mix order.
    """
    out: dict[str, dict[str, Any]] = {}
    if seeds.height:
        phase_rows = seeds.filter((pl.col("kind") == "phase") & (pl.col("metric") == "fvu"))
        for phase in ("prefill", "decode"):
            for r in phase_rows.filter(pl.col("phase") == phase).iter_rows(named=True):
                out[f"fvu {phase} {r['sae']}"] = {
                    "value": _num(r["value"]), "lo": _num(r["lo"]), "hi": _num(r["hi"]), "n": r.get("n"),
                    "n_prompts": r.get("n_prompts"), "n_seeds": r.get("n_seeds"),
                    "seed_min": _num(r.get("seed_min")), "seed_max": _num(r.get("seed_max"))}
    if diffs.height:
        dec = diffs.filter((pl.col("kind") == "phase") & (pl.col("phase") == "decode") & (pl.col("metric") == "fvu"))
        for r in dec.iter_rows(named=True):
            out[f"fvu decode {r['sae']} − {r['base']}"] = {
                "value": _num(r["diff"]), "lo": _num(r["diff_lo"]), "hi": _num(r["diff_hi"]),
                "seed_floor": _num(r.get("seed_floor")), "verdict": r.get("verdict")}
    if overlap.height:
        jac = overlap.filter((pl.col("decode_group") == "decode") & (pl.col("metric") == "jaccard_topk"))
        for (sae,), g in jac.group_by(["sae"], maintain_order=True):
            out[f"jaccard decode {sae}"] = {
                "value": _num(g["observed"].mean()), "lo": None, "hi": None, "n": int(g["n_matched"].max()),
                "null_mean": _num(g["null_mean"].mean()), "null_lo": _num(g["null_lo"].mean()),
                "null_hi": _num(g["null_hi"].mean()), "n_seeds": g.height,
                "seeds_outside_null": int(g["outside_null"].cast(pl.Int64).sum())}
    return out


def summary_table(summaries: dict[str, Any]) -> pl.DataFrame:
    """The summaries as the ``sae-drift_summary`` table: one row per headline number (``setup`` left out)."""
    rows = [{"summary": name, "value": s.get("value"), "lo": s.get("lo"), "hi": s.get("hi"), "n": s.get("n"),
             "n_prompts": s.get("n_prompts"), "seed_min": s.get("seed_min"), "seed_max": s.get("seed_max"),
             "verdict": s.get("verdict")}
            for name, s in summaries.items() if name != "setup" and isinstance(s, dict)]
    schema = {"summary": pl.String, "value": pl.Float64, "lo": pl.Float64, "hi": pl.Float64, "n": pl.Int64,
              "n_prompts": pl.Int64, "seed_min": pl.Float64, "seed_max": pl.Float64, "verdict": pl.String}
    return pl.DataFrame(rows, schema=schema)
