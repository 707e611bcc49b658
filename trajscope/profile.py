"""ReferenceProfile: what the residual stream looks like during prefill, per layer.

Built from the prefill positions of a prompt set (position 0 left out by
default: the attention sink, whose massive activations are an outlier class of
their own; the one treatment is :data:`trajscope.positions.SKIP_SINK`, recorded in
``info`` by :func:`trajscope.positions.sink_meta`), a profile stores per layer and dimension the mean and variance,
the distribution of per-position statistics (norm, variance, excess kurtosis,
outlier rate |x| > 6, massive-activation rate |x| > 100 and > 1000 × the layer's
median |x|), and a drift threshold calibrated to a false-positive rate.

The drift score of a position at a layer is the diagonal Mahalanobis distance
to the prefill mean, divided by √d_model so that in-distribution positions
score about 1: ``m(x) = sqrt(mean_d((x_d − μ_d)² / σ_d²))``. Calibration: the
prompts are split into a fitting part (mean, variance) and a calibration part —
named id lists (the drift study's :func:`trajscope.studies.drift.build.named_split`
takes whole source files for each part), recorded in the profile's ``info["split"]``
so that a report can evaluate on the prompts of files in neither, or by default a
seeded permutation of prompts; the threshold of each layer is the ``1 − fpr``
quantile of the calibration prompts' prefill scores, so a fresh prefill position
of the same prompt distribution is flagged with probability ≈ ``fpr``.

Per-(step, layer) flags at rate ``fpr`` add up over a trajectory: 127 steps × 6
layers flag almost every prefill-like run. :class:`DriftProbe` therefore also
takes a **trajectory-level threshold** on the run statistic ``max over probed
(step, layer) of score / threshold[layer]`` (scores in units of their layer's
per-position threshold, so layers of different spread are comparable),
calibrated with :func:`trajscope.conformal.calibrate_max` on prefill-like runs.

Profiles save to one ``.safetensors`` file (tensors + JSON metadata) and refuse to
score a model of another width or depth.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any, Sequence

import numpy as np
import torch

from trajscope.errors import TrajscopeError
from trajscope.metrics.residual_stats import ACT_FIELDS, residual_stats

SCALAR_STATS = ("norm", "var", "kurtosis", "outlier_rate", "massive_rate")


def position_stats(x: torch.Tensor, median_abs: torch.Tensor | float) -> dict[str, torch.Tensor]:
    """Per-position statistics of residual vectors (the one kernel, :mod:`trajscope.metrics.residual_stats`).

    Args:
        x: ``[n, d_model]``; median_abs: the layer's median |x| (scalar) for the massive rule.
    Returns:
        ``{stat: [n]}`` for SCALAR_STATS (float64); the rates are counts divided by d_model.
    """
    st = residual_stats(x, median_abs=float(median_abs), dtype=torch.float64)
    col = {f: st[..., i] for i, f in enumerate(ACT_FIELDS)}
    d = x.shape[-1]
    return {"norm": col["norm"], "var": col["var"], "kurtosis": col["kurtosis"],
            "outlier_rate": col["n_outliers"] / d, "massive_rate": col["n_massive"] / d}


@dataclasses.dataclass
class ReferenceProfile:
    """Prefill reference statistics for every layer of one model.

    Attributes:
        mean, var: ``[n_layers, d_model]`` per-dimension mean and variance (float64).
        median_abs: ``[n_layers]`` median |x| over all prefill values.
        stat_mean, stat_std: ``[n_layers, len(SCALAR_STATS)]`` distribution of per-position stats.
        threshold: ``[n_layers]`` drift-score threshold calibrated to ``fpr``.
        info: model fingerprint and build settings (model_id, revision, n_layers, d_model,
            n_prompts, n_positions, fpr, skip_first, heldout_fraction, seed).
    """

    mean: torch.Tensor
    var: torch.Tensor
    median_abs: torch.Tensor
    stat_mean: torch.Tensor
    stat_std: torch.Tensor
    threshold: torch.Tensor
    info: dict[str, Any]

    @property
    def n_layers(self) -> int:
        return int(self.mean.shape[0])

    @property
    def d_model(self) -> int:
        return int(self.mean.shape[1])

    def score(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """Drift score (diagonal Mahalanobis / √d) of ``x`` ``[n, d_model]`` at ``layer``: ``[n]``."""
        z2 = (x.double() - self.mean[layer]).pow(2) / self.var[layer].clamp_min(1e-12)
        return z2.mean(-1).sqrt()

    def check_model(self, n_layers: int, d_model: int, model_id: str = "") -> None:
        """Refuse a model whose depth or width differs from the profile's."""
        if (n_layers, d_model) != (self.n_layers, self.d_model):
            raise TrajscopeError(
                f"This profile was built on '{self.info.get('model_id')}' ({self.n_layers} layers, width "
                f"{self.d_model}) and cannot score '{model_id}' ({n_layers} layers, width {d_model}).")

    # -- IO ---------------------------------------------------------------------------------
    def save(self, path: str | pathlib.Path) -> pathlib.Path:
        from safetensors.torch import save_file

        path = pathlib.Path(path)
        tensors = {k: getattr(self, k).contiguous() for k in
                   ("mean", "var", "median_abs", "stat_mean", "stat_std", "threshold")}
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            save_file(tensors, str(path), metadata={"info": json.dumps(self.info), "kind": "trajscope-profile"})
        except OSError as exc:
            raise TrajscopeError(f"Cannot write the profile to '{path}': {exc.strerror or exc}.") from exc
        return path

    @classmethod
    def load(cls, path: str | pathlib.Path) -> "ReferenceProfile":
        from safetensors import safe_open

        path = pathlib.Path(path)
        if not path.is_file():
            raise TrajscopeError(f"No profile at '{path}'; build one with `trajscope profile`.")
        try:
            with safe_open(str(path), framework="pt") as fh:
                meta = fh.metadata() or {}
                if meta.get("kind") != "trajscope-profile":
                    raise TrajscopeError(f"'{path}' is not a trajscope profile.")
                tensors = {k: fh.get_tensor(k) for k in fh.keys()}
        except TrajscopeError:
            raise
        except Exception as exc:
            raise TrajscopeError(f"'{path}' is not a readable profile ({exc}).") from exc
        return cls(info=json.loads(meta["info"]), **tensors)


