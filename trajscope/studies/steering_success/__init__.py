"""The steering-success study, registered: steering as the field measures it.

A steering vector is judged by what it does to the text: a behavioural success rate on held-out
prompts with a criterion computed from the generated text (for a French vector: French function
words outnumber English ones), the fluency cost (perplexity of the steered text under the
unsteered model, paired with the unsteered text's), the anti-steerable fraction (prompts moved
the wrong way, Tan et al. 2024), a CAA layer × multiplier sweep (the shape of Rimsky et al.
2024's behaviour-vs-layer curves), the same by the decode step where steering starts (equal
windows, beside the steering study's onset and accumulation), and an SAE decoder row against CAA at
matched norm.

Parts: :mod:`.config` (settings, artefacts), :mod:`.generate` (batched steered decoding),
:mod:`.study` (the runs), :mod:`.summary` (tables and headline numbers, computed once) and
:mod:`.section` (the report section).
"""

from __future__ import annotations

from trajscope.studies.registry import Study, register
from trajscope.studies.steering_success.config import SuccessConfig
from trajscope.studies.steering_success.section import section
from trajscope.studies.steering_success.study import run

PROMPTS = "sample_data/smollm2/report/monitor/chat_prompts.jsonl"

STUDY = register(Study(
    name="steering-success",
    question="does a steering vector change the behaviour of the text (success rate), at what fluency cost, for "
             "which prompts the wrong way, by layer, start depth and source (CAA vs SAE feature)",
    config=SuccessConfig, run=run, section=section, marker="steering_success_summary.parquet",
    example=f"trajscope study steering-success --model smollm2 --prompts {PROMPTS} --max-tokens 0 "
            "--exclude-files chat_history.jsonl,chat_math.jsonl,chat_programming.jsonl,chat_travel.jsonl "
            "--out reports/steering-success",
    shared_defaults={"max_prompts": 64},
    uses={"vector": "vector", "sae": "sae", "seen_prompt_files": "exclude_files"},
    quick={"heldout_prompts": 8, "sweep_layers": (6,), "strengths": (2.0,), "sweep_prompts": 4, "new_tokens": 8, "depths": (1, 4), "window": 4,
           "depth_prompts": 4, "n_boot": 200}))

__all__ = ["STUDY", "SuccessConfig", "run", "section"]
