"""``trajscope capture | serve | report | export``: capture runs, serve the app, compare and export runs.

``capture`` runs one prompt (``--prompt``) or a JSON-lines file of prompts
(``--prompts``; a line may hold chat ``messages`` instead of a ``prompt``; ``--chat`` sends each
plain prompt as one user message through the model's chat template), optionally steered (``--steer FILE``), and writes one run
directory per prompt under ``--out`` (``--batch-size N`` decodes N prompts together, padded on
``--padding-side``: :mod:`trajscope.capture.batch`; names made safe: a prompt id such as
``a/b:c`` becomes ``a_b_c``; the id itself stays in ``meta.json``), so the folder
reads as one dataset (``pl.scan_parquet("OUT/*/attention.parquet")``). Two ids that
become the same name (``a/b:c`` and ``a_b_c``) both survive: the second gets a suffix
(``a_b_c-2``) and a one-line note says so (:func:`~trajscope.cli.options.RunNames`). A progress
bar follows the decode steps; Ctrl-C saves the steps captured so far and stops.

``report`` and ``export`` take run directories or folders of them, searched recursively
(:func:`trajscope.io.find_runs`): ``trajscope export runs --out ds`` exports every run
under ``runs/``. ``export`` is atomic (:func:`trajscope.export.export`): a corrupt run
stops it with one sentence and leaves no partial dataset, or, with ``--skip-bad``, is
left out and named.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import threading

from trajscope.cli import options as opt
from trajscope.errors import TrajscopeError


def cmd_capture(args: argparse.Namespace) -> int:
    from tqdm.auto import tqdm

    from trajscope.capture import capture
    from trajscope.prompts import read_prompts

    if (args.prompt is None) == (args.prompts is None):
        raise TrajscopeError("Give exactly one of --prompt TEXT or --prompts FILE.jsonl.")
    items = [{"prompt": args.prompt}] if args.prompt is not None else read_prompts(args.prompts, chat=True)
    if args.chat:
        from trajscope.chat import user_message

        items = [{**it, "messages": user_message(it.pop("prompt"))} if "prompt" in it else it for it in items]
    out = opt.out_dir(args.out)
    config = opt.capture_config(args)
    model = opt.load(args)
    if args.batch_size != 1:
        return _capture_batched(args, items, config, model, out)
    names = opt.RunNames(out)
    interrupted = False
    outer = tqdm(items, desc="prompts", unit="prompt", disable=len(items) == 1 or args.quiet)
    for i, item in enumerate(outer):
        cfg = config.replace(max_new_tokens=int(item.get("max_new_tokens", config.max_new_tokens)),
                             seed=int(item.get("seed", config.seed)))
        bar = tqdm(total=cfg.max_new_tokens, desc=f"prompt {i + 1}/{len(items)}", unit="step", leave=False,
                   disable=args.quiet)

        def on_step(ev, bar=bar):
            bar.update(1)
            bar.set_postfix_str(repr(ev.text)[:24])

        try:
            traj = capture(model, _prompt(item), cfg, on_step=on_step, cancel=threading.Event(),
                           run_id=str(item["id"]) if item.get("id") is not None else None)
        finally:
            bar.close()
        path = traj.save(names.path(traj.run_id))
        print(f"{path}  ({traj.meta['n_generated']} tokens, stop: {traj.meta['stop_reason']})", file=sys.stderr)
        if traj.meta["stop_reason"] == "interrupted":
            interrupted = True
            break
    if interrupted:
        print("Interrupted: the steps captured so far were saved.", file=sys.stderr)
        return 130
    return 0


def _prompt(item: dict):
    """What capture takes for a prompt-file item: its chat messages, or its prompt text."""
    return item["messages"] if "messages" in item else item["prompt"]


def _capture_batched(args: argparse.Namespace, items: list[dict], config, model, out: pathlib.Path) -> int:
    """``--batch-size N > 1``: :func:`trajscope.capture.batch.capture_batch`, one batch at a time, each batch's
    runs saved as soon as it finishes (Ctrl-C keeps the finished batches)."""
    from tqdm.auto import tqdm

    from trajscope.capture.batch import capture_batch

    if any("max_new_tokens" in item or "seed" in item for item in items):
        raise TrajscopeError("A batched capture shares one max_new_tokens and seed; remove them from the prompt "
                             "file or use --batch-size 1.")
    n = args.batch_size
    names = opt.RunNames(out)
    bar = tqdm(total=len(items), desc="prompts", unit="prompt", disable=args.quiet)
    try:
        for start in range(0, len(items), n):
            group = items[start:start + n]
            trajs = capture_batch(model, [_prompt(item) for item in group], config, batch_size=n,
                                  padding_side=args.padding_side,
                                  run_ids=[str(it["id"]) if it.get("id") is not None else None for it in group])
            for traj in trajs:
                path = traj.save(names.path(traj.run_id))
                print(f"{path}  ({traj.meta['n_generated']} tokens, stop: {traj.meta['stop_reason']})", file=sys.stderr)
            bar.update(len(group))
    except KeyboardInterrupt:
        print("Interrupted: the finished batches were saved.", file=sys.stderr)
        return 130
    finally:
        bar.close()
    return 0


# the operator's options (trajscope/ui/operator.py), passed to the app after ``--args``
OPERATOR_OPTIONS = ("data_dir", "models", "max_new_tokens", "max_models", "max_generations", "max_sessions",
                    "max_prompt_chars", "capture_threads")


def serve_command(args: argparse.Namespace) -> list[str]:
    """The ``panel serve`` command line of ``trajscope serve``: local address unless told, operator options."""
    app = pathlib.Path(__file__).resolve().parents[2] / "apps" / "trajscope.py"
    if not app.exists():
        raise TrajscopeError(f"The app file is missing: {app}.")
    cmd = [sys.executable, "-m", "panel", "serve", str(app), "--address", args.address, "--port", str(args.port)]
    for origin in args.allow_websocket_origin or ():
        cmd += ["--allow-websocket-origin", origin]
    if args.prefix:
        cmd += ["--prefix", args.prefix]
    if args.show:
        cmd.append("--show")
    extra = []
    for name in OPERATOR_OPTIONS:
        value = getattr(args, name)
        for v in (value if isinstance(value, list) else [value]) if value is not None else ():
            extra += [f"--{name.replace('_', '-')}", str(v)]
    return cmd + (["--args", *extra] if extra else [])


def cmd_serve(args: argparse.Namespace) -> int:
    import subprocess

    cmd = serve_command(args)
    host = "localhost" if args.address in ("127.0.0.1", "localhost", "::1") else args.address
    print(f"serving the app at http://{host}:{args.port}{args.prefix or ''}/trajscope (Ctrl-C stops it)",
          file=sys.stderr)
    if args.show:
        print("--show asks for a browser; on a machine without a display none opens: open the address above.",
              file=sys.stderr)
    return subprocess.call(cmd)  # (the app file sets the served process's environment: ui/serving_env.py)


def cmd_report(args: argparse.Namespace) -> int:
    from trajscope.io import find_runs
    from trajscope.reports.comparison import compare
    from trajscope.reports.studies import detect, study_report

    studies = [d for d in args.runs if pathlib.Path(d).is_dir() and detect(d)]
    if studies and len(studies) == len(args.runs):  # folders of registered studies' output: their sections
        path = study_report(studies, args.output)
        print(f"{path}  ({opt.plural(len(studies), 'study folder')}: "
              f"{', '.join(sorted({s for d in studies for s in detect(d)}))})", file=sys.stderr)
        return 0
    if studies:
        raise TrajscopeError(f"'{studies[0]}' holds a study's output and the other paths hold runs; give run "
                             "directories for a comparison report, or study folders for the studies' report.")
    comp = compare(find_runs(args.runs), skip_bad=args.skip_bad, profile=args.profile)
    if args.profile and "drift_by_depth" not in comp.tables():
        print("note: --profile adds the drift section only for runs that kept residuals "
              "(capture them with --residual-layers all); none of these did.", file=sys.stderr)
    path = comp.save(args.output)
    for run, reason in comp.skipped:
        print(f"left out {run}: {reason}", file=sys.stderr)
    print(f"{path}  ({opt.plural(len(comp.runs), 'run')}; tables in {path.stem}_files/)", file=sys.stderr)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from trajscope.export import export
    from trajscope.io import find_runs

    from trajscope.leftovers import is_temporary

    runs, skipped = [r for r in find_runs(args.runs) if not is_temporary(r)], []
    on_skip = (lambda run, reason: skipped.append((run, reason))) if args.skip_bad else None
    out = export(runs, args.out, partition_by=tuple(args.partition_by.split(",")), progress=not args.quiet,
                 on_skip=on_skip)
    for run, reason in skipped:
        print(f"left out {run}: {reason}", file=sys.stderr)
    keys = "/".join(k + "=..." for k in args.partition_by.split(","))
    print(f"{out}/<table>/{keys}/part-N.parquet  ({opt.plural(len(runs) - len(skipped), 'run')})", file=sys.stderr)
    return 0


def register(sub) -> None:
    """Add ``capture``, ``serve``, ``report`` and ``export``."""
    c = opt.command(sub, "capture", "capture runs to run directories",
                    "Generate a continuation of each prompt and record every step (tokens, attention telemetry, "
                    "activation statistics; tensors of the layers you name) as one run directory per prompt.",
                    "trajscope capture --prompt 'def fibonacci(n):' --max-new-tokens 64 --out runs/base")
    opt.add_model(c, remote=True)
    c.add_argument("--prompt", help="one prompt")
    c.add_argument("--prompts", help="JSON-lines file of prompts ({\"prompt\": ..., \"id\": ...} per line, or "
                   "{\"messages\": [{\"role\": \"user\", \"content\": ...}], ...} for a chat prompt), "
                   "e.g. sample_data/prompts/heldout_code.jsonl")
    c.add_argument("--chat", action="store_true", help="send each plain prompt as one user message through the "
                   "model's chat template (for instruction-tuned models such as smollm2)")
    opt.add_sampling(c)
    opt.add_layers(c)
    opt.add_steering(c)
    c.add_argument("--batch-size", type=int, default=1, help="prompts decoded together in one padded batch "
                   "(greedy, unsteered; per prompt equal to batch 1 within the float32 floor)")
    c.add_argument("--padding-side", choices=("left", "right"), default="left", help="padding of those batches")
    opt.add_out(c, "folder that receives one run directory per prompt")
    opt.add_quiet(c)
    c.set_defaults(func=cmd_capture)
    s = opt.command(sub, "serve", "serve the app (panel serve apps/trajscope.py)",
                    "Serve the interactive app on this machine.", "trajscope serve --port 5006")
    s.add_argument("--port", type=int, default=5006, help="port to listen on")
    s.add_argument("--address", default="127.0.0.1", help="address to listen on: this machine only unless you "
                   "name another (0.0.0.0: every interface; then restrict --allow-websocket-origin)")
    s.add_argument("--allow-websocket-origin", action="append", default=None, metavar="HOST[:PORT]",
                   help="host a browser may open the page from (repeatable; default: localhost:PORT only)")
    s.add_argument("--prefix", default=None, help="URL prefix, behind a reverse proxy (e.g. /trajscope-app)")
    s.add_argument("--show", action="store_true", help="also open a browser (if this machine has one)")
    s.add_argument("--data-dir", action="append", default=None, metavar="DIR",
                   help="directory browsers may read (repeatable; default sample_data/ and the runs directory)")
    s.add_argument("--models", default=None, help="models Generate may load, comma-separated (default: sample)")
    s.add_argument("--max-new-tokens", type=int, default=None, help="cap on one generation's length (default 1000)")
    s.add_argument("--max-models", type=int, default=None, help="models kept loaded (default 2)")
    s.add_argument("--max-generations", type=int, default=None,
                   help="generations at once, steering and sweeps included (default 1)")
    s.add_argument("--max-sessions", type=int, default=None, help="open pages (default 20)")
    s.add_argument("--max-prompt-chars", type=int, default=None, help="characters of a prompt (default 5000)")
    s.add_argument("--capture-threads", type=int, default=None,
                   help="CPU threads of each capture the app runs (default: every core PyTorch uses)")
    s.set_defaults(func=cmd_serve)
    r = opt.command(sub, "report", "standalone HTML comparison report of run directories (or of study folders)",
                    "Compare runs (the first is the reference) in one offline HTML file plus its Parquet tables. "
                    "Given folders that hold registered studies' output instead (trajscope study ... --out DIR), it "
                    "writes their sections, as trajscope study-report does.",
                    "trajscope report runs/base/* runs/steered/* -o report.html")
    r.add_argument("runs", nargs="+", help="run directories, or folders searched below for them (the first run "
                   "is the reference)")
    r.add_argument("-o", "--output", default="report.html", help="the HTML file to write")
    r.add_argument("--skip-bad", action="store_true", help="leave unreadable runs out (named in the report)")
    r.add_argument("--profile", default=None, help="prefill profile: adds drift by layer x depth for runs that "
                   "kept residuals (a note says so when none did)")
    r.set_defaults(func=cmd_report)
    e = opt.command(sub, "export", "Hive-partitioned Parquet dataset of many runs",
                    "Write the tables of many run directories as one schema-versioned Parquet dataset.",
                    "trajscope export runs/* --out dataset/")
    e.add_argument("runs", nargs="+", help="run directories, or folders searched below for them")
    opt.add_out(e, "dataset root")
    e.add_argument("--partition-by", default="model,run_id", help="keys among model, run_id, family")
    e.add_argument("--skip-bad", action="store_true", help="leave unreadable runs out (named on stderr)")
    opt.add_quiet(e)
    e.set_defaults(func=cmd_export)
