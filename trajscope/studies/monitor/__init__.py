"""The monitor study, registered: do monitors tuned to prefill catch a shift planted into decode?

Seed 000's claim is that "monitors tuned to prefill miss regime-specific failures". This study plants
a known shift into decode from decode step k (a steering vector at strength s; a teacher-forced switch of
topic and language; a forced run of random tokens — each beside a null arm run the same way; sampled runs)
and measures, for each monitor — the prefill-calibrated drift profile, attention telemetry of a
middle layer, and SAE reconstruction error — the run-level detection AUROC against clean runs with
a bootstrap interval over prompts, and the time-to-detect at a threshold that holds the
false-positive rate on clean decode fixed, fitted on some source files and checked on others.

Parts: :mod:`~trajscope.studies.monitor.config` (settings, artefacts),
:mod:`~trajscope.studies.monitor.monitors` (per-step scores),
:mod:`~trajscope.studies.monitor.measures` (AUROC, threshold, time-to-detect),
:mod:`~trajscope.studies.monitor.study` (the runs and tables) and
:mod:`~trajscope.studies.monitor.report` (the report section).
"""

from __future__ import annotations

from trajscope.studies.monitor.config import MonitorConfig
from trajscope.studies.monitor.study import run
from trajscope.studies.monitor.report import section
from trajscope.studies.registry import Study, register

PROMPTS = "sample_data/smollm2/report/monitor/chat_prompts.jsonl"

STUDY = register(Study(
    name="monitor", question="do monitors tuned to prefill catch a shift planted into decode (AUROC, time-to-detect "
                             "at a fixed false-positive rate)",
    config=MonitorConfig, run=run, section=section, family="", marker="monitor_summary.parquet",
    example=f"trajscope study monitor --model smollm2 --prompts {PROMPTS} --max-tokens 0 --new-tokens 24 --fit-files "
            "chat_history.jsonl,chat_math.jsonl,chat_programming.jsonl,chat_travel.jsonl --out reports/monitor",
    shared_defaults={"max_prompts": 64},
    uses={"sae": "saes", "vector": "vector", "profile": "profile", "seen_prompt_files": "fit_files"},
    # about a minute on SmolLM2 (2-core CPU): 8 fitting + 8 evaluate prompts, the null and one shift per kind
    quick={"max_prompts": 16, "new_tokens": 18, "start_step": 4, "strengths": (0.0, 2.0), "forced_tokens": 4,
           "fpr": 0.12, "n_boot": 200}))

__all__ = ["MonitorConfig", "run", "section", "STUDY"]
