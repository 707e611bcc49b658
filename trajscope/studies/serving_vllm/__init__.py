"""The serving-vllm study, registered: seed 002's serving questions on a real vLLM engine.

trajscope's serving studies (:mod:`trajscope.studies.serving`) simulate a serving stack with
Hugging Face padding, chunking and cache reuse. This one runs the prompts through vLLM itself
(``vllm.LLM``, float32, eager; the trajscope plugin of :mod:`trajscope.vllm` reads the residual rows
of one layer inside the engine) and compares each prompt's rows under three serving conditions
against the same prompt run alone, at the float32 floor the determinism study defines:

- co-scheduled neighbours under continuous batching;
- chunked prefill on (a token budget per forward of a few tokens) vs off (one forward);
- prefix caching on, with vLLM's own hit counts giving the coverage map by token class.

With ``--sae-seeds``, one TopK SAE is trained per harvest mode and seed on the kept rows and the SAEs are
compared as the sae-stability study does (:mod:`~trajscope.studies.serving_vllm.saes`).

It needs vLLM, so it runs in the environment of ``bash scripts/install.sh --vllm``
(``.venv-vllm/bin/trajscope study serving-vllm --model smollm2``); elsewhere it says so in one
sentence. Parts: :mod:`~trajscope.studies.serving_vllm.study` (the runs),
:mod:`~trajscope.studies.serving_vllm.engine` (one engine, in its own process),
:mod:`~trajscope.studies.serving_vllm.tables`, :mod:`~trajscope.studies.serving_vllm.saes` (the SAE part)
and :mod:`~trajscope.studies.serving_vllm.report`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import field

from trajscope.errors import TrajscopeError
from trajscope.studies.registry import Study, register
from trajscope.studies.serving_vllm.report import section
from trajscope.studies.serving_vllm.study import run

PROMPTS = "sample_data/prompts/heldout_code.jsonl"
NEIGHBOURS = ("shorter", "longer", "mixed", "copies")


@dataclasses.dataclass(frozen=True)
class ServingVllmConfig:
    """Settings of the serving-vllm study."""

    header: str = field(default="default", metadata={"help": (
        "text prepended to every prompt, the shared prefix the prefix cache reuses ('default': a fixed system "
        "prompt / license header; 'none': no header)")})
    new_tokens: int = field(default=8, metadata={"help": "greedy tokens generated per request"})
    batch_size: int = field(default=4, metadata={"help": "requests per co-scheduled call (the prompt plus neighbours)"})
    neighbours: tuple[str, ...] = field(default=NEIGHBOURS, metadata={"help": (
        "neighbour kinds: shorter, longer, mixed, copies (identical-input control)")})
    slots: tuple[str, ...] = field(default=("first", "last"), metadata={"help": "the prompt's place among the requests"})
    chunks: tuple[int, ...] = field(default=(16,), metadata={"help": (
        "chunked-prefill token budgets per forward (one engine each; empty: no chunked part)")})
    no_prefix_cache: bool = field(default=False, metadata={"help": "leave out the prefix-cache part (prompts in order, one cache)"})
    block: int = field(default=32, metadata={"help": "vLLM's KV block size in tokens, the prefix cache's granularity (the CPU backend takes multiples of 32)"})
    sae_seeds: tuple[int, ...] = field(default=(), metadata={"help": (
        "SAE part: train one TopK SAE per harvest mode (alone, batch, chunked prefill, prefix cache) and seed on the "
        "layer's rows and compare them as the sae-stability study does (at least 2 seeds; empty: no SAE part)")})
    sae_d_sae: int = field(default=512, metadata={"help": "SAE part: SAE width"})
    sae_k: int = field(default=16, metadata={"help": "SAE part: active features (TopK)"})
    sae_n_tokens: int = field(default=256_000, metadata={"help": "SAE part: training rows drawn per SAE (the budget)"})
    sae_eval_fraction: float = field(default=0.5, metadata={"help": (
        "SAE part: share of prompts held out; every SAE is evaluated on the alone rows of these")})
    sae_first_pos: int = field(default=1, metadata={"help": (
        "SAE part: positions before it are left out of training and evaluation (1: position 0, the attention sink, "
        "as the project's SmolLM2 SAEs do; 0: keep it)")})

    def __post_init__(self) -> None:
        if self.new_tokens < 2:
            raise TrajscopeError(f"--new-tokens must be at least 2 (decode steps need a generated token), not {self.new_tokens}.")
        if self.batch_size < 2:
            raise TrajscopeError(f"--batch-size must be at least 2 (the prompt and a neighbour), not {self.batch_size}.")
        bad = [n for n in self.neighbours if n not in NEIGHBOURS]
        if bad:
            raise TrajscopeError(f"Unknown neighbour kind '{bad[0]}'; use one of {', '.join(NEIGHBOURS)}.")
        bad = [s for s in self.slots if s not in ("first", "last")]
        if bad:
            raise TrajscopeError(f"Unknown slot '{bad[0]}'; use first or last.")
        if any(c < 1 for c in self.chunks):
            raise TrajscopeError(f"Chunk budgets must be positive numbers of tokens, not {list(self.chunks)}.")
        if self.block < 1:
            raise TrajscopeError(f"--block must be a positive number of tokens, not {self.block}.")
        if self.sae_seeds and len(set(self.sae_seeds)) < 2:
            raise TrajscopeError("Give --sae-seeds at least two distinct seeds; the seed-to-seed spread needs them.")
        if not 1 <= self.sae_k <= self.sae_d_sae:
            raise TrajscopeError(f"--sae-k must lie between 1 and --sae-d-sae ({self.sae_d_sae}), not {self.sae_k}.")
        if self.sae_n_tokens < 1:
            raise TrajscopeError(f"--sae-n-tokens must be a positive number of rows, not {self.sae_n_tokens}.")
        if self.sae_first_pos < 0:
            raise TrajscopeError(f"--sae-first-pos must be a position (0 or more), not {self.sae_first_pos}.")
        if not 0 < self.sae_eval_fraction < 1:
            raise TrajscopeError(f"--sae-eval-fraction must lie between 0 and 1, not {self.sae_eval_fraction}.")


STUDY = register(Study(
    name="serving-vllm", question="seed 002 on a real vLLM engine: do co-scheduled neighbours, chunked prefill or "
                                  "prefix caching move a prompt's activations beyond the float32 floor",
    config=ServingVllmConfig, run=run, section=section, family="", marker="serving-vllm_summary.parquet",
    example=f"trajscope study serving-vllm --model smollm2 --prompts {PROMPTS} --max-prompts 8 --out reports/serving-vllm",
    shared_defaults={"max_prompts": 8}))

__all__ = ["STUDY", "ServingVllmConfig", "run", "section"]
