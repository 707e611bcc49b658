"""``trajscope eviction``: an alias of ``trajscope study eviction`` that also studies run directories.

Its flags are the registered study's, generated from
:class:`~trajscope.studies.eviction.config.EvictionConfig` (:func:`trajscope.studies.flags.add_study_parser`);
with ``--prompts FILE --out DIR`` it *is* ``trajscope study eviction`` (:func:`trajscope.studies.flags.cmd_study`).

With ``--runs RUN_DIR …`` instead, the same registered run function studies each run directory's
prompt tokens (for as many decode steps as the run generated, unless ``--max-new-tokens`` is given)
and saves its Result into ``RUN_DIR/eviction/``: the comparison report (``trajscope report``) then
shows an eviction section for those runs (:mod:`trajscope.studies.eviction.runs`).
"""

from __future__ import annotations

import argparse
import sys

from trajscope.errors import TrajscopeError


def _on_runs(args: argparse.Namespace) -> int:
    """``--runs``: the registered study on each run directory's prompt, saved into ``RUN_DIR/eviction/``."""
    import dataclasses

    from trajscope.model.load import load_model
    from trajscope.studies import flags
    from trajscope.studies.eviction.runs import run_eviction_dir
    from trajscope.studies.registry import get
    from trajscope.trajectory import Trajectory

    study = get("eviction")
    explicit = args.cfg_max_new_tokens is not None
    config = flags.config_from(_with_steps(args), study)
    runs = [Trajectory.load(r, lazy=True) for r in args.runs]  # one clear error per unreadable directory
    model = load_model(args.model, device=args.device, dtype=args.dtype)
    for run_dir, t in zip(args.runs, runs):
        run_model = t.meta.get("model", {}).get("model_id")
        if run_model is not None and run_model != model.model_id:
            raise TrajscopeError(f"Run '{run_dir}' was captured with '{run_model}', not '{model.model_id}': "
                                 f"pass --model {run_model}.")
    for run_dir, t in zip(args.runs, runs):
        P = t.prompt_len
        cfg = config if explicit else dataclasses.replace(config, max_new_tokens=len(t.token_ids) - P)
        with model.numerics(threads=args.threads):
            result = study.run(model, [(t.run_id, list(t.token_ids[:P]))], cfg)
        paths = result.save(run_eviction_dir(run_dir))
        print(f"{t.run_id}: written {paths[-1].parent}", file=sys.stderr)
    return 0


def _with_steps(args: argparse.Namespace) -> argparse.Namespace:
    """``args`` with the config's default decode steps where ``--max-new-tokens`` was not given."""
    from trajscope.studies.eviction.config import EvictionConfig

    if args.cfg_max_new_tokens is None:
        args.cfg_max_new_tokens = EvictionConfig.max_new_tokens
    return args


def cmd_eviction(args: argparse.Namespace) -> int:
    """``--runs``: :func:`_on_runs`; else the registered study (``trajscope study eviction``)."""
    from trajscope.studies.flags import cmd_study

    if args.runs:
        if args.prompts or args.out:
            raise TrajscopeError("--runs writes into each run directory: leave out --prompts and --out.")
        return _on_runs(args)
    if not (args.prompts and args.out):
        raise TrajscopeError("Give --prompts FILE and --out DIR, or --runs RUN_DIR [RUN_DIR …].")
    return cmd_study(_with_steps(args))


def register(sub) -> None:
    """Add ``eviction``: the registered study's flags, ``--prompts``/``--out`` optional beside ``--runs``."""
    from trajscope.studies.flags import add_study_parser
    from trajscope.studies.registry import get

    p = add_study_parser(sub, get("eviction"), command="eviction")
    for action in p._actions:
        if action.dest in ("prompts", "out"):  # --runs replaces both
            action.required = False
        if action.dest == "cfg_max_new_tokens":  # with --runs: as many as each run generated
            action.default = None
            action.help += " (default 32; with --runs, as many as the run generated)"
    p.add_argument("--runs", nargs="+", default=None, metavar="RUN_DIR",
                   help="instead of --prompts/--out: each run directory's prompt, for as many steps as the run "
                        "generated; the Result is saved into RUN_DIR/eviction/ (the comparison report's section)")
    p.epilog = (f"{p.epilog}; or: trajscope eviction --runs runs/base/* --window 4 --budgets 0.2,0.5 "
                "(same as 'trajscope study eviction', plus --runs)")
    p.set_defaults(func=cmd_eviction)
