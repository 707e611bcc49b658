"""The monitors: a score per decode step of a captured run, from what capture recorded.

Every monitor reads the decode steps ``s ≥ 1`` of a :class:`~trajscope.trajectory.Trajectory`
(the residual of step s is its query's, at ``pos = P + s − 1``: :func:`trajscope.positions.query_pos`).
A *replayed* run (the topic and forced shifts: a run's first tokens, and the forced ones, re-read as
the prompt of a second capture) gives ``origin``, the original prompt length P: its positions from P on
are scored as the steps they stand for, ``s = pos − P + 1``, whether the second capture computed them
in its prefill or decoding (a causal model computes the same residual and attention row either way):

- ``drift``: the prefill-calibrated drift monitor. At each probed layer l, the shipped profile's
  drift score (:meth:`trajscope.profile.ReferenceProfile.score`, diagonal Mahalanobis / √d) divided by
  the layer's per-position prefill threshold (as :meth:`trajscope.profile.DriftProbe.run_statistic`
  does, so layers of different spread compare); the step's value is the max over the layers. Nothing
  is fitted on decode.
- ``attn-sink`` and ``attn-entropy``: attention telemetry of one layer: the step's sink mass
  (attention on position 0) and normalised attention entropy, each the mean over heads. Their score is
  the deviation from the clean-decode mean in clean-decode standard deviations, ``|v − μ| / σ``, with
  ``μ, σ`` fitted on the clean runs of the fitting prompts (:func:`standardise`).
- ``sae:<name>``: an SAE's relative reconstruction error at its layer, ``‖x − x̂‖ / ‖x‖`` (the
  SAE's own encode/decode, :meth:`trajscope.sae.model.SAE.reconstruct`). Nothing is fitted on decode.

:func:`step_values` returns the raw values; :func:`standardise` turns them into scores.
"""

from __future__ import annotations

from typing import Any, Sequence

import polars as pl
import torch

from trajscope import positions
from trajscope.errors import TrajscopeError

ATTENTION = {"attn-sink": "sink_mass", "attn-entropy": "entropy_norm"}  # monitor -> attention table column
CENTRED = tuple(ATTENTION)  # monitors scored as |v − μ| / σ against clean decode


def decode_steps(traj: Any, origin: int | None = None) -> list[int]:
    """The decode steps whose query the run computed (1 .. n_steps − 1), counted from prompt length ``origin``
    (default: the run's own prompt length; a replayed run's earlier positions then count as steps too)."""
    P = int(traj.meta["prompt_len"])
    origin = P if origin is None else int(origin)
    if not 1 <= origin <= P:
        raise TrajscopeError(f"origin {origin} must lie in 1..{P} (the run's prompt length).")
    return list(range(1, P - origin + int(traj.meta["n_steps"])))


def _rows(origin: int, steps: Sequence[int]) -> list[int]:
    return [int(positions.query_pos(s, origin)) for s in steps]


def _resid(traj: Any, layer: int, rows: list[int]) -> torch.Tensor:
    key = f"residual.{layer}"
    if key not in traj.tensors:
        raise TrajscopeError(f"The run kept no residual of layer {layer}; capture it with residual_layers.")
    return traj.tensors[key][rows].double()


def step_values(traj: Any, *, profile: Any = None, drift_layers: Sequence[int] = (), attention_layer: int | None = None,
                saes: dict[str, Any] | None = None, origin: int | None = None) -> pl.DataFrame:
    """Each monitor's raw value at each decode step of one run.

    Args:
        traj: a captured run (residuals of ``drift_layers`` and of each SAE's layer kept).
        profile: a :class:`~trajscope.profile.ReferenceProfile` (None: no ``drift`` monitor).
        drift_layers: the layers the drift monitor probes.
        attention_layer: the layer of the attention monitors (None: none).
        saes: ``{name: SAE}`` (each read at its own layer).
        origin: the prompt length the steps count from (default: the run's; see the module docstring).
    Returns:
        ``step`` (Int32), ``monitor`` (String), ``value`` (Float64): one row per decode step and monitor.
    """
    origin = int(traj.meta["prompt_len"]) if origin is None else int(origin)
    steps = decode_steps(traj, origin)
    if not steps:
        return pl.DataFrame(schema={"step": pl.Int32, "monitor": pl.String, "value": pl.Float64})
    rows = _rows(origin, steps)
    out: list[pl.DataFrame] = []

    def add(name: str, values: Any, at: Sequence[int] = steps) -> None:
        out.append(pl.DataFrame({"step": list(at), "monitor": name, "value": [float(v) for v in values]},
                                schema={"step": pl.Int32, "monitor": pl.String, "value": pl.Float64}))

    if profile is not None and drift_layers:
        ratios = torch.stack([profile.score(layer, _resid(traj, layer, rows)) / profile.threshold[layer]
                              for layer in drift_layers])
        add("drift", ratios.max(0).values.tolist())
    if attention_layer is not None:
        att = (traj.attention.filter((pl.col("layer") == attention_layer) & (pl.col("pos") >= origin))
               .group_by("pos").agg([pl.col(c).mean().alias(m) for m, c in ATTENTION.items()])
               .with_columns(step=pl.col("pos") - origin + 1).sort("step"))
        if att["step"].to_list() != steps:
            raise TrajscopeError(f"The run has no attention row at some scored step (rows from pos {origin} on); "
                                 "capture it with prefill_rows covering the replayed positions.")
        for m in ATTENTION:
            add(m, att[m].to_list(), att["step"].to_list())
    for name, sae in (saes or {}).items():
        x = _resid(traj, int(sae.cfg.layer), rows).float()
        with torch.no_grad():
            x_hat = sae.reconstruct(x)[0].float()
        add(f"sae:{name}", ((x - x_hat).norm(dim=-1) / x.norm(dim=-1).clamp_min(1e-12)).tolist())
    return pl.concat(out) if out else pl.DataFrame(schema={"step": pl.Int32, "monitor": pl.String,
                                                          "value": pl.Float64})


def clean_moments(values: pl.DataFrame) -> pl.DataFrame:
    """Mean and standard deviation of each centred monitor's value over clean decode steps (``monitor, mu, sigma``)."""
    return (values.filter(pl.col("monitor").is_in(CENTRED)).group_by("monitor")
            .agg(mu=pl.col("value").mean(), sigma=pl.col("value").std()))


def standardise(values: pl.DataFrame, moments: pl.DataFrame) -> pl.DataFrame:
    """``values`` with a ``score`` column: ``|value − μ| / σ`` for the centred monitors, the value itself otherwise.

    Args:
        values: rows with ``monitor`` and ``value``.
        moments: :func:`clean_moments` of the fitting prompts' clean runs.
    """
    bad = moments.filter(~(pl.col("sigma") > 0))
    if bad.height:
        raise TrajscopeError(f"The clean fitting runs give monitor '{bad['monitor'][0]}' no spread (σ = 0 or "
                             "undefined); add prompts or tokens.")
    joined = values.join(moments, on="monitor", how="left")
    return joined.with_columns(score=pl.when(pl.col("mu").is_not_null())
                               .then((pl.col("value") - pl.col("mu")).abs() / pl.col("sigma"))
                               .otherwise(pl.col("value"))).drop("mu", "sigma")
