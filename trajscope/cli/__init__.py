"""The ``trajscope`` command line, one module per command group.

- :mod:`trajscope.cli.capture`: ``capture`` (runs to run directories, optionally steered),
  ``serve`` (the app), ``report`` (standalone HTML comparison), ``export`` (Parquet dataset);
- :mod:`trajscope.cli.steer`: ``steer-sweep`` (steering effect by start depth);
- :mod:`trajscope.cli.drift`: ``profile`` and ``drift`` (the decode-regime calibration report);
- :mod:`trajscope.cli.sae`: ``harvest``, ``train-sae`` and ``sae-drift``;
- :mod:`trajscope.cli.studies`: ``eviction`` (the KV-eviction study);
- :mod:`trajscope.studies.cli`: ``study batch | determinism | chunked-prefill | prefix-cache | sae-stability``
  (serving artefacts);
- :mod:`trajscope.report_studies`: ``study-report`` (one offline HTML page of the studies in directories);
- :mod:`trajscope.cli.options`: the options they share, defined once, and the one place where
  parsed options become a :class:`~trajscope.capture.CaptureConfig`.

Command modules import :mod:`~trajscope.cli.options`, never each other. Every subcommand's
``--help`` has a description, its defaults and an example. Bad input prints one sentence on
stderr and exits with status 2.
"""

from __future__ import annotations

import argparse
import sys

from trajscope import report_studies
from trajscope.cli import capture, drift, prepare, sae, steer, studies
from trajscope.studies import cli as serving_studies
from trajscope.errors import TrajscopeError

GROUPS = (capture, steer, drift, sae, prepare, studies, serving_studies, report_studies)


def build_parser() -> argparse.ArgumentParser:
    """The ``trajscope`` parser with every command group registered."""
    ap = argparse.ArgumentParser(prog="trajscope", description="Step through LLM decode and measure drift from "
                                 "prefill. Run 'trajscope COMMAND --help' for a command's options and an example.")
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
        return 2


if __name__ == "__main__":
    sys.exit(main())
