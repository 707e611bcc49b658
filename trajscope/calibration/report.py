"""The calibration report as one offline HTML page, plus ``summary.json``.

The page opens with the verdict table (:mod:`trajscope.calibration.verdict`; each cell links to its section
and the rules are printed under it), then section 1 (the model and the data method: model, dtype,
attention implementation, prompts by source file, each study's split, serving settings) and one section per
question (:data:`trajscope.calibration.plan.SECTIONS`). A question's section is its studies' own report
sections, each rendered by the study from the Result on disk: no number is recomputed here. A study that
was not run says why (no artefact, the budget, or its one-sentence failure).

The page holds no wall time or date and is drawn by :func:`trajscope.reports.page.render` (Bokeh ids renumbered,
the custom-model definitions of whatever the process imported left out), so the same Results always give the
same bytes: a report resumed after a kill equals one run straight through.
BokehJS is inline; nothing is fetched.
"""

from __future__ import annotations

import json
import pathlib
from collections import Counter
from typing import Any, Sequence

from trajscope.calibration.inputs import Inputs
from trajscope.calibration.plan import SECTIONS, study_of
from trajscope.calibration.runner import JobState
from trajscope.calibration.verdict import MIN_FILES, MIN_PROMPTS, RULES, Verdict, verdicts
from trajscope.escaping import html_text
from trajscope.studies.registry import Result

REPORT = "report.html"
SUMMARY = "summary.json"
STYLE = """<style>
table.verdicts td.transfers { background: #dff3df; } table.verdicts td.degrades { background: #fff2cc; }
table.verdicts td.fails { background: #fde2e2; } table.verdicts td.undecided { background: #eeeeee; }
table.verdicts a { color: inherit; }
</style>"""


def _results(states: Sequence[JobState], out: pathlib.Path) -> list[tuple[JobState, Result]]:
    return [(s, Result.load(out / s.job.folder, s.job.study)) for s in states if s.state in ("done", "resumed")]


def _verdict_table(rows: Sequence[Verdict]) -> str:
    if not rows:
        return "<p class='note'>No SAE, steering vector or monitor was judged (none given, shipped or run).</p>"
    head = "<tr><th>artefact</th><th>kind</th><th>regime</th><th>verdict</th><th>evidence</th></tr>"
    body = "".join(
        f"<tr><td>{html_text(v.artefact)}</td><td>{html_text(v.kind)}</td><td>{html_text(v.regime)}</td>"
        f"<td class='{html_text(v.verdict)}'><a href='#sec-{html_text(v.section)}'>{html_text(v.verdict)}</a></td>"
        f"<td>{html_text(v.evidence)}</td></tr>" for v in rows)
    kinds = sorted({v.kind for v in rows})
    rules = "".join(f"<li><b>{html_text(k)}</b>: {html_text(RULES[k])}.</li>" for k in kinds)
    counts = Counter(v.verdict for v in rows)
    tally = ", ".join(f"{counts[k]} {k}" for k in ("transfers", "degrades", "fails", "undecided") if counts[k])
    return (f"<table class='verdicts'>{head}{body}</table><p class='note'>{html_text(tally)}. Rules (95 % intervals "
            f"as each study reports them; 'undecided' means the interval is too wide to decide, or fewer than "
            f"{MIN_PROMPTS} prompts ({MIN_FILES} source files for intervals over files): n too small):</p>"
            f"<ul class='note'>{rules}</ul>")


def _method(inputs: Inputs, model: dict[str, Any], results: Sequence[tuple[JobState, Result]], quick: bool) -> str:
    from trajscope.studies.monitor.config import file_of

    files = Counter(file_of(r["id"]) for r in inputs.records)
    rows = "".join(f"<tr><td>{html_text(f)}</td><td>{n}</td></tr>" for f, n in sorted(files.items()))
    facts = "".join(f"<tr><th>{html_text(k)}</th><td>{html_text(v)}</td></tr>" for k, v in model.items())
    given = []
    for kind, items in (("SAE", inputs.saes), ("steering vector", inputs.vectors),
                        ("drift profile", [inputs.profile] if inputs.profile else [])):
        src = "shipped with the model" if {"SAE": "sae", "steering vector": "vector",
                                            "drift profile": "profile"}[kind] in inputs.shipped else "given"
        given.append(f"<li>{html_text(kind)}: " + (", ".join(f"<code>{html_text(_shown(p))}</code>" for p in items) + f" ({src})"
                                                     if items else "none") + "</li>")
    splits = []
    for state, res in results:
        split = res.summaries.get("split")
        if isinstance(split, dict):
            text = "; ".join(f"{k}: {_brief(v)}" for k, v in split.items() if v not in (None, [], {}))
            splits.append(f"<li><b>{html_text(state.job.key)}</b>: {html_text(text)}</li>")
    seen_here = sorted(set(inputs.seen_files) & set(files))
    if inputs.seen_files:
        given.append(f"<li>fitted on {len(inputs.seen_files)} source files, as the artefacts record it; of the prompt "
                     f"files, {html_text(', '.join(seen_here) or 'none')}: the SAE, steering-success and monitor "
                     "studies evaluate on the other files</li>")
    split_html = ("<p>Splits the studies report (held-out by source file where they split):</p><ul>"
                  + "".join(splits) + "</ul>") if splits else ""
    src = "shipped with the model" if "prompts" in inputs.shipped else "given"
    return (f"<table>{facts}</table><p>Mode: {'quick (each study on its quick settings)' if quick else 'full'}. "
            f"Serving: one sequence at a time, no batching, no prefix cache, no chunked prefill (the serving studies "
            f"measure those).</p>"
            f"<p>Prompts: {len(inputs.records)} from {len(files)} source files ({src}: "
            f"{', '.join(html_text(_shown(p)) for p in inputs.prompt_files)}); the set measured is <code>prompts.jsonl</code>."
            f"</p><table><tr><th>source file</th><th>prompts</th></tr>{rows}</table><p>Artefacts:</p><ul>"
            + "".join(given) + f"</ul>{split_html}")


