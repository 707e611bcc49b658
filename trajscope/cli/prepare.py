"""``trajscope prepare``: build a model's assets (profile, SAEs, steering vector) into one directory.

Resumable: each finished stage leaves ``OUT/<stage>/DONE.json`` and is skipped on a
re-run (:mod:`trajscope.prepare`). ``--only`` runs the named stages; ``--ship DIR`` copies the
shippable artefacts (:mod:`trajscope.prepare.ship`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any

from trajscope.cli import options as opt
from trajscope.errors import TrajscopeError


def cmd_prepare(args: argparse.Namespace) -> int:
    from trajscope.prepare import PrepareConfig, prepare, stages

    overrides = json.loads(args.set) if args.set else {}
    fields = {f.name for f in dataclasses.fields(PrepareConfig)}
    if set(overrides) - fields:
        raise TrajscopeError(f"Unknown setting(s) {', '.join(sorted(set(overrides) - fields))} in --set.")
    cfg = PrepareConfig.from_dict({**PrepareConfig(model_id=args.model).to_dict(), **overrides})
    names = [s.name for s in stages(cfg)]
    only = args.only.split(",") if args.only else None
    unknown = sorted(set(only or ()) - set(names))
    if unknown:
        raise TrajscopeError(f"Unknown stage(s) {', '.join(unknown)}; the stages are {', '.join(names)}.")
    status = prepare(args.model_path or args.model, args.out, cfg, only)
    print(json.dumps(status, indent=1))
    if args.ship:
        from trajscope.prepare.ship import ship

        print(f"shipped to {ship(args.out, args.ship, cfg.layer, cfg.seeds[0])}")
    return 0


def register(sub: Any) -> None:
    """Add ``prepare`` to the CLI's subparsers."""
    p = opt.command(sub, "prepare", "build a model's drift profile, SAEs and steering vector (resumable)",
                    "Run the asset build stages into OUT (collect, profile, SAEs, SAE evaluation, steering); a "
                    "finished stage is skipped on a re-run.",
                    "trajscope prepare --model smollm2 --out build/smollm2")
    p.add_argument("--model", default="smollm2", help="model id recorded in the artefacts (and loaded, unless "
                   "--model-path is given)")
    p.add_argument("--model-path", default=None, help="load the model from this directory instead of --model")
    p.add_argument("--out", required=True, help="output directory (re-use it to resume)")
    p.add_argument("--only", default=None, help="comma-separated stage names to run")
    p.add_argument("--set", default=None, help="JSON object of PrepareConfig overrides, e.g. '{\"sae_tokens\": 51200}'")
    p.add_argument("--ship", default=None, help="then copy the shippable artefacts and figures.md into this "
                   "directory (e.g. sample_data/smollm2)")
    p.set_defaults(func=cmd_prepare)
