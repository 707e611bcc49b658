"""KV-cache eviction as two registered studies: ``eviction`` (what the kept prompt keys cost decode) and
``needle`` (passkey retrieval under eviction).

**eviction** — do the prompt keys a KV-eviction policy (SnapKV, H2O, StreamingLLM, PyramidKV, LAQ
lookahead, pseudo queries, the oracle; :mod:`trajscope.metrics.eviction`) keeps after prefill stay the
ones decode attends to, and what does evicting the rest cost the next-token distribution?

- config: :class:`~trajscope.studies.eviction.config.EvictionConfig` (``trajscope study eviction --help``);
- run: :func:`~trajscope.studies.eviction.engine.run` (the engine, :func:`~trajscope.studies.eviction.engine.eviction`,
  with its queries :mod:`~trajscope.studies.eviction.queries` and per-step vs accumulated split
  :mod:`~trajscope.studies.eviction.split`);
- summaries: :func:`~trajscope.studies.eviction.summary.summarize`, the one function that computes the
  study's means and intervals (the ``eviction_summary`` table; its ``all`` rows are the Result's summaries);
- report section: :func:`~trajscope.studies.eviction.section.section`; the comparison report's
  per-run section: :mod:`~trajscope.studies.eviction.runs`;
- app card: the Eviction tab (:mod:`~trajscope.studies.eviction.card`, state in
  :mod:`~trajscope.studies.eviction.state`, plots in :mod:`~trajscope.studies.eviction.plots`);
- ``trajscope eviction`` is an alias of ``trajscope study eviction`` that also takes ``--runs RUN_DIR…``
  (:mod:`~trajscope.studies.eviction.cli`).

**needle** — a registered study of its own rather than a ``--task`` of ``eviction``: it builds its prompts
(no ``--prompts``), has its own options (context length, passkey depths, answer length), its own tables
(``needle_answers``, ``needle_summary``) and its own headline (retrieval accuracy with a Wilson interval,
:func:`~trajscope.studies.eviction.needle.accuracy_table`), so ``trajscope study needle --help`` lists only
what applies. Section: :func:`~trajscope.studies.eviction.section.needle_section`; no app card (a 2k-token
prompt set is not the run on screen).

**eviction-ppl** — held-out perplexity against budget, the field's other measure: one text per held-out
standard-library file, its first ``--prompt-len`` tokens compressed, the next ``--continuation`` teacher-forced
under the key mask (:mod:`~trajscope.studies.eviction.perplexity`; tables ``eviction_ppl`` and
``eviction_ppl_summary``, the paired increase over the full cache with a bootstrap interval over files from
:func:`~trajscope.studies.eviction.perplexity.perplexity_summary`). Its own study for the same reason as needle: it
reads its own input and has its own headline. Section: :func:`~trajscope.studies.eviction.section.perplexity_section`.
"""

from __future__ import annotations

from typing import Any

from trajscope.studies.eviction.config import EvictionConfig, NeedleConfig, PerplexityConfig
from trajscope.studies.eviction.section import needle_section, perplexity_section, section
from trajscope.studies.registry import Result, Study, register

PROMPTS = "sample_data/prompts/heldout_code.jsonl"


def run(model: Any, prompts: Any, config: EvictionConfig, progress: Any = None, layers: Any = None) -> Result:
    """The eviction study on ``(id, token ids)`` prompts (:func:`trajscope.studies.eviction.engine.run`)."""
    from trajscope.studies.eviction.engine import run as run_eviction

    return run_eviction(model, prompts, config, progress, layers)


def run_needle(model: Any, prompts: Any, config: NeedleConfig, progress: Any = None, layers: Any = None) -> Result:
    """The needle study (:func:`trajscope.studies.eviction.needle.run`); ``prompts`` is not used."""
    from trajscope.studies.eviction.needle import run as needle_run

    return needle_run(model, prompts, config, progress, layers)


def run_perplexity(model: Any, prompts: Any, config: PerplexityConfig, progress: Any = None,
                   layers: Any = None) -> Result:
    """The held-out perplexity study (:func:`trajscope.studies.eviction.perplexity.run`); ``prompts`` is not used."""
    from trajscope.studies.eviction.perplexity import run as ppl_run

    return ppl_run(model, prompts, config, progress, layers)


def card(state: Any) -> Any:
    """The app's Eviction tab for ``state`` (Panel loads only when the app asks for it)."""
    from trajscope.studies.eviction.card import EvictionView

    return EvictionView(state=state)


def _question(config: type) -> str:
    doc = " ".join((config.__doc__ or "").split()).rstrip(".")
    return doc[0].lower() + doc[1:]


register(Study(name="eviction", question=_question(EvictionConfig), config=EvictionConfig, run=run, section=section,
               card=card, title="Eviction", order=30, shared_defaults={"max_tokens": 0},
               quick={"policies": ("snapkv", "h2o", "streamingllm", "lookahead"), "budgets": (0.5,),
                      "max_new_tokens": 12, "max_prompts": 8},
               example=f"trajscope study eviction --prompts {PROMPTS} --budgets 0.2,0.5 --out ev/"))
register(Study(name="needle", question=_question(NeedleConfig), config=NeedleConfig, run=run_needle,
               section=needle_section,
               quick={"n_prompts": 4, "context": 1024, "budgets": (0.2, 1.0),
                      "policies": ("snapkv", "lookahead", "streamingllm_rolling"), "answer_tokens": 10},
               example="trajscope study needle --model smollm2 --context 2048 --n-prompts 24 --out needle/"))
register(Study(name="eviction-ppl", question=_question(PerplexityConfig), config=PerplexityConfig, run=run_perplexity,
               section=perplexity_section,
               quick={"n_files": 4, "prompt_len": 256, "continuation": 32, "budgets": (0.2,),
                      "policies": ("snapkv", "streamingllm", "lookahead")},
               example="trajscope study eviction-ppl --model smollm2 --n-files 16 --prompt-len 1024 --out ppl/"))
