"""``trajscope study NAME``: command-line flags generated from a study's config dataclass.

Every registered study (:mod:`trajscope.studies.registry`) becomes a subcommand. Its flags are

- the shared ones, defined once here (:data:`SHARED`): ``--model``, ``--prompts``, ``--out``,
  ``--max-prompts``, ``--max-tokens``, ``--layers``, ``--device``, ``--dtype``, ``--threads``;
- one per field of the study's frozen config dataclass: ``--field-name``, its help from the
  field's ``metadata["help"]``, its type from the annotation (``int``, ``float``, ``str``,
  ``bool`` as a switch, ``tuple[int, ...]`` / ``tuple[float, ...]`` / ``tuple[str, ...]`` as
  comma-separated lists, any of them ``| None``) and ``metadata["choices"]`` where given. A float
  is a finite number (:func:`number`, which the other commands' float flags use too).

A study that builds its own input (the needle study's passkey prompts, the compaction study's
sessions) says so with a class attribute ``OWN_INPUT`` on its config (a phrase naming what it reads
instead); it gets no ``--prompts``, ``--max-prompts`` or ``--max-tokens``, and its run receives
``prompts=None``.

A config field named ``header`` is text prepended to every prompt before the ``--max-tokens``
cut (``default``: :data:`trajscope.studies.prompts.DEFAULT_HEADER`; ``none``: no header). A
config validates itself in ``__post_init__`` (one :class:`~trajscope.errors.TrajscopeError`),
before any model is loaded.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import types
import typing
from typing import Any

from trajscope.errors import TrajscopeError
from trajscope.studies.registry import Study, studies

PROMPT_FLAGS = ("--prompts", "--max-prompts", "--max-tokens")  # left out for a config with OWN_INPUT
# (flag, keywords) of the flags every study shares
SHARED: tuple[tuple[str, dict[str, Any]], ...] = (
    ("--model", {"default": "sample", "help": "'sample', 'smollm2', a model directory or a cached Hugging Face name"}),
    ("--prompts", {"required": True, "help": 'JSON-lines file, one {"prompt": ..., "id": ...} per line'}),
    ("--out", {"required": True, "help": "directory for the Parquet tables and the study's result marker"}),
    ("--max-prompts", {"type": int, "default": 16, "help": "use the first N prompts"}),
    ("--max-tokens", {"type": int, "default": 96, "help": "cut each prompt to its first N tokens (0: no cut)"}),
    ("--layers", {"type": "ints", "default": None, "help": "comma-separated blocks to compare (default: all)"}),
    ("--device", {"default": None, "help": "cpu, cuda, cuda:1 … (default: CUDA when present)"}),
    ("--dtype", {"default": None, "help": "model dtype (default: float32 on CPU, bfloat16 on CUDA)"}),
    ("--threads", {"type": int, "default": None, "help": "CPU threads for the run (default: torch's)"}),
)


def ints(text: str) -> tuple[int, ...]:
    """``"1,4,16"`` → ``(1, 4, 16)``; argparse's error when it is not whole numbers."""
    try:
        return tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers like 1,4,16; got '{text}'") from exc


def number(text: str) -> float:
    """``"0.5"`` → ``0.5``; argparse's error when it is not a finite number (``float`` alone takes ``nan`` and
    ``inf``, which no trajscope setting means: a NaN fails every range check written as ``x < lo``)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number like 0.5; got '{text}'")
    return value


def floats(text: str) -> tuple[float, ...]:
    """``"0.1,0.5,6"`` → ``(0.1, 0.5, 6.0)``; argparse's error when it is not finite numbers."""
    try:
        return tuple(number(t) for t in text.split(",") if t.strip())
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated finite numbers like 0.1,0.5; got '{text}'") from exc


def words(text: str) -> tuple[str, ...]:
    """``"a, b"`` → ``("a", "b")``."""
    return tuple(t.strip() for t in text.split(",") if t.strip())


