"""``trajscope study batch|determinism|chunked-prefill|prefix-cache|sae-stability``: the serving studies as commands.

:func:`register` adds a ``study`` subcommand (with the four studies as its subcommands) to an
``argparse`` subparsers object; each study's parser sets ``func`` to a function taking the
parsed arguments and returning an exit status. Every study reads a JSON-lines prompt file,
runs on ``--model`` (default: the shipped sample model), prints its summary and writes its
Parquet tables under ``--out`` (:func:`trajscope.studies.run.run_study`). Bad input raises
:class:`~trajscope.errors.TrajscopeError` with one sentence, which the main CLI prints.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from trajscope.errors import TrajscopeError
from trajscope.interval_text import interval_columns

_HELP = {
    "batch": ("a prompt alone vs co-batched: neighbours of other lengths, left/right padding, its row",
              "trajscope study batch --prompts sample_data/prompts/heldout_code.jsonl --out reports/serving"),
    "determinism": ("the noise floor: repeats, deterministic algorithms, threads, TF32, fp32/bf16/fp16 vs fp64",
                    "trajscope study determinism --prompts sample_data/prompts/heldout_code.jsonl "
                    "--out reports/serving --dtypes float32,bfloat16"),
    "chunked-prefill": ("prefill in chunks of c tokens vs one pass, per layer and position",
                        "trajscope study chunked-prefill --prompts sample_data/prompts/heldout_code.jsonl "
                        "--out reports/serving --chunks 1,8,32"),
    "prefix-cache": ("which positions a prefix cache never computes, and cached-prefix vs full recompute",
                     "trajscope study prefix-cache --prompts sample_data/prompts/heldout_code.jsonl "
                     "--out reports/serving --header default"),
    "sae-stability": ("SAEs trained on harvests that differ only by serving mode vs the seed-to-seed spread",
                      "trajscope study sae-stability --prompts sample_data/prompts/heldout_chunks.jsonl "
                      "--out reports/serving --max-prompts 96"),
}


def _ints(text: str) -> list[int]:
    try:
        return [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers like 1,4,16; got '{text}'") from None


def _words(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``study`` with its four subcommands to ``subparsers`` (from ``add_subparsers``); return its parser."""
    fmt = argparse.ArgumentDefaultsHelpFormatter
    study = subparsers.add_parser("study", help="serving studies: batching, determinism, chunked prefill, prefix cache, "
                                  "SAE stability",
                                  description=__doc__.split("\n\n")[0], formatter_class=fmt,
                                  epilog="example:\n  trajscope study determinism --prompts "
                                         "sample_data/prompts/heldout_code.jsonl --out studies/determinism "
                                         "(then 'trajscope study STUDY --help' for each study's options)")
    sub = study.add_subparsers(dest="study", required=True, metavar="STUDY")
    from trajscope.studies import compaction_cli

    compaction_cli.register(sub)
    parsers = {}
    for name, (text, example) in _HELP.items():
        p = sub.add_parser(name, help=text, description=f"{text[0].upper()}{text[1:]}.", epilog=f"example: {example}",
                           formatter_class=fmt)
        p.add_argument("--model", default="sample", help="'sample', a model directory or a cached Hugging Face name")
        p.add_argument("--prompts", required=True, help='JSON-lines file, one {"prompt": ..., "id": ...} per line')
        p.add_argument("--out", required=True, help="directory for the Parquet tables")
        p.add_argument("--max-prompts", type=int, default=16, help="use the first N prompts")
        p.add_argument("--max-tokens", type=int, default=96, help="cut each prompt to its first N tokens (0: no cut)")
        p.add_argument("--layers", type=_ints, default=None, help="comma-separated blocks to compare (default: all)")
        p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 … (default: CUDA when present)")
        p.add_argument("--dtype", default=None, help="model dtype (default: float32 on CPU, bfloat16 on CUDA)")
        p.add_argument("--threads", type=int, default=None, help="CPU threads for the run (default: torch's)")
        p.set_defaults(func=cmd_study, study_name=name)
        parsers[name] = p
    b = parsers["batch"]
    b.add_argument("--batch-size", type=int, default=4, help="rows per batch (the prompt plus neighbours)")
    b.add_argument("--padding", type=_words, default=["left", "right"], help="padding sides to run")
    b.add_argument("--neighbours", type=_words, default=["shorter", "longer", "mixed", "copies"],
                   help="neighbour kinds: shorter, longer, mixed, copies (identical-input control)")
    b.add_argument("--slots", type=_words, default=["first", "last"], help="the prompt's row in the batch")
    d = parsers["determinism"]
    d.add_argument("--dtypes", type=_words, default=None,
                   help="dtypes to compare (default: float32, bfloat16, float16 where the device runs them)")
    d.add_argument("--repeats", type=int, default=2, help="repeated runs per prompt and dtype")
    parsers["chunked-prefill"].add_argument("--chunks", type=_ints, default=[1, 4, 16, 64], help="chunk sizes in tokens")
    c = parsers["prefix-cache"]
    c.add_argument("--header", default=None,
                   help="text prepended to every prompt to give the set a shared prefix ('default': a fixed "
                        "system prompt / license header); without it the prompts must already share one")
    c.add_argument("--cold", action="store_true", help="start with an empty cache (default: the shared prefix is warm)")
    c.add_argument("--block", type=int, default=1, help="cache block size in tokens (vLLM: 16)")
    c.add_argument("--min-shared", type=int, default=4, help="tokens the whole set must share")
    s = parsers["sae-stability"]
    s.set_defaults(max_prompts=96)
    s.add_argument("--header", default="default", help="shared prefix prepended to every prompt ('default': the "
                   "fixed system prompt; 'none': the prompts already share one or prefix-cache is not among --modes)")
    s.add_argument("--layer", type=int, default=3, help="block whose output the SAEs read")
    s.add_argument("--modes", type=_words, default=["reference", "batch", "bfloat16", "prefix-cache"],
                   help="serving modes: reference (always), batch, bfloat16, prefix-cache")
    s.add_argument("--seeds", type=_ints, default=[0, 1, 2], help="SAE training seeds (same budget each)")
    s.add_argument("--d-sae", type=int, default=512, help="SAE width")
    s.add_argument("--k", type=int, default=16, help="active features (TopK)")
    s.add_argument("--n-tokens", type=int, default=256_000, help="training rows per SAE (the budget)")
    s.add_argument("--serve-batch", type=int, default=16, help="batch size of the batch mode")
    s.add_argument("--padding-side", choices=("left", "right"), default="left", help="padding of the batch mode")
    return study


