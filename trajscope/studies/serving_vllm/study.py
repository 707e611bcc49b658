"""The serving-vllm study's runs: which engine runs what, and the tables built from the runs.

Every prompt is first run **alone** (one request in the engine) on the reference engine
(prefix caching on, a token budget larger than any batch, so a prompt is prefilled in one
forward). Each comparison then runs the same prompt under one serving condition and compares
its layer-``L`` residual rows with the alone run's, position by position:

- ``batch``: the prompt co-scheduled with three neighbours in one ``generate`` call (vLLM's
  continuous batching flattens them into one token batch): ``shorter`` / ``longer`` / ``mixed``
  neighbours from the prompt set (:func:`trajscope.studies.batching.pick_neighbours`) or
  ``copies`` of itself (identical inputs), the prompt's request ``first`` or ``last``. Every
  request gets its own prefix-cache salt, so no request reads another's cache;
- ``chunked-prefill``: a second engine whose token budget per forward is the chunk size
  (``max_num_batched_tokens``; vLLM then prefills a prompt in chunks of that many tokens), prefix
  caching off;
- ``prefix-cache``: the prompts in order on one shared salt, so each reuses the cached full blocks
  of what came before (the shared header above all); vLLM's own ``num_cached_tokens`` says how many
  leading positions were served from the cache and were never computed.

Rows are compared at the positions both runs computed, up to the first generated token that
differs (after it the inputs differ); whether the greedy tokens stayed identical is recorded per run.
The **float32 floor** is the determinism study's (:mod:`trajscope.studies.determinism`): the max over
the alone sequences and positions of ``max(rel L2 of 1 vs 2 threads, 2 × rel L2 vs float64)``,
measured on Hugging Face (trajscope's own forward) at layer ``L``.
"""

from __future__ import annotations

import importlib.util
import json
import pathlib
import subprocess
import sys
import tempfile
from typing import Any, Callable, Sequence

import torch

from trajscope.errors import TrajscopeError
from trajscope.studies.registry import Result

NO_VLLM = ("The serving-vllm study runs vLLM itself, which is not installed in this environment: run it with "
           ".venv-vllm/bin/trajscope after `bash scripts/install.sh --vllm`.")


def plan_calls(prompts: Sequence[tuple[str, list[int]]], config: Any) -> dict[str, list[list[dict]]]:
    """The reference engine's calls (``alone``, ``batch``, ``prefix-cache``) and the chunked engines' calls.

    Returns:
        ``{"reference": [...], "chunk<c>": [...]}``; each call a list of requests ``{run_id, ids, salt}``.
    """
    from trajscope.studies.batching import pick_neighbours

    lengths = [len(ids) for _, ids in prompts]
    ref = [[{"run_id": f"alone-{i}", "ids": ids, "salt": f"alone-{i}"}] for i, (_, ids) in enumerate(prompts)]
    k = config.batch_size - 1
    for i, (_, ids) in enumerate(prompts):
        for kind in config.neighbours:
            others = pick_neighbours(i, lengths, kind, k)
            if others is None:
                continue
            for slot in config.slots:
                if kind == "copies" and slot != config.slots[0]:
                    continue  # identical requests: the slot cannot matter
                tag = f"batch-{i}-{kind}-{slot}"
                target = {"run_id": tag, "ids": ids, "salt": f"{tag}-0"}
                rest = [{"ids": prompts[j][1], "salt": f"{tag}-{n + 1}"} for n, j in enumerate(others)]
                ref.append([target, *rest] if slot == "first" else [*rest, target])
    if not config.no_prefix_cache:
        ref += [[{"run_id": f"prefix-{i}", "ids": ids, "salt": "shared"}] for i, (_, ids) in enumerate(prompts)]
    out = {"reference": ref}
    for c in config.chunks:
        out[f"chunk{c}"] = [[{"run_id": f"chunk{c}-{i}", "ids": ids, "salt": None}] for i, (_, ids) in enumerate(prompts)]
    return out


def engine_settings(name: str, config: Any, longest: int) -> dict:
    """``vllm.LLM`` keywords of the reference engine or of ``chunk<c>``."""
    max_len = longest + config.new_tokens + 8
    if name == "reference":
        return {"enable_prefix_caching": True, "block_size": config.block, "max_model_len": max_len,
                "max_num_batched_tokens": max(2048, config.batch_size * max_len), "max_num_seqs": max(config.batch_size, 1)}
    c = int(name.removeprefix("chunk"))
    return {"enable_prefix_caching": False, "block_size": config.block, "max_model_len": max_len,
            "enable_chunked_prefill": True, "max_num_batched_tokens": c, "max_num_seqs": min(c, 4)}


def run_engine(model_dir: str, name: str, calls: list, config: Any, layer: int, longest: int, out: pathlib.Path,
               progress: Callable[[int], None] | None = None) -> dict:
    """Run one engine's calls in a subprocess (:mod:`trajscope.studies.serving_vllm.engine`); its ``engine.json``."""
    d = out / name
    d.mkdir(parents=True)
    spec = {"model": model_dir, "out": str(d), "engine": engine_settings(name, config, longest), "calls": calls,
            "max_tokens": config.new_tokens, "layer": layer}
    (d / "spec.json").write_text(json.dumps(spec))
    with open(d / "engine.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "trajscope.studies.serving_vllm.engine", str(d / "spec.json")],
                                stdout=subprocess.PIPE, stderr=log, text=True)
        for line in proc.stdout:
            if line.startswith("PROGRESS ") and progress is not None:
                progress(int(line.split()[1]))
        rc = proc.wait()
    if rc != 0:
        tail = (d / "engine.log").read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
        raise TrajscopeError(f"The vLLM engine '{name}' stopped with exit code {rc} ({tail[0][:200]}).")
    return json.loads((d / "engine.json").read_text())


