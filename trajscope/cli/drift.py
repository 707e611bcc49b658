"""``trajscope profile`` and ``trajscope drift``: the decode-regime calibration report.

``profile`` splits the prompt set into fit / calibrate / evaluate parts
(:func:`trajscope.stats.split_ids`, seeded, by prompt id), captures the prefill
of the fit and calibrate prompts, and writes a
:class:`~trajscope.profile.ReferenceProfile`: moments from the fit prompts, a
per-layer drift threshold calibrated to ``--fpr`` on the calibrate prompts, and
the split itself in the profile's metadata.

``drift`` evaluates only on prompts the profile neither fitted nor calibrated
on. For each it scores three regimes at matched positions
(:mod:`trajscope.metrics.drift_regimes`): prefill over the human prompt, greedy
decode over self-generated text, and the human continuation teacher-forced at
the decode positions. It also runs the continuation of the calibrate prompts to
calibrate a trajectory-level threshold (max over steps and layers of score /
layer threshold) at ``--trajectory-rate``, then measures that threshold's
false-alarm rate on the held-out continuation runs and its flag rate on the
held-out decode runs. Every summary has a prompt-clustered bootstrap interval.
Written under ``--out`` (each Parquet file's metadata names the split):
``positions.parquet`` (prompt × regime × position × layer), ``by_position``,
``by_depth``, ``by_entropy`` (regime × bin × layer), ``gap`` (decode −
continuation, matched), ``heldout_fpr`` (per layer), ``trajectory`` and
``profile.safetensors``.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys

from trajscope.cli import options as opt
from trajscope.errors import TrajscopeError
from trajscope.trajectory import write_table


def cmd_profile(args: argparse.Namespace) -> int:
    from trajscope.profile_build import build_profile, named_split, prompt_ids
    from trajscope.prompts import read_prompts

    items = read_prompts(args.prompts)
    ids = prompt_ids(items)
    split = named_split(ids, seed=args.seed)
    model = opt.load(args)
    prof = build_profile(model, [p["prompt"] for p in items], fpr=args.fpr, ids=ids, split=split,
                         progress=not args.quiet)
    path = prof.save(args.out)
    thr = ", ".join(f"{t:.3f}" for t in prof.threshold.tolist())
    print(f"{path}: {prof.info['n_positions']} prefill positions; moments from {len(split['fit'])} 'fit' prompts, "
          f"thresholds at fpr {args.fpr} from {len(split['calibrate'])} 'calibrate' prompts: [{thr}]; "
          f"{len(split['evaluate'])} 'evaluate' prompts left for `trajscope drift` (split seed {args.seed})",
          file=sys.stderr)
    return 0


def _split_for(prof, ids: list[str], profile_path: str | None) -> dict:
    """The profile's recorded split, restricted to this prompt file; evaluate = prompts it never saw."""
    split = prof.info.get("split")
    if split is None:
        raise TrajscopeError(f"The profile '{profile_path}' records no fit/calibrate split, so held-out prompts "
                             f"cannot be told apart; rebuild it with `trajscope profile`.")
    seen = set(split["fit"]) | set(split["calibrate"])
    out = dict(split, calibrate=[i for i in split["calibrate"] if i in set(ids)],
               evaluate=sorted(i for i in ids if i not in seen))
    if not out["evaluate"]:
        raise TrajscopeError("Every prompt in this file was used to fit or calibrate the profile; drift needs "
                             "held-out prompts to evaluate on.")
    return out


def _cell(est: float, lo: float, hi: float, digits: int = 3) -> str:
    if math.isnan(lo):
        return f"{est:.{digits}f}"
    return f"{est:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def _pivot(df, value: str, on: str, index=("layer",), digits: int = 3):
    import polars as pl

    cells = df.with_columns(pl.struct(value, f"{value}_lo", f"{value}_hi").map_elements(
        lambda r: _cell(r[value], r[f"{value}_lo"], r[f"{value}_hi"], digits), return_dtype=pl.String).alias("cell"))
    return cells.pivot(on=on, index=list(index), values="cell", maintain_order=True)


