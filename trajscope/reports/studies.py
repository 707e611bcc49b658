"""Study report: the sections of every study found in one or more directories, as one offline HTML file.

A study writes its Parquet tables into a directory (``trajscope study … --out DIR``); one directory
may hold several studies (``sample_data/reports/serving`` holds all the serving studies). Every
study in the registry (:func:`trajscope.studies.registry.studies`) is **detected** by its result
marker or marker table (:meth:`~trajscope.studies.registry.Study.holds`) and rendered by its own
section from its :class:`~trajscope.studies.registry.Result`: ``(title, html, figures)`` — an
HTML fragment with the numbers, their 95 % intervals, setup, n and split, plus Bokeh figures.
A section that fails is reported in the page (with its one-sentence reason) instead of ending
the report.

:func:`study_report` writes the page through :func:`trajscope.reports.page.render` (BokehJS inline),
so it opens offline: no script, stylesheet or font is fetched. ``trajscope study-report DIR
[DIR …] --out FILE.html`` is the command.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
from typing import Any, Callable, Sequence

from trajscope.errors import TrajscopeError
from trajscope.escaping import html_text
from trajscope.studies.registry import Result, studies

SectionFn = Callable[[pathlib.Path], tuple[str, str, list]]


def sections() -> dict[str, SectionFn]:
    """Every study's section as a function of a folder, in registry order."""
    return {name: (lambda d, s=s: s.section(Result.load(d, s.name))) for name, s in studies().items()}


def marker(study: str) -> str:
    """The file whose presence says a directory holds ``study``, as an error message names it."""
    s = studies().get(study)
    return f"{study}.result.json or {(s.marker if s else None) or study + '_summary.parquet'}"


def detect(study_dir: str | os.PathLike) -> list[str]:
    """The studies whose output is in ``study_dir``, in :func:`sections` order."""
    d = pathlib.Path(study_dir)
    return [name for name, s in studies().items() if s.holds(d)]


def study_report(dirs: Sequence[str | os.PathLike], out_path: str | os.PathLike) -> pathlib.Path:
    """Write one standalone HTML page with a section per study found in ``dirs``.

    Args:
        dirs: study output directories.
        out_path: the HTML file to write.
    Returns:
        The path written.
    Raises:
        TrajscopeError: a directory is missing, or no directory holds a study.
    """
    from trajscope.reports.page import components, render

    if not dirs:
        raise TrajscopeError("Give at least one study directory.")
    found: list[tuple[pathlib.Path, str]] = []
    for d in map(pathlib.Path, dirs):
        if not d.is_dir():
            raise TrajscopeError(f"'{d}' is not a directory.")
        found += [(d, s) for s in detect(d)]
    if not found:
        raise TrajscopeError(f"No study tables found in {', '.join(map(str, dirs))}; expected files such as "
                             f"{', '.join(marker(s) for s in sections())} (written by 'trajscope study …').")
    parts: list[tuple[str, str, list]] = []
    failed: list[str] = []
    drawers = sections()
    for d, study in found:
        try:
            title, body, figs = drawers[study](d)
        except TrajscopeError as exc:
            failed.append(f"<li>{html_text(study)} in <code>{html_text(str(d))}</code>: {html_text(str(exc))}</li>")
            continue
        where = f" — <code>{html_text(d.name or str(d))}</code>" if len({x for x, _ in found}) > 1 else ""
        parts.append((f"<h2>{html_text(title)}{where}</h2>", body, list(figs)))
    figs = [f for _, _, fs in parts for f in fs]
    script, divs = components(figs)
    it = iter(divs)
    body = [f"<p class='note'>Studies: "
            f"{', '.join(html_text(s) for _, s in found)}; from {', '.join(html_text(str(d)) for d in dirs)}.</p>"]
    body += [head + text + "".join(next(it) for _ in fs) for head, text, fs in parts]
    if failed:
        body.append("<h2>Sections left out</h2><ul>" + "".join(failed) + "</ul>")
    out = pathlib.Path(out_path)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(render("trajscope study report", "\n".join(body), script), encoding="utf-8")
    except OSError as exc:
        raise TrajscopeError(f"Cannot write the report to '{out}': {exc.strerror or exc}.") from exc
    return out


def cmd_study_report(args: argparse.Namespace) -> int:
    path = study_report(args.dirs, args.out)
    print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB; studies: "
          f"{', '.join(s for d in args.dirs for s in detect(d))})", file=sys.stderr)
    return 0


def register(sub: Any) -> argparse.ArgumentParser:
    """Add ``study-report`` to the CLI's subparsers."""
    p = sub.add_parser("study-report", help="one offline HTML report of the studies in one or more directories",
                       description="Detect the studies in each directory by their Parquet tables and write one "
                                   "standalone HTML report (opens offline) with a section per study.",
                       epilog="example: trajscope study-report sample_data/reports/serving --out serving.html",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("dirs", nargs="+", help="study output directories ('trajscope study … --out DIR')")
    p.add_argument("--out", required=True, help="HTML file to write")
    p.set_defaults(func=cmd_study_report)
    return p
