"""The drift study: does the residual stream during decode still look like prefill, on held-out prompts?

:class:`DriftConfig` holds its settings (each field's help is a flag of ``trajscope study drift``).
:func:`evaluate` runs it: the prompt set is split by source file into fit / calibrate / evaluate
(:func:`~trajscope.studies.drift.build.named_split`, seeded; no file supplies two parts) unless a
profile with a recorded split is given (then evaluate = prompts of files that supplied neither its
fit nor its calibrate prompts); the prefill profile's moments come from the fit prompts and its per-layer threshold
(at ``fpr``) from the calibrate prompts. Only evaluate prompts are scored, in three regimes at
matched positions (:mod:`trajscope.studies.drift.regimes`): prefill over the prompt, greedy
decode, and the human continuation teacher-forced at the decode positions (for prompt records
with a ``continuation``). The calibrate prompts' continuations calibrate a trajectory-level
threshold (max over steps and layers of score / layer threshold) at ``trajectory_rate``.

The Result's tables: ``drift_positions`` (prompt × regime × position × layer, with each position's chat
segment), ``drift_by_position``, ``drift_by_depth``, ``drift_by_entropy``, ``drift_by_segment`` (regime × bin
or segment × layer; segments: the prompt's system / user turns and generation prompt, the generated
answer), ``drift_heldout_fpr`` (per layer),
``drift_gap`` (decode − continuation, matched) and ``drift_trajectory``; every mean has a
clustered bootstrap interval. Its summaries: the headline numbers of
:func:`trajscope.studies.drift.summary.headline`, the split and the profile's thresholds.

:func:`score_run` is the same study on one captured run (the app's Drift card): the run's
positions scored against a profile, and the same headline numbers.
"""

from __future__ import annotations

import dataclasses
from dataclasses import field
from typing import Any, Callable, ClassVar, Sequence

import polars as pl

from trajscope.errors import TrajscopeError
from trajscope.studies.drift import summary
from trajscope.studies.registry import Result


def _help(text: str, **more: Any) -> dict[str, Any]:
    return {"help": text, **more}


@dataclasses.dataclass(frozen=True)
class DriftConfig:
    """Decode vs prefill residual drift against a held-out prefill profile."""

    # the command reads prompt records itself: their continuation and source file are part of the method
    OWN_INPUT: ClassVar[str] = ('prompt records {"prompt", "id", optional "continuation" and "file"} from '
                                "--prompts FILE, uncut")

    prompts: str | None = field(default=None, metadata=_help(
        'JSON-lines file of prompt records: {"prompt": ..., "id": ...} with optional "continuation" (the human '
        'text that followed, for the matched regime) and "file" (the source, the resampling unit)'))
    max_prompts: int | None = field(default=None, metadata=_help("use the first N records (default: all)"))
    profile: str | None = field(default=None, metadata=_help(
        "a profile file from 'trajscope profile' (its split names the held-out prompts); default: built here "
        "from the prompts' fit / calibrate split"))
    fpr: float = field(default=0.01, metadata=_help("false-positive rate of the per-position threshold when the "
                                                     "profile is built here"))
    max_new_tokens: int = field(default=64, metadata=_help("decode steps per prompt"))
    temperature: float = field(default=0.0, metadata=_help("sampling temperature (0 = greedy)"))
    no_eos: bool = field(default=False, metadata=_help("do not stop at the EOS token"))
    seed: int = field(default=0, metadata=_help("sampling, split (when the profile is built here) and bootstrap seed"))
    trajectory_rate: float = field(default=0.1, metadata=_help(
        "target false-alarm rate of the trajectory-level flag (needs >= 1/rate - 1 calibrate runs)"))
    n_boot: int = field(default=1000, metadata=_help("bootstrap resamples per interval"))
    cluster: str = field(default="auto", metadata=_help(
        "bootstrap resampling unit: a prompt's source 'file' field (prompts cut from one file are not "
        "independent), each prompt, or auto = file when every record names one", choices=("auto", "file", "prompt")))

    def __post_init__(self) -> None:
        if not 0 < self.fpr < 1:
            raise TrajscopeError(f"--fpr must be between 0 and 1, not {self.fpr}.")
        if not 0 < self.trajectory_rate < 1:
            raise TrajscopeError(f"--trajectory-rate must be between 0 and 1, not {self.trajectory_rate}.")
        if self.max_new_tokens < 2:
            raise TrajscopeError(f"--max-new-tokens must be at least 2, not {self.max_new_tokens}.")
        if self.n_boot < 1:
            raise TrajscopeError(f"--n-boot must be at least 1, not {self.n_boot}.")
        if self.max_prompts is not None and self.max_prompts < 2:
            raise TrajscopeError(f"--max-prompts must be at least 2, not {self.max_prompts}.")
        if self.cluster not in ("auto", "file", "prompt"):
            raise TrajscopeError(f"--cluster must be auto, file or prompt, not '{self.cluster}'.")


