"""The ``trajscope`` command line, one module per command group.

- :mod:`trajscope.cli.capture`: ``capture`` (runs to run directories, optionally steered),
  ``serve`` (the app), ``report`` (standalone HTML comparison), ``export`` (Parquet dataset);
- :mod:`trajscope.cli.steer`: ``steer-sweep``, an alias of ``study steering`` (steering effect by start depth);
- :mod:`trajscope.cli.drift`: ``profile`` (the drift study's prefill profile) and ``drift``, an alias of
  ``study drift`` that also writes the profile and prints the decode-regime calibration report;
- :mod:`trajscope.cli.sae`: ``harvest``, ``train-sae`` and ``sae-drift``;
- :mod:`trajscope.studies.flags`: ``study NAME``, one subcommand per registered study (flags from its config);
- :mod:`trajscope.studies.eviction.cli`: ``eviction``, an alias of ``study eviction`` that also takes ``--runs``;
- :mod:`trajscope.reports.studies`: ``study-report`` (one offline HTML page of the studies in directories);
- :mod:`trajscope.cli.calibrate`: ``calibrate`` (the decode-regime calibration report, :mod:`trajscope.calibration`);
- :mod:`trajscope.cli.options`: the options they share, defined once, and the one place where
  parsed options become a :class:`~trajscope.capture.CaptureConfig`.

Command modules import :mod:`~trajscope.cli.options`, never each other. Every subcommand's
``--help`` has a description, its defaults and an example. Bad input prints one sentence on
stderr and exits with status 2; an unexpected failure prints one sentence and exits with 1.
``trajscope --debug COMMAND …`` (or ``TRAJSCOPE_DEBUG=1``) prints the traceback, with its
chained causes, after the sentence.
"""

from __future__ import annotations

import argparse
import os
import sys

from trajscope.reports import studies as report_studies
from trajscope.cli import calibrate, capture, drift, prepare, sae, steer
from trajscope.studies import flags as registered_studies
from trajscope.studies.eviction import cli as eviction_alias
from trajscope.errors import TrajscopeError, first_sentence

GROUPS = (capture, steer, drift, sae, prepare, eviction_alias, registered_studies, report_studies, calibrate)


def build_parser() -> argparse.ArgumentParser:
    """The ``trajscope`` parser with every command group registered."""
    ap = argparse.ArgumentParser(prog="trajscope", description="Step through LLM decode and measure drift from "
                                 "prefill. Run 'trajscope COMMAND --help' for a command's options and an example.")
    ap.add_argument("--debug", action="store_true", default=bool(os.environ.get("TRAJSCOPE_DEBUG")),
                    help="print the traceback (with its causes) after the one-sentence error")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in GROUPS:
        group.register(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except TrajscopeError as exc:
        print(f"trajscope: {exc}", file=sys.stderr)
        _traceback(args, exc)
        return 2
    except Exception as exc:  # not bad input: say what failed in one sentence; --debug has the rest
        print(f"trajscope: {args.command} failed unexpectedly: {type(exc).__name__}: {first_sentence(exc, 200)}"
              f"{'' if args.debug else ' (run with --debug for the traceback)'}.", file=sys.stderr)
        _traceback(args, exc)
        return 1


def _traceback(args: argparse.Namespace, exc: BaseException) -> None:
    if getattr(args, "debug", False):
        import traceback

        traceback.print_exception(exc, file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
