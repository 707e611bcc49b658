"""The ``trajscope`` command line: capture runs and serve the app.

``trajscope capture`` runs one prompt (``--prompt``) or a JSON-lines file of
prompts (``--prompts``) and writes one run directory per prompt under
``--out``, so the folder reads as one dataset
(``pl.scan_parquet("OUT/*/attention.parquet")``). A progress bar follows the
decode steps. Ctrl-C saves the steps captured so far and stops.

``trajscope serve`` starts ``panel serve apps/trajscope.py``; ``trajscope
steer-sweep`` lives in :mod:`trajscope.cli_steer`.

Bad input prints one sentence on stderr and exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
from typing import Any

from trajscope.errors import TrajscopeError


def _layers(text: str | None) -> Any:
    if text is None or text == "none":
        return None
    if text == "all":
        return "all"
    try:
        return [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise TrajscopeError(f"Layers must be 'all', 'none' or comma-separated indices like 0,3,5; got '{text}'.") from None


def read_jsonl(path: str, what: str, convert) -> list:
    """Items of a JSON-lines file, each passed through ``convert(item, line_no)`` (which may raise).

    Blank lines are skipped; a missing file, invalid JSON or an empty file is one clear error.
    """
    p = pathlib.Path(path)
    if not p.is_file():
        raise TrajscopeError(f"No {what} file at '{path}'.")
    out = []
    for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TrajscopeError(f"{path}, line {n}: not valid JSON ({exc.msg}).") from None
        out.append(convert(item, n))
    if not out:
        raise TrajscopeError(f"The {what} file '{path}' holds no {what}s.")
    return out


def read_prompts(path: str) -> list[dict]:
    """Prompts from a JSON-lines file: each line ``{"prompt": ..., "id": ...}`` or a JSON string."""
    def convert(item, n):
        if isinstance(item, str):
            item = {"prompt": item}
        if not isinstance(item, dict) or not isinstance(item.get("prompt"), str) or not item["prompt"].strip():
            raise TrajscopeError(f"{path}, line {n}: expected a JSON object with a non-empty \"prompt\" string.")
        return item

    return read_jsonl(path, "prompt", convert)


def cmd_capture(args: argparse.Namespace) -> int:
    import threading

    from tqdm.auto import tqdm

    import trajscope as ts

    if (args.prompt is None) == (args.prompts is None):
        raise TrajscopeError("Give exactly one of --prompt TEXT or --prompts FILE.jsonl.")
    items = [{"prompt": args.prompt}] if args.prompt is not None else read_prompts(args.prompts)
    out = pathlib.Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TrajscopeError(f"Cannot create the output folder '{out}': {exc.strerror or exc}.") from None
    if not os.access(out, os.W_OK):
        raise TrajscopeError(f"The output folder '{out}' is not writable.")
    model = ts.load_model(args.model, remote=True if args.remote else False, device=args.device, dtype=args.dtype)
    res_layers, attn_layers = _layers(args.residual_layers), _layers(args.attention_layers)
    interrupted = False
    outer = tqdm(items, desc="prompts", unit="prompt", disable=len(items) == 1 or args.quiet)
    for i, item in enumerate(outer):
        bar = tqdm(total=args.max_new_tokens, desc=f"prompt {i + 1}/{len(items)}", unit="step",
                   leave=False, disable=args.quiet)
        cancel = threading.Event()

        def on_step(ev, bar=bar):
            bar.update(1)
            bar.set_postfix_str(repr(ev.text)[:24])

        try:
            traj = ts.capture(model, item["prompt"], max_new_tokens=int(item.get("max_new_tokens", args.max_new_tokens)),
                              temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                              seed=int(item.get("seed", args.seed)), stop_at_eos=not args.no_eos,
                              residual_layers=res_layers, attention_layers=attn_layers, on_step=on_step,
                              cancel=cancel, run_id=item.get("id"))
        finally:
            bar.close()
        path = traj.save(out / traj.run_id)
        print(f"{path}  ({traj.meta['n_generated']} tokens, stop: {traj.meta['stop_reason']})", file=sys.stderr)
        if traj.meta["stop_reason"] == "interrupted":
            interrupted = True
            break
    if interrupted:
        print("Interrupted: the steps captured so far were saved.", file=sys.stderr)
        return 130
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    import subprocess

    app = pathlib.Path(__file__).resolve().parents[1] / "apps" / "trajscope.py"
    if not app.exists():
        raise TrajscopeError(f"The app file is missing: {app}.")
    cmd = [sys.executable, "-m", "panel", "serve", str(app), "--port", str(args.port)]
    if args.show:
        cmd.append("--show")
    return subprocess.call(cmd)


def cmd_report(args: argparse.Namespace) -> int:
    from trajscope.report import compare

    comp = compare(args.runs, skip_bad=args.skip_bad, profile=args.profile)
    path = comp.save(args.output)
    for run, reason in comp.skipped:
        print(f"left out {run}: {reason}", file=sys.stderr)
    print(f"{path}  ({len(comp.runs)} runs; tables in {path.stem}_files/)", file=sys.stderr)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from trajscope.export import export

    out = export(args.runs, args.out, partition_by=tuple(args.partition_by.split(",")))
    print(f"{out}/<table>/{'/'.join(k + '=...' for k in args.partition_by.split(','))}/part-0.parquet", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="trajscope", description="Step through LLM decode and measure drift from prefill.")
    sub = ap.add_subparsers(dest="command", required=True)
    c = sub.add_parser("capture", help="capture runs to run directories")
    c.add_argument("--model", default="sample", help="'sample', a model directory, a cached HF name, or an NDIF model with --remote")
    c.add_argument("--remote", action="store_true", help="run on NDIF (needs NDIF_API_KEY)")
    c.add_argument("--prompt", help="one prompt")
    c.add_argument("--prompts", help="JSON-lines file of prompts ({\"prompt\": ..., \"id\": ...} per line)")
    c.add_argument("--max-new-tokens", type=int, default=64)
    c.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    c.add_argument("--top-p", type=float, default=None)
    c.add_argument("--top-k", type=int, default=None)
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--no-eos", action="store_true", help="do not stop at the EOS token")
    c.add_argument("--residual-layers", default=None, help="'all', 'none' or indices like 0,3 (tensors kept)")
    c.add_argument("--attention-layers", default=None, help="'all', 'none' or indices (full attention rows kept)")
    c.add_argument("--device", default=None)
    c.add_argument("--dtype", default=None)
    c.add_argument("--out", required=True, help="folder that receives one run directory per prompt")
    c.add_argument("--quiet", action="store_true", help="no progress bars")
    c.set_defaults(func=cmd_capture)
    s = sub.add_parser("serve", help="serve the app (panel serve apps/trajscope.py)")
    s.add_argument("--port", type=int, default=5006)
    s.add_argument("--show", action="store_true")
    s.set_defaults(func=cmd_serve)
    r = sub.add_parser("report", help="standalone HTML comparison report of run directories")
    r.add_argument("runs", nargs="+", help="run directories (the first is the reference)")
    r.add_argument("-o", "--output", default="report.html")
    r.add_argument("--skip-bad", action="store_true", help="leave unreadable runs out (named in the report)")
    r.add_argument("--profile", default=None, help="prefill profile: adds drift by layer x depth for runs with residuals")
    r.set_defaults(func=cmd_report)
    e = sub.add_parser("export", help="Hive-partitioned Parquet dataset of many runs")
    e.add_argument("runs", nargs="+")
    e.add_argument("--out", required=True)
    e.add_argument("--partition-by", default="model,run_id", help="keys among model, run_id, family")
    e.set_defaults(func=cmd_export)
    from trajscope import cli_drift, cli_steer

    cli_steer.register(sub)
    cli_drift.register(sub)
    from trajscope import cli_sae
    cli_sae.register(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except TrajscopeError as exc:
        print(f"trajscope: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
