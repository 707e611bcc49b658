"""``trajscope calibrate``: the decode-regime calibration report in one command (:mod:`trajscope.calibration`)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import typing
from typing import Any

from trajscope.errors import TrajscopeError
from trajscope.studies.flags import number


def parse_settings(items: list[str]) -> dict[str, dict[str, Any]]:
    """``["steering.depths=1,8", "monitor.n_boot=200"]`` → per-study overrides, each value typed as the study's
    flag would type it (one sentence for an unknown study or field, or a bad value)."""
    from trajscope.studies.flags import _flag_kwargs
    from trajscope.studies.registry import get

    out: dict[str, dict[str, Any]] = {}
    for item in items:
        key, sep, value = item.partition("=")
        study_name, dot, field = key.partition(".")
        if not sep or not dot or not field:
            raise TrajscopeError(f"--set takes STUDY.FIELD=VALUE (for example steering.depths=1,8), not '{item}'.")
        field = field.replace("-", "_")
        if field in ("max_prompts", "max_tokens"):
            try:
                out.setdefault(study_name, {})[field] = int(value)
            except ValueError:
                raise TrajscopeError(f"--set {key} takes a whole number, not '{value}'.") from None
            continue
        study = get(study_name)
        fields = {f.name: f for f in dataclasses.fields(study.config)}
        if field not in fields:
            raise TrajscopeError(f"The {study_name} study has no setting '{field}'; its settings are "
                                 f"{', '.join(sorted(fields))}.")
        kw = _flag_kwargs(fields[field], typing.get_type_hints(study.config)[field])
        try:
            if kw.get("action") == "store_true":
                typed: Any = value.strip().lower() in ("1", "true", "yes", "on")
            else:
                typed = kw["type"](value) if "type" in kw else value
        except (ValueError, argparse.ArgumentTypeError) as exc:
            raise TrajscopeError(f"--set {key}: {exc}.") from None
        out.setdefault(study_name, {})[field] = typed
    return out


def cmd_calibrate(args: argparse.Namespace) -> int:
    from trajscope.calibration import calibrate

    result = calibrate(args.model, args.out, prompts=args.prompts or (), saes=args.sae or (),
                       vectors=args.vector or (), profile=args.profile, budget_minutes=args.budget, quick=args.quick,
                       settings=parse_settings(args.set or []), threads=args.threads,
                       only=tuple(t.strip() for t in (args.only or "").split(",") if t.strip()))
    counts: dict[str, int] = {}
    for v in result.verdicts:
        counts[v["verdict"]] = counts.get(v["verdict"], 0) + 1
    ran = sum(s.state in ("done", "resumed") for s in result.states)
    print(f"{result.report}  ({ran} of {len(result.states)} studies; verdicts: "
          + (", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "none") + ")", file=sys.stderr)
    return 0


def register(sub: Any) -> argparse.ArgumentParser:
    """Add ``calibrate`` to the CLI's subparsers."""
    p = sub.add_parser(
        "calibrate", help="the decode-regime calibration report: do an SAE, a steering vector and a monitor fitted "
                          "on prefill hold in decode?",
        description="Run the registered studies that apply to the model and the artefacts given (or the model's "
                    "shipped ones) and write one offline HTML report with a verdict table, plus the studies' Parquet "
                    "tables and summary.json. A second call into the same --out resumes: finished studies are not "
                    "run again.",
        epilog="example: trajscope calibrate --model smollm2 --quick --out calib/",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", default="smollm2", help="'smollm2', 'sample', a model directory or a cached name")
    p.add_argument("--prompts", nargs="+", default=None,
                   help="JSON-lines prompt files (default: the model's shipped evaluation prompts)")
    p.add_argument("--sae", nargs="+", default=None, help="SAE directories (default: the model's shipped SAEs)")
    p.add_argument("--vector", nargs="+", default=None, help="steering vector files (default: the shipped ones)")
    p.add_argument("--profile", default=None, help="drift profile (default: the model's shipped profile)")
    p.add_argument("--budget", type=number, default=None, help="minutes after which no further study starts")
    p.add_argument("--quick", action="store_true", help="each study on its quick settings (minutes, not an hour)")
    p.add_argument("--set", action="append", default=None, metavar="STUDY.FIELD=VALUE",
                   help="a study setting, e.g. steering.depths=1,8 (repeatable)")
    p.add_argument("--only", default=None, metavar="STUDY,…", help="run only these studies (default: all that apply)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's)")
    p.add_argument("--out", required=True, help="output folder (report.html, summary.json, studies/)")
    p.set_defaults(func=cmd_calibrate)
    return p
