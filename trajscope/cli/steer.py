"""``trajscope steer-sweep``: an alias of the registered steering study (``trajscope study steering``).

The vector comes from ``--vector FILE`` (safetensors/.npy) or is built with CAA from
``--pairs FILE.jsonl`` (lines ``{"positive": ..., "negative": ...}``) at ``--layer``
(:func:`trajscope.studies.steering.study.vector_for`). The study
(:func:`trajscope.studies.steering.study.run`) writes its Result under ``--out``:
``steering.parquet`` (the per-step table), ``steering_summary.parquet`` (decay by depth over
equal windows), ``steering_texts.parquet`` and the marker ``steering.result.json``; this command
also writes ``vector.safetensors`` and prints the summary. Ctrl-C keeps the finished cells.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import threading

from trajscope.cli import options as opt
from trajscope.errors import TrajscopeError
from trajscope.studies.flags import number


def cmd_steer_sweep(args: argparse.Namespace) -> int:
    from trajscope.prompts import read_prompts
    from trajscope.studies.steering.study import SteeringConfig, run, vector_for

    prompts = [p["prompt"] for p in read_prompts(args.prompts)]
    config = SteeringConfig(vector=args.vector, pairs=args.pairs, layer=args.layer, mode=args.mode,
                            depths=tuple(opt.ints(args.depths, "--depths")),
                            strengths=tuple(s for s in args.strengths.split(",") if s.strip()), window=args.window,
                            max_new_tokens=args.max_new_tokens, seeds=tuple(opt.ints(args.seeds, "--seeds")),
                            temperature=args.temperature, targets=tuple(args.targets or ()))
    model = opt.load(args)
    vec = vector_for(model, config)
    out = pathlib.Path(args.out)
    from tqdm.auto import tqdm

    try:
        with tqdm(desc="steering sweep", unit="run", file=sys.stderr) as bar:
            def progress(done: int, total: int) -> None:
                bar.total, bar.n = total, done
                bar.refresh()

            result = run(model, prompts, config, progress, vector=vec, cancel=threading.Event())
    except KeyboardInterrupt as exc:
        raise TrajscopeError("Interrupted before the sweep could save; rerun with fewer depths or prompts.") from exc
    result.save(out)
    vec.save(out / "vector.safetensors")
    print_summary(result)
    print(f"written to {out}/ (steering.parquet, steering_summary.parquet, steering_texts.parquet, "
          f"steering.result.json, vector.safetensors)", file=sys.stderr)
    return 0 if result.summaries.get("complete", True) else 130


def print_summary(result) -> None:
    """Print the Result's ``steering_summary`` with each mean and its 95 % interval in one cell."""
    import polars as pl

    from trajscope.interval_text import interval_columns

    cols = ["strength", "start_step", "n_prompts", "n_short", "onset_kl", "effect", "from_step1_kl", "changed_frac",
            "half_life_median", "half_life_lo", "half_life_hi", "halved_frac"]
    summ = interval_columns(result.table("steering_summary").sort("strength", "start_step"),
                            ["onset_kl", "effect", "from_step1_kl", "changed_frac"], "n_prompts")
    with pl.Config(tbl_rows=50, tbl_cols=12, fmt_str_lengths=30, tbl_width_chars=220, tbl_hide_dataframe_shape=True,
                   tbl_hide_column_data_types=True):
        print(summ.select(c for c in cols if c in summ.columns))


def register(sub) -> None:
    """Add the ``steer-sweep`` subcommand."""
    s = opt.command(sub, "steer-sweep", "steering effect by start depth (alias of 'trajscope study steering')",
                    "Steer every prompt from each start depth k and strength, teacher-forced on the unsteered "
                    "run's tokens, and summarise the effect by depth over equal windows (KL, logit change, "
                    "projection, changed tokens, half-life).",
                    "trajscope steer-sweep --pairs sample_data/prompts/quotes_pairs.jsonl --layer 3 "
                    "--prompts sample_data/prompts/heldout_code.jsonl --depths 1,10,50 --out sweep/")
    opt.add_model(s, dtype=False)
    s.add_argument("--vector", help="steering direction (.safetensors or .npy)")
    s.add_argument("--pairs", help="contrast pairs for CAA (JSON lines: positive, negative)")
    s.add_argument("--layer", type=int, default=None, help="block to steer (required with --pairs)")
    s.add_argument("--mode", default="add", choices=["add", "clamp"], help="add the direction, or clamp its projection")
    s.add_argument("--prompts", required=True, help="JSON-lines prompts to continue")
    s.add_argument("--depths", default="1,10,50,200", help="start steps k")
    s.add_argument("--strengths", default="4", help="comma-separated strengths")
    s.add_argument("--window", type=int, default=20, help="steered steps averaged into the effect size")
    s.add_argument("--max-new-tokens", type=int, default=None, help="default: max depth + window")
    s.add_argument("--seeds", default="0", help="comma-separated sampling seeds")
    s.add_argument("--temperature", type=number, default=0.0, help="0 = greedy")
    s.add_argument("--targets", nargs="*", help="single-token strings whose logit change is tracked")
    opt.add_out(s, "folder for the steering study's tables (steering*.parquet), its marker and vector.safetensors")
    s.set_defaults(func=cmd_steer_sweep)
