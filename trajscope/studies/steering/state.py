"""The Steering card's state (``param``, no Panel): the steering vector's settings and the results
of steering the current prompt.

:class:`SteeringSettings` holds the CAA settings (contrast pairs, layer, strength, start step,
mode), the last steered run, and the :class:`~trajscope.studies.registry.Result` of the steering
study's depth sweep on the current prompt. :func:`parse_depths` reads the sweep's start depths.
"""

from __future__ import annotations

import param

from trajscope.errors import TrajscopeError
from trajscope.model import sample_data_dir
from trajscope.studies.registry import Result
from trajscope.trajectory import Trajectory

SAMPLE_PAIRS = sample_data_dir() / "prompts" / "quotes_pairs.jsonl"

MAX_SWEEP_DEPTHS = 16  # start depths of one sweep: each is one more generation on the server


def skipped_depths(text: str, max_new_tokens: int) -> str:
    """A sentence naming the depths of ``text`` that :func:`parse_depths` leaves out ("" when none)."""
    gone = sorted(set(_depths(text)) - set(d for d in _depths(text) if 1 <= d < max_new_tokens))
    if not gone:
        return ""
    return (f"Skipped depth{'s' if len(gone) > 1 else ''} {', '.join(map(str, gone))}: the run has "
            f"{max_new_tokens} decode steps (depths must be 1..{max_new_tokens - 1}).")


def _depths(text: str) -> list[int]:
    try:
        return sorted({int(t) for t in text.replace(" ", ",").split(",") if t})
    except ValueError as exc:
        raise TrajscopeError(f"Depths must be comma-separated steps like '1,10,50', not '{text}'.") from exc


def parse_depths(text: str, max_new_tokens: int) -> list[int]:
    """Start depths from ``"1,10,50,200"``, keeping those that fit a run of ``max_new_tokens`` steps
    (:func:`skipped_depths` names the others)."""
    depths = _depths(text)
    kept = [d for d in depths if 1 <= d < max_new_tokens]
    if not kept:
        raise TrajscopeError(f"No depth in '{text}' fits a run of {max_new_tokens} steps (each must be 1..{max_new_tokens - 1}).")
    if len(kept) > MAX_SWEEP_DEPTHS:
        raise TrajscopeError(f"A sweep takes at most {MAX_SWEEP_DEPTHS} depths (each is one more generation on the "
                             f"server); {len(kept)} were given.")
    return kept


class SteeringSettings(param.Parameterized):
    """A CAA steering vector's settings and the results of steering the current prompt."""

    pairs_path = param.String(default=str(SAMPLE_PAIRS), doc="Contrast pairs (JSON lines: positive, negative) for CAA.")
    layer = param.Integer(default=3, doc="Block whose output is steered (checked against the model when the vector is "
                          "built: a bound here would make the field drop an out-of-range value unsaid).")
    strength = param.Number(default=1.0, doc="Multiplier of the CAA direction (add) or target projection (clamp).")
    start_step = param.Integer(default=1, doc="First steered step (1 = first decode step; ≥ 0, checked when steering).")
    mode = param.Selector(default="add", objects=["add", "clamp"], doc="add: h + s·v; clamp: set the projection on v to s.")
    depths = param.String(default="1,10,50,200", doc="Start depths of the sweep (those beyond the run are skipped).")
    busy = param.Boolean(default=False, doc="A steering job is running.")
    status = param.String(default="", doc="Progress / result line.")
    base = param.ClassSelector(class_=Trajectory, allow_None=True, doc="The unsteered run (the app's current run).")
    steered = param.ClassSelector(class_=Trajectory, allow_None=True, doc="The steered run of the same prompt.")
    sweep = param.ClassSelector(class_=Result, allow_None=True, doc="The steering study's Result of the last depth sweep on this prompt (tables steering, steering_summary).")

    def vector(self, base):
        """``base`` (a :class:`~trajscope.steering.SteeringVector`) with this card's start step, strength and mode."""
        import dataclasses

        return dataclasses.replace(base, start_step=int(self.start_step), strength=float(self.strength), mode=self.mode)

    def clear(self) -> None:
        """Forget the results (they belong to the previous run)."""
        self.param.update(base=None, steered=None, sweep=None, status="")
