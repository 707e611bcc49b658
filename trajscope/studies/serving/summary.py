"""The serving studies' headline numbers: one function computes them, from the Result's tables.

:func:`headline` is the only place where a serving study's headline is computed. The study's run
stores it in ``Result.summaries`` (written to ``<study>.result.json``); the report section shows
``Result.summaries``, and computes them with this same function for a folder written before the
marker held them (:func:`summaries_of`). Each entry is ``{"value", "lo", "hi", "n"}`` (``lo``/``hi``
None where the number is a maximum or a floor, which has no interval) plus what it describes.

- determinism: the float32 floor at the deepest layer; the largest change a lower precision makes
  there (mean relative L2 vs float32, with its prompt-clustered interval);
- batch, chunked-prefill, prefix-cache: the largest mean relative L2 at the deepest layer over the
  study's conditions (with its interval), and the largest single delta as a multiple of the floor;
- prefix-cache also: the share of a prompt's positions a warm cache never computes (mean over
  prompts, prompt bootstrap);
- sae-stability: the lowest active-feature Jaccard between SAEs that differ only by serving mode,
  and the same between seeds.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from trajscope.studies.registry import Result


def _entry(value: Any, lo: Any = None, hi: Any = None, n: Any = None, **what: Any) -> dict[str, Any]:
    f = (lambda v: None if v is None else float(v))
    return {"value": f(value), "lo": f(lo), "hi": f(hi), "n": None if n is None else int(n), **what}


def _largest_delta(summ: pl.DataFrame, group: list[str]) -> dict[str, dict]:
    deepest = summ.filter(pl.col("layer") == summ["layer"].max())
    row = deepest.sort("rel_l2_mean", descending=True, nulls_last=True).row(0, named=True)
    out = {"largest mean rel. L2 at the deepest layer": _entry(
        row["rel_l2_mean"], row.get("rel_l2_mean_lo"), row.get("rel_l2_mean_hi"), row.get("n_prompts"),
        layer=int(row["layer"]), condition=", ".join(f"{g} {row[g]}" for g in group if g in row))}
    if "floor_rel_l2" in summ.columns:
        ratio = (summ["rel_l2_max"] / summ["floor_rel_l2"]).max()
        out["largest delta / float32 floor"] = _entry(ratio, n=row.get("n_prompts"))
    return out


def reused_share(coverage: pl.DataFrame) -> Any:
    """Mean over prompts of the share of a prompt's positions served from the prefix cache (``status`` "reused"
    in a coverage table), with its bootstrap interval over prompts (:func:`trajscope.stats.cluster_bootstrap`).
    The prompts are put in ``prompt_id`` order first: the bootstrap resamples them by index."""
    from trajscope.stats import cluster_bootstrap

    per = coverage.group_by("prompt_id").agg((pl.col("status") == "reused").mean().alias("share")).sort("prompt_id")
    return cluster_bootstrap(per["share"].to_numpy())


def headline(result: Result) -> dict[str, dict]:
    """The headline numbers of a serving study's Result (see the module docstring)."""
    name = result.study
    if name == "determinism":
        fl = result.table("determinism_floor").filter(pl.col("dtype") == "float32")
        out = {}
        if fl.height:
            deepest = fl.filter(pl.col("layer") == fl["layer"].max()).row(0, named=True)
            out["float32 floor at the deepest layer"] = _entry(deepest["floor_rel_l2"], n=deepest.get("n_prompts"),
                                                               layer=int(deepest["layer"]))
        summ = result.table("determinism_summary").filter(pl.col("condition") == "vs_float32")
        if summ.height:
            out["largest precision change vs float32 at the deepest layer"] = _largest_delta(summ, ["dtype"])[
                "largest mean rel. L2 at the deepest layer"]
        return out
    if name in ("batch", "chunked-prefill", "prefix-cache"):
        group = {"batch": ["neighbours", "padding_side", "slot"], "chunked-prefill": ["chunk"]}.get(name, [])
        out = _largest_delta(result.table(f"{name}_summary"), group)
        if name == "prefix-cache":
            iv = reused_share(result.table("prefix-cache_coverage"))
            out["share of a prompt's positions never computed"] = _entry(iv.estimate, iv.lo, iv.hi, iv.n_clusters)
        return out
    if name == "sae-stability":
        summ = result.table("sae-stability_summary").filter(pl.col("metric") == "row_jaccard")
        out = {}
        for kind, label in (("same_seed", "lowest row Jaccard, serving mode only"), ("seed", "row Jaccard between seeds")):
            rows = summ.filter(pl.col("kind") == kind).sort("value")
            if rows.height:
                r = rows.row(0, named=True)
                out[label] = _entry(r["value"], r.get("lo"), r.get("hi"), r.get("n_pairs"), mode=str(r["mode"]))
        return out
    return {}


def summaries_of(result: Result) -> dict[str, dict]:
    """``result.summaries`` when the study wrote them, else :func:`headline` of its tables."""
    return result.summaries or headline(result)
