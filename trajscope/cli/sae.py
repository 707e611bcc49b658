"""SAE subcommands of the ``trajscope`` CLI: ``harvest``, ``train-sae``, ``sae-drift`` and ``sae-index``.

- ``trajscope harvest``: capture a prompt set's continuations and save one layer's
  activations with their tags (:mod:`trajscope.sae.harvest`).
- ``trajscope train-sae``: train a prefill-only (``--decode-fraction 0``) or hybrid
  SAE on one or more harvests; writes the SAELens-format SAE, ``training_log.csv``
  (loss curve) and ``training_metrics.json``.
- ``trajscope sae-drift``: the prefill→decode report — prints reconstruction by
  decode depth and next-token-entropy band for every SAE side by side, and the
  feature overlap; writes ``sae_drift.parquet``, ``sae_overlap.parquet`` and
  ``sae_drift_wide.parquet``.
- ``trajscope sae-index``: the feature index (top-activating contexts and prefill/decode
  density of every feature over a prompt set, :mod:`trajscope.sae.index`), written
  beside the SAE (or to ``--out``).

:func:`register` adds them to the main parser (:mod:`trajscope.cli`).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
from typing import Any

from trajscope.cli import options as opt
from trajscope.errors import TrajscopeError
from trajscope.trajectory import write_table


def cmd_harvest(args: argparse.Namespace) -> int:
    from tqdm.auto import tqdm

    from trajscope.prompts import read_prompts
    from trajscope.sae.harvest import harvest

    opt.threads(args.threads)
    items = read_prompts(args.prompts)
    if args.split != "all":
        items = [p for p in items if p.get("split", "all") == args.split]
        if not items:
            raise TrajscopeError(f"No prompt in '{args.prompts}' has split '{args.split}'.")
    if args.limit:
        items = items[: args.limit]
    model = opt.load(args)
    bar = tqdm(total=1, desc="harvest", unit="run", disable=args.quiet)

    def on_capture(done: int, total: int) -> None:
        bar.total = total
        bar.update(done - bar.n)

    h = harvest(model, items, args.layer, max_new_tokens=args.max_new_tokens, n_sampled=args.n_sampled,
                temperature=args.temperature, top_p=args.top_p, seed=args.seed, stop_at_eos=args.stop_at_eos,
                greedy=not args.no_greedy, engine=args.engine, on_capture=on_capture)
    bar.close()
    h.meta.update(prompts=args.prompts, split=args.split)
    path = h.save(opt.out_dir(args.out))
    counts = h.rows.group_by("phase").len().sort("phase")
    print(f"{path}: {len(h)} rows at layer {h.layer} ({dict(counts.iter_rows())})", file=sys.stderr)
    return 0


def cmd_train_sae(args: argparse.Namespace) -> int:
    import polars as pl
    import torch

    from trajscope.sae.harvest import Harvest
    from trajscope.sae.train import TrainConfig, train_sae

    opt.threads(args.threads)
    harvests = [Harvest.load(p) for p in args.harvest]
    layers = {h.layer for h in harvests}
    if len(layers) != 1:
        raise TrajscopeError(f"The harvests come from different layers ({sorted(layers)}); train on one layer.")
    pre = torch.cat([h.where(pl.col("phase") == "prefill").acts for h in harvests])
    dec = torch.cat([h.where(pl.col("phase") == "decode").acts for h in harvests])
    cfg = TrainConfig(architecture=args.architecture, d_sae=args.d_sae, k=args.k, l1_coefficient=args.l1,
                      decode_fraction=args.decode_fraction, n_tokens=args.n_tokens, batch_size=args.batch_size,
                      lr=args.lr, seed=args.seed)
    out = opt.out_dir(args.out)
    meta = {"model_name": harvests[0].meta.get("model"), "model_revision": harvests[0].meta.get("revision"),
            "harvests": [str(p) for p in args.harvest], "n_prefill_rows": int(pre.shape[0]),
            "n_decode_rows": int(dec.shape[0]), "trained_with": "trajscope train-sae"}
    sae, curve = train_sae(pre, dec, cfg, layer=layers.pop(), metadata=meta, log_csv=out / "training_log.csv",
                           progress=not args.quiet)
    sae.save(str(out))
    last = curve.tail(max(1, len(curve) // 10)).mean().to_dicts()[0]
    metrics = {"final_train_fvu_batch": last["fvu"], "final_l0": last["l0"], "final_dead_fraction": last["dead"],
               "steps": int(curve["step"].max()) + 1, "tokens": int(curve["tokens"].max()),
               "seconds": float(curve["seconds"].max()), **meta, "config": cfg.to_dict()}
    (out / "training_metrics.json").write_text(json.dumps(metrics, indent=1), encoding="utf-8")
    print(f"{out}: {sae!r}; last-10% batch FVU {last['fvu']:.3f}, L0 {last['l0']:.1f}, "
          f"dead {last['dead']:.3f}, {metrics['seconds']:.0f} s", file=sys.stderr)
    return 0


def _parse_saes(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        name, _, path = item.partition("=")
        if not path:
            name, path = pathlib.Path(item).name, item
        out[name] = path
    return out


def format_table(df: Any, digits: int = 4) -> str:
    """A plain fixed-width text rendering of a small Polars frame (what the CLI prints)."""
    cols = df.columns
    cells = [[c for c in cols]]
    for row in df.iter_rows():
        cells.append(["" if v is None else f"{v:.{digits}g}" if isinstance(v, float) else str(v) for v in row])
    widths = [max(len(r[i]) for r in cells) for i in range(len(cols))]
    lines = ["  ".join(r[i].rjust(widths[i]) if i > 1 else r[i].ljust(widths[i]) for i in range(len(cols)))
             for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def cmd_sae_drift(args: argparse.Namespace) -> int:
    from tqdm.auto import tqdm

    from trajscope.metrics.sae_eval import side_by_side
    from trajscope.sae.model import SAE
    from trajscope.sae.reconstruction import reconstruction_report
    from trajscope.sae.harvest import Harvest

    opt.threads(args.threads)
    h = Harvest.load(args.harvest)
    saes = {name: SAE.load(path) for name, path in _parse_saes(args.sae).items()}
    model = None if args.no_splice else opt.load(args)
    bars: dict[str, Any] = {}

    def progress(name: str, done: int, total: int) -> None:
        if args.quiet:
            return
        bar = bars.setdefault(name, tqdm(total=total, desc=f"splice {name}", unit="seq"))
        bar.update(done - bar.n)
        if done == total:
            bar.close()

    table, overlap = reconstruction_report(h, saes, model=model, overlap_k=args.overlap_k, progress=progress)
    wide = side_by_side(table, args.metrics.split(","))
    out = opt.out_dir(args.out)
    write_table(table, out / "sae_drift.parquet")
    write_table(wide, out / "sae_drift_wide.parquet")
    write_table(overlap, out / "sae_overlap.parquet")
    print(f"SAE drift at layer {h.layer}: {h.meta.get('n_prompts')} prompts, {len(h)} rows "
          f"({h.meta.get('split', '?')} split); prefill is the reference row.\n")
    print(format_table(wide))
    print("\nFeature overlap, prefill vs decode (top-k by frequency, k=%d):\n" % args.overlap_k)
    print(format_table(overlap))
    print(f"\nwrote {out / 'sae_drift.parquet'}, {out / 'sae_drift_wide.parquet'}, {out / 'sae_overlap.parquet'}",
          file=sys.stderr)
    return 0


def cmd_sae_index(args: argparse.Namespace) -> int:
    from tqdm.auto import tqdm

    from trajscope.prompts import read_prompts
    from trajscope.sae.index import EXAMPLES_FILE, IndexSettings, build_index
    from trajscope.sae.model import SAE

    opt.threads(args.threads)
    items = read_prompts(args.prompts)
    if args.split != "all":
        items = [p for p in items if p.get("split", "all") == args.split]
        if not items:
            raise TrajscopeError(f"No prompt in '{args.prompts}' has split '{args.split}'.")
    if args.limit:
        items = items[: args.limit]
    sae = SAE.load(args.sae)
    model = opt.load(args)
    settings = IndexSettings(prompts=args.prompts, split=args.split, n_prompts=len(items),
                             max_new_tokens=args.max_new_tokens, top_n=args.top_n, context=args.context)
    bar = tqdm(total=len(items), desc="sae-index", unit="prompt", disable=args.quiet)
    index = build_index(model, sae, items, settings, on_progress=lambda done, total: bar.update(done - bar.n))
    bar.close()
    out = opt.out_dir(args.out) if args.out else pathlib.Path(args.sae)
    index.save(out)
    size = (out / EXAMPLES_FILE).stat().st_size
    print(f"{out / EXAMPLES_FILE}: {len(index.examples)} examples of {index.examples['feature'].n_unique()} features "
          f"over {index.info['n_positions']} positions ({index.info['n_prefill']} prefill, "
          f"{index.info['n_decode']} decode), {size / 1024:.0f} KiB", file=sys.stderr)
    return 0


def register(sub: Any) -> None:
    """Add ``harvest``, ``train-sae``, ``sae-drift`` and ``sae-index`` to the CLI's subparsers."""
    h = opt.command(sub, "harvest", "save one layer's prefill and decode activations over a prompt set",
                    "Capture a prompt set's greedy and sampled continuations and save one layer's activations with "
                    "their tags (phase, step, depth and entropy bands).",
                    "trajscope harvest --prompts sample_data/prompts/heldout_chunks.jsonl --layer 3 --out h/")
    h.add_argument("--model", default="sample")
    h.add_argument("--prompts", required=True, help="JSON-lines prompt file ({\"prompt\", \"id\", \"split\"})")
    h.add_argument("--split", default="all", help="keep prompts whose 'split' is this (train, eval) or all")
    h.add_argument("--limit", type=int, default=None, help="first N prompts only")
    h.add_argument("--layer", type=int, required=True)
    h.add_argument("--max-new-tokens", type=int, default=256, help="0 = prefill positions only")
    h.add_argument("--n-sampled", type=int, default=1, help="sampled continuations per prompt (besides greedy)")
    h.add_argument("--no-greedy", action="store_true")
    h.add_argument("--temperature", type=float, default=0.8)
    h.add_argument("--top-p", type=float, default=0.95)
    h.add_argument("--seed", type=int, default=0)
    h.add_argument("--stop-at-eos", action="store_true", help="end continuations at EOS (default: run to the limit)")
    h.add_argument("--engine", choices=("capture", "forward"), default="capture")
    h.add_argument("--device", default=None)
    h.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    h.add_argument("--out", required=True)
    h.add_argument("--quiet", action="store_true")
    h.set_defaults(func=cmd_harvest)

    t = opt.command(sub, "train-sae", "train a prefill-only or hybrid SAE on harvests",
                    "Train a TopK or ReLU SAE in SAELens format on prefill rows, or on a mix with decode rows.",
                    "trajscope train-sae --harvest h/ --decode-fraction 0.5 --out sae-hybrid/")
    t.add_argument("--harvest", nargs="+", required=True, help="harvest directories (same layer)")
    t.add_argument("--decode-fraction", type=float, default=0.0, help="share of decode rows per batch (0 = prefill-only)")
    t.add_argument("--architecture", choices=("topk", "standard"), default="topk")
    t.add_argument("--d-sae", type=int, default=1024)
    t.add_argument("--k", type=int, default=32, help="active features (topk)")
    t.add_argument("--l1", type=float, default=3e-3, help="L1 coefficient (standard)")
    t.add_argument("--n-tokens", type=int, default=1_000_000, help="training rows (the budget)")
    t.add_argument("--batch-size", type=int, default=1024)
    t.add_argument("--lr", type=float, default=1e-3)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--threads", type=int, default=None)
    t.add_argument("--out", required=True)
    t.add_argument("--quiet", action="store_true")
    t.set_defaults(func=cmd_train_sae)

    d = opt.command(sub, "sae-drift", "report SAE reconstruction and feature overlap, prefill vs decode",
                    "Encode a harvest with each SAE; print reconstruction by decode depth and entropy band side by "
                    "side, and the prefill-vs-decode feature overlap.",
                    "trajscope sae-drift --harvest h-eval/ --sae prefill=sample_data/saes/layer3-prefill-only "
                    "--out sae-report/")
    d.add_argument("--harvest", required=True, help="harvest directory to evaluate on (e.g. the eval prompts)")
    d.add_argument("--sae", nargs="+", required=True, help="NAME=DIR (or DIR) of SAELens-format SAEs")
    d.add_argument("--model", default="sample", help="model for the spliced-in KL / CE increase")
    d.add_argument("--no-splice", action="store_true", help="skip the spliced forward (no model needed)")
    d.add_argument("--overlap-k", type=int, default=64)
    d.add_argument("--metrics", default="fvu,fvu_uncentred,cos,l0,kl,ce_increase")
    d.add_argument("--device", default=None)
    d.add_argument("--threads", type=int, default=None)
    d.add_argument("--out", required=True)
    d.add_argument("--quiet", action="store_true")
    d.set_defaults(func=cmd_sae_drift)

    x = opt.command(sub, "sae-index", "build an SAE's feature index (top contexts, prefill/decode density)",
                    "Capture each prompt with a greedy continuation, encode every position with the SAE and keep, per "
                    "feature, its top-activating contexts and its activation density in prefill and in decode. "
                    "Writes feature_index.parquet, feature_density.parquet and feature_index.json beside the SAE.",
                    "trajscope sae-index --sae sample_data/saes/layer3-prefill-only "
                    "--prompts sample_data/prompts/heldout_code.jsonl")
    x.add_argument("--sae", required=True, help="SAELens-format SAE directory (also where the index goes)")
    x.add_argument("--model", default="sample", help="the model the SAE reads (default: %(default)s)")
    x.add_argument("--prompts", default="sample_data/prompts/heldout_code.jsonl",
                   help="JSON-lines prompt file (default: %(default)s)")
    x.add_argument("--split", default="all", help="keep prompts whose 'split' is this (train, eval) or all")
    x.add_argument("--limit", type=int, default=None, help="first N prompts only")
    x.add_argument("--max-new-tokens", type=int, default=64, help="greedy continuation per prompt (default: %(default)s)")
    x.add_argument("--top-n", type=int, default=8, help="examples kept per feature (default: %(default)s)")
    x.add_argument("--context", type=int, default=12, help="tokens of context left of the activating token")
    x.add_argument("--device", default=None)
    x.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    x.add_argument("--out", default=None, help="write here instead of the SAE directory")
    x.add_argument("--quiet", action="store_true")
    x.set_defaults(func=cmd_sae_index)
