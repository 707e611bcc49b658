"""Settings and results of the Drift and Steering views, as ``param`` objects (no Panel here).

:class:`DriftSettings` names the prefill profile that drift is measured against
(by default the one shipped for the sample model) and holds the drift table of
the run on screen. :class:`SteeringSettings` holds the steering vector settings
(CAA contrast pairs, layer, strength, start step, mode) and the results of the
last steered run and depth sweep. Both are computed from the app's current
trajectory; the views run the work off the event loop.
"""

from __future__ import annotations

import pathlib

import param
import polars as pl

from trajscope.errors import TrajscopeError
from trajscope.model import sample_data_dir
from trajscope.trajectory import Trajectory

SAMPLE_PROFILE = sample_data_dir() / "profiles" / "trajscope-tiny.safetensors"
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
    except ValueError:
        raise TrajscopeError(f"Depths must be comma-separated steps like '1,10,50', not '{text}'.") from None


def parse_depths(text: str, max_new_tokens: int) -> list[int]:
    """Start depths from ``"1,10,50,200"``, keeping those that fit a run of ``max_new_tokens`` steps
    (:func:`skipped_depths` names the others)."""
    try:
        depths = sorted({int(t) for t in text.replace(" ", ",").split(",") if t})
    except ValueError:
        raise TrajscopeError(f"Depths must be comma-separated steps like '1,10,50', not '{text}'.") from None
    kept = [d for d in depths if 1 <= d < max_new_tokens]
    if not kept:
        raise TrajscopeError(f"No depth in '{text}' fits a run of {max_new_tokens} steps (each must be 1..{max_new_tokens - 1}).")
    if len(kept) > MAX_SWEEP_DEPTHS:
        raise TrajscopeError(f"A sweep takes at most {MAX_SWEEP_DEPTHS} depths (each is one more generation on the "
                             f"server); {len(kept)} were given.")
    return kept


class DriftSettings(param.Parameterized):
    """Which profile drift is measured against, and the drift of the current run."""

    profile_path = param.String(default=str(SAMPLE_PROFILE), doc="Prefill reference profile (.safetensors) built with `trajscope profile`.")
    drift = param.ClassSelector(class_=pl.DataFrame, allow_None=True, doc="profile_drift_table of the run on screen (None when it cannot be computed).")
    message = param.String(default="", doc="Why drift is not shown, when it is not.")
    thresholds = param.Dict(default={}, doc="Calibrated drift threshold per layer, from the profile.")
    fpr = param.Number(default=None, allow_None=True, doc="False-positive rate the thresholds were calibrated to.")

    def profile(self):
        """The profile at ``profile_path`` (cached per path); sets ``thresholds`` and ``fpr``.

        Raises:
            TrajscopeError: no file there, or not a profile.
        """
        from trajscope.profile import ReferenceProfile
        from trajscope.ui.operator import config

        config().path(self.profile_path, "drift profile")  # typed in the browser: inside the data directories
        if getattr(self, "_profile_path", None) != self.profile_path:
            self._profile, self._profile_path = None, self.profile_path
            if not pathlib.Path(self.profile_path).is_file():
                raise TrajscopeError(f"No profile at {self.profile_path}; build one with "
                                     "`trajscope profile --prompts FILE --model M --out PROFILE`.")
            prof = ReferenceProfile.load(self.profile_path)
            self.thresholds = {i: float(t) for i, t in enumerate(prof.threshold.tolist())}
            self.fpr = prof.info.get("fpr")
            self._profile = prof
        if self._profile is None:
            raise TrajscopeError(f"No profile at {self.profile_path}.")
        return self._profile

    @staticmethod
    def score(traj: Trajectory, prof) -> tuple[pl.DataFrame | None, str]:
        """``(drift_table, note)`` for ``traj`` against ``prof`` (the note says when only some layers were
        kept, else ""), or ``(None, why not)``. Pure; safe off the event loop."""
        from trajscope.metrics.profile_drift import profile_drift_table

        kept = {int(k.split(".")[1]) for k in traj.tensors if k.startswith("residual.")}
        if not kept:
            return None, ("This run kept no residuals, so there is nothing to score. Generate it again (the app "
                          "keeps the Drift card's layers), or add layers under 'Keep residuals of layers'.")
        try:
            m = traj.meta["model"]
            prof.check_model(m["n_layers"], m["d_model"], m["model_id"])
            layers = sorted(k for k in kept if k < prof.n_layers)
            note = "" if len(layers) == prof.n_layers else (
                f"Scored {len(layers)} of {prof.n_layers} layers ({', '.join(map(str, layers))}): the layers this "
                "run kept. Add layers under 'Keep residuals of layers' and Generate again for more.")
            return profile_drift_table(traj, prof, layers=layers), note
        except TrajscopeError as exc:
            return None, str(exc)

    def compute(self, traj: Trajectory | None) -> None:
        """Fill ``drift`` (or ``message``) for ``traj`` (on the calling thread)."""
        self.drift, self.message = None, ""
        if traj is None:
            self.message = "No run yet."
            return
        try:
            prof = self.profile()
        except TrajscopeError as exc:
            self.message = str(exc)
            return
        self.drift, self.message = self.score(traj, prof)


class SteeringSettings(param.Parameterized):
    """A CAA steering vector's settings and the results of steering the current prompt."""

    pairs_path = param.String(default=str(SAMPLE_PAIRS), doc="Contrast pairs (JSON lines: positive, negative) for CAA.")
    layer = param.Integer(default=3, bounds=(0, None), doc="Block whose output is steered.")
    strength = param.Number(default=1.0, doc="Multiplier of the CAA direction (add) or target projection (clamp).")
    start_step = param.Integer(default=1, bounds=(0, None), doc="First steered step (1 = first decode step).")
    mode = param.Selector(default="add", objects=["add", "clamp"], doc="add: h + s·v; clamp: set the projection on v to s.")
    depths = param.String(default="1,10,50,200", doc="Start depths of the sweep (those beyond the run are skipped).")
    busy = param.Boolean(default=False, doc="A steering job is running.")
    status = param.String(default="", doc="Progress / result line.")
    base = param.ClassSelector(class_=Trajectory, allow_None=True, doc="The unsteered run (the app's current run).")
    steered = param.ClassSelector(class_=Trajectory, allow_None=True, doc="The steered run of the same prompt.")
    sweep_steps = param.ClassSelector(class_=pl.DataFrame, allow_None=True, doc="Sweep steps table (per start depth × step).")
    sweep_summary = param.ClassSelector(class_=pl.DataFrame, allow_None=True, doc="Sweep decay summary (per start depth).")

    def vector(self, base):
        """``base`` (a :class:`~trajscope.steering.SteeringVector`) with this card's start step, strength and mode."""
        import dataclasses

        return dataclasses.replace(base, start_step=int(self.start_step), strength=float(self.strength), mode=self.mode)

    def clear(self) -> None:
        """Forget the results (they belong to the previous run)."""
        self.param.update(base=None, steered=None, sweep_steps=None, sweep_summary=None, status="")