def records(prompts: Sequence[Any]) -> list[dict]:
    """Prompt records (``id``, ``prompt``, optional ``continuation`` / ``file`` / ``segments``) from records or
    ``(id, ids)``."""
    from trajscope.studies.drift.build import prompt_ids

    items = [dict(p) if isinstance(p, dict) else {"id": str(p[0]), "prompt": list(p[1])} for p in prompts]
    return [{**it, "id": i} for it, i in zip(items, prompt_ids(items))]


def held_out_split(prof: Any, ids: list[str], profile_path: str | None, files: Sequence[str] | None = None) -> dict:
    """The profile's recorded split, restricted to these prompts; evaluate = the prompts of files it never saw.

    Args:
        prof: the profile (its ``info["split"]`` names the fit and calibrate prompts, and, when built by
            :func:`~trajscope.studies.drift.build.named_split`, their files; a profile from ``trajscope prepare``
            records only its files, ``info["split_groups"]``).
        ids: the prompt set's ids; ``files``: their source files (default: the id's file prefix).
    Returns:
        The split with ``evaluate`` = prompts whose file supplied no fit or calibrate prompt, ``files`` per part
        and ``shared_fit_calibrate`` (files a profile split by prompt id gave both its parts; [] when by file).
    """
    from trajscope.studies.drift.build import check_file_disjoint, file_of

    split = prof.info.get("split")
    groups = prof.info.get("split_groups")
    if split is None and isinstance(groups, dict):  # `trajscope prepare` records its split by file only
        split = {"fit": [], "calibrate": []}
    elif split is None:
        raise TrajscopeError(f"The profile '{profile_path}' records no fit/calibrate split, so held-out prompts "
                             f"cannot be told apart; rebuild it with `trajscope profile`.")
    where = {**{i: file_of(i) for i in [*split["fit"], *split["calibrate"]]}, **dict(split.get("file_of") or {}),
             **dict(zip(ids, files if files is not None else [file_of(i) for i in ids]))}
    fit_files = {where[i] for i in split["fit"]} | set((groups or {}).get("fit", []))
    cal_files = {where[i] for i in split["calibrate"]} | set((groups or {}).get("calibrate", []))
    seen = set(split["fit"]) | set(split["calibrate"])
    out = dict(split, calibrate=[i for i in split["calibrate"] if i in set(ids)],
               evaluate=sorted(i for i in ids if i not in seen and where[i] not in fit_files | cal_files))
    if not out["evaluate"]:
        raise TrajscopeError("Every prompt in this file was used to fit or calibrate the profile, or comes from a "
                             "source file that was; drift needs held-out prompts (of other files) to evaluate on.")
    check_file_disjoint({"fit": split["fit"], "evaluate": out["evaluate"]}, where)
    check_file_disjoint({"calibrate": split["calibrate"], "evaluate": out["evaluate"]}, where)
    out["files"] = {"fit": sorted(fit_files), "calibrate": sorted(cal_files),
                    "evaluate": sorted({where[i] for i in out["evaluate"]})}
    out["shared_fit_calibrate"] = sorted(fit_files & cal_files)
    out["file_of"] = where
    return out


