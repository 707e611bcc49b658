"""Run the monitor study: plant a shift into decode, score every run with every monitor, measure detection.

Design (one prompt set, split by source file with :func:`trajscope.stats.split_ids`):

- **fit** prompts: one clean run each (sampling seed ``seed``). Their run scores fit each monitor's
  detection threshold at ``fpr`` (:func:`~trajscope.studies.monitor.measures.fit_threshold`) and their
  decode steps the attention monitors' clean baseline.
- **evaluate** prompts: one clean run (seed ``seed``) and, per strength s, one shifted run (seed
  ``seed + 1``, the steering vector at strength s from decode step k). At s = 0 the two arms differ
  only by sampling seed: the null.

A run's score under a monitor is the max of its step scores over steps ``s ≥ k``. Per (strength,
monitor), on the evaluate prompts: AUROC of shifted vs clean runs with a bootstrap interval over
prompts, the share of shifted runs detected, the Kaplan–Meier median time-to-detect, and the
realised false-positive rate on the held-out clean runs (Wilson).

Tables: ``monitor`` (per run and monitor), ``monitor_summary`` (per strength and monitor),
``monitor_pairs`` (per strength, each monitor's AUROC minus the drift monitor's, paired over prompts),
``monitor_steps`` (per run, monitor and decode step) and ``monitor_runs`` (per run: its steps and the
text it generated from step k on, for a behavioural check of the shift).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Sequence

import polars as pl

from trajscope.errors import TrajscopeError
from trajscope.stats import split_ids
from trajscope.studies.monitor import config as C
from trajscope.studies.monitor import measures as M
from trajscope.studies.monitor import monitors as MON
from trajscope.studies.registry import Result

RUN_KEYS = ["prompt_id", "file", "part", "arm", "strength", "seed"]


def split_prompts(ids: Sequence[str], config: C.MonitorConfig) -> dict[str, list[str]]:
    """``{"fit": ids, "evaluate": ids}``, disjoint in source files (``fit_files``, or half the files by seed)."""
    files = [C.file_of(i) for i in ids]
    if config.fit_files is None:
        if len(set(files)) < 2:
            raise TrajscopeError(f"The monitor study splits prompts by source file, but all {len(ids)} prompts come "
                                 f"from '{files[0]}'; give prompts from at least two files.")
        return split_ids(list(ids), (0.5, 0.5), ("fit", "evaluate"), seed=config.seed, groups=files)
    unknown = sorted(set(config.fit_files) - set(files))
    if unknown:
        raise TrajscopeError(f"--fit-files names '{unknown[0]}', which no prompt comes from (files: "
                             f"{', '.join(sorted(set(files)))}).")
    parts = {"fit": sorted(i for i, f in zip(ids, files) if f in config.fit_files),
             "evaluate": sorted(i for i, f in zip(ids, files) if f not in config.fit_files)}
    if not parts["evaluate"]:
        raise TrajscopeError("--fit-files names every file, so no prompt is left to evaluate on.")
    return parts


def plan_runs(parts: dict[str, list[str]], config: C.MonitorConfig) -> list[dict[str, Any]]:
    """One dict per run: prompt_id, file, part, arm (clean / shifted), strength (None for clean), seed."""
    runs = []
    for part in ("fit", "evaluate"):
        for pid in parts[part]:
            base = {"prompt_id": pid, "file": C.file_of(pid), "part": part}
            runs.append({**base, "arm": "clean", "strength": None, "seed": config.seed})
            if part == "evaluate":
                runs += [{**base, "arm": "shifted", "strength": s, "seed": config.seed + 1} for s in config.strengths]
    return runs


def run(model: Any, prompts: Sequence[tuple[str, list[int]]], config: C.MonitorConfig,
        progress: Callable[[int, int], None] | None = None, layers: Sequence[int] | None = None) -> Result:
    """Run the study on ``prompts`` (``(id, token ids)``); ``layers``: the drift monitor's layers.

    Returns:
        A :class:`~trajscope.studies.registry.Result` with tables ``monitor``, ``monitor_summary``,
        ``monitor_pairs``, ``monitor_steps`` and ``monitor_runs`` and summaries ``split`` and ``setup``.
    """
    from trajscope.capture import CaptureConfig, capture

    ids = [pid for pid, _ in prompts]
    if len(set(ids)) != len(ids):
        raise TrajscopeError("The monitor study needs distinct prompt ids (each prompt's file comes from its id).")
    parts = split_prompts(ids, config)
    vector = C.steering_vector(model, config)
    profile = C.drift_profile(model, config)
    saes = C.monitor_saes(model, config)
    drift_layers = sorted(set(layers)) if layers else C.default_drift_layers(model.n_layers)
    att_layer = model.n_layers // 2 if config.attention_layer is None else config.attention_layer
    if not 0 <= att_layer < model.n_layers:
        raise TrajscopeError(f"--attention-layer {att_layer} is out of range; the model has layers "
                             f"0..{model.n_layers - 1}.")
    keep = sorted(set(drift_layers if profile is not None else []) | {int(s.cfg.layer) for s in saes.values()})
    base = CaptureConfig(max_new_tokens=config.new_tokens, temperature=config.temperature,
                         stop_at_eos=config.stop_at_eos, residual_layers=keep or None, prefill_rows=1)
    by_id = dict(prompts)
    plan = plan_runs(parts, config)
    frames, texts = [], []
    for i, r in enumerate(plan):
        steer = () if r["strength"] is None else (vector.at(strength=r["strength"]),)
        traj = capture(model, by_id[r["prompt_id"]], base.replace(seed=r["seed"], steering=steer),
                       run_id=f"{r['prompt_id']}|{r['arm']}|{r['strength']}")
        vals = MON.step_values(traj, profile=profile, drift_layers=drift_layers if profile is not None else (),
                               attention_layer=att_layer, saes=saes)
        frames.append(vals.with_columns(**{k: pl.lit(r[k]) for k in RUN_KEYS}))
        texts.append({**r, "n_steps": int(traj.meta["n_steps"]), "text_from_k": shifted_text(traj, config.start_step)})
        if progress:
            progress(i + 1, len(plan))
    schema = {"prompt_id": pl.String, "file": pl.String, "part": pl.String, "arm": pl.String,
              "strength": pl.Float64, "seed": pl.Int64}
    values = pl.concat([f.cast(schema) for f in frames], how="vertical_relaxed")
    moments = MON.clean_moments(values.filter((pl.col("part") == "fit") & (pl.col("arm") == "clean")))
    steps = MON.standardise(values, moments).select(*RUN_KEYS, "monitor", "step", "value", "score")
    per_run = run_table(steps, config)
    summary = summary_table(per_run, config)
    pairs = pairs_table(per_run, config)
    info = {"split": {"by": "source file", **{f"{p}_files": sorted({C.file_of(i) for i in v}) for p, v in parts.items()},
                      **{f"n_{p}_prompts": len(v) for p, v in parts.items()}},
            "setup": {"model_id": model.model_id, "vector": vector.to_dict() | {"source": config.vector},
                      "drift_layers": drift_layers if profile is not None else [],
                      "profile": None if profile is None else {k: profile.info.get(k) for k in ("model_id", "fpr")},
                      "attention_layer": att_layer, "saes": {n: int(s.cfg.layer) for n, s in saes.items()},
                      "baseline": moments.sort("monitor").to_dicts(),
                      "n_runs": len(plan), "dropped_runs": per_run.filter(pl.col("run_score").is_null())
                      .select("prompt_id", "arm", "strength").unique().height}}
    return Result(study="monitor", config=dataclasses.asdict(config), summaries=info,
                  tables={"monitor": per_run, "monitor_summary": summary, "monitor_pairs": pairs,
                          "monitor_steps": steps, "monitor_runs": pl.DataFrame(texts).cast(schema)})


def shifted_text(traj: Any, start_step: int) -> str:
    """The text a run generated from step k on (tokens produced by steps ≥ k; the shift acts from there)."""
    tok = traj.tokens
    return "".join(tok.filter(pl.col("produced_at_step") >= start_step).sort("pos")["text"].to_list())


def run_table(steps: pl.DataFrame, config: C.MonitorConfig) -> pl.DataFrame:
    """Per run and monitor: run score (max over steps ≥ k), threshold, detected, detect step and time-to-detect.

    A run with no step ≥ k (it ended at EOS before) keeps a row with a null run score.
    """
    k = config.start_step
    runs = (steps.group_by([*RUN_KEYS, "monitor"], maintain_order=True)
            .agg(run_score=pl.col("score").filter(pl.col("step") >= k).max(), last_step=pl.col("step").max(),
                 steps=pl.col("step"), scores=pl.col("score")))
    fit = runs.filter((pl.col("part") == "fit") & (pl.col("arm") == "clean") & pl.col("run_score").is_not_null())
    thresholds = {}
    for m in runs["monitor"].unique().sort().to_list():
        scores = fit.filter(pl.col("monitor") == m)["run_score"].to_list()
        try:
            thresholds[m] = M.fit_threshold(scores, config.fpr)
        except TrajscopeError as exc:
            raise TrajscopeError(f"Monitor '{m}': {str(exc).rstrip('.')} (clean runs of the fitting prompts).") from exc
    detect = [M.detect_step(st, sc, thresholds[m], k) if rs is not None else None
              for st, sc, m, rs in zip(runs["steps"], runs["scores"], runs["monitor"], runs["run_score"])]
    return (runs.drop("steps", "scores")
            .with_columns(threshold=pl.col("monitor").replace_strict(thresholds, return_dtype=pl.Float64),
                          detect_step=pl.Series(detect, dtype=pl.Int32))
            .with_columns(detected=pl.col("detect_step").is_not_null() & pl.col("run_score").is_not_null(),
                          time_to_detect=(pl.col("detect_step") - k).cast(pl.Int32)))


def summary_table(per_run: pl.DataFrame, config: C.MonitorConfig) -> pl.DataFrame:
    """Per (strength, monitor) on the evaluate prompts: AUROC [lo, hi] (``value``, ``lo``, ``hi``), detected share,
    Kaplan–Meier median time-to-detect [lo, hi], the false-positive rate on fitting (in-sample) and held-out clean
    runs, and the n behind each."""
    k = config.start_step
    ok = per_run.filter(pl.col("run_score").is_not_null())
    rows = []
    for m in ok["monitor"].unique().sort().to_list():
        mine = ok.filter(pl.col("monitor") == m)
        fit_clean = mine.filter((pl.col("part") == "fit") & (pl.col("arm") == "clean"))
        ev = mine.filter(pl.col("part") == "evaluate")
        clean = ev.filter(pl.col("arm") == "clean")
        thr = float(mine["threshold"][0])
        fpr_fit = M.false_positive_rate(fit_clean["run_score"].to_list(), thr)
        fpr_out = M.false_positive_rate(clean["run_score"].to_list(), thr)
        for s in config.strengths:
            shifted = ev.filter((pl.col("arm") == "shifted") & (pl.col("strength") == s))
            pair = set(shifted["prompt_id"]) & set(clean["prompt_id"])
            both = pl.concat([clean, shifted]).filter(pl.col("prompt_id").is_in(pair))
            row = {"monitor": m, "shift": f"s={s:g} from step {k}", "strength": s, "n_prompts": len(pair),
                   "measure": "AUROC", "value": math.nan, "lo": math.nan, "hi": math.nan}
            if pair:
                iv = M.auroc_interval(both["run_score"].to_numpy(), (both["arm"] == "shifted").to_numpy(),
                                      both["prompt_id"].to_numpy(), n_boot=config.n_boot, seed=config.seed)
                row.update(value=iv.estimate, lo=iv.lo, hi=iv.hi)
            det = shifted["detect_step"].to_list()
            ttd = M.time_to_detect(det, shifted["last_step"].to_list(), k) if det else None
            row.update(detected=float(shifted["detected"].mean()) if shifted.height else math.nan,
                       n_detected=int(shifted["detected"].sum()), n_shifted=shifted.height,
                       ttd_median=ttd.estimate if ttd else math.nan, ttd_lo=ttd.lo if ttd else math.nan,
                       ttd_hi=ttd.hi if ttd else math.nan, threshold=thr, fpr_target=config.fpr,
                       fpr_fit=fpr_fit.estimate, n_fit_runs=fpr_fit.n_clusters, fpr_heldout=fpr_out.estimate,
                       fpr_heldout_lo=fpr_out.lo, fpr_heldout_hi=fpr_out.hi, n_heldout_runs=fpr_out.n_clusters)
            rows.append(row)
    ints = ("n_prompts", "n_detected", "n_shifted", "n_fit_runs", "n_heldout_runs")
    return pl.DataFrame(rows).with_columns([pl.col(c).cast(pl.Int32) for c in ints]).sort("strength", "monitor")


def pairs_table(per_run: pl.DataFrame, config: C.MonitorConfig, reference: str = "drift") -> pl.DataFrame:
    """Per strength, each monitor's AUROC minus the ``reference`` monitor's on the same evaluate runs
    (``value``, ``lo``, ``hi``: paired bootstrap over prompts, :func:`~trajscope.studies.monitor.measures.auroc_difference`).
    Empty when the reference monitor did not run."""
    ev = per_run.filter((pl.col("part") == "evaluate") & pl.col("run_score").is_not_null())
    rows = []
    if reference in set(ev["monitor"]):
        for s in config.strengths:
            arm = ev.filter((pl.col("arm") == "clean") | (pl.col("strength") == s))
            wide = arm.pivot(on="monitor", index=["prompt_id", "arm"], values="run_score").drop_nulls()
            paired = wide.group_by("prompt_id").agg(pl.col("arm").n_unique().alias("n")).filter(pl.col("n") == 2)
            wide = wide.filter(pl.col("prompt_id").is_in(paired["prompt_id"].implode())).sort("prompt_id", "arm")
            for m in sorted(c for c in wide.columns if c not in ("prompt_id", "arm", reference)):
                iv = M.auroc_difference(wide[m].to_numpy(), wide[reference].to_numpy(),
                                        (wide["arm"] == "shifted").to_numpy(), wide["prompt_id"].to_numpy(),
                                        n_boot=config.n_boot, seed=config.seed)
                rows.append({"strength": s, "monitor": m, "reference": reference, "n_prompts": iv.n_clusters,
                             "value": iv.estimate, "lo": iv.lo, "hi": iv.hi})
    schema = {"strength": pl.Float64, "monitor": pl.String, "reference": pl.String, "n_prompts": pl.Int32,
              "value": pl.Float64, "lo": pl.Float64, "hi": pl.Float64}
    return pl.DataFrame(rows, schema=schema)
