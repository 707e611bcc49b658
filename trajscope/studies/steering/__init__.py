"""The steering-depth study, registered: does a steering vector's effect depend on where it starts?

One :class:`~trajscope.studies.registry.Study` (``trajscope study steering``; the app's Steering tab):

- :mod:`.study`: :class:`~.study.SteeringConfig` (its fields are the command's flags) and ``run``;
- :mod:`.sweep`: :func:`~.sweep.steering_sweep` and :class:`~.sweep.SweepResult`, the model runs;
- :mod:`.summary`: the decay summary over equal windows and its headline numbers, computed once;
- :mod:`.section`: the report section, reading the Result only;
- :mod:`.card`, :mod:`.state`, :mod:`.plots`: the app card (a Viewer reading the Result of a sweep).

``trajscope steer-sweep`` (:mod:`trajscope.cli.steer`) is an alias that calls :func:`~.study.run`.
"""

from __future__ import annotations

from typing import Any

from trajscope.studies.registry import Study, register
from trajscope.studies.steering.section import steering_section
from trajscope.studies.steering.study import SteeringConfig, run
from trajscope.studies.steering.sweep import SweepResult, steering_sweep


def _card(state: Any) -> Any:
    from trajscope.studies.steering.card import card

    return card(state)


STUDY = register(Study(
    name="steering", question="steering effect by the decode step where steering starts, over equal windows",
    config=SteeringConfig, run=run, section=steering_section, card=_card, title="Steering", order=20,
    uses={"vector": "vector"},
    # a short pass: 6 prompts, steering from decode step 1 or 8 over an equal 8-step window
    quick={"max_prompts": 6, "max_tokens": 64, "depths": (1, 8), "window": 8},
    example="trajscope study steering --pairs sample_data/prompts/quotes_pairs.jsonl --layer 3 "
            "--prompts sample_data/prompts/heldout_code.jsonl --depths 1,10,50 --out reports/steering"))

__all__ = ["STUDY", "SteeringConfig", "SweepResult", "run", "steering_sweep"]