def float32_floor(model: Any, sequences: Sequence[Sequence[int]], layer: int,
                  tick: Callable[[], None] | None = None) -> list[float]:
    """Per sequence the float32 floor at ``layer`` (the determinism study's definition, module docstring)."""
    from trajscope.studies.determinism import sibling

    model, f64 = sibling(model, "float32"), sibling(model, "float64")
    threads = torch.get_num_threads()
    out = []
    try:
        for ids in sequences:
            h = {}
            for key, m, n in (("a", model, 1), ("b", model, 2), ("f64", f64, 1)):
                torch.set_num_threads(n)
                h[key] = m.forward(list(ids), layers=[layer]).resid[layer].double()
            rel = lambda p, q: float(((p - q).norm(dim=-1) / q.norm(dim=-1).clamp_min(1e-30)).max())
            out.append(max(rel(h["a"], h["b"]), 2 * rel(h["a"], h["f64"])))
            if tick is not None:
                tick()
    finally:
        torch.set_num_threads(threads)
    return out


def run(model: Any, prompts: Sequence[tuple[str, list[int]]] | None, config: Any,
        progress: Callable[[int, int], None] | None = None, layers: Sequence[int] | None = None) -> Result:
    """Run the study (module docstring); tables ``serving-vllm`` (deltas), ``serving-vllm_summary``,
    ``serving-vllm_runs``, ``serving-vllm_floor``, ``serving-vllm_coverage`` and ``serving-vllm_coverage_summary``;
    with ``config.sae_seeds`` also the SAE part's (:func:`trajscope.studies.serving_vllm.saes.sae_tables`)."""
    if importlib.util.find_spec("vllm") is None:
        raise TrajscopeError(NO_VLLM)
    from trajscope.studies.serving_vllm.saes import mode_runs
    from trajscope.studies.serving_vllm.tables import build

    if not prompts or len(prompts) < 2:
        raise TrajscopeError("The serving-vllm study needs at least 2 prompts (neighbours come from the same set).")
    layer = int(layers[0]) if layers else model.n_layers // 2  # --layers: the first one given
    if not 0 <= layer < model.n_layers:
        raise TrajscopeError(f"Layer {layer} is out of range; the model has layers 0..{model.n_layers - 1}.")
    model_dir = model.source_path
    if model.remote or not model_dir or not (pathlib.Path(model_dir) / "config.json").is_file():
        raise TrajscopeError("The serving-vllm study serves the model's own directory with vLLM, so it needs a local "
                             "model with a config.json.")
    if config.sae_seeds and len(prompts) < 4:
        raise TrajscopeError(f"The SAE part (--sae-seeds) needs at least 4 prompts (train and eval), not {len(prompts)}.")
    plan = plan_calls(prompts, config)
    n_saes = len(set(config.sae_seeds)) * len(mode_runs(plan, len(prompts))) if config.sae_seeds else 0
    total = sum(len(c) for c in plan.values()) + len(prompts) + n_saes
    done = 0
    longest = max(len(ids) for _, ids in prompts)
    with tempfile.TemporaryDirectory(prefix="trajscope-serving-vllm-") as tmp:
        out, engines = pathlib.Path(tmp), {}
        for name, calls in plan.items():
            base = done
            engines[name] = run_engine(model_dir, name, calls, config, layer, longest, out,
                                       None if progress is None else (lambda n, b=base: progress(b + n, total)))
            done += len(calls)
        alone = [engines["reference"]["runs"][f"alone-{i}"]["output_ids"] for i in range(len(prompts))]
        seqs = [ids + o[:-1] for (_, ids), o in zip(prompts, alone)]
        ticks = iter(range(done + 1, total + 1))
        floors = float32_floor(model, seqs, layer, None if progress is None else lambda: progress(next(ticks), total))
        tables = build(model, prompts, plan, engines, floors, layer, out)
        if config.sae_seeds:
            tables.update(_sae_part(prompts, plan, config, layer, out,
                                    None if progress is None else (lambda n, b=len(prompts) + done: progress(b + n, total))))
    result = Result(study="serving-vllm", tables=tables, config={**_asdict(config), "layer": layer})
    from trajscope.studies.serving_vllm.report import headline

    result.summaries = headline(result)
    result.summaries["setup"] = {"engines": {k: {"settings": v["engine"], "start_seconds": round(v["start_seconds"], 1),
                                                 "run_seconds": round(v["run_seconds"], 1), "vllm": v["vllm"]}
                                             for k, v in engines.items()},
                                 "model": model.model_id, "layer": layer, "n_prompts": len(prompts)}
    return result


def _sae_part(prompts: Sequence[tuple[str, list[int]]], plan: dict, config: Any, layer: int, out: pathlib.Path,
              progress: Callable[[int, int], None] | None) -> dict:
    """The SAE part's tables (:mod:`trajscope.studies.serving_vllm.saes`) from the runs the engines wrote."""
    from trajscope.studies.prompts import shared_prefix_len
    from trajscope.studies.sae_stability import StabilityConfig
    from trajscope.studies.serving_vllm.saes import load_harvests, mode_runs, sae_tables

    harvests = load_harvests(out, mode_runs(plan, len(prompts)), prompts, layer)
    cfg = StabilityConfig(layer=layer, seeds=tuple(dict.fromkeys(config.sae_seeds)), d_sae=config.sae_d_sae,
                          k=config.sae_k, n_tokens=config.sae_n_tokens)
    return sae_tables(harvests, shared_prefix_len([ids for _, ids in prompts]), cfg,
                      eval_fraction=config.sae_eval_fraction, first_pos=config.sae_first_pos, progress=progress)


def _asdict(config: Any) -> dict:
    import dataclasses

    return dataclasses.asdict(config)
