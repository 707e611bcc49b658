"""``trajscope eviction``: the KV-eviction study as a command.

Runs :func:`trajscope.studies.eviction.eviction` over a JSON-lines prompt set and writes
``eviction_kept.parquet``, ``eviction_steps.parquet`` and ``eviction_rerun.parquet`` (with the
schema metadata) under ``--out``, plus ``summary.parquet`` (means by policy, budget and decode-depth
band), and prints the summary.

With ``--runs RUN_DIR …`` instead of ``--prompts``, the study runs on each run directory's prompt
tokens (for as many decode steps as the run generated, unless ``--max-new-tokens``) and writes its
tables into ``RUN_DIR/eviction/``: the comparison report (``trajscope report``) then shows an
eviction section for those runs (:mod:`trajscope.report_eviction`).
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


def _study(args, model, items, max_new_tokens, bar):
    from trajscope.studies.eviction import eviction

    policies = args.policies or "snapkv,h2o,streamingllm,pyramidkv,lookahead,pseudo,oracle"
    return eviction(model, items, policies=[p.strip() for p in policies.split(",") if p.strip()],
                    budgets=_budgets(args.budgets), max_new_tokens=max_new_tokens, window=args.window,
                    lookahead=args.lookahead, k=args.k, per_head=not args.shared, rerun=not args.no_rerun,
                    progress=lambda d, t: bar.update(d - bar.n))


def _on_runs(args) -> int:
    """``--runs``: one study per run directory, written into ``RUN_DIR/eviction/``."""
    from tqdm.auto import tqdm

    from trajscope.report_eviction import run_eviction_dir
    from trajscope.trajectory import Trajectory

    runs = [Trajectory.load(r, lazy=True) for r in args.runs]  # one clear error per unreadable directory
    model = opt.load(args)
    for run_dir, t in zip(args.runs, runs):
        run_model = t.meta.get("model", {}).get("model_id")
        if run_model is not None and run_model != model.model_id:
            raise TrajscopeError(f"Run '{run_dir}' was captured with '{run_model}', not '{model.model_id}': "
                                 f"pass --model {run_model}.")
    for run_dir, t in zip(args.runs, runs):
        P = t.prompt_len
        n_new = args.max_new_tokens or (len(t.token_ids) - P)
        bar = tqdm(total=1, desc=f"eviction {t.run_id}", unit="run", disable=args.quiet)
        res = _study(args, model, [{"prompt": list(t.token_ids[:P]), "id": t.run_id}], n_new, bar)
        bar.close()
        _write(res, opt.out_dir(run_eviction_dir(run_dir)))
    return 0


def cmd_eviction(args: argparse.Namespace) -> int:
    from tqdm.auto import tqdm

    from trajscope.prompts import read_prompts

    if args.task == "needle":
        from trajscope.cli.needle import cmd_needle

        if args.prompts or args.runs:
            raise TrajscopeError("--task needle builds its own prompts: leave out --prompts and --runs.")
        return cmd_needle(args, _budgets(args.budgets))
    if args.runs:
        if args.prompts or args.out:
            raise TrajscopeError("--runs writes into each run directory: leave out --prompts and --out.")
        return _on_runs(args)
    if not (args.prompts and args.out):
        raise TrajscopeError("Give --prompts FILE and --out DIR, or --runs RUN_DIR [RUN_DIR …].")
    items = read_prompts(args.prompts)[: args.max_prompts or None]
    out = opt.out_dir(args.out)
    model = opt.load(args)
    bar = tqdm(total=len(items), desc="eviction", unit="prompt", disable=args.quiet)
    res = _study(args, model, items, args.max_new_tokens or 32, bar)
    bar.close()
    return _write(res, out)


def _write(res, out) -> int:
    """Save the tables and ``summary.parquet`` under ``out``; print the summary."""
    import polars as pl

    from trajscope.interval_text import interval_columns

    res.save(out)
    summary = res.summary()
    write_table(summary, out / "summary.parquet", "eviction_summary")
    metrics = [m for m in ("recall_at_k", "evicted_mass", "kl_to_full", "token_agreement", "forced_agreement")
               if m in summary.columns]
    shown = interval_columns(summary, metrics, "n_prompts").select("policy", "budget", "depth_band", "n_prompts",
                                                                    *metrics)
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
    e.add_argument("--prompts", default=None, help="JSON-lines prompt file (with --out)")
    e.add_argument("--runs", nargs="+", default=None, metavar="RUN_DIR",
                   help="instead of --prompts: each run directory's prompt; tables written into RUN_DIR/eviction/ "
                        "(the report's eviction section)")
    e.add_argument("--max-prompts", type=int, default=None, help="first N prompts only")
    e.add_argument("--policies", default=None,
                   help="comma-separated policies (default: snapkv,h2o,streamingllm,pyramidkv,lookahead,pseudo,oracle; "
                        "with --task needle: snapkv,pyramidkv,streamingllm,lookahead,pseudo)")
    e.add_argument("--budgets", default="0.1,0.2,0.5", help="kept prompt positions per head: fractions of P or counts")
    e.add_argument("--max-new-tokens", type=int, default=None,
                   help="decode steps of each full run (default 32; with --runs, as many as the run generated)")
    e.add_argument("--window", type=int, default=16, help="observation / recent window w (≤ every prompt's length)")
    e.add_argument("--lookahead", type=int, default=8, help="m: draft, pseudo and oracle queries")
    e.add_argument("--k", type=int, default=8, help="top-k attended prompt positions for recall")
    e.add_argument("--shared", action="store_true", help="one kept set per layer instead of per head")
    e.add_argument("--no-rerun", action="store_true", help="skip the masked re-runs (KL, token agreement)")
    opt.add_out(e, "folder for the eviction tables (with --prompts or --task needle)", required=False)
    from trajscope.cli.needle import add_arguments

    add_arguments(e)
    opt.add_quiet(e)
    e.set_defaults(func=cmd_eviction)