def _flag_kwargs(f: dataclasses.Field, hint: Any) -> dict[str, Any]:
    """argparse keywords for one config field, from its annotation and metadata."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
        hint = next(a for a in args if a is not type(None))
    default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
    kw: dict[str, Any] = {"help": f.metadata.get("help", ""), "default": default}
    if hint is bool:
        return {**kw, "action": "store_true"}
    if typing.get_origin(hint) is tuple:
        kw["type"] = {int: ints, float: floats}.get(typing.get_args(hint)[0], words)
        if default is not None:  # a string default goes through ``type``: shown as it is typed
            kw["default"] = ",".join(map(str, default))
    elif hint in (int, float, str):
        kw["type"] = number if hint is float else hint
    else:
        raise TypeError(f"config field {f.name!r}: no flag for type {hint!r}")
    if "choices" in f.metadata:
        kw["choices"] = f.metadata["choices"]
    return kw


def add_study_parser(sub: Any, study: Study, command: str | None = None) -> argparse.ArgumentParser:
    """Add ``study`` as a subcommand of ``sub`` (named ``command``, default the study's name) with the shared
    and its config's flags."""
    text = study.question
    own = getattr(study.config, "OWN_INPUT", None)
    p = sub.add_parser(command or study.name, help=text,
                       description=f"{text[0].upper()}{text[1:]}{'' if text.endswith('?') else '.'}"
                       + (f" Its input: {own}." if own else ""),
                       epilog=f"example: {study.example}", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    for flag, kw in SHARED:
        if own and flag in PROMPT_FLAGS:
            continue
        p.add_argument(flag, **({**kw, "type": ints} if kw.get("type") == "ints" else kw))
    hints = typing.get_type_hints(study.config)
    for f in dataclasses.fields(study.config):
        kw = _flag_kwargs(f, hints[f.name])
        if kw.get("action") != "store_true":
            kw["metavar"] = f.name.upper()
        p.add_argument(f"--{f.name.replace('_', '-')}", dest=f"cfg_{f.name}", **kw)
    p.set_defaults(func=cmd_study, study_name=study.name, **study.shared_defaults)
    return p


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``study`` with one subcommand per registered study to ``subparsers``."""
    found = studies()
    study = subparsers.add_parser(
        "study", help="run a registered study: " + ", ".join(sorted(found)),
        description="Run one study on a prompt set (or on the input it builds itself) and write its tables and "
                    "result marker under --out; "
                    "'trajscope study-report DIR' renders any study's output.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        epilog="example:\n  trajscope study determinism --prompts sample_data/prompts/heldout_code.jsonl "
               "--out studies/determinism (then 'trajscope study STUDY --help' for each study's options)")
    sub = study.add_subparsers(dest="study", required=True, metavar="STUDY")
    for s in found.values():
        add_study_parser(sub, s)
    return study


def config_from(args: argparse.Namespace, study: Study) -> Any:
    """The study's frozen config from the parsed ``cfg_*`` flags (it validates itself)."""
    return study.config(**{f.name: getattr(args, f"cfg_{f.name}") for f in dataclasses.fields(study.config)})


def cmd_study(args: argparse.Namespace) -> int:
    """Run the study named by ``args.study_name`` on the prompt file, print its summaries, write its Result."""
    from trajscope.model.forward import check_dtype
    from trajscope.model.load import load_model
    from trajscope.studies import prompts as P
    from trajscope.studies.registry import get

    study = get(args.study_name)
    config = config_from(args, study)
    own = getattr(study.config, "OWN_INPUT", None)
    if not own and args.max_prompts < 1:
        raise TrajscopeError(f"--max-prompts must be at least 1, not {args.max_prompts}.")
    if args.threads is not None and args.threads < 1:
        raise TrajscopeError(f"--threads must be at least 1, not {args.threads}.")
    if not own:
        P.check_cut(args.max_tokens)  # before the model loads
    items = [] if own else P.read_prompt_file(args.prompts, args.max_prompts)
    if args.dtype:
        import torch

        check_dtype(args.device or ("cuda" if torch.cuda.is_available() else "cpu"), args.dtype)
    model = load_model(args.model, device=args.device, dtype=args.dtype)
    bad = [x for x in (args.layers or ()) if not 0 <= int(x) < model.n_layers]
    if bad:
        raise TrajscopeError(f"Layer {bad[0]} is out of range; the model has layers 0..{model.n_layers - 1}.")
    prompts = None
    if not own:
        prompts = P.encode_prompts(model, *P.study_items(model, items, config, args.max_tokens))
    from tqdm.auto import tqdm

    with tqdm(desc=study.name, unit="item", file=sys.stderr, disable=None) as bar:
        def progress(done: int, total: int) -> None:
            bar.total = total
            bar.n = done
            bar.refresh()

        with model.numerics(threads=args.threads):
            result = study.run(model, prompts, config, progress=progress, layers=args.layers)
    paths = result.save(args.out, family=study.family)
    print_summaries(result)
    print("written: " + ", ".join(str(p) for p in paths), file=sys.stderr)
    return 0


def print_summaries(result: Any) -> None:
    """Print the Result's ``*_summary`` tables: grouping columns and the headline numbers."""
    import polars as pl

    from trajscope.interval_text import interval_columns

    keep = ("rel_l2_mean", "rel_l2_mean_lo", "rel_l2_mean_hi", "rel_l2_max", "floor_rel_l2", "frac_above_floor",
            "frac_greedy_diverged", "share_never_produced", "n_positions", "n_reused", "value", "lo", "hi",
            "seed_min", "seed_max", "budget")
    with pl.Config(tbl_rows=60, tbl_cols=-1, tbl_width_chars=200, fmt_float="mixed", fmt_str_lengths=36,
                   tbl_hide_dataframe_shape=True, tbl_hide_column_data_types=True):
        for key in (k for k in result.tables if k.endswith("_summary")):
            df = result.tables[key]
            point = next((c for c in ("value", "estimate", "accuracy") if c in df.columns), "value")
            df = df.rename({"lo": f"{point}_lo", "hi": f"{point}_hi"}, strict=False)
            est = [c for c in df.columns if f"{c}_lo" in df.columns and f"{c}_hi" in df.columns]
            n = next((c for c in ("n_prompts", "n_sessions", "n") if c in df.columns), None)
            cols = [c for c in df.columns if df.schema[c] in (pl.String, pl.Int16, pl.Int32) or c in keep
                    or c in est or c == n]
            cols = [c for c in cols if c not in ("device", "dtype", "padding_side")] or cols
            merged = interval_columns(df, est, n)  # "0.1 [lo, hi]", or why none
            print(f"{key}:")
            print(merged.select(c for c in cols if c in merged.columns))