def _options(args: argparse.Namespace) -> dict[str, Any]:
    name = args.study_name
    if name == "batch":
        return {"batch_size": args.batch_size, "sides": args.padding, "neighbours": args.neighbours, "slots": args.slots}
    if name == "determinism":
        return {"dtypes": args.dtypes, "repeats": args.repeats}
    if name == "chunked-prefill":
        return {"chunks": args.chunks}
    if name == "sae-stability":
        from trajscope.studies.sae_stability import StabilityConfig

        return {"config": StabilityConfig(layer=args.layer, modes=tuple(args.modes), seeds=tuple(args.seeds),
                                          d_sae=args.d_sae, k=args.k, n_tokens=args.n_tokens,
                                          serve_batch=args.serve_batch, padding_side=args.padding_side)}
    return {"warm": not args.cold, "block": args.block, "min_shared": args.min_shared}


def cmd_study(args: argparse.Namespace) -> int:
    """Run the study named by ``args.study_name``, print its summary and write its tables."""
    import polars as pl

    from trajscope.model.forward import check_dtype
    from trajscope.model.load import load_model
    from trajscope.studies import prompts as P
    from trajscope.studies.run import run_study, write_tables

    name = args.study_name
    opts = _options(args)  # validated by the study itself before any model runs
    if name == "chunked-prefill":
        from trajscope.studies.prefill import check_chunks

        check_chunks(opts["chunks"])
    if args.max_prompts < 1:
        raise TrajscopeError(f"--max-prompts must be at least 1, not {args.max_prompts}.")
    items = P.read_prompt_file(args.prompts, args.max_prompts)
    header = None
    if name in ("prefix-cache", "sae-stability") and args.header not in (None, "none"):
        header = P.DEFAULT_HEADER if args.header == "default" else args.header
    if header:
        items = P.with_header(items, header)
    if args.dtype:
        import torch

        check_dtype(args.device or ("cuda" if torch.cuda.is_available() else "cpu"), args.dtype)
    model = load_model(args.model, device=args.device, dtype=args.dtype)
    max_tokens = args.max_tokens + (len(model.encode(header)) if header and args.max_tokens else 0)
    prompts = P.encode_prompts(model, items, max_tokens or None)  # the cut applies after the header
    step = max(1, len(prompts) // 4)

    def progress(done: int, total: int) -> None:
        if done % step == 0 or done == total:
            print(f"{name}: {done}/{total} {'SAEs trained' if name == 'sae-stability' else 'prompts'}", file=sys.stderr)

    if args.threads is not None and args.threads < 1:
        raise TrajscopeError(f"--threads must be at least 1, not {args.threads}.")
    with model.numerics(threads=args.threads):
        tables = run_study(name, model, prompts, layers=args.layers, progress=progress, **opts)
    paths = write_tables(tables, args.out)
    keep = ("rel_l2_mean", "rel_l2_mean_lo", "rel_l2_mean_hi", "rel_l2_max", "floor_rel_l2", "frac_above_floor",
            "frac_greedy_diverged", "share_never_produced", "n_positions", "n_reused", "value", "lo", "hi",
            "seed_min", "seed_max")
    with pl.Config(tbl_rows=60, tbl_cols=-1, tbl_width_chars=200, fmt_float="mixed", fmt_str_lengths=20,
                   tbl_hide_dataframe_shape=True, tbl_hide_column_data_types=True):
        for key in (k for k in tables if k.endswith("_summary")):
            df = tables[key]
            cols = [c for c in df.columns if df.schema[c] in (pl.String, pl.Int16, pl.Int32) or c in keep]
            cols = [c for c in cols if c not in ("device", "dtype", "padding_side")] or cols
            merged = interval_columns(df.rename({"lo": "value_lo", "hi": "value_hi"}, strict=False),
                                      ["rel_l2_mean", "value"], "n_prompts")  # "0.1 [lo, hi]", or why none
            shown = merged.select(c for c in cols if c in merged.columns)
            print(f"{key}:")
            print(shown)
    print("written: " + ", ".join(str(p) for p in paths), file=sys.stderr)
    return 0
