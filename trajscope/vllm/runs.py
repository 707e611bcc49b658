"""A tracked vLLM request as a trajscope run directory (the schema of :mod:`trajscope.trajectory`).

When a tracked request finishes, its recorded rows become a :class:`~trajscope.trajectory.Trajectory`
saved under the server's output directory (``$TRAJSCOPE_VLLM_OUT/<run_id>``), which
``trajscope report``, the app's "Open run" and ``Trajectory.load`` read:

- ``tokens``: every position (prompt and generated), with the next-token entropy, top-k
  and the logprob of each token where vLLM computed the distribution before it (the last
  prompt position and every decode step; earlier prompt rows are null, since vLLM
  unembeds only the rows it samples from), and, with an SAE, ``sae_l0`` / ``sae_rel_err`` / ``sae_cos``;
- ``activations``: the monitored layer's residual statistics at every position the engine computed
  (positions served from the prefix cache were not computed and have no row);
- ``features``: the SAE's top-k active features per computed position;
- ``probe``: the drift score per decode step at the monitored layer against the profile's threshold
  (as capture's probe: the prefill is not probed);
- ``attention``: empty — vLLM's fused attention kernels return no probabilities;
- ``tensors.safetensors``: ``residual.{layer}`` rows of the computed positions when asked
  (``meta["vllm"]["first_computed_pos"]`` says where they start);
- ``meta.json``: the usual fields plus ``vllm`` (request id, prefix-cache hits, engine version).
"""

from __future__ import annotations

import pathlib
import time
from typing import Any

import numpy as np
import polars as pl
import torch

from trajscope import positions
from trajscope.metrics.residual_stats import ACT_FIELDS
from trajscope.trajectory import Trajectory, library_versions
from trajscope.vllm.monitor import TOP_K_TOKENS, Tracked

_ATTN_SCHEMA = {"run_id": pl.String, "step": pl.Int32, "pos": pl.Int32, "layer": pl.Int16, "head": pl.Int16,
                **{f: pl.Float32 for f in ("entropy", "entropy_norm", "prefix_mass", "generated_mass", "sink_mass",
                                           "sink4_mass", "self_mass")},
                "top_pos": pl.List(pl.Int32), "top_w": pl.List(pl.Float32)}


def run_id_of(t: Tracked) -> str:
    """The run directory name: the request's ``trajscope_run_id``, else its vLLM request id made path-safe."""
    if t.plan.run_id:
        return t.plan.run_id
    return "vllm-" + "".join(c if c.isalnum() or c in "-_." else "_" for c in t.req_id)[:120]


def trajectory(t: Tracked, output_ids: list[int], tokenizer: Any, model_info: dict, stop_reason: str,
               threshold: float | None, engine: dict) -> Trajectory:
    """Build the run of a finished tracked request.

    Args:
        output_ids: the generated token ids (all of them, the last one included).
        tokenizer: decodes each token's text.
        model_info: the ``meta["model"]`` entry; stop_reason: why generation ended.
        threshold: the profile's drift threshold at the monitored layer (None without a profile).
        engine: extra ``meta["vllm"]`` fields (engine version, settings).
    """
    run_id, P = run_id_of(t), t.prompt_len
    ids = t.prompt_ids + [int(i) for i in output_ids]
    T = len(ids)
    if t.last_logp is not None and t.last_logp_pos == T - 2:
        t.chosen_lp[T - 1] = float(t.last_logp[ids[-1]])
    texts = tokenizer.batch_decode([[i] for i in ids]) if T else []
    pos = np.arange(T)
    dist = [t.dist.get(i) for i in range(T)]
    top_texts = [tokenizer.batch_decode([[j] for j in d[1]]) if d else None for d in dist]
    tokens = pl.DataFrame({
        "run_id": [run_id] * T, "pos": pos.astype(np.int32), "step": positions.query_step(pos, P).astype(np.int32),
        "phase": positions.phases(pos, P),
        "segment": positions.segments_from_runs(None, min(P, T)) + positions.generated_segments(texts[P:]),
        "token_id": np.asarray(ids, dtype=np.int64), "text": texts,
        "logprob": [t.chosen_lp.get(i) for i in range(T)], "entropy": [d[0] if d else None for d in dist],
        "top_ids": [d[1] if d else None for d in dist], "top_texts": top_texts,
        "top_logprobs": [d[2] if d else None for d in dist],
    }, schema_overrides={"logprob": pl.Float32, "entropy": pl.Float32, "top_ids": pl.List(pl.Int64),
                         "top_texts": pl.List(pl.String), "top_logprobs": pl.List(pl.Float32)})
    tokens = tokens.with_columns(positions.produced_at_step_expr(P)).select(
        "run_id", "pos", "step", "produced_at_step", "phase", "segment", "token_id", "text", "logprob", "entropy",
        "top_ids", "top_texts", "top_logprobs")
    rows = sorted(t.rows, key=lambda r: int(r["pos"][0]))
    layer = t.plan.layer
    rpos = torch.cat([r["pos"] for r in rows]).numpy().astype(np.int32) if rows else np.zeros(0, np.int32)
    act = torch.cat([r["act"] for r in rows]).numpy() if rows else np.zeros((0, len(ACT_FIELDS)), np.float32)
    activations = pl.DataFrame({
        "run_id": [run_id] * len(rpos), "pos": rpos, "step": positions.query_step(rpos, P).astype(np.int32),
        "phase": positions.phases(rpos, P) if len(rpos) else np.zeros(0, dtype=str),
        "layer": np.full(len(rpos), layer, dtype=np.int16), **{f: act[:, i].astype(np.float32) for i, f in enumerate(ACT_FIELDS)},
    }, schema_overrides={"phase": pl.String}).with_columns(pl.col("n_outliers", "n_massive").cast(pl.Int32))
    traj = Trajectory(meta={}, tokens=tokens, attention=pl.DataFrame(schema=_ATTN_SCHEMA), activations=activations)
    if t.plan.sae is not None and rows:
        traj.features, traj.tokens = _features(run_id, P, layer, t, rows, rpos, tokens)
    if t.plan.profile is not None and rows:
        score = torch.cat([r["score"] for r in rows]).numpy()
        keep = positions.query_step(rpos, P) >= 1
        traj.probe = pl.DataFrame({
            "run_id": [run_id] * int(keep.sum()), "step": positions.query_step(rpos[keep], P).astype(np.int32),
            "pos": rpos[keep], "layer": np.full(int(keep.sum()), layer, dtype=np.int16), "score": score[keep],
            "threshold": np.full(int(keep.sum()), float(threshold)),
        }).with_columns((pl.col("score") > pl.col("threshold")).alias("flagged"))
    if t.plan.keep_residuals and rows:
        traj.tensors[f"residual.{layer}"] = torch.cat([r["resid"] for r in rows]).float()
    if t.plan.steered:
        traj.tensors["steering.0"] = t.plan.steer_direction
    traj.meta = _meta(t, run_id, P, T, texts, model_info, stop_reason, engine, traj)
    return traj


