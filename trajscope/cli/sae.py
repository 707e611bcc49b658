"""SAE subcommands of the ``trajscope`` CLI: ``harvest``, ``train-sae``, ``sae-drift`` and ``sae-index``.

- ``trajscope harvest``: capture a prompt set's continuations and save one layer's
  activations with their tags (:mod:`trajscope.features.harvest`).
- ``trajscope train-sae``: train a prefill-only (``--decode-fraction 0``) or hybrid
  SAE on one or more harvests; writes the SAELens-format SAE, ``training_log.csv``
  (loss curve) and ``training_metrics.json``.
- ``trajscope sae-drift``: an alias of the registered ``sae-drift`` study
  (:mod:`trajscope.studies.sae_drift`, ``trajscope study sae-drift``) that evaluates a saved
  harvest instead of harvesting a prompt set; writes the study's Result (``sae-drift*.parquet``,
  ``sae-drift.result.json``) and the printed text, ``sae-drift.txt``.
- ``trajscope sae-index``: the feature index (top-activating contexts and prefill/decode
  density of every feature over a prompt set, :mod:`trajscope.features.index`), written
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
from trajscope.studies.flags import number


def cmd_harvest(args: argparse.Namespace) -> int:
    from tqdm.auto import tqdm

    from trajscope.prompts import read_prompts
    from trajscope.features.harvest import harvest

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
                greedy=not args.no_greedy, engine=args.engine, on_capture=on_capture,
                batch_size=args.batch_size, padding_side=args.padding_side)
    bar.close()
    h.meta.update(prompts=args.prompts, split=args.split)
    path = h.save(opt.out_dir(args.out))
    counts = h.rows.group_by("phase").len().sort("phase")
    print(f"{path}: {len(h)} rows at layer {h.layer} ({dict(counts.iter_rows())})", file=sys.stderr)
    return 0


def seed_list(text: str) -> list[int]:
    """Seeds from ``"0"`` or ``"0,1,2"`` (distinct non-negative integers), one clear error otherwise."""
    try:
        seeds = [int(t) for t in str(text).split(",") if t.strip()]
    except ValueError as exc:
        raise TrajscopeError(f"--seed takes integers separated by commas (e.g. 0,1,2), not '{text}'.") from exc
    if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
        raise TrajscopeError(f"--seed needs distinct non-negative integers (e.g. 0,1,2), not '{text}'.")
    return seeds


def seed_out_dirs(out: str, seeds: list[int]) -> list[str]:
    """One output directory per seed: ``out`` with ``{seed}`` filled in (required when there are several seeds)."""
    if len(seeds) > 1 and "{seed}" not in out:
        raise TrajscopeError(f"Several seeds ({','.join(map(str, seeds))}) need '{{seed}}' in --out so each SAE gets "
                             f"its own directory, e.g. --out 'sae-hybrid-seed{{seed}}'.")
    return [out.replace("{seed}", str(s)) for s in seeds]


def cmd_train_sae(args: argparse.Namespace) -> int:
    import polars as pl
    import torch

    from trajscope.features.harvest import Harvest
    from trajscope.features.train import TrainConfig, train_sae

    opt.threads(args.threads)
    seeds = seed_list(args.seed)
    outs = seed_out_dirs(args.out, seeds)
    harvests = [Harvest.load(p) for p in args.harvest]
    layers = {h.layer for h in harvests}
    if len(layers) != 1:
        raise TrajscopeError(f"The harvests come from different layers ({sorted(layers)}); train on one layer.")
    layer = layers.pop()
    from trajscope import positions

    # the sink (position 0) is left out even of harvests made before harvest left it out (positions.SKIP_SINK)
    not_sink = pl.col("pos") >= positions.first_reference_pos()
    pre = torch.cat([h.where((pl.col("phase") == "prefill") & not_sink).acts for h in harvests])
    dec = torch.cat([h.where(pl.col("phase") == "decode").acts for h in harvests])
    meta = {"model_name": harvests[0].meta.get("model"), "model_revision": harvests[0].meta.get("revision"),
            "harvests": [str(p) for p in args.harvest], "n_prefill_rows": int(pre.shape[0]),
            "n_decode_rows": int(dec.shape[0]), "trained_with": "trajscope train-sae", **positions.sink_meta()}
    for seed, out_text in zip(seeds, outs):  # same pools, same budget; only the seed differs
        cfg = TrainConfig(architecture=args.architecture, d_sae=args.d_sae, k=args.k, l1_coefficient=args.l1,
                          decode_fraction=args.decode_fraction, n_tokens=args.n_tokens, batch_size=args.batch_size,
                          lr=args.lr, seed=seed)
        out = opt.out_dir(out_text)
        sae, curve = train_sae(pre, dec, cfg, layer=layer, metadata=meta, log_csv=out / "training_log.csv",
                               progress=not args.quiet)
        sae.save(str(out))
        last = curve.tail(max(1, len(curve) // 10)).mean().to_dicts()[0]
        metrics = {"final_train_fvu_batch": last["fvu"], "final_l0": last["l0"], "final_dead_fraction": last["dead"],
                   "steps": int(curve["step"].max()) + 1, "tokens": int(curve["tokens"].max()),
                   "seconds": float(curve["seconds"].max()), **meta, "config": cfg.to_dict()}
        (out / "training_metrics.json").write_text(json.dumps(metrics, indent=1), encoding="utf-8")
        print(f"{out}: {sae!r} (seed {seed}); last-10% batch FVU {last['fvu']:.3f}, L0 {last['l0']:.1f}, "
              f"dead {last['dead']:.3f}, {metrics['seconds']:.0f} s", file=sys.stderr)
    return 0


def _parse_saes(items: list[str]) -> dict[str, list[str]]:
    """``NAME=DIR[,DIR...]`` (or ``DIR``) → {name: [dirs]}; several dirs are seed replicates of one mix."""
    out: dict[str, list[str]] = {}
    for item in items:
        name, _, paths = item.partition("=")
        if not paths:
            name, paths = pathlib.Path(item).name, item
        if name in out:
            raise TrajscopeError(f"SAE name '{name}' is given twice; list its seed replicates as {name}=DIR1,DIR2.")
        out[name] = [p for p in paths.split(",") if p]
    return out


def cmd_sae_drift(args: argparse.Namespace) -> int:
    """The ``sae-drift`` study on a saved harvest (:func:`trajscope.studies.sae_drift.evaluate`); an alias kept for
    the ``--harvest``/``--sae NAME=DIR,DIR`` form. Writes the study's Result and ``sae-drift.txt``."""
    from tqdm.auto import tqdm

    from trajscope.features.harvest import Harvest
    from trajscope.studies import sae_drift

    opt.threads(args.threads)
    mixes = _parse_saes(args.sae)  # argument errors before any loading
    config = sae_drift.SaeDriftConfig(saes=tuple(f"{n}={d}" for n, dirs in mixes.items() for d in dirs),
                                      overlap_k=args.overlap_k, n_boot=args.n_boot, n_null=args.n_null,
                                      seed=args.seed, no_splice=args.no_splice)
    h = Harvest.load(args.harvest)
    config = sae_drift.with_harvest_settings(config, h.meta)  # the Result records how the harvest was made
    saes = sae_drift.load_saes(config)
    model = None if args.no_splice else opt.load(args)
    with tqdm(desc="splice", unit="seq", disable=args.quiet or model is None) as bar:
        def progress(done: int, total: int) -> None:
            bar.total, bar.n = total, done
            bar.refresh()

        result = sae_drift.evaluate(h, config, model, progress, saes=saes)
    out = opt.out_dir(args.out)
    paths = result.save(out)
    text = sae_drift.report_text(result, metrics=args.metrics.split(","))
    (out / "sae-drift.txt").write_text(text + "\n", encoding="utf-8")
    print(text)
    print(f"wrote {', '.join(str(p) for p in [*paths, out / 'sae-drift.txt'])}", file=sys.stderr)
    return 0


