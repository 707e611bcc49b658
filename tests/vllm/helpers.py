"""Shared pieces of the vLLM tests: generation with trajscope keys, reading the runs, the numeric floor."""

from __future__ import annotations

import pathlib

import torch

LAYER = 15


def generate(llm, prompts: list[list[int]], n_new: int, extra: list[dict]) -> list:
    """Greedy generation of token-id prompts, one ``extra_args`` per prompt; returns vLLM's outputs."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = [SamplingParams(max_tokens=n_new, temperature=0.0, ignore_eos=True, extra_args=e) for e in extra]
    return llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)


def load_run(out: pathlib.Path, run_id: str):
    import trajscope as ts

    return ts.Trajectory.load(out / run_id)


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-row ‖a − b‖ / ‖b‖ (float64)."""
    a, b = a.double(), b.double()
    return (a - b).norm(dim=-1) / b.norm(dim=-1).clamp_min(1e-30)


def float32_floor(model_dir, ids: list[int], layer: int = LAYER) -> float:
    """The determinism floor of float32 at ``layer`` for these tokens, measured on Hugging Face:
    2 × max over positions of rel L2(float32 forward, float64 forward) (trajscope.studies.determinism's
    ``2 × vs float64`` term: two float32 computations each within ε of exact differ by up to 2ε)."""
    from transformers import AutoModelForCausalLM

    x = torch.tensor([ids])
    out = {}
    for dtype in (torch.float32, torch.float64):
        m = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype, attn_implementation="eager")
        with torch.no_grad():
            out[dtype] = m(x, output_hidden_states=True).hidden_states[layer + 1][0]
    return 2 * float(rel_l2(out[torch.float32], out[torch.float64]).max())