def _brief(value: Any) -> str:
    """A split entry in a line: short lists in full, long ones and dicts by their sizes."""
    if isinstance(value, dict):
        return ", ".join(f"{k} {_brief(v)}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return ", ".join(map(str, value)) if len(value) <= 6 else f"{len(value)} items"
    return str(value)


def _shown(path: Any) -> str:
    """A path as the page shows it: relative to the working directory when it lies below it."""
    p = pathlib.Path(str(path))
    try:
        return str(p.resolve().relative_to(pathlib.Path.cwd().resolve()))
    except (ValueError, OSError):
        return str(p)


def _not_run(state: JobState) -> str:
    what = {"missing": "not run", "budget": "not run", "failed": "failed", "pending": "not run"}.get(state.state, state.state)
    return (f"<p class='note'><b>{html_text(state.job.key)}</b> {what}: {html_text(state.why)}.</p>")


def write(out: pathlib.Path, inputs: Inputs, model: dict[str, Any], states: Sequence[JobState],
          quick: bool) -> tuple[pathlib.Path, dict[str, Any]]:
    """Write ``report.html`` and ``summary.json`` into ``out``; returns the page's path and the summary."""
    from trajscope.io import atomic_write_text
    from trajscope.reports.page import bokeh_js, components, render

    results = _results(states, out)
    rows = verdicts([(s.job.study, s.job.key, s.job.label, r) for s, r in results])
    parts: list[tuple[str, list]] = []
    for sec in SECTIONS:
        mine = [s for s in states if s.job.section == sec.key]
        html = [f"<h2 id='sec-{sec.key}'>{html_text(sec.title)}</h2><p><i>{html_text(sec.question)}</i></p>"]
        figs: list = []
        if not mine:
            html.append("<p class='note'>No registered study answers this here.</p>")
        for state in mine:
            if state.state not in ("done", "resumed"):
                html.append(_not_run(state))
                continue
            res = next(r for s, r in results if s is state)
            try:
                title, body, f = study_of(state.job).section(res)
            except Exception as exc:  # a section that cannot render is reported, not fatal
                html.append(f"<p class='note'>{html_text(state.job.key)}: its section could not be drawn "
                            f"({html_text(type(exc).__name__)}: {html_text(str(exc)[:200])}).</p>")
                continue
            html.append(f"<h3 id='job-{html_text(state.job.key)}'>{html_text(title)} — "
                        f"<code>{html_text(state.job.folder)}</code></h3>{body}")
            figs += list(f)
        parts.append(("".join(html), figs))
    allfigs = [f for _, fs in parts for f in fs]
    script, divs = components(allfigs)
    it = iter(divs)
    body = [f"<h2 id='verdicts'>Verdicts</h2>{_verdict_table(rows)}",
            f"<h2 id='sec-method'>1. Model and data</h2>{_method(inputs, model, results, quick)}"]
    body += [text + "".join(next(it) for _ in fs) for text, fs in parts]
    title = f"Decode-regime calibration report — {inputs.model}"
    page = render(title, "\n".join(body), script, resources=bokeh_js() + STYLE)
    path = out / REPORT
    atomic_write_text(path, page)
    summary = {"model": model, "inputs": inputs.describe(), "quick": quick,
               "verdicts": [v.__dict__ for v in rows],
               "studies": {s.job.key: {"study": s.job.study, "section": s.job.section, "state": s.state, "why": s.why,
                                       "summaries": r.summaries if r is not None else None}
                           for s, r in [(s, next((r for x, r in results if x is s), None)) for s in states]}}
    atomic_write_text(out / SUMMARY, json.dumps(summary, indent=1, default=str, ensure_ascii=False))
    return path, summary