def profile_from_residuals(residuals: Sequence[dict[int, torch.Tensor]], *, fpr: float = 0.01,
                           heldout_fraction: float = 0.3, seed: int = 0, info: dict | None = None,
                           fit: Sequence[int] | None = None, calibrate: Sequence[int] | None = None) -> ReferenceProfile:
    """Fit a profile from prefill residuals of many prompts.

    Args:
        residuals: per prompt, ``{layer: [n_prefill_positions, d_model]}`` (all layers 0..L-1).
        fpr: target false-positive rate of the calibrated threshold.
        heldout_fraction: share of prompts used only for calibration (when ``fit``/``calibrate`` are not given).
        fit, calibrate: disjoint indices into ``residuals``: the prompts that fit the moments and those that
            calibrate the threshold (e.g. from :func:`trajscope.stats.split_ids`); prompts in neither are unused.
    Returns:
        A :class:`ReferenceProfile`.
    """
    n = len(residuals)
    if n < 2:
        raise TrajscopeError("A profile needs at least two prompts (one to fit, one to calibrate).")
    if not 0 < fpr < 0.5:
        raise TrajscopeError(f"fpr must be between 0 and 0.5, not {fpr}.")
    if (fit is None) != (calibrate is None):
        raise TrajscopeError("Give both fit and calibrate prompt indices, or neither.")
    if fit is None:
        order = np.random.default_rng(seed).permutation(n)
        n_held = min(n - 1, max(1, int(round(n * heldout_fraction))))
        held, fit = order[:n_held], order[n_held:]
    else:
        held, fit = np.asarray(list(calibrate), dtype=np.int64), np.asarray(list(fit), dtype=np.int64)
        if held.size == 0 or fit.size == 0 or set(held.tolist()) & set(fit.tolist()):
            raise TrajscopeError("The fit and calibrate prompt sets must both be non-empty and disjoint.")
        if min(held.min(), fit.min()) < 0 or max(held.max(), fit.max()) >= n:
            raise TrajscopeError(f"Prompt indices must lie in 0..{n - 1}.")
        n_held = int(held.size)
    layers = sorted(residuals[0])
    means, vars_, meds, smean, sstd, thr = [], [], [], [], [], []
    for layer in layers:
        x = torch.cat([residuals[i][layer] for i in fit]).double()
        if x.shape[0] < 2:
            raise TrajscopeError("The prompts hold too few prefill positions to fit a profile.")
        mu, var = x.mean(0), x.var(0, unbiased=True)
        med = torch.tensor(float(np.median(x.abs().numpy())), dtype=torch.float64)
        stats = position_stats(x, med)
        means.append(mu)
        vars_.append(var)
        meds.append(med)
        smean.append(torch.stack([stats[s].mean() for s in SCALAR_STATS]))
        sstd.append(torch.stack([stats[s].std() for s in SCALAR_STATS]))
        xh = torch.cat([residuals[i][layer] for i in held]).double()
        scores = ((xh - mu).pow(2) / var.clamp_min(1e-12)).mean(-1).sqrt()
        thr.append(torch.quantile(scores, 1.0 - fpr))
    info = dict(info or {}, n_prompts=n, n_fit_prompts=len(fit), n_heldout_prompts=n_held,
                n_positions=int(sum(residuals[i][layers[0]].shape[0] for i in [*fit, *held])), fpr=fpr,
                heldout_fraction=heldout_fraction, seed=seed)
    return ReferenceProfile(mean=torch.stack(means), var=torch.stack(vars_), median_abs=torch.stack(meds),
                            stat_mean=torch.stack(smean), stat_std=torch.stack(sstd), threshold=torch.stack(thr),
                            info=info)


