"""``trajscope study compaction``: the context-compaction study as a command.

:func:`register` adds the ``compaction`` parser to the sub-parsers of ``trajscope study``::

    parser = argparse.ArgumentParser(prog="trajscope")
    commands = parser.add_subparsers(dest="command", required=True)
    study = commands.add_parser("study", help="run a study").add_subparsers(dest="study", required=True)
    compaction_cli.register(study)          # → trajscope study compaction ...
    args = parser.parse_args(argv)
    args.func(args)                         # cmd_compaction(args); TrajscopeError → one line on stderr

The command runs :func:`trajscope.studies.compaction.compaction` over a JSON-lines session file
(``--sessions``) or ``--synthetic N`` generated sessions, writes ``compaction_*.parquet`` (schema
metadata), ``settings.json`` and the sessions it ran (``sessions.jsonl``) under ``--out``, and prints
the summary and the probe's held-out accuracies.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
from typing import Any

from trajscope.errors import TrajscopeError

EXAMPLE = "trajscope study compaction --model sample --synthetic 200 --out sample_data/reports/compaction"


class _Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Shows defaults and keeps the description's and example's line breaks."""


def register(study_subparsers: Any) -> argparse.ArgumentParser:
    """Add ``compaction`` to ``study_subparsers`` (the object ``add_subparsers()`` of ``trajscope study`` returned).

    Sets ``func=cmd_compaction`` on the parsed namespace. Returns the new sub-parser.
    """
    p = study_subparsers.add_parser(
        "compaction", help="context compaction: masking vs restart, and what the masked past leaves in the states",
        description="For each session <sys> <T1> <T2> <summary> <T3>: run T3 with T1/T2 masked from T3 on (A, the "
                    "summary's states kept), restarted from <sys> <summary> (B), with nothing masked (C) and, as a "
                    "control, with T1/T2 masked from the summary on (D); compare "
                    "hidden states per layer and T3 token, next-token KL and greedy continuations, and probe the "
                    "masked fact from T3's last hidden state on held-out sessions.",
        epilog=f"example:\n  {EXAMPLE}", formatter_class=_Formatter)
    p.add_argument("--model", default="sample",
                   help="'sample' (shipped), a model directory or a cached Hugging Face name")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 … (default: CUDA when present)")
    p.add_argument("--dtype", default=None, help="float32, bfloat16 or float16 (default: float32 on CPU)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--sessions", default=None, help="JSON-lines file: one object per line with string keys sys, "
                     "t1, t2, summary, t3 (optional: id, fact, integer label for the probe)")
    src.add_argument("--synthetic", type=int, default=None, metavar="N",
                     help="generate N code-shaped sessions (a 4-digit number only in T1; label = its first digit)")
    p.add_argument("--out", required=True, help="output folder for the Parquet tables")
    p.add_argument("--layers", default="all", help="'all' or comma-separated block indices to compare and probe")
    p.add_argument("--max-new-tokens", type=int, default=16, help="greedy tokens after T3 per setup (0: skip decode)")
    p.add_argument("--test-fraction", type=float, default=0.3, help="held-out share of sessions for the probe")
    p.add_argument("--no-probe", action="store_true", help="skip the probe (sessions without labels)")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic sessions, the split and the bootstrap")
    p.add_argument("--plant-strength", type=float, default=0.0,
                   help="add strength × a per-class direction to T1's block output (a planted fact); 0 = off")
    p.add_argument("--plant-layer", type=int, default=0, help="block whose output the planted signal is added to")
    p.add_argument("--n-boot", type=int, default=1000, help="bootstrap resamples for the intervals")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_compaction)
    return p


def _layers(text: str) -> list[int] | None:
    if text.strip() == "all":
        return None
    try:
        return [int(t) for t in text.split(",") if t.strip()]
    except ValueError as exc:
        raise TrajscopeError(f"--layers must be 'all' or comma-separated indices like 0,3,5; got '{text}'.") from exc


def cmd_compaction(args: argparse.Namespace) -> int:
    """Run the study that ``args`` describe; write the tables; print the summary. Returns 0."""
    import polars as pl
    import torch
    from tqdm.auto import tqdm

    from trajscope.model import load_model
    from trajscope.studies.compaction import compaction
    from trajscope.studies.sessions import read_sessions, synthetic_sessions, write_sessions

    if args.threads:
        torch.set_num_threads(args.threads)
    sessions = read_sessions(args.sessions) if args.sessions else synthetic_sessions(args.synthetic, args.seed)
    out = pathlib.Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TrajscopeError(f"Cannot create the output folder '{out}': {exc.strerror or exc}.") from exc
    if not os.access(out, os.W_OK):
        raise TrajscopeError(f"The output folder '{out}' is not writable.")
    model = load_model(args.model, device=args.device, dtype=args.dtype)
    bar = tqdm(total=len(sessions), desc="compaction", unit="session", disable=args.quiet)
    res = compaction(model, sessions, layers=_layers(args.layers), max_new_tokens=args.max_new_tokens,
                     probe=not args.no_probe, test_fraction=args.test_fraction, seed=args.seed,
                     plant_strength=args.plant_strength, plant_layer=args.plant_layer, n_boot=args.n_boot,
                     progress=lambda d, t: bar.update(d - bar.n))
    bar.close()
    res.save(out)
    write_sessions(sessions, out / "sessions.jsonl")
    fmt = pl.format("{} [{}, {}]", *[pl.col(c).round(3) for c in ("estimate", "lo", "hi")]).alias("mean [95% CI]")
    with pl.Config(tbl_rows=400, tbl_cols=-1, fmt_str_lengths=40, tbl_width_chars=200, tbl_hide_dataframe_shape=True):
        print("mean [95% bootstrap interval over sessions]")
        print(res.summary(n_boot=args.n_boot).select("metric", "pair", "layer", fmt, "n_sessions"))
        if not res.probe.is_empty():
            acc = pl.format("{} [{}, {}]", *[pl.col(c).round(3) for c in ("accuracy", "lo", "hi")])
            print("probe: held-out accuracy [95% bootstrap over held-out sessions], chance = majority class")
            table = res.probe.with_columns(acc.alias("acc [CI]"),
                                           pl.format("{}→{}", "train_setup", "test_setup").alias("setup"))
            base = res.probe.group_by("layer").agg(pl.col("majority").first(), pl.col("n_test").first())
            print(table.pivot("control", index=["layer", "setup"], values="acc [CI]").join(base, on="layer")
                  .sort("layer", "setup"))
    print(f"written to {out}/ (compaction_*.parquet, settings.json, sessions.jsonl)", file=sys.stderr)
    return 0
