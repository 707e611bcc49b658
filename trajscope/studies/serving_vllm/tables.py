"""The serving-vllm study's tables, built from the engines' runs (:mod:`trajscope.studies.serving_vllm.study`).

- ``serving-vllm``: one row per (part, condition, prompt, position) compared: ``l2``, ``rel_l2``,
  ``cos`` against the prompt's alone run, ``phase`` (prefill / decode), ``floor_rel_l2`` (the
  study-wide float32 floor: max over prompts) and ``above_floor``;
- ``serving-vllm_summary``: per part and condition, :func:`trajscope.studies.common.summarize`
  (mean / p95 / max relative L2 with the prompt-bootstrap interval of the mean, the share of
  positions above the floor);
- ``serving-vllm_runs``: per compared run, whether its greedy tokens equal the alone run's, the
  first generated index that differs, the prompt tokens vLLM served from its prefix cache
  (``num_cached_tokens``) and the first position the engine computed;
- ``serving-vllm_floor``: the float32 floor of each prompt's alone sequence;
- ``serving-vllm_coverage`` / ``_coverage_summary``: the prefix-cache part's coverage map, from
  vLLM's own hit counts (:func:`trajscope.studies.prefix_cache.coverage_map` / ``coverage_summary``):
  which positions a prefix-cached harvest never computes, by token class, region and position band.
"""

from __future__ import annotations

import pathlib
from typing import Any, Sequence

import polars as pl
import torch

from trajscope.studies.common import summarize


def _condition(run_id: str) -> tuple[str, str, int]:
    """``(part, condition, prompt index)`` of a compared run id."""
    kind, rest = run_id.split("-", 1)
    if kind == "batch":
        i, nb, slot = rest.split("-")
        return "batch", f"{nb} neighbours, {slot}", int(i)
    if kind == "prefix":
        return "prefix-cache", "shared cache, in order", int(rest)
    return "chunked-prefill", f"chunks of {kind.removeprefix('chunk')} tokens", int(rest)


def _rows(run_dir: pathlib.Path, layer: int) -> tuple[int, torch.Tensor, list[int], int]:
    """``(first computed position, residual rows [n, d], token ids, prompt length)`` of one run."""
    from trajscope.trajectory import Trajectory

    t = Trajectory.load(run_dir)
    return int(t.meta["vllm"]["first_computed_pos"]), t.residual(layer).double(), list(t.token_ids), t.prompt_len


def compare(ref_dir: pathlib.Path, run_dir: pathlib.Path, layer: int) -> tuple[pl.DataFrame, dict]:
    """Per common position: ``pos``, ``l2``, ``rel_l2``, ``cos``; and the run's token facts."""
    f0, x0, ids0, P = _rows(ref_dir, layer)
    f1, x1, ids1, _ = _rows(run_dir, layer)
    div = next((j for j, (a, b) in enumerate(zip(ids0[P:], ids1[P:])) if a != b), None)
    end = min(f0 + len(x0), f1 + len(x1), P + div if div is not None else 1 << 30)
    lo = max(f0, f1)
    a, b = x0[lo - f0:end - f0], x1[lo - f1:end - f1]
    diff = (b - a).norm(dim=-1)
    df = pl.DataFrame({"pos": list(range(lo, end)), "l2": diff.tolist(),
                       "rel_l2": (diff / a.norm(dim=-1).clamp_min(1e-30)).tolist(),
                       "cos": torch.nn.functional.cosine_similarity(a, b, dim=-1).tolist()},
                      schema_overrides={"pos": pl.Int32})
    return df, {"tokens_identical": ids0 == ids1, "first_divergence": div, "first_computed_pos": f1}


def build(model: Any, prompts: Sequence[tuple[str, list[int]]], plan: dict, engines: dict, floors: list[float],
          layer: int, out: pathlib.Path) -> dict[str, pl.DataFrame]:
    from trajscope.studies.prefix_cache import coverage_map, coverage_summary

    floor = max(floors)
    frames, runs = [], []
    for name, calls in plan.items():
        for call in calls:
            for r in call:
                rid = r.get("run_id")
                if not rid or rid.startswith("alone-"):
                    continue
                part, cond, i = _condition(rid)
                pid, ids = prompts[i]
                df, facts = compare(out / "reference" / f"alone-{i}", out / name / rid, layer)
                hits = engines[name]["runs"][rid]["num_cached_tokens"]
                runs.append({"part": part, "condition": cond, "prompt_id": pid, "prompt_len": len(ids),
                             "num_cached_tokens": hits, **facts, "n_compared": df.height})
                frames.append(df.with_columns(part=pl.lit(part), condition=pl.lit(cond), prompt_id=pl.lit(pid),
                                              layer=pl.lit(layer, pl.Int16),
                                              phase=pl.when(pl.col("pos") < len(ids)).then(pl.lit("prefill"))
                                              .otherwise(pl.lit("decode"))))
    deltas = pl.concat(frames, how="vertical_relaxed").with_columns(floor_rel_l2=pl.lit(floor)).with_columns(
        above_floor=pl.col("rel_l2") > pl.col("floor_rel_l2")).select(
        "part", "condition", "prompt_id", "layer", "pos", "phase", "l2", "rel_l2", "cos", "floor_rel_l2", "above_floor")
    tables = {"serving-vllm": deltas,
              "serving-vllm_summary": summarize(deltas, ["part", "condition"]),
              "serving-vllm_runs": pl.DataFrame(runs, schema_overrides={"first_divergence": pl.Int32}),
              "serving-vllm_floor": pl.DataFrame({"prompt_id": [p for p, _ in prompts], "layer": [layer] * len(prompts),
                                                  "floor_rel_l2": floors})}
    hits = {int(rid.split("-")[1]): v["num_cached_tokens"] for rid, v in engines["reference"]["runs"].items()
            if rid.startswith("prefix-")}
    if hits:
        reused = [hits[i] for i in range(len(prompts))]
        cov = coverage_map(model, prompts, reused)
        tables["serving-vllm_coverage"] = cov
        tables["serving-vllm_coverage_summary"] = coverage_summary(cov)
    return tables
