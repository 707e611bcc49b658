"""The drift study, registered: does the residual stream during decode still look like prefill?

One :class:`~trajscope.studies.registry.Study` (``trajscope study drift``; the app's Drift tab):

- :mod:`.study`: :class:`~.study.DriftConfig` (its fields are the command's flags) and ``run``, which
  scores held-out prompts in three regimes against a prefill profile fitted and calibrated on
  prompts of other source files; :func:`~.study.score_run` is the same study on one captured run (the card);
- :mod:`.summary`: the headline numbers, computed once (:func:`~.summary.headline`);
- :mod:`.section`: the report section, reading the Result only;
- :mod:`.card`, :mod:`.state`, :mod:`.plots`: the app card (a Viewer reading the Result);
- :mod:`.build`: :func:`~.build.build_profile`, the prefill profile (``trajscope profile``);
  :mod:`.runs`: the model runs of the three regimes; :mod:`.regimes`: their scoring and the summary
  tables (by position, depth and entropy band, the matched gap, held-out FPR, the trajectory flag).

``trajscope profile`` and ``trajscope drift`` (:mod:`trajscope.cli.drift`) are aliases that call
:func:`~.build.build_profile` and :func:`~.study.evaluate`.
"""

from __future__ import annotations

from typing import Any

from trajscope.studies.drift.build import build_profile, named_split, prompt_ids
from trajscope.studies.drift.section import drift_section
from trajscope.studies.drift.study import DriftConfig, evaluate, run, score_run
from trajscope.studies.registry import Study, register


def _card(state: Any) -> Any:
    from trajscope.studies.drift.card import card

    return card(state)


STUDY = register(Study(
    name="drift", question="decode vs prefill residual drift against a held-out prefill profile",
    config=DriftConfig, run=run, section=drift_section, card=_card, title="Drift", order=10,
    marker="drift_by_position.parquet",
    example="trajscope study drift --prompts sample_data/prompts/heldout_code.jsonl --out reports/drift",
    uses={"profile": "profile", "prompts": "prompts"},
    # a short pass: 24 prompts (at least 3 source files), 16 decode steps, a looser trajectory rate for few runs
    quick={"max_prompts": 24, "max_new_tokens": 16, "n_boot": 200, "trajectory_rate": 0.2}))

__all__ = ["STUDY", "DriftConfig", "build_profile", "evaluate", "named_split", "prompt_ids", "run", "score_run"]