def evaluate(model: Any, prompts: Sequence[Any] | None, config: DriftConfig, progress: Callable[[int, int], None] | None = None,
             layers: Sequence[int] | None = None) -> tuple[Result, Any]:
    """Run the drift study; returns ``(Result, the profile it scored against)``.

    Args:
        model: a :class:`~trajscope.model.ModelHandle`.
        prompts: prompt records (``prompt``, ``id``, optional ``continuation``, ``file`` and ``segments``, the
            prompt positions' chat segments) or ``(id, token ids)``
            pairs (no continuation: the matched regime and the trajectory flag are left out); None reads the
            records of ``config.prompts`` (what ``trajscope study drift`` does).
        config: the study's settings.
        progress: ``(done, total)`` after each prompt.
        layers: blocks to report (default all; the trajectory statistic is taken over these).
    """
    from trajscope.capture import CaptureConfig
    from trajscope.studies.drift import regimes as dr
    from trajscope.profile import ReferenceProfile
    from trajscope.studies.drift.build import build_profile, named_split, source_files
    from trajscope.studies.drift.runs import prompt_regime_rows

    if prompts is None:
        if not config.prompts:
            raise TrajscopeError("The drift study needs prompt records: give --prompts FILE.")
        from trajscope.prompts import read_prompts

        prompts = read_prompts(config.prompts)
    items = records(prompts)[: config.max_prompts]
    ids = [it["id"] for it in items]
    files = source_files(items)
    by_id = dict(zip(ids, items))
    if config.profile:
        prof = ReferenceProfile.load(config.profile)
        prof.check_model(model.n_layers, model.d_model, model.model_id)
        split = held_out_split(prof, ids, config.profile, files)
    else:
        split = named_split(ids, seed=config.seed, groups=files)
        prof = build_profile(model, [it["prompt"] for it in items], fpr=config.fpr, ids=ids, split=split,
                             progress=False)
    cfg = CaptureConfig(max_new_tokens=config.max_new_tokens, residual_layers="all", temperature=config.temperature,
                        seed=config.seed, stop_at_eos=not config.no_eos)
    has_cont = [i for i in ids if by_id[i].get("continuation")]
    jobs = [(i, True) for i in split["evaluate"]] + [(i, False) for i in split["calibrate"] if i in has_cont]
    parts = []
    for n, (pid, decode) in enumerate(jobs, 1):
        rows = prompt_regime_rows(model, prof, pid, by_id[pid], cfg, decode=decode)
        parts.append(rows.with_columns(pl.lit("evaluate" if decode else "calibrate").alias("split")))
        if progress:
            progress(n, len(jobs))
    rows = pl.concat([p for p in parts if p.height])
    if layers is not None:
        rows = rows.filter(pl.col("layer").is_in([int(x) for x in layers]))
    has_file = all(by_id[i].get("file") for i in ids)
    unit = config.cluster if config.cluster != "auto" else ("file" if has_file else "prompt")
    if unit == "file" and not has_file:
        raise TrajscopeError("--cluster file needs a 'file' field in every prompt record.")
    key = {i: (str(by_id[i]["file"]) if unit == "file" else i) for i in ids}
    rows = rows.with_columns(pl.col("prompt_id").replace_strict(key, return_dtype=pl.String).alias("cluster"))
    ev = rows.filter(pl.col("split") == "evaluate")
    kw = {"n_boot": config.n_boot, "seed": config.seed, "cluster": "cluster"}
    tables = {"drift_positions": rows,
              "drift_by_position": dr.summarize(ev, ("regime", "pos_bin", "layer"), **kw),
              "drift_by_depth": dr.summarize(ev, ("regime", "depth_band", "layer"), **kw),
              "drift_by_entropy": dr.summarize(ev, ("regime", "entropy_band", "layer"), **kw),
              "drift_heldout_fpr": dr.heldout_fpr(ev, **kw)}
    if ev["segment"].is_not_null().any():
        tables["drift_by_segment"] = dr.summarize(ev, ("regime", "segment", "layer"), **kw)
    notes = []
    if ev.filter(pl.col("regime") == "continuation").height:
        tables["drift_gap"] = pl.concat([
            dr.paired_gap(ev, (g, "layer"), **kw).with_columns(pl.lit(g).alias("group_by")).rename({g: "group"})
            for g in ("pos_bin", "depth_band")])
        traj = _trajectory(rows, ev, config.trajectory_rate, notes)
        if traj is not None:
            tables["drift_trajectory"] = traj
    sizes = {k: len(split[k]) for k in ("fit", "calibrate", "evaluate")}
    summaries = {**summary.headline(ev, **kw),
                 "split": {"seed": split.get("seed"), "fractions": split.get("fractions"), "sizes": sizes,
                           "evaluate": list(split["evaluate"]), "cluster": unit,
                           "by": split.get("by", "prompt id"), "files": split.get("files"),
                           "n_files": {k: len(v) for k, v in (split.get("files") or {}).items()},
                           "shared_fit_calibrate": split.get("shared_fit_calibrate", [])},
                 "profile": {"fpr": prof.info.get("fpr"), "threshold": [float(t) for t in prof.threshold.tolist()],
                             "model_id": prof.info.get("model_id")},
                 "notes": notes}
    return Result(study="drift", tables=tables, config=dataclasses.asdict(config), summaries=summaries), prof


