"""``trajscope steer-sweep``: build or load a steering vector and sweep its start depth.

The vector comes from ``--vector FILE`` (safetensors/.npy) or is built with CAA
from ``--pairs FILE.jsonl`` (lines ``{"positive": ..., "negative": ...}``) at
``--layer``. The sweep writes ``steps.parquet`` (the steering table),
``summary.parquet`` (decay by depth) and ``texts.parquet`` under ``--out`` and
prints the summary. Ctrl-C keeps the finished cells.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import threading

from trajscope.cli import options as opt
from trajscope.errors import TrajscopeError


def cmd_steer_sweep(args: argparse.Namespace) -> int:
    import polars as pl

    from trajscope.prompts import read_pairs, read_prompts
    from trajscope.steering import SteeringVector
    from trajscope.sweep import steering_sweep

    prompts = [p["prompt"] for p in read_prompts(args.prompts)]
    depths = opt.ints(args.depths, "--depths")
    try:
        strengths = [float(s) for s in args.strengths.split(",") if s.strip()]
    except ValueError as exc:
        raise TrajscopeError(f"--strengths must be comma-separated numbers, not '{args.strengths}'.") from exc
    if (args.vector is None) == (args.pairs is None):
        raise TrajscopeError("Give exactly one of --vector FILE or --pairs FILE.jsonl.")
    model = opt.load(args)
    if args.vector:
        vec = SteeringVector.load(args.vector, layer=args.layer, mode=args.mode)
    else:
        if args.layer is None:
            raise TrajscopeError("CAA needs --layer.")
        vec = SteeringVector.from_contrast(model, read_pairs(args.pairs), args.layer, mode=args.mode,
                                              name=pathlib.Path(args.pairs).stem)
    out = pathlib.Path(args.out)
    cancel = threading.Event()
    try:
        res = steering_sweep(model, prompts, vec, depths=depths, strengths=strengths, window=args.window,
                                seeds=opt.ints(args.seeds, "--seeds"), temperature=args.temperature,
                                targets=args.targets or (), cancel=cancel, max_new_tokens=args.max_new_tokens)
    except KeyboardInterrupt as exc:
        raise TrajscopeError("Interrupted before the sweep could save; rerun with fewer depths or prompts.") from exc
    res.save(str(out))
    vec.save(out / "vector.safetensors")
    with pl.Config(tbl_rows=50, tbl_cols=12, float_precision=4):
        print(res.summary)
    print(f"written to {out}/ (steps.parquet, summary.parquet, texts.parquet, vector.safetensors)", file=sys.stderr)
    return 0 if res.complete else 130


def register(sub) -> None:
    """Add the ``steer-sweep`` subcommand."""
    s = opt.command(sub, "steer-sweep", "steering effect by start depth (CAA or a vector file)",
                    "Steer every prompt from each start depth k and strength, teacher-forced on the unsteered "
                    "run's tokens, and summarise the effect by depth (KL, logit change, projection, changed tokens).",
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
    s.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    s.add_argument("--targets", nargs="*", help="single-token strings whose logit change is tracked")
    opt.add_out(s, "folder for steps.parquet, summary.parquet, texts.parquet and vector.safetensors")
    s.set_defaults(func=cmd_steer_sweep)
