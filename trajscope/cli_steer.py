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

from trajscope.errors import TrajscopeError


def read_pairs(path: str) -> list[tuple[str, str]]:
    """Contrast pairs from JSON lines ``{"positive": str, "negative": str}``."""
    from trajscope.cli import read_jsonl

    def convert(item, n):
        if not isinstance(item, dict) or not isinstance(item.get("positive"), str) or not isinstance(item.get("negative"), str):
            raise TrajscopeError(f"{path}, line {n}: expected {{\"positive\": ..., \"negative\": ...}}.")
        return item["positive"], item["negative"]

    return read_jsonl(path, "contrast-pair", convert)


def _ints(text: str, what: str) -> list[int]:
    try:
        return [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise TrajscopeError(f"{what} must be comma-separated whole numbers, not '{text}'.") from None


def cmd_steer_sweep(args: argparse.Namespace) -> int:
    import polars as pl

    import trajscope as ts
    from trajscope.cli import read_prompts

    prompts = [p["prompt"] for p in read_prompts(args.prompts)]
    depths = _ints(args.depths, "--depths")
    try:
        strengths = [float(s) for s in args.strengths.split(",") if s.strip()]
    except ValueError:
        raise TrajscopeError(f"--strengths must be comma-separated numbers, not '{args.strengths}'.") from None
    if (args.vector is None) == (args.pairs is None):
        raise TrajscopeError("Give exactly one of --vector FILE or --pairs FILE.jsonl.")
    model = ts.load_model(args.model, device=args.device)
    if args.vector:
        vec = ts.SteeringVector.load(args.vector, layer=args.layer, mode=args.mode)
    else:
        if args.layer is None:
            raise TrajscopeError("CAA needs --layer.")
        vec = ts.SteeringVector.from_contrast(model, read_pairs(args.pairs), args.layer, mode=args.mode,
                                              name=pathlib.Path(args.pairs).stem)
    out = pathlib.Path(args.out)
    cancel = threading.Event()
    try:
        res = ts.steering_sweep(model, prompts, vec, depths=depths, strengths=strengths, window=args.window,
                                seeds=_ints(args.seeds, "--seeds"), temperature=args.temperature,
                                targets=args.targets or (), cancel=cancel, max_new_tokens=args.max_new_tokens)
    except KeyboardInterrupt:
        raise TrajscopeError("Interrupted before the sweep could save; rerun with fewer depths or prompts.") from None
    res.save(str(out))
    vec.save(out / "vector.safetensors")
    with pl.Config(tbl_rows=50, tbl_cols=12, float_precision=4):
        print(res.summary)
    print(f"written to {out}/ (steps.parquet, summary.parquet, texts.parquet, vector.safetensors)", file=sys.stderr)
    return 0 if res.complete else 130


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``steer-sweep`` subcommand to the ``trajscope`` parser."""
    s = sub.add_parser("steer-sweep", help="steering effect by start depth (CAA or a vector file)")
    s.add_argument("--model", default="sample")
    s.add_argument("--device", default=None)
    s.add_argument("--vector", help="steering direction (.safetensors or .npy)")
    s.add_argument("--pairs", help="contrast pairs for CAA (JSON lines: positive, negative)")
    s.add_argument("--layer", type=int, default=None, help="block to steer (required with --pairs)")
    s.add_argument("--mode", default="add", choices=["add", "clamp"])
    s.add_argument("--prompts", required=True, help="JSON-lines prompts to continue")
    s.add_argument("--depths", default="1,10,50,200", help="start steps k")
    s.add_argument("--strengths", default="4", help="comma-separated strengths")
    s.add_argument("--window", type=int, default=20, help="steered steps averaged into the effect size")
    s.add_argument("--max-new-tokens", type=int, default=None, help="default: max depth + window")
    s.add_argument("--seeds", default="0")
    s.add_argument("--temperature", type=float, default=0.0)
    s.add_argument("--targets", nargs="*", help="single-token strings whose logit change is tracked")
    s.add_argument("--out", required=True)
    s.set_defaults(func=cmd_steer_sweep)
