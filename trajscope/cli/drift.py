"""``trajscope profile`` and ``trajscope drift``: aliases of the registered drift study.

``profile`` splits the prompt set into fit / calibrate / evaluate parts by source file (seeded)
and writes the study's prefill profile (:func:`trajscope.studies.drift.build.build_profile`):
moments from the fit prompts, a per-layer threshold at ``--fpr`` from the calibrate prompts,
and the split itself in the profile's metadata.

``drift`` runs the drift study (:func:`trajscope.studies.drift.study.evaluate`, the same code as
``trajscope study drift``) on the prompts the profile never saw, writes the study's Result under
``--out`` (``drift_positions``, ``drift_by_position``, ``drift_by_depth``, ``drift_by_entropy``, ``drift_by_segment``,
``drift_gap``, ``drift_heldout_fpr``, ``drift_trajectory`` as Parquet, the marker
``drift.result.json`` with the headline numbers and the split) plus ``profile.safetensors``,
and prints the report from that Result.
"""

from __future__ import annotations

import argparse
import math
import pathlib
import sys

from trajscope.cli import options as opt
from trajscope.errors import TrajscopeError
from trajscope.studies.flags import number


def cmd_profile(args: argparse.Namespace) -> int:
    from trajscope.prompts import read_prompts
    from trajscope.studies.drift.build import build_profile, named_split, prompt_ids, source_files

    items = read_prompts(args.prompts)
    ids = prompt_ids(items)
    split = named_split(ids, seed=args.seed, groups=source_files(items))
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
    """The registered drift study (:func:`trajscope.studies.drift.study.evaluate`) on a prompt file."""
    from tqdm.auto import tqdm

    from trajscope.studies.drift.study import DriftConfig, evaluate

    config = DriftConfig(prompts=args.prompts, profile=args.profile, fpr=args.fpr, max_new_tokens=args.max_new_tokens,
                         temperature=args.temperature, no_eos=args.no_eos, seed=args.seed,
                         trajectory_rate=args.trajectory_rate, n_boot=args.n_boot, cluster=args.cluster)
    model = opt.load(args)
    with tqdm(desc="drift regimes", unit="prompt", disable=args.quiet) as bar:
        def progress(done: int, total: int) -> None:
            bar.total, bar.n = total, done
            bar.refresh()

        result, prof = evaluate(model, None, config, progress)
    out = pathlib.Path(args.out)
    result.save(out)
    try:
        prof.save(out / "profile.safetensors")
    except OSError as exc:
        raise TrajscopeError(f"Cannot write the profile to '{out}': {exc.strerror or exc}.") from exc
    for note in result.summaries.get("notes", []):
        print(note, file=sys.stderr)
    _print_report(result, args)
    print(f"written to {out}/", file=sys.stderr)
    return 0


def _print_report(result, args) -> None:
    import polars as pl

    from trajscope.studies.drift.summary import lines

    s = result.summaries
    split, fpr = s["split"], s["profile"]["fpr"]
    sizes, unit = split["sizes"], split["cluster"]
    tables = {k.removeprefix("drift_"): v for k, v in result.tables.items()}
    matched = "gap" in tables
    ev, nc = tables["by_position"]["n_prompts"].max(), tables["by_position"]["n_clusters"].max()
    over = (f"the {ev} evaluated prompts" if unit == "prompt" else
            f"the {ev} evaluated prompts, resampled by source file ({nc} files: prompts cut from one file move together)")
    nf = split.get("n_files") or {}
    files = {k: f" from {nf[k]} files" if k in nf else "" for k in sizes}
    print(f"split (seed {split.get('seed')}, by {split.get('by', 'prompt id')}): fit {sizes['fit']} prompts{files['fit']} "
          f"(profile moments), calibrate {sizes['calibrate']}{files['calibrate']} (per-position threshold at fpr {fpr}; "
          f"trajectory threshold), evaluate {sizes['evaluate']}{files['evaluate']} (every number below). "
          f"Intervals: 95% bootstrap over {over} "
          f"({args.n_boot} resamples) unless named otherwise.")
    with pl.Config(tbl_rows=200, tbl_cols=20, tbl_width_chars=250, fmt_str_lengths=40, tbl_hide_dataframe_shape=True,
                   tbl_hide_column_data_types=True):
        print(f"\nheld-out prefill false-positive rate per layer at nominal {fpr} (evaluate split, positions 1..P-1)")
        print(_pivot(tables["heldout_fpr"].with_columns(pl.lit(f"fpr [95% {unit} bootstrap]").alias("k")), "fpr", "k")
              .join(tables["heldout_fpr"].select("layer", "wilson_lo", "wilson_hi", "n_positions", "n_clusters",
                                                 "n_prompts"),
                    on="layer").with_columns(pl.col("wilson_lo", "wilson_hi").round(4)))
        print("\nheadline (pooled over layers):")
        for label, text in lines(s):
            print(f"  {label}: {text}")
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
        if "trajectory" in tables:
            t = tables["trajectory"].row(0, named=True)
            print(f"\ntrajectory-level flag: max over steps >= 1 and layers of score / layer threshold; threshold "
                  f"{t['threshold']:.3f} calibrated to rate {t['target_rate']} on {t['n_calibrate']} "
                  f"'calibrate' continuation runs (conformal: the exact false-alarm rate on exchangeable runs is "
                  f"{t['expected_rate']:.3f} <= target)")
            for r in tables["trajectory"].iter_rows(named=True):
                name = r["runs"]
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
    p.add_argument("--fpr", type=number, default=0.01, help="target false-positive rate of the drift threshold")
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
    d.add_argument("--fpr", type=number, default=0.01, help="false-positive rate when the profile is built here")
    d.add_argument("--max-new-tokens", type=int, default=64, help="decode steps per prompt")
    d.add_argument("--temperature", type=number, default=0.0, help="0 = greedy")
    d.add_argument("--no-eos", action="store_true", help="do not stop at the EOS token")
    d.add_argument("--seed", type=int, default=0, help="sampling, split (when the profile is built here) and "
                   "bootstrap seed")
    d.add_argument("--trajectory-rate", type=number, default=0.1,
                   help="target false-alarm rate of the trajectory-level flag (needs >= 1/rate - 1 calibrate runs)")
    d.add_argument("--n-boot", type=int, default=1000, help="bootstrap resamples per interval")
    d.add_argument("--cluster", choices=("auto", "file", "prompt"), default="auto",
                   help="bootstrap resampling unit: a prompt's source 'file' field (prompts cut from one file are "
                        "not independent), each prompt, or auto = file when every record names one")
    opt.add_out(d, "folder for the drift study's tables (drift_*.parquet), its marker drift.result.json and "
                   "profile.safetensors")
    opt.add_quiet(d)
    d.set_defaults(func=cmd_drift)
