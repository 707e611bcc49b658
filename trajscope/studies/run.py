"""One call per serving study: run it, read it against the determinism floor, summarise it.

:func:`run_study` returns the study's tables by name (what ``trajscope study …`` writes as
``<name>.parquet``):

- ``determinism``: ``determinism`` (long; each row against its dtype's floor, except
  ``vs_float32`` rows — what choosing bf16/fp16 does — against the float32 floor),
  ``determinism_floor`` (per dtype × layer, :func:`~trajscope.studies.determinism.floor_by_layer`),
  ``determinism_summary`` (per dtype × condition × layer);
- ``batch``: ``batch`` (long, with ``floor_rel_l2`` / ``above_floor``), ``batch_bands``,
  ``batch_summary`` (per neighbours × padding side × slot × layer), ``batch_floor``;
- ``chunked-prefill``: ``chunked-prefill``, ``chunked-prefill_summary`` (per chunk × layer),
  ``chunked-prefill_floor``;
- ``prefix-cache``: ``prefix-cache`` (reuse deltas), ``prefix-cache_coverage`` (per position),
  ``prefix-cache_coverage_summary``, ``prefix-cache_summary`` (per layer), ``prefix-cache_floor``;
- ``sae-stability``: ``sae-stability_harvests``, ``_saes``, ``_pairs``, ``_summary``
  (:func:`~trajscope.studies.sae_stability.sae_stability_study`; no floor, it compares SAEs).

Summaries come from :func:`~trajscope.studies.common.summarize` (mean / p95 / max relative
L2 with a bootstrap interval over prompts, share above the floor, greedy divergence). Unless
a floor is given, the floor of the model's own dtype is measured on the same prompts first.
"""

from __future__ import annotations

import pathlib
from typing import Any, Callable, Sequence

import polars as pl

from trajscope.errors import TrajscopeError
from trajscope.studies import batching, determinism, prefill, prefix_cache
from trajscope.studies.common import against_floor, summarize, write_table

STUDIES = ("batch", "determinism", "chunked-prefill", "prefix-cache", "sae-stability")


def run_study(name: str, model: Any, prompts: Sequence[tuple[str, list[int]]], *, floor: pl.DataFrame | None = None,
              layers: Sequence[int] | None = None, progress: Callable[[int, int], None] | None = None,
              **options: Any) -> dict[str, pl.DataFrame]:
    """Run the study ``name`` on ``prompts`` (``(id, token ids)`` pairs) and return its tables.

    Args:
        name: one of :data:`STUDIES`.
        model: a local :class:`~trajscope.model.ModelHandle`.
        floor: a determinism floor (``floor_by_layer`` frame); default: measured here.
        layers: blocks to compare (default all).
        options: the study's own keywords (``batch_size``, ``neighbours``, ``sides``, ``slots``;
            ``dtypes``, ``repeats``; ``chunks``; ``warm``, ``block``, ``min_shared``).
    """
    if name not in STUDIES:
        raise TrajscopeError(f"Unknown study '{name}'; choose one of {', '.join(STUDIES)}.")
    if not prompts:
        raise TrajscopeError("The prompt set is empty.")
    bad = [x for x in (layers or ()) if not 0 <= int(x) < model.n_layers]
    if bad:
        raise TrajscopeError(f"Layer {bad[0]} is out of range; the model has layers 0..{model.n_layers - 1}.")
    if name == "sae-stability":
        from trajscope.studies.sae_stability import sae_stability_study

        return sae_stability_study(model, prompts, options.get("config") or _default_stability(layers), progress=progress)
    if name == "determinism":
        det = determinism.determinism_study(model, prompts, layers=layers, progress=progress, **options)
        fl = determinism.floor_by_layer(det)
        # each dtype's noise against its own floor; what choosing the dtype does (vs_float32) against float32's
        vs32 = det["condition"] == "vs_float32"
        parts = [against_floor(det.filter(~vs32), fl)]
        if vs32.any():
            parts.append(against_floor(det.filter(vs32), fl, dtype="float32"))
        det = pl.concat(parts, how="vertical_relaxed")
        return {"determinism": det, "determinism_floor": fl,
                "determinism_summary": summarize(det, ["dtype", "condition", "layer"])}
    if name == "prefix-cache":
        seqs = [ids for _, ids in prompts]
        reused = prefix_cache.plan_reuse(seqs, warm=options.get("warm", True), block=options.get("block", 1),
                                         min_shared=options.get("min_shared", prefix_cache.MIN_SHARED))
    fl = floor if floor is not None else determinism.measure_floor(model, prompts, layers=layers)
    if name == "batch":
        d, bands = batching.batch_composition_study(model, prompts, layers=layers, progress=progress, **options)
        d = against_floor(d, fl)
        return {"batch": d, "batch_bands": bands,
                "batch_summary": summarize(d, ["neighbours", "padding_side", "slot", "layer"]), "batch_floor": fl}
    if name == "chunked-prefill":
        d = against_floor(prefill.chunked_prefill_study(model, prompts, layers=layers, progress=progress, **options), fl)
        return {"chunked-prefill": d, "chunked-prefill_summary": summarize(d, ["chunk", "layer"]),
                "chunked-prefill_floor": fl}
    cov = prefix_cache.coverage_map(model, prompts, reused)
    d = against_floor(prefix_cache.prefix_reuse_deltas(model, prompts, reused, layers=layers, progress=progress), fl)
    return {"prefix-cache": d, "prefix-cache_coverage": cov,
            "prefix-cache_coverage_summary": prefix_cache.coverage_summary(cov),
            "prefix-cache_summary": summarize(d, ["layer"]), "prefix-cache_floor": fl}


def _default_stability(layers: Sequence[int] | None) -> Any:
    from trajscope.studies.sae_stability import StabilityConfig

    return StabilityConfig(layer=int(layers[0])) if layers else StabilityConfig()


def write_tables(tables: dict[str, pl.DataFrame], out: str | pathlib.Path) -> list[pathlib.Path]:
    """Write every table as ``out/<name>.parquet`` with trajscope's schema metadata
    (table name ``serving_<name>``); returns the paths."""
    return [write_table(df, pathlib.Path(out) / f"{name}.parquet", f"serving_{name}") for name, df in tables.items()]