def cmd_drift(args: argparse.Namespace) -> int:
    import polars as pl
    from tqdm.auto import tqdm

    from trajscope.capture import CaptureConfig
    from trajscope.drift_runs import prompt_regime_rows
    from trajscope.metrics import drift_regimes as dr
    from trajscope.profile import ReferenceProfile
    from trajscope.profile_build import build_profile, named_split, prompt_ids
    from trajscope.prompts import read_prompts

    items = read_prompts(args.prompts)
    ids = prompt_ids(items)
    by_id = dict(zip(ids, items))
    prof = ReferenceProfile.load(args.profile) if args.profile else None
    model = opt.load(args)
    if prof is None:
        split = named_split(ids, seed=args.seed)
        prof = build_profile(model, [p["prompt"] for p in items], fpr=args.fpr, ids=ids, split=split,
                             progress=not args.quiet)
    else:
        prof.check_model(model.n_layers, model.d_model, model.model_id)
        split = _split_for(prof, ids, args.profile)
    cfg = CaptureConfig(max_new_tokens=args.max_new_tokens, residual_layers="all", temperature=args.temperature,
                        seed=args.seed, stop_at_eos=not args.no_eos)
    has_cont = [i for i in ids if by_id[i].get("continuation")]
    jobs = [(i, True) for i in split["evaluate"]] + [(i, False) for i in split["calibrate"] if i in has_cont]
    parts = []
    for pid, decode in tqdm(jobs, desc="drift regimes", unit="prompt", disable=args.quiet):
        rows = prompt_regime_rows(model, prof, pid, by_id[pid], cfg, decode=decode)
        parts.append(rows.with_columns(pl.lit("evaluate" if decode else "calibrate").alias("split")))
    rows = pl.concat([p for p in parts if p.height])
    # the resampling unit: prompts cut from one source file are not independent, so by default they resample together
    unit = args.cluster if args.cluster != "auto" else ("file" if all(by_id[i].get("file") for i in ids) else "prompt")
    if unit == "file" and not all(by_id[i].get("file") for i in ids):
        raise TrajscopeError(f"--cluster file needs a 'file' field in every record of '{args.prompts}'.")
    key = {i: (by_id[i]["file"] if unit == "file" else i) for i in ids}
    rows = rows.with_columns(pl.col("prompt_id").replace_strict(key, return_dtype=pl.String).alias("cluster"))
    ev = rows.filter(pl.col("split") == "evaluate")
    kw = dict(n_boot=args.n_boot, seed=args.seed, cluster="cluster")
    tables = {
        "by_position": dr.summarize(ev, ("regime", "pos_bin", "layer"), **kw),
        "by_depth": dr.summarize(ev, ("regime", "depth_band", "layer"), **kw),
        "by_entropy": dr.summarize(ev, ("regime", "entropy_band", "layer"), **kw),
        "heldout_fpr": dr.heldout_fpr(ev, **kw),
    }
    matched = bool(has_cont) and ev.filter(pl.col("regime") == "continuation").height > 0
    traj = None
    if matched:
        tables["gap"] = pl.concat([
            dr.paired_gap(ev, ("pos_bin", "layer"), **kw).with_columns(pl.lit("pos_bin").alias("group_by"))
            .rename({"pos_bin": "group"}),
            dr.paired_gap(ev, ("depth_band", "layer"), **kw).with_columns(pl.lit("depth_band").alias("group_by"))
            .rename({"depth_band": "group"})])
        cal_stats = dr.run_statistics(rows.filter(pl.col("split") == "calibrate"), "continuation")
        if cal_stats.height:
            try:
                traj = dr.trajectory_calibration(
                    cal_stats, {"continuation (prefill-like)": dr.run_statistics(ev, "continuation"),
                                "decode": dr.run_statistics(ev, "decode")}, args.trajectory_rate)
            except TrajscopeError as exc:
                print(f"trajectory-level calibration skipped: {exc}", file=sys.stderr)
        if traj is not None:
            tables["trajectory"] = pl.DataFrame([
                {"runs": name, "target_rate": traj["target_rate"], "expected_rate": traj["expected_rate"],
                 "threshold": traj["threshold"],
                 "n_calibrate": traj["n_calibrate"], **r} for name, r in traj["rates"].items()])
    sizes = {k: len(split[k]) for k in ("fit", "calibrate", "evaluate")}
    meta = {"trajscope_split": json.dumps({"seed": split.get("seed"), "fractions": split.get("fractions"),
                                           "sizes": sizes, "evaluate": split["evaluate"]}),
            "trajscope_cluster": unit,
            "trajscope_profile_fpr": str(prof.info.get("fpr"))}
    out = pathlib.Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        write_table(rows, out / "positions.parquet", "drift_positions", extra=meta)
        for name, df in tables.items():
            write_table(df, out / f"{name}.parquet", f"drift_{name}", extra=meta)
        prof.save(out / "profile.safetensors")
    except OSError as exc:
        raise TrajscopeError(f"Cannot write the drift report to '{out}': {exc.strerror or exc}.") from exc
    _print_report(tables, traj, split, sizes, prof, args, matched, unit)
    print(f"written to {out}/", file=sys.stderr)
    return 0