def cmd_sae_index(args: argparse.Namespace) -> int:
    from tqdm.auto import tqdm

    from trajscope.prompts import read_prompts
    from trajscope.features.index import EXAMPLES_FILE, IndexSettings, build_index
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
    h.add_argument("--temperature", type=number, default=0.8)
    h.add_argument("--top-p", type=number, default=0.95)
    h.add_argument("--seed", type=int, default=0)
    h.add_argument("--stop-at-eos", action="store_true", help="end continuations at EOS (default: run to the limit)")
    h.add_argument("--engine", choices=("capture", "forward"), default="capture")
    h.add_argument("--batch-size", type=int, default=1, help="sequences per reading forward (needs --engine forward)")
    h.add_argument("--padding-side", choices=("left", "right"), default="right", help="padding of those batches")
    h.add_argument("--device", default=None)
    h.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    h.add_argument("--out", required=True)
    h.add_argument("--quiet", action="store_true")
    h.set_defaults(func=cmd_harvest)

    t = opt.command(sub, "train-sae", "train a prefill-only or hybrid SAE on harvests",
                    "Train a TopK or ReLU SAE in SAELens format on prefill rows, or on a mix with decode rows.",
                    "trajscope train-sae --harvest h/ --decode-fraction 0.5 --out sae-hybrid/")
    t.add_argument("--harvest", nargs="+", required=True, help="harvest directories (same layer)")
    t.add_argument("--decode-fraction", type=number, default=0.0, help="share of decode rows per batch (0 = prefill-only)")
    t.add_argument("--architecture", choices=("topk", "standard"), default="topk")
    t.add_argument("--d-sae", type=int, default=1024)
    t.add_argument("--k", type=int, default=32, help="active features (topk)")
    t.add_argument("--l1", type=number, default=3e-3, help="L1 coefficient (standard)")
    t.add_argument("--n-tokens", type=int, default=1_000_000, help="training rows (the budget)")
    t.add_argument("--batch-size", type=int, default=1024)
    t.add_argument("--lr", type=number, default=1e-3)
    t.add_argument("--seed", default="0", help="seed, or several (0,1,2) to train one SAE per seed on the same data "
                   "and budget (replicates for the seed-to-seed noise floor; --out must then contain {seed})")
    t.add_argument("--threads", type=int, default=None)
    t.add_argument("--out", required=True, help="output directory; '{seed}' in it is replaced by the seed")
    t.add_argument("--quiet", action="store_true")
    t.set_defaults(func=cmd_train_sae)

    d = opt.command(sub, "sae-drift", "report SAE reconstruction and feature overlap, prefill vs decode",
                    "Encode a harvest with each SAE; print reconstruction by decode depth and entropy band side by "
                    "side, and the prefill-vs-decode feature overlap.",
                    "trajscope sae-drift --harvest h-eval/ --sae prefill=sample_data/saes/layer3-prefill-only "
                    "--out sae-report/")
    d.add_argument("--harvest", required=True, help="harvest directory to evaluate on (e.g. the eval prompts)")
    d.add_argument("--sae", nargs="+", required=True,
                   help="NAME=DIR[,DIR...] (or DIR) of SAELens-format SAEs; several DIRs are seed replicates of one "
                        "training mix (their spread is the noise floor); the first NAME is the base of differences")
    d.add_argument("--model", default="sample", help="model for the spliced-in KL / CE increase")
    d.add_argument("--no-splice", action="store_true", help="skip the spliced forward (no model needed)")
    d.add_argument("--overlap-k", type=int, default=64)
    d.add_argument("--metrics", default="fvu,fvu_uncentred,cos,kl,ce_increase,dead,dense",
                   help="metrics printed (all are in the Parquet files)")
    d.add_argument("--n-boot", type=int, default=1000, help="prompt-bootstrap resamples per interval")
    d.add_argument("--n-null", type=int, default=200, help="prefill-vs-prefill draws per matched-n null")
    d.add_argument("--seed", type=int, default=0, help="seed of the resampling")
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
