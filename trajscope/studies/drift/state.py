"""The Drift card's state (``param``, no Panel): which profile drift is measured against, and the
:class:`~trajscope.studies.registry.Result` of the drift study on the run on screen.

:class:`DriftSettings` names the prefill profile (by default the one shipped for the sample
model) and holds the Result of :func:`~trajscope.studies.drift.study.score_run` for the app's
current trajectory: its ``drift_run`` table (also as ``drift``) and its headline numbers. The
card computes it off the event loop.
"""

from __future__ import annotations

import pathlib

import param
import polars as pl

from trajscope.errors import TrajscopeError
from trajscope.model import sample_data_dir
from trajscope.studies.registry import Result
from trajscope.trajectory import Trajectory

SAMPLE_PROFILE = sample_data_dir() / "profiles" / "trajscope-tiny.safetensors"


class DriftSettings(param.Parameterized):
    """Which profile drift is measured against, and the drift study's Result on the current run."""

    profile_path = param.String(default=str(SAMPLE_PROFILE), doc="Prefill reference profile (.safetensors) built with `trajscope profile`.")
    result = param.ClassSelector(class_=Result, allow_None=True, doc="The drift study's Result on the run on screen (score_run), or None.")
    drift = param.ClassSelector(class_=pl.DataFrame, allow_None=True, doc="The Result's drift_run table (profile_drift_table of the run on screen; None when it cannot be computed).")
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
    def score(traj: Trajectory, prof) -> tuple[Result | None, str]:
        """``(result, note)``: the drift study on ``traj`` against ``prof``
        (:func:`~trajscope.studies.drift.study.score_run`; the note says when only some layers were kept, else
        ""), or ``(None, why not)``. Pure; safe off the event loop."""
        from trajscope.studies.drift import study

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
            return study.score_run(traj, prof, layers=layers), note
        except TrajscopeError as exc:
            return None, str(exc)

    def show(self, result: Result | None, message: str = "") -> None:
        """Show ``result`` (its ``drift_run`` table as ``drift``), or none with ``message``."""
        self.param.update(result=result, drift=None if result is None else result.table("drift_run"), message=message)

    def compute(self, traj: Trajectory | None) -> None:
        """Fill ``result`` and ``drift`` (or ``message``) for ``traj`` (on the calling thread)."""
        self.show(None)
        if traj is None:
            self.show(None, "No run yet.")
            return
        try:
            prof = self.profile()
        except TrajscopeError as exc:
            self.show(None, str(exc))
            return
        self.show(*self.score(traj, prof))