@dataclasses.dataclass(frozen=True)
class DriftProbe:
    """An online drift probe for :func:`trajscope.capture` (``probe=``).

    During decode, the residual of each probed layer is scored against ``profile``
    every ``every`` steps, and at any step whose next-token entropy exceeds
    ``entropy_threshold`` (nats); a step is flagged when its score passes the
    layer's calibrated threshold. Step-level false alarms happen at the profile's
    ``fpr`` per probed (step, layer), so "any step flagged" fires on most long
    prefill-like runs. With ``trajectory_threshold`` (from :meth:`calibrated`), a
    run is flagged when its run statistic (:meth:`run_statistic`: max over probed
    (step, layer) of score / layer threshold) exceeds it; the false-alarm rate on
    prefill-like runs exchangeable with the calibration runs is then ≤ ``trajectory_rate``.

    Attributes:
        profile: the prefill reference.
        layers: probed layers (default: all).
        every: probe every k-th decode step.
        entropy_threshold: also probe when next-token entropy exceeds this (None: never).
        trajectory_threshold: threshold on the run statistic (None: no trajectory-level flag).
        trajectory_rate: the false-alarm rate it was calibrated to.
    """

    profile: ReferenceProfile
    layers: tuple[int, ...] | None = None
    every: int = 1
    entropy_threshold: float | None = None
    trajectory_threshold: float | None = None
    trajectory_rate: float | None = None

    @staticmethod
    def run_statistic(probe_table: Any) -> float:
        """Max over a run's probed (step, layer) rows of ``score / threshold`` (a probe table or any frame with both)."""
        if probe_table.height == 0:
            raise TrajscopeError("The run has no probed steps, so it has no trajectory statistic.")
        return float((probe_table["score"] / probe_table["threshold"]).max())

    def calibrated(self, runs: Sequence[Any], target_rate: float) -> "DriftProbe":
        """This probe with a trajectory-level threshold calibrated on prefill-like runs.

        Args:
            runs: per calibration run, its ``score / threshold`` ratios over probed (step, layer) (any shape), or
                its probe table. Use runs disjoint from the profile's fit prompts and from evaluation.
            target_rate: the false-alarm rate wanted (:func:`trajscope.conformal.calibrate_max`).
        """
        from trajscope.conformal import calibrate_max

        arrays = [np.asarray((r["score"] / r["threshold"]).to_numpy()) if hasattr(r, "columns") else np.asarray(r)
                  for r in runs]
        return dataclasses.replace(self, trajectory_threshold=calibrate_max(arrays, target_rate),
                                   trajectory_rate=float(target_rate))

    def flags_run(self, probe_table: Any) -> bool:
        """Whether a run's probe table passes the trajectory-level threshold."""
        if self.trajectory_threshold is None:
            raise TrajscopeError("This probe has no trajectory-level threshold; calibrate one with DriftProbe.calibrated.")
        return self.run_statistic(probe_table) > self.trajectory_threshold

    def spec(self) -> tuple:
        """Plain tuple for the capture loop: (layers, mean, 1/sd, thresholds, every, entropy threshold)."""
        layers = list(self.layers) if self.layers is not None else list(range(self.profile.n_layers))
        if self.every < 1:
            raise TrajscopeError(f"The probe's every must be ≥ 1, not {self.every}.")
        p = self.profile
        return (layers, p.mean[layers].float(), p.var[layers].clamp_min(1e-12).rsqrt().float(),
                p.threshold[layers].float(), int(self.every),
                -1.0 if self.entropy_threshold is None else float(self.entropy_threshold))

    def to_dict(self) -> dict[str, Any]:
        return {"layers": list(self.layers) if self.layers is not None else "all", "every": self.every,
                "entropy_threshold": self.entropy_threshold, "fpr": self.profile.info.get("fpr"),
                "profile_model": self.profile.info.get("model_id"),
                "trajectory_threshold": self.trajectory_threshold, "trajectory_rate": self.trajectory_rate}
