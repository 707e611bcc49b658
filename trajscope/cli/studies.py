"""``trajscope eviction``: the KV-eviction study as a command.

Runs :func:`trajscope.studies.eviction.eviction` over a JSON-lines prompt set and writes
``eviction_kept.parquet``, ``eviction_steps.parquet`` and ``eviction_rerun.parquet`` (with the
schema metadata) under ``--out``, plus ``summary.parquet`` (means by policy, budget and decode-depth
band), and prints the summary.
"""

from __future__ import annotations

import argparse
import sys

from trajscope.cli import options as opt
from trajscope.errors import TrajscopeError
from trajscope.trajectory import write_table


def _budgets(text: str) -> list[float | int]:
    out: list[float | int] = []
    for t in text.split(","):
        t = t.strip()
        if not t:
            continue
        try:
            out.append(int(t) if t.isdigit() else float(t))
        except ValueError:
            raise TrajscopeError(f"--budgets must be comma-separated fractions or counts, not '{text}'.") from None
    return out


def cmd_eviction(args: argparse.Namespace) -> int:
    import polars as pl
    from tqdm.auto import tqdm

    from trajscope.prompts import read_prompts
    from trajscope.studies.eviction import eviction

    items = read_prompts(args.prompts)[: args.max_prompts or None]
    out = opt.out_dir(args.out)
    model = opt.load(args)
    bar = tqdm(total=len(items), desc="eviction", unit="prompt", disable=args.quiet)
    res = eviction(model, items, policies=[p.strip() for p in args.policies.split(",") if p.strip()],
                   budgets=_budgets(args.budgets), max_new_tokens=args.max_new_tokens, window=args.window,
                   lookahead=args.lookahead, k=args.k, per_head=not args.shared, rerun=not args.no_rerun,
                   progress=lambda d, t: bar.update(d - bar.n))
    bar.close()
    res.save(out)
    summary = res.summary()
    write_table(summary, out / "summary.parquet", "eviction_summary")
    shown = summary.select("policy", "budget", "depth_band", "n_prompts", *[
        pl.format("{} [{}, {}]", *[pl.col(c).round(3) for c in (m, f"{m}_lo", f"{m}_hi")]).alias(m)
        for m in ("recall_at_k", "evicted_mass", "kl_to_full", "token_agreement") if m in summary.columns])
    with pl.Config(tbl_rows=200, tbl_cols=-1, fmt_str_lengths=40, tbl_width_chars=240, tbl_hide_dataframe_shape=True):
        print("mean [95% prompt-clustered bootstrap interval] by policy, budget and decode-depth band")
        print(shown)
    print(f"written to {out}/ (eviction_kept, eviction_steps, eviction_rerun, summary .parquet)", file=sys.stderr)
    return 0


def register(sub) -> None:
    """Add ``eviction``."""
    e = opt.command(sub, "eviction", "KV-eviction study: recall, evicted mass and masked re-runs per policy",
                    "For each prompt and each policy x budget: which prompt keys the policy keeps after prefill, "
                    "how much of each decode step's attention falls on evicted keys, and what a real decode with "
                    "those keys masked does to the next-token distribution and the greedy tokens.",
                    "trajscope eviction --prompts sample_data/prompts/heldout_code.jsonl --policies "
                    "snapkv,h2o,streamingllm,pyramidkv,lookahead,pseudo,oracle --budgets 0.1,0.2,0.5 --out ev/")
    opt.add_model(e)
    e.add_argument("--prompts", required=True, help="JSON-lines prompt file")
    e.add_argument("--max-prompts", type=int, default=None, help="first N prompts only")
    e.add_argument("--policies", default="snapkv,h2o,streamingllm,pyramidkv,lookahead,pseudo,oracle",
                   help="comma-separated policies")
    e.add_argument("--budgets", default="0.1,0.2,0.5", help="kept prompt positions per head: fractions of P or counts")
    e.add_argument("--max-new-tokens", type=int, default=32, help="decode steps of each full run")
    e.add_argument("--window", type=int, default=16, help="observation / recent window w (≤ every prompt's length)")
    e.add_argument("--lookahead", type=int, default=8, help="m: draft, pseudo and oracle queries")
    e.add_argument("--k", type=int, default=8, help="top-k attended prompt positions for recall")
    e.add_argument("--shared", action="store_true", help="one kept set per layer instead of per head")
    e.add_argument("--no-rerun", action="store_true", help="skip the masked re-runs (KL, token agreement)")
    opt.add_out(e, "folder for the eviction tables")
    opt.add_quiet(e)
    e.set_defaults(func=cmd_eviction)
