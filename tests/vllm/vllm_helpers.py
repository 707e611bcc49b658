"""Shared pieces of the vLLM tests: generation with trajscope keys, reading the runs, the numeric floor."""

from __future__ import annotations

import pathlib

import torch

LAYER = 15
N_NEW = 8
PROMPT = "The capital of France is Paris. The capital of Germany is"
BATCH_TEXTS = ("Hi", "Write a short poem about the sea and the wind in the evening light",
               PROMPT + " Berlin, and of Spain")
ROOT = pathlib.Path(__file__).resolve().parents[2]
SMOLLM2 = ROOT / "sample_data" / "smollm2"
RATE_WINDOWS = (2, 2)  # baseline and current feature-rate windows, in requests, of the test engines


def generate(llm, prompts: list[list[int]], n_new: int, extra: list[dict]) -> list:
    """Greedy generation of token-id prompts, one ``extra_args`` per prompt; returns vLLM's outputs."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = [SamplingParams(max_tokens=n_new, temperature=0.0, ignore_eos=True, extra_args=e) for e in extra]
    return llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)


def load_run(out: pathlib.Path, run_id: str):
    """A finished request's run directory, once the plugin's writer thread has saved it."""
    import trajscope as ts
    from trajscope.vllm.plugin import flush

    assert flush(timeout=60), "the plugin's writer thread did not save the runs within 60 s"
    return ts.Trajectory.load(out / run_id)


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-row ‖a − b‖ / ‖b‖ (float64)."""
    a, b = a.double(), b.double()
    return (a - b).norm(dim=-1) / b.norm(dim=-1).clamp_min(1e-30)


def float32_floor(model_dir, sequences: list[list[int]], layer: int = LAYER) -> float:
    """The float32 determinism floor at ``layer``, measured on Hugging Face over ``sequences`` (teacher-forced).

    As :mod:`trajscope.studies.determinism` defines it: the max over sequences and positions of
    ``max(rel L2 of the float32 forward at 1 thread vs 2 threads, 2 × rel L2 of float32 vs float64)``
    (two float32 computations each within ε of exact differ by up to 2ε; vLLM's CPU worker runs one
    thread, Hugging Face here two)."""
    from transformers import AutoModelForCausalLM

    models = {d: AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=d, attn_implementation="eager")
              for d in (torch.float32, torch.float64)}
    threads = torch.get_num_threads()
    worst = 0.0
    try:
        for ids in sequences:
            x = torch.tensor([ids])
            with torch.no_grad():
                h = {}
                for key, dtype, n in (("f32", torch.float32, 2), ("f32-1", torch.float32, 1), ("f64", torch.float64, 2)):
                    torch.set_num_threads(n)
                    h[key] = models[dtype](x, output_hidden_states=True).hidden_states[layer + 1][0]
            worst = max(worst, float(rel_l2(h["f32"], h["f32-1"]).max()), 2 * float(rel_l2(h["f32"], h["f64"]).max()))
    finally:
        torch.set_num_threads(threads)
    return worst


def expected_series(run_dirs: list[pathlib.Path], sae_width: int, baseline: int, window: int) -> dict:
    """The trajscope_* values recomputed from the runs' Parquet files alone (polars + numpy + SciPy, not trajscope):
    drift sum/count/flagged over the probe tables, reconstruction error sum/count over ``tokens.sae_rel_err``,
    and the feature-rate windows over the decode-position firings of ``features``, in the given finish order."""
    import numpy as np
    import polars as pl
    from scipy.stats import entropy

    out = {"drift_sum": 0.0, "drift_count": 0, "flagged": 0, "recon_sum": 0.0, "recon_count": 0}
    per_req = []
    for d in run_dirs:
        if (d / "probe.parquet").is_file():
            probe = pl.read_parquet(d / "probe.parquet")
            out["drift_sum"] += float(probe["score"].cast(pl.Float64).sum())
            out["drift_count"] += probe.height
            out["flagged"] += int((probe["score"] > probe["threshold"]).sum())
        if (d / "features.parquet").is_file():
            err = pl.read_parquet(d / "tokens.parquet")["sae_rel_err"].drop_nulls()
            out["recon_sum"] += float(err.cast(pl.Float64).sum())
            out["recon_count"] += err.len()
            f = pl.read_parquet(d / "features.parquet").filter(pl.col("step") >= 1, pl.col("value") > 0)
            n_pos = int((pl.read_parquet(d / "activations.parquet")["step"] >= 1).sum())
            per_req.append((np.bincount(f["feature"].to_numpy(), minlength=sae_width), n_pos))
    if per_req:
        base = sum(c for c, _ in per_req[:baseline])
        cur_reqs = per_req[baseline:][-window:]
        out["baseline_positions"] = sum(n for _, n in per_req[:baseline])
        out["baseline_rates"] = base / out["baseline_positions"]
        if cur_reqs:
            cur = sum(c for c, _ in cur_reqs)
            out["current_positions"] = sum(n for _, n in cur_reqs)
            out["current_rates"] = cur / out["current_positions"]
            out["kl"] = float(entropy((cur + 0.5) / (cur + 0.5).sum(), (base + 0.5) / (base + 0.5).sum()))
    return out
