"""``trajscope eviction --task needle``: passkey retrieval accuracy against budget, per policy.

Builds ``--n-prompts`` passkey prompts of ``--context`` tokens offline (:mod:`trajscope.studies.needle`), runs every
policy × budget on each from one shared prefill, and writes ``needle_answers.parquet`` (one row per prompt × policy
× budget, plus the full cache's) and ``needle_accuracy.parquet`` (accuracy with a Wilson interval over prompts)
under ``--out``; prints the table.
"""

from __future__ import annotations

import argparse
import sys
import time

from trajscope.cli import options as opt
from trajscope.errors import TrajscopeError
from trajscope.trajectory import write_table


def _floats(text: str, what: str) -> list[float]:
    try:
        return [float(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise TrajscopeError(f"{what} must be comma-separated numbers, not '{text}'.") from None


def cmd_needle(args: argparse.Namespace, budgets: list) -> int:
    import polars as pl
    from tqdm.auto import tqdm

    from trajscope.studies import needle as nd

    if not args.out:
        raise TrajscopeError("The needle task writes its tables under --out DIR; give one.")
    policies = [p.strip() for p in args.policies.split(",") if p.strip()] if args.policies else list(nd.POLICIES)
    depths = _floats(args.depths, "--depths")
    out = opt.out_dir(args.out)
    model = opt.load(args)
    prompts = nd.needle_prompts(model, args.n_prompts, args.context, depths, seed=args.seed)
    total = len(prompts) * (1 + len(policies) * len(budgets))
    bar = tqdm(total=total, desc="needle", unit="answer", disable=args.quiet)
    t0 = time.perf_counter()
    answers = nd.needle_study(model, prompts, policies, budgets, window=args.window, lookahead=args.lookahead,
                              answer_tokens=args.answer_tokens, progress=lambda d, t: bar.update(d - bar.n))
    bar.close()
    seconds = time.perf_counter() - t0
    table = nd.accuracy_table(answers)
    write_table(answers, out / "needle_answers.parquet", "needle_answers")
    write_table(table, out / "needle_accuracy.parquet", "needle_accuracy", extra={"seconds": f"{seconds:.0f}"})
    shown = table.select("policy", "budget", "mean_kept_tokens", "n", pl.format(
        "{} [{}, {}]", *[pl.col(c).round(2) for c in ("accuracy", "lo", "hi")]).alias("accuracy [95% Wilson]"))
    with pl.Config(tbl_rows=200, tbl_cols=-1, fmt_str_lengths=40, tbl_width_chars=200, tbl_hide_dataframe_shape=True):
        print(f"passkey retrieval, {len(prompts)} prompts of ~{args.context} tokens, depths {depths}, "
              f"{seconds:.0f} s")
        print(shown)
    print(f"written to {out}/ (needle_answers, needle_accuracy .parquet)", file=sys.stderr)
    return 0


def add_arguments(e: argparse.ArgumentParser) -> None:
    """The ``--task needle`` options of ``trajscope eviction``."""
    e.add_argument("--task", choices=("continuation", "needle"), default="continuation",
                   help="continuation: recall, evicted mass and masked re-runs of each prompt's own continuation; "
                        "needle: passkey retrieval accuracy against budget on built prompts (no --prompts)")
    e.add_argument("--context", type=int, default=2048, help="needle: prompt length in tokens")
    e.add_argument("--n-prompts", type=int, default=24, help="needle: passkey prompts to build")
    e.add_argument("--depths", default="0.1,0.5,0.9", help="needle: depths of the passkey (fractions), cycled")
    e.add_argument("--answer-tokens", type=int, default=12, help="needle: greedy answer length")
    e.add_argument("--seed", type=int, default=0, help="needle: passkeys and filler windows")