def _features(run_id: str, P: int, layer: int, t: Tracked, rows: list, rpos: np.ndarray, tokens: pl.DataFrame):
    sae = {k: torch.cat([r["sae"][k] for r in rows]) for k in rows[0]["sae"]}
    feat, val = sae["feature"], sae["value"]
    n, k = feat.shape
    keep = val > 0
    pos = torch.from_numpy(rpos.astype(np.int64)).unsqueeze(1).expand(n, k)
    features = pl.DataFrame({"pos": pos[keep].numpy().astype(np.int32), "feature": feat[keep].numpy(),
                             "value": val[keep].numpy()}).with_columns(
        pl.lit(run_id).alias("run_id"), positions.query_step_expr(P), positions.phase_expr(P),
        pl.lit(layer).cast(pl.Int16).alias("layer"), pl.lit(t.plan.sae).alias("sae"),
    ).select("run_id", "pos", "step", "phase", "layer", "sae", "feature", "value")
    per_pos = pl.DataFrame({"pos": rpos, "sae_l0": sae["l0"].numpy(),
                            "sae_rel_err": (sae["sq_err"] / sae["sq_norm"].clamp_min(1e-12)).numpy(),
                            "sae_cos": sae["cos"].numpy()}, schema_overrides={"pos": pl.Int32})
    return features, tokens.join(per_pos, on="pos", how="left")


def _meta(t: Tracked, run_id: str, P: int, T: int, texts: list[str], model_info: dict, stop_reason: str,
          engine: dict, traj: Trajectory) -> dict:
    s = t.sampling
    first = t.first_pos if t.first_pos is not None else P
    meta = {
        "run_id": run_id, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "prompt": "".join(texts[:P]),
        "prompt_ids": t.prompt_ids, "prompt_len": P,
        "sampling": {"do_sample": float(s.get("temperature") or 0.0) > 0, **s},
        "model": model_info, "versions": library_versions(),
        "residual_layers": [t.plan.layer] if t.plan.keep_residuals else [], "attention_layers": [],
        "top_k_tokens": TOP_K_TOKENS, "steering": [t.plan.steering_dict()] if t.plan.steered else [],
        "probe": None, "sae": None, "stop_reason": stop_reason, "n_steps": max(0, T - P),
        "n_generated": T - P,
        "vllm": {"request_id": t.req_id, "prefix_cached_tokens": int(first), "first_computed_pos": int(first),
                 "monitored_layer": t.plan.layer, "n_forwards": t.n_forwards, **engine},
    }
    if t.plan.profile is not None:
        probe = traj.probe
        meta["probe"] = {"layers": [t.plan.layer], "every": 1, "entropy_threshold": None, "profile": t.plan.profile,
                         "n_probed": 0 if probe is None else probe["step"].n_unique(),
                         "n_flagged_steps": 0 if probe is None else probe.filter("flagged")["step"].n_unique(),
                         "flagged": bool(probe is not None and probe["flagged"].any())}
    if t.plan.sae is not None:
        meta["sae"] = {"layer": t.plan.layer, "top_k": t.plan.sae_top_k, "name": t.plan.sae}
    return meta


def save(traj: Trajectory, out_dir: str | pathlib.Path) -> pathlib.Path:
    """Write the run to ``out_dir/<run_id>`` (atomically, as :meth:`Trajectory.save`)."""
    return traj.save(pathlib.Path(out_dir) / traj.run_id)