def _print_report(tables: dict, traj: dict | None, split: dict, sizes: dict, prof, args, matched: bool,
                  unit: str) -> None:
    import polars as pl

    fpr = prof.info.get("fpr")
    ev, nc = tables["by_position"]["n_prompts"].max(), tables["by_position"]["n_clusters"].max()
    over = (f"the {ev} evaluated prompts" if unit == "prompt" else
            f"the {ev} evaluated prompts, resampled by source file ({nc} files: prompts cut from one file move together)")
    print(f"split (seed {split.get('seed')}, by prompt id): fit {sizes['fit']} prompts (profile moments), calibrate "
          f"{sizes['calibrate']} (per-position threshold at fpr {fpr}; trajectory threshold), evaluate "
          f"{sizes['evaluate']} (every number below). Intervals: 95% bootstrap over {over} "
          f"({args.n_boot} resamples) unless named otherwise.")
    with pl.Config(tbl_rows=200, tbl_cols=20, tbl_width_chars=250, fmt_str_lengths=40, tbl_hide_dataframe_shape=True,
                   tbl_hide_column_data_types=True):
        print(f"\nheld-out prefill false-positive rate per layer at nominal {fpr} (evaluate split, positions 1..P-1)")
        print(_pivot(tables["heldout_fpr"].with_columns(pl.lit(f"fpr [95% {unit} bootstrap]").alias("k")), "fpr", "k")
              .join(tables["heldout_fpr"].select("layer", "wilson_lo", "wilson_hi", "n_positions", "n_clusters",
                                                 "n_prompts"),
                    on="layer").with_columns(pl.col("wilson_lo", "wilson_hi").round(4)))
        for value, title in (("score", "mean drift score (diagonal Mahalanobis / sqrt(d); prefill ~ 1)"),
                             ("flagged_frac", "fraction of positions flagged")):
            print(f"\n{title} by absolute position bin x regime "
                  "(prefill = human prompt, decode = self-generated, continuation = human text at the decode positions)")
            bp = tables["by_position"].with_columns((pl.col("pos_bin") + " " + pl.col("regime")).alias("bin regime"))
            print(_pivot(bp, value, "layer", index=("bin regime",)))
        if matched:
            g = tables["gap"]
            for value, title in (("score_gap", "drift score"), ("flagged_gap", "flagged fraction")):
                print(f"\ndecode minus continuation, {title}, same prompt / position / layer, by position bin and "
                      f"decode depth band")
                print(_pivot(g.with_columns((pl.col("group_by") + " " + pl.col("group")).alias("group")), value,
                             "layer", index=("group",)))
        else:
            print("\nno prompt has a 'continuation': the matched regime and trajectory calibration are skipped")
        if traj is not None:
            print(f"\ntrajectory-level flag: max over steps >= 1 and layers of score / layer threshold; threshold "
                  f"{traj['threshold']:.3f} calibrated to rate {traj['target_rate']} on {traj['n_calibrate']} "
                  f"'calibrate' continuation runs (conformal: the exact false-alarm rate on exchangeable runs is "
                  f"{traj['expected_rate']:.3f} <= target)")
            for name, r in traj["rates"].items():
                note = "" if r["rule"] == "trajectory" else " (no multiple-testing control)"
                print(f"  held-out {name} runs flagged{note}: {r['k']}/{r['n']} = {r['rate']:.3f} "
                      f"[Wilson 95% {r['lo']:.3f}, {r['hi']:.3f}], binomial se {r['se']:.3f}")


