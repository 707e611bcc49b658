"""Run the monitor study: plant a shift into decode, score every run with every monitor, measure detection.

Design (one prompt set, split by source file with :func:`trajscope.stats.split_ids`):

- **fit** prompts: one clean run each (sampling seed ``seed``). Their run scores fit each monitor's
  detection threshold at ``fpr`` (:func:`~trajscope.studies.monitor.measures.fit_threshold`) and their
  decode steps the attention monitors' clean baseline.
- **evaluate** prompts: one clean run (seed ``seed``) and one run per shifted arm (seed ``seed + 1``):

  - ``steer`` at each strength s: the steering vector from decode step k. At s = 0 the two arms differ
    only by sampling seed: the null of the steering shift.
  - ``topic`` and ``forced``: a first capture samples the run's first k tokens (steps 0..k − 1, seed
    ``seed + 1``, no EOS stop); then the tokens produced at steps k..k + n − 1 are *forced*: the switch
    text's tokens (topic) or n tokens drawn uniformly from the vocabulary without special tokens (forced;
    a seeded draw per prompt). A second capture reads prompt + first k tokens + forced tokens as its
    prompt and generates the remaining ``new_tokens − k − n`` tokens freely (seed ``seed + 1``). The
    positions after the original prompt are scored as the steps they stand for
    (:func:`~trajscope.studies.monitor.monitors.step_values` with ``origin``), so every run has steps
    1..new_tokens − 1. The first forced token is the query of step k + 1, so these shifts cannot be seen
    before one step after k.
  - ``replay``: the null of topic and forced: the same two captures with nothing forced.

A run's score under a monitor is the max of its step scores over steps ``s ≥ k``. Per (arm, monitor),
on the evaluate prompts: AUROC of the arm's runs vs the clean runs with a bootstrap interval over
prompts, the share of the arm's runs detected, the Kaplan–Meier median time-to-detect, and the
realised false-positive rate on the held-out clean runs (Wilson).

Tables: ``monitor`` (per run and monitor), ``monitor_summary`` (per arm and monitor),
``monitor_pairs`` (per arm, each monitor's AUROC minus the drift monitor's, paired over prompts),
``monitor_vs_null`` (per shifted arm and monitor, its AUROC against its own null arm's runs),
``monitor_steps`` (per run, monitor and step) and ``monitor_runs`` (per run: its steps, the forced text
and the text from step k on and after the forced run, for a behavioural check of the shift).
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

RUN_KEYS = ["prompt_id", "file", "part", "arm", "shift", "strength", "seed"]
SCHEMA = {"prompt_id": pl.String, "file": pl.String, "part": pl.String, "arm": pl.String, "shift": pl.String,
          "strength": pl.Float64, "seed": pl.Int64}
REPLAYED = ("replay", "topic", "forced")  # arms run as two captures (first k tokens, then the rest)


def arms(config: C.MonitorConfig) -> list[dict[str, Any]]:
    """The shifted arms in report order: ``shift`` (steer / replay / topic / forced), ``strength`` (steer only)
    and ``label``."""
    out = []
    if "steer" in config.shifts:
        out += [{"shift": "steer", "strength": s, "label": f"steer s={s:g}" + (" (null)" if s == 0 else "")}
                for s in config.strengths]
    if {"topic", "forced"} & set(config.shifts):
        out.append({"shift": "replay", "strength": None, "label": "replay (null of topic, forced)"})
    if "topic" in config.shifts:
        out.append({"shift": "topic", "strength": None, "label": "topic switch"})
    if "forced" in config.shifts:
        out.append({"shift": "forced", "strength": None, "label": f"forced {config.forced_tokens} random tokens"})
    return out


def _same_arm(shift: str, strength: float | None) -> pl.Expr:
    e = pl.col("shift") == shift
    return e & (pl.col("strength") == strength) if strength is not None else e


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
    """One dict per run: prompt_id, file, part, arm (clean / shifted), shift (none / steer / replay / topic /
    forced), strength (steer only), seed."""
    runs = []
    for part in ("fit", "evaluate"):
        for pid in parts[part]:
            base = {"prompt_id": pid, "file": C.file_of(pid), "part": part}
            runs.append({**base, "arm": "clean", "shift": "none", "strength": None, "seed": config.seed})
            if part == "evaluate":
                runs += [{**base, "arm": "shifted", "shift": a["shift"], "strength": a["strength"],
                          "seed": config.seed + 1} for a in arms(config)]
    return runs


def forced_ids(model: Any, config: C.MonitorConfig, shift: str, prompt_index: int) -> list[int]:
    """The tokens a shift forces from step k: none (replay), the switch text's (topic) or ``forced_tokens`` ids
    drawn uniformly from the vocabulary without special tokens, seeded by ``(seed, prompt_index)`` (forced)."""
    import numpy as np

    if shift == "replay":
        return []
    if shift == "topic":
        ids = model.tokenizer(config.switch_text, add_special_tokens=False)["input_ids"]
        if config.start_step + len(ids) >= config.new_tokens:
            raise TrajscopeError(f"--switch-text is {len(ids)} tokens; with --start-step {config.start_step} it "
                                 f"needs --new-tokens above {config.start_step + len(ids)}.")
        return [int(i) for i in ids]
    special = set(int(i) for i in (model.tokenizer.all_special_ids or []))
    pool = np.array([i for i in range(min(len(model.tokenizer), model.vocab_size)) if i not in special])
    rng = np.random.default_rng([config.seed, prompt_index])
    return [int(i) for i in rng.choice(pool, size=config.forced_tokens, replace=True)]


def replayed_run(model: Any, prompt: list[int], forced: list[int], base: Any, config: C.MonitorConfig,
                 seed: int, run_id: str, prefix_cache: dict) -> Any:
    """A run whose tokens produced at steps k.. k + len(forced) − 1 are ``forced``: its first k tokens sampled
    (seed ``seed``; cached per prompt in ``prefix_cache``), then prompt + those + forced re-read as a prompt and
    the rest generated freely (seed ``seed``). Its scored positions start at ``len(prompt)``."""
    from trajscope.capture import capture

    k = config.start_step
    key = (tuple(prompt), seed)
    if key not in prefix_cache:
        first = capture(model, prompt, base.replace(max_new_tokens=k, seed=seed, steering=(), stop_at_eos=False,
                                                    residual_layers=None, prefill_rows=1), run_id=f"{run_id}|prefix")
        prefix_cache[key] = first.tokens.filter(pl.col("pos") >= len(prompt)).sort("pos")["token_id"].to_list()[:k]
    head = list(prompt) + prefix_cache[key] + list(forced)
    rest = config.new_tokens - k - len(forced)
    return capture(model, head, base.replace(max_new_tokens=rest, seed=seed, steering=(),
                                             prefill_rows=len(head) - len(prompt)), run_id=run_id)


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
    vector = C.steering_vector(model, config) if "steer" in config.shifts else None
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
    frames, texts, prefixes = [], [], {}
    index = {pid: i for i, pid in enumerate(ids)}
    k = config.start_step
    for i, r in enumerate(plan):
        prompt, run_id = by_id[r["prompt_id"]], f"{r['prompt_id']}|{r['shift']}|{r['strength']}"
        forced: list[int] = []
        if r["shift"] in REPLAYED:
            forced = forced_ids(model, config, r["shift"], index[r["prompt_id"]])
            traj = replayed_run(model, prompt, forced, base, config, r["seed"], run_id, prefixes)
        else:
            steer = () if r["strength"] is None else (vector.at(strength=r["strength"]),)
            traj = capture(model, prompt, base.replace(seed=r["seed"], steering=steer), run_id=run_id)
        origin = len(prompt)
        vals = MON.step_values(traj, profile=profile, drift_layers=drift_layers if profile is not None else (),
                               attention_layer=att_layer, saes=saes, origin=origin)
        frames.append(vals.with_columns(**{c: pl.lit(r[c]) for c in RUN_KEYS}))
        texts.append({**r, "n_steps": int(traj.meta["prompt_len"]) - origin + int(traj.meta["n_steps"]),
                      "forced_text": model.tokenizer.decode(forced) if forced else "",
                      "text_from_k": shifted_text(traj, k, origin),
                      "text_after_shift": shifted_text(traj, k + len(forced), origin)})
        if progress:
            progress(i + 1, len(plan))
    schema = SCHEMA
    values = pl.concat([f.cast(schema) for f in frames], how="vertical_relaxed")
    moments = MON.clean_moments(values.filter((pl.col("part") == "fit") & (pl.col("arm") == "clean")))
    steps = MON.standardise(values, moments).select(*RUN_KEYS, "monitor", "step", "value", "score")
    per_run = run_table(steps, config)
    summary = summary_table(per_run, config)
    pairs = pairs_table(per_run, config)
    vs_null = null_table(per_run, config)
    info = {"split": {"by": "source file", **{f"{p}_files": sorted({C.file_of(i) for i in v}) for p, v in parts.items()},
                      **{f"n_{p}_prompts": len(v) for p, v in parts.items()}},
            "setup": {"model_id": model.model_id,
                      "vector": None if vector is None else vector.to_dict() | {"source": config.vector},
                      "drift_layers": drift_layers if profile is not None else [],
                      "profile": None if profile is None else {k: profile.info.get(k) for k in ("model_id", "fpr")},
                      "attention_layer": att_layer, "saes": {n: int(s.cfg.layer) for n, s in saes.items()},
                      "baseline": moments.sort("monitor").to_dicts(),
                      "arms": arms(config),
                      "switch_ids": forced_ids(model, config, "topic", 0) if "topic" in config.shifts else [],
                      "n_runs": len(plan), "n_captures": len(plan) + len(prefixes),
                      "dropped_runs": per_run.filter(pl.col("run_score").is_null())
                      .select("prompt_id", "shift", "strength").unique().height}}
    info["auroc"] = {f"{r['label']} | {r['monitor']}": {k: r[k] for k in ("value", "lo", "hi", "n_prompts")}
                     for r in summary.iter_rows(named=True)}  # the headline numbers, as summary_table gave them
    return Result(study="monitor", config=dataclasses.asdict(config), summaries=info,
                  tables={"monitor": per_run, "monitor_summary": summary, "monitor_pairs": pairs,
                          "monitor_vs_null": vs_null,
                          "monitor_steps": steps, "monitor_runs": pl.DataFrame(texts).cast(schema)})


def shifted_text(traj: Any, start_step: int, origin: int | None = None) -> str:
    """The text of the tokens produced at steps ≥ ``start_step`` (the shift acts from step k), steps counted from
    prompt length ``origin`` (default: the run's own): the tokens at ``pos ≥ origin + start_step``."""
    origin = int(traj.meta["prompt_len"]) if origin is None else int(origin)
    tok = traj.tokens
    return "".join(tok.filter(pl.col("pos") >= origin + start_step).sort("pos")["text"].to_list())


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
    """Per (arm, monitor) on the evaluate prompts: AUROC [lo, hi] of the arm's runs vs the clean runs (``value``,
    ``lo``, ``hi``), detected share, Kaplan–Meier median time-to-detect [lo, hi], the false-positive rate on fitting
    (in-sample) and held-out clean runs, and the n behind each. Rows in :func:`arms` order, then by monitor."""
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
        for order, a in enumerate(arms(config)):
            shifted = ev.filter((pl.col("arm") == "shifted") & _same_arm(a["shift"], a["strength"]))
            pair = set(shifted["prompt_id"]) & set(clean["prompt_id"])
            both = pl.concat([clean, shifted]).filter(pl.col("prompt_id").is_in(pair))
            row = {"order": order, "monitor": m, "shift": a["shift"], "label": a["label"], "strength": a["strength"],
                   "start_step": k, "n_prompts": len(pair), "measure": "AUROC", "value": math.nan, "lo": math.nan,
                   "hi": math.nan}
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
    ints = ("order", "start_step", "n_prompts", "n_detected", "n_shifted", "n_fit_runs", "n_heldout_runs")
    return (pl.DataFrame(rows, schema_overrides={"strength": pl.Float64})
            .with_columns([pl.col(c).cast(pl.Int32) for c in ints]).sort("order", "monitor"))


def null_of(a: dict[str, Any], config: C.MonitorConfig) -> dict[str, Any] | None:
    """The null arm a shifted arm is read against: steer s → steer s = 0 (when run), topic / forced → replay; None for
    a null itself."""
    if a["shift"] == "steer":
        return {"shift": "steer", "strength": 0.0} if a["strength"] != 0 and 0.0 in config.strengths else None
    return {"shift": "replay", "strength": None} if a["shift"] in ("topic", "forced") else None


def null_table(per_run: pl.DataFrame, config: C.MonitorConfig) -> pl.DataFrame:
    """Per shifted arm and monitor: AUROC of the arm's runs against its null arm's runs (:func:`null_of`) on the same
    evaluate prompts, with a bootstrap over prompts (``value``, ``lo``, ``hi``). The two arms share the seed (and, for
    topic / forced vs replay, the first k tokens), so this reads a shift against the machinery that carries it."""
    ev = per_run.filter((pl.col("part") == "evaluate") & (pl.col("arm") == "shifted") & pl.col("run_score").is_not_null())
    rows = []
    for a in arms(config):
        null = null_of(a, config)
        if null is None:
            continue
        for m in sorted(ev["monitor"].unique().to_list()):
            mine = ev.filter((pl.col("monitor") == m) & _same_arm(a["shift"], a["strength"]))
            base = ev.filter((pl.col("monitor") == m) & _same_arm(null["shift"], null["strength"]))
            pair = set(mine["prompt_id"]) & set(base["prompt_id"])
            if not pair:
                continue
            both = pl.concat([base, mine]).filter(pl.col("prompt_id").is_in(pair))
            iv = M.auroc_interval(both["run_score"].to_numpy(),
                                  both.select(_same_arm(a["shift"], a["strength"]))[:, 0].to_numpy(),
                                  both["prompt_id"].to_numpy(), n_boot=config.n_boot, seed=config.seed)
            rows.append({"shift": a["shift"], "label": a["label"], "strength": a["strength"], "monitor": m,
                         "null": null["shift"] if null["strength"] is None else f"steer s={null['strength']:g}",
                         "n_prompts": iv.n_clusters, "value": iv.estimate, "lo": iv.lo, "hi": iv.hi})
    schema = {"shift": pl.String, "label": pl.String, "strength": pl.Float64, "monitor": pl.String, "null": pl.String,
              "n_prompts": pl.Int32, "value": pl.Float64, "lo": pl.Float64, "hi": pl.Float64}
    return pl.DataFrame(rows, schema=schema)


def pairs_table(per_run: pl.DataFrame, config: C.MonitorConfig, reference: str = "drift") -> pl.DataFrame:
    """Per arm, each monitor's AUROC minus the ``reference`` monitor's on the same evaluate runs (``value``,
    ``lo``, ``hi``: paired bootstrap over prompts, :func:`~trajscope.studies.monitor.measures.auroc_difference`).
    Empty when the reference monitor did not run."""
    ev = per_run.filter((pl.col("part") == "evaluate") & pl.col("run_score").is_not_null())
    rows = []
    if reference in set(ev["monitor"]):
        for a in arms(config):
            arm = ev.filter((pl.col("arm") == "clean") | ((pl.col("arm") == "shifted")
                                                          & _same_arm(a["shift"], a["strength"])))
            wide = arm.pivot(on="monitor", index=["prompt_id", "arm"], values="run_score").drop_nulls()
            paired = wide.group_by("prompt_id").agg(pl.col("arm").n_unique().alias("n")).filter(pl.col("n") == 2)
            wide = wide.filter(pl.col("prompt_id").is_in(paired["prompt_id"].implode())).sort("prompt_id", "arm")
            if wide.height == 0:
                continue
            for m in sorted(c for c in wide.columns if c not in ("prompt_id", "arm", reference)):
                iv = M.auroc_difference(wide[m].to_numpy(), wide[reference].to_numpy(),
                                        (wide["arm"] == "shifted").to_numpy(), wide["prompt_id"].to_numpy(),
                                        n_boot=config.n_boot, seed=config.seed)
                rows.append({"shift": a["shift"], "label": a["label"], "strength": a["strength"], "monitor": m,
                             "reference": reference, "n_prompts": iv.n_clusters, "value": iv.estimate, "lo": iv.lo,
                             "hi": iv.hi})
    schema = {"shift": pl.String, "label": pl.String, "strength": pl.Float64, "monitor": pl.String,
              "reference": pl.String, "n_prompts": pl.Int32, "value": pl.Float64, "lo": pl.Float64, "hi": pl.Float64}
    return pl.DataFrame(rows, schema=schema)
