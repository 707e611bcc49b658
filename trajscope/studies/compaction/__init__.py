"""Context compaction as a registered study: is masking compacted turns the same as restarting from the summary?

For each session ``<sys> <T1> <T2> <summary> <T3>``: T3 run with T1/T2 masked from T3 on (A, the
summary's states kept), restarted from ``<sys> <summary>`` (B), in full (C) and masked from the
summary on (D, a control); hidden states, next-token KL, greedy continuations, attention on the
summary, and a held-out probe of the masked fact.

- config: :class:`~trajscope.studies.compaction.config.CompactionConfig` (``trajscope study compaction --help``;
  its input is ``--sessions FILE`` or ``--synthetic N``);
- run: :func:`~trajscope.studies.compaction.study.run` (:func:`~trajscope.studies.compaction.study.compaction`
  over the per-session setups of :mod:`~trajscope.studies.compaction.engine` and
  :mod:`~trajscope.studies.compaction.attention`);
- summaries: :func:`~trajscope.studies.compaction.summary.summarize`, the one function that computes the
  study's means and intervals (``compaction_summary``; the headline — A vs C divergence at the deepest layer —
  and next-token KL are the Result's summaries);
- report section: :func:`~trajscope.studies.compaction.section.section`;
- app card: the Compaction tab (:mod:`~trajscope.studies.compaction.card`, state in
  :mod:`~trajscope.studies.compaction.state`, plots in :mod:`~trajscope.studies.compaction.plots`): one
  session run through the same run function.
"""

from __future__ import annotations

from typing import Any

from trajscope.studies.compaction.config import CompactionConfig
from trajscope.studies.compaction.section import section
from trajscope.studies.registry import Result, Study, register


def run(model: Any, prompts: Any, config: CompactionConfig, progress: Any = None, layers: Any = None) -> Result:
    """The compaction study (:func:`trajscope.studies.compaction.study.run`); ``prompts`` is not used."""
    from trajscope.studies.compaction.study import run as run_compaction

    return run_compaction(model, prompts, config, progress, layers)


def card(state: Any) -> Any:
    """The app's Compaction tab for ``state`` (Panel loads only when the app asks for it)."""
    from trajscope.studies.compaction.card import CompactionView

    return CompactionView(state=state)


_doc = " ".join((CompactionConfig.__doc__ or "").split()).rstrip(".")
register(Study(name="compaction", question=_doc[0].lower() + _doc[1:], config=CompactionConfig, run=run,
               section=section, card=card, title="Compaction", order=40,
               example="trajscope study compaction --model sample --synthetic 200 --out compaction/"))
