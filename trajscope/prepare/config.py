"""Settings of one ``trajscope prepare`` run (frozen; written to ``OUT/config.json``)."""

from __future__ import annotations

import dataclasses
from typing import Any

from trajscope.positions import first_reference_pos


@dataclasses.dataclass(frozen=True)
class PrepareConfig:
    """Every size and seed of the asset build; the defaults are the shipped SmolLM2 build."""

    model_id: str = "smollm2"
    prompts_dir: str = "sample_data/smollm2/prompts"
    n_stdlib_files: int = 40
    n_per_file: int = 2
    n_doc_topics: int = 16
    n_per_topic: int = 2
    chunk_chars: int = 400
    max_prompt_tokens: int = 80
    max_new_tokens: int = 32
    gen_batch: int = 22
    split_fractions: tuple = (0.5, 0.25, 0.25)
    split_seed: int = 0
    first_pos: int = first_reference_pos()  # the project's one sink rule: 1, position 0 left out everywhere
    fpr: float = 0.01
    layer: int = 15
    harvest_seq_tokens: int = 128
    harvest_per_source: int = 8
    harvest_prefill_rows: int = 300_000
    harvest_decode_prompt_tokens: int = 64
    harvest_decode_new_tokens: int = 64
    harvest_decode_per_source: int = 2
    harvest_decode_rows: int = 48_000
    harvest_batch: int = 16
    harvest_seconds: float = 780.0
    d_sae: int = 4608
    k: int = 32
    sae_tokens: int = 2_867_200
    sae_batch: int = 2048
    sae_lr: float = 2e-3
    sae_warmup_steps: int = 50
    sae_dead_after: int = 102_400
    sae_log_every: int = 25
    sae_snapshot_every: int = 100
    seeds: tuple = (0, 1)
    hybrid_decode_fraction: float = 0.5
    reproduce_cos: float = 0.9
    ce_seeds: tuple = (0,)
    ce_max_seqs: int = 16
    n_boot: int = 1000
    index_top_n: int = 8
    steer_layers: tuple = (6, 12, 18)
    steer_strengths: tuple = (0.5, 1.0, 2.0)
    steer_sweep_prompts: int = 4
    steer_sweep_tokens: int = 20
    steer_eval_tokens: int = 32
    threads: int = 1  # on a shared 2-core machine one thread is several times faster than two (OpenMP waits)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "PrepareConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k in names})
