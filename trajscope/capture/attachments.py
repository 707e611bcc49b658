"""Attachments to a capture: an SAE (features table) and an online drift probe (probe table).

:func:`trajscope.capture` hands the step kernels a plain ``(layer, encode)`` tuple
for an SAE and the :meth:`~trajscope.profile.DriftProbe.spec` tuple for a probe;
the :class:`~trajscope.capture.record.StepRecord` s then carry their small per-step outputs, which the functions
here turn into the ``features`` table (position × top-k active feature, plus
``sae_l0`` / ``sae_rel_err`` / ``sae_cos`` columns on ``tokens``) and the
``probe`` table (probed step × layer: score, threshold, flagged).
"""

from __future__ import annotations

import functools
import weakref
from typing import Any

import torch

from trajscope.errors import TrajscopeError
from trajscope.model import ModelHandle
from trajscope import positions
from trajscope.capture.record import StepRecord
from trajscope.trajectory import Trajectory


def sae_spec(model: ModelHandle, sae: Any, k: int) -> tuple | None:
    """``(layer, encode)`` for the capture loop, after checking the SAE fits the model."""
    if sae is None:
        return None
    from trajscope.sae.model import sae_features

    layer = sae.cfg.layer
    if layer is None:
        raise TrajscopeError("The SAE's config names no layer (hook_name); trajscope cannot tell where to apply it.")
    if not 0 <= layer < model.n_layers:
        raise TrajscopeError(f"The SAE reads layer {layer} but the model has layers 0..{model.n_layers - 1}.")
    sae.check_input(torch.zeros(1, model.d_model), layer)
    if model.remote is True:
        raise TrajscopeError("Attaching an SAE to a remote (NDIF) capture is not supported yet; capture residuals "
                             "with residual_layers and encode them locally.")
    return (layer, functools.partial(sae_features, on_device(sae, model.device), k=k))


_COPIES: "weakref.WeakKeyDictionary[Any, tuple[tuple, Any]]" = weakref.WeakKeyDictionary()


def on_device(sae: Any, device: str):
    """``sae`` itself when its parameters are on ``device``, else a copy moved there (the caller's SAE stays put).

    The copy is kept while the SAE lives and reused by the next capture on that device, until one of the SAE's
    parameters is replaced or changed in place (each tensor's storage and version counter are checked).
    """
    import copy

    want = torch.empty(0, device=device).device  # "cuda" resolved to "cuda:0"
    params = list(sae.parameters())
    if not params or params[0].device == want:
        return sae
    stamp = (want, tuple((p.data_ptr(), p._version) for p in params))
    hit = _COPIES.get(sae)
    if hit is not None and hit[0] == stamp:
        return hit[1]
    moved = copy.deepcopy(sae).to(want)
    _COPIES[sae] = (stamp, moved)
    return moved


def feature_tables(traj: Trajectory, records: list[StepRecord], layer: int, sae_name: str):
    """The ``features`` table (position × top-k active feature) and ``tokens`` with SAE columns."""
    import polars as pl

    outs = [r.sae for r in records]
    if not outs:
        return pl.DataFrame(), traj.tokens
    feat = torch.cat([o["feature"] for o in outs]).cpu()
    val = torch.cat([o["value"] for o in outs]).cpu()
    n, k = feat.shape
    pos = torch.arange(n).unsqueeze(1).expand(n, k)
    keep = val > 0
    P = traj.prompt_len
    features = pl.DataFrame({"pos": pos[keep].numpy().astype("int32"), "feature": feat[keep].numpy(),
                             "value": val[keep].numpy()}).with_columns(
        pl.lit(traj.run_id).alias("run_id"), positions.query_step_expr(P), positions.phase_expr(P),
        pl.lit(layer).cast(pl.Int16).alias("layer"), pl.lit(sae_name).alias("sae"),
    ).select("run_id", "pos", "step", "phase", "layer", "sae", "feature", "value")
    sq_err = torch.cat([o["sq_err"] for o in outs]).cpu()
    sq_norm = torch.cat([o["sq_norm"] for o in outs]).cpu()
    per_pos = pl.DataFrame({"pos": list(range(n)), "sae_l0": torch.cat([o["l0"] for o in outs]).cpu().numpy(),
                            "sae_rel_err": (sq_err / sq_norm.clamp_min(1e-12)).numpy(),
                            "sae_cos": torch.cat([o["cos"] for o in outs]).cpu().numpy()},
                           schema_overrides={"pos": pl.Int32})
    return features, traj.tokens.join(per_pos, on="pos", how="left")


def probe_table(traj: Trajectory, records: list[StepRecord], spec: tuple):
    """One row per probed step × layer: run_id, step, pos, layer, score, threshold, flagged."""
    import polars as pl

    layers, thr = spec[0], spec[3].tolist()
    rows = [(r.step, r.last_pos, layer, float(sc), thr[i])
            for r in records if r.probe is not None for i, (layer, sc) in enumerate(zip(layers, r.probe.tolist()))]
    df = pl.DataFrame(rows, schema={"step": pl.Int32, "pos": pl.Int32, "layer": pl.Int16, "score": pl.Float64,
                                    "threshold": pl.Float64}, orient="row")
    return df.with_columns(pl.lit(traj.run_id).alias("run_id"), (pl.col("score") > pl.col("threshold")).alias("flagged")
                           ).select("run_id", "step", "pos", "layer", "score", "threshold", "flagged")
