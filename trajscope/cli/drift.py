"""``trajscope profile`` and ``trajscope drift``: the decode-regime calibration report.

``profile`` captures the prefill of a prompt set and writes a
:class:`~trajscope.profile.ReferenceProfile` (per-layer moments plus a drift
threshold calibrated to ``--fpr`` on held-out prompts).

``drift`` continues every prompt for ``--max-new-tokens`` steps with all
residuals kept, scores every position against the profile (given with
``--profile`` or built from the same prompts' prefill), and writes under
``--out``: ``positions.parquet`` (position × layer), ``by_depth.parquet`` and
``by_entropy.parquet`` (group × layer summaries with the per-dimension Gaussian
KL), and ``profile.safetensors``. It prints drift score and flagged fraction by
layer × decode depth.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

from trajscope.cli import options as opt
from trajscope.errors import TrajscopeError
from trajscope.trajectory import write_table


def cmd_profile(args: argparse.Namespace) -> int:
    from trajscope.profile_build import build_profile
    from trajscope.prompts import read_prompts

    prompts = [p["prompt"] for p in read_prompts(args.prompts)]
    model = opt.load(args)
    prof = build_profile(model, prompts, fpr=args.fpr, seed=args.seed)
    path = prof.save(args.out)
    thr = ", ".join(f"{t:.3f}" for t in prof.threshold.tolist())
    print(f"{path}: {prof.info['n_positions']} prefill positions from {len(prompts)} prompts; "
          f"thresholds at fpr {args.fpr}: [{thr}]", file=sys.stderr)
    return 0


def cmd_drift(args: argparse.Namespace) -> int:
    import polars as pl
    from tqdm.auto import tqdm

    from trajscope.capture import CaptureConfig, capture
    from trajscope.metrics.profile_drift import profile_drift_by_group, profile_drift_table
    from trajscope.prompts import read_prompts
    from trajscope.profile import ReferenceProfile
    from trajscope.profile_build import build_profile

    prompts = [p["prompt"] for p in read_prompts(args.prompts)]
    prof = ReferenceProfile.load(args.profile) if args.profile else None
    model = opt.load(args)
    if prof is None:
        prof = build_profile(model, prompts, fpr=args.fpr, seed=args.seed)
    prof.check_model(model.n_layers, model.d_model, model.model_id)
    out = pathlib.Path(args.out)
    trajs = []
    cfg = CaptureConfig(max_new_tokens=args.max_new_tokens, residual_layers="all", temperature=args.temperature,
                        seed=args.seed, stop_at_eos=not args.no_eos)
    for prompt in tqdm(prompts, desc="decode", unit="prompt", disable=args.quiet):
        trajs.append(capture(model, prompt, cfg))
    positions = pl.concat([profile_drift_table(t, prof) for t in trajs])
    by_depth = profile_drift_by_group(trajs, prof, by="depth_band")
    by_entropy = profile_drift_by_group(trajs, prof, by="entropy_band")
    try:
        out.mkdir(parents=True, exist_ok=True)
        write_table(positions, out / "positions.parquet", "drift_positions")
        write_table(by_depth, out / "by_depth.parquet", "drift_by_depth")
        write_table(by_entropy, out / "by_entropy.parquet", "drift_by_entropy")
        prof.save(out / "profile.safetensors")
    except OSError as exc:
        raise TrajscopeError(f"Cannot write the drift report to '{out}': {exc.strerror or exc}.") from None
    wide = by_depth.pivot(on="depth_band", index="layer", values="score", maintain_order=True)
    flags = by_depth.pivot(on="depth_band", index="layer", values="flagged_frac", maintain_order=True)
    with pl.Config(tbl_rows=100, tbl_cols=20, float_precision=3):
        print("mean drift score (diagonal Mahalanobis / sqrt(d); prefill ~ 1) by layer x decode depth")
        print(wide)
        print(f"fraction of positions flagged (threshold calibrated to fpr {prof.info['fpr']} on held-out prefill)")
        print(flags)
    print(f"written to {out}/", file=sys.stderr)
    return 0


def register(sub) -> None:
    """Add ``profile`` and ``drift``."""
    p = opt.command(sub, "profile", "prefill reference profile of a prompt set",
                    "Capture the prefill of every prompt and fit per-layer moments plus a drift threshold "
                    "calibrated to --fpr on held-out prompts.",
                    "trajscope profile --prompts sample_data/prompts/heldout_chunks.jsonl --out profile.safetensors")
    opt.add_model(p, dtype=False)
    p.add_argument("--prompts", required=True, help="JSON-lines prompt file")
    p.add_argument("--fpr", type=float, default=0.01, help="target false-positive rate of the drift threshold")
    p.add_argument("--seed", type=int, default=0, help="seed of the fit/calibration split")
    opt.add_out(p, "profile file (.safetensors)")
    opt.add_quiet(p)
    p.set_defaults(func=cmd_profile)
    d = opt.command(sub, "drift", "drift of decode versus the prefill profile, by layer and depth",
                    "Continue every prompt with all residuals kept and score each position against the prefill "
                    "profile; prints drift score and flagged fraction by layer x decode depth.",
                    "trajscope drift --prompts sample_data/prompts/heldout_code.jsonl "
                    "--profile sample_data/profiles/trajscope-tiny.safetensors --out drift/")
    opt.add_model(d, dtype=False)
    d.add_argument("--prompts", required=True, help="JSON-lines prompt file")
    d.add_argument("--profile", default=None, help="a profile file; default: built from these prompts' prefill")
    d.add_argument("--fpr", type=float, default=0.01, help="false-positive rate when the profile is built here")
    d.add_argument("--max-new-tokens", type=int, default=64, help="decode steps per prompt")
    d.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    d.add_argument("--no-eos", action="store_true", help="do not stop at the EOS token")
    d.add_argument("--seed", type=int, default=0, help="sampling and split seed")
    opt.add_out(d, "folder for positions.parquet, by_depth.parquet, by_entropy.parquet, profile.safetensors")
    opt.add_quiet(d)
    d.set_defaults(func=cmd_drift)