def _trajectory(rows: pl.DataFrame, ev: pl.DataFrame, rate: float, notes: list[str]) -> pl.DataFrame | None:
    """The trajectory-level flag: calibrated on the calibrate continuations, measured on held-out runs."""
    from trajscope.studies.drift import regimes as dr

    cal = dr.run_statistics(rows.filter(pl.col("split") == "calibrate"), "continuation")
    if not cal.height:
        return None
    try:
        t = dr.trajectory_calibration(cal, {"continuation (prefill-like)": dr.run_statistics(ev, "continuation"),
                                            "decode": dr.run_statistics(ev, "decode")}, rate)
    except TrajscopeError as exc:
        notes.append(f"trajectory-level calibration skipped: {exc}")
        return None
    return pl.DataFrame([{"runs": name, "target_rate": t["target_rate"], "expected_rate": t["expected_rate"],
                          "threshold": t["threshold"], "n_calibrate": t["n_calibrate"], **r}
                         for name, r in t["rates"].items()])


def run(model: Any, prompts: Sequence[Any] | None, config: DriftConfig, progress: Callable[[int, int], None] | None = None,
        layers: Sequence[int] | None = None) -> Result:
    """The registered run: :func:`evaluate`'s Result."""
    return evaluate(model, prompts, config, progress, layers)[0]


def score_run(traj: Any, prof: Any, layers: Sequence[int] | None = None) -> Result:
    """The study on one captured run: its positions scored against ``prof``, with the headline numbers.

    Args:
        traj: a :class:`~trajscope.trajectory.Trajectory` that kept the residuals of ``layers``.
        prof: a :class:`~trajscope.profile.ReferenceProfile` of the run's model.
        layers: default every layer the run kept.
    Returns:
        A Result with the table ``drift_run`` (:func:`trajscope.metrics.profile_drift.profile_drift_table`:
        one row per position × layer) and :func:`~trajscope.studies.drift.summary.headline` over it (one run:
        no interval).
    """
    from trajscope.metrics.profile_drift import profile_drift_table

    table = profile_drift_table(traj, prof, layers=layers)
    rows = table.with_columns(pl.col("run_id").alias("prompt_id"), pl.col("phase").alias("regime"))
    return Result(study="drift", tables={"drift_run": table}, summaries=summary.headline(rows),
                  config={"profile_fpr": prof.info.get("fpr"), "run_id": traj.run_id})