def register(sub) -> None:
    """Add ``profile`` and ``drift``."""
    p = opt.command(sub, "profile", "prefill reference profile of a prompt set",
                    "Split the prompts by id into fit / calibrate / evaluate, fit per-layer moments on the fit "
                    "prompts' prefill and a drift threshold at --fpr on the calibrate prompts' prefill.",
                    "trajscope profile --prompts sample_data/prompts/heldout_chunks.jsonl --out profile.safetensors")
    opt.add_model(p, dtype=False)
    p.add_argument("--prompts", required=True, help="JSON-lines prompt file")
    p.add_argument("--fpr", type=float, default=0.01, help="target false-positive rate of the drift threshold")
    p.add_argument("--seed", type=int, default=0, help="seed of the fit / calibrate / evaluate split of prompt ids")
    opt.add_out(p, "profile file (.safetensors)")
    opt.add_quiet(p)
    p.set_defaults(func=cmd_profile)
    d = opt.command(sub, "drift", "drift of decode versus the prefill profile, by layer and depth",
                    "On prompts the profile never saw, score prefill, greedy decode and the teacher-forced human "
                    "continuation at matched positions; prints held-out false-positive rates, drift by position "
                    "bin x regime, the decode-minus-continuation gap and a trajectory-level flag rate, with "
                    "prompt-clustered bootstrap intervals.",
                    "trajscope drift --prompts sample_data/prompts/heldout_code.jsonl "
                    "--profile sample_data/profiles/trajscope-tiny.safetensors --out drift/")
    opt.add_model(d, dtype=False)
    d.add_argument("--prompts", required=True, help="JSON-lines prompt file")
    d.add_argument("--profile", default=None, help="a profile file; default: built from these prompts' prefill")
    d.add_argument("--fpr", type=float, default=0.01, help="false-positive rate when the profile is built here")
    d.add_argument("--max-new-tokens", type=int, default=64, help="decode steps per prompt")
    d.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    d.add_argument("--no-eos", action="store_true", help="do not stop at the EOS token")
    d.add_argument("--seed", type=int, default=0, help="sampling, split (when the profile is built here) and "
                   "bootstrap seed")
    d.add_argument("--trajectory-rate", type=float, default=0.1,
                   help="target false-alarm rate of the trajectory-level flag (needs >= 1/rate - 1 calibrate runs)")
    d.add_argument("--n-boot", type=int, default=1000, help="bootstrap resamples per interval")
    d.add_argument("--cluster", choices=("auto", "file", "prompt"), default="auto",
                   help="bootstrap resampling unit: a prompt's source 'file' field (prompts cut from one file are "
                        "not independent), each prompt, or auto = file when every record names one")
    opt.add_out(d, "folder for positions, by_position, by_depth, by_entropy, gap, heldout_fpr, trajectory "
                   "(.parquet) and profile.safetensors")
    opt.add_quiet(d)
    d.set_defaults(func=cmd_drift)
