"""The monitor study's report section: read from its Result only (nothing is recomputed from a model).

States the question, the planted shifts, the split (files and n of each part), one row per
(arm, monitor) with AUROC [95% bootstrap over prompts], the detected share, the Kaplan–Meier
median time-to-detect and the held-out false-positive rate [Wilson], each monitor's AUROC against the
drift monitor's on the same runs (paired), each shifted arm's AUROC against its own null arm, what the numbers do not show, and one figure: AUROC by
arm per monitor.
"""

from __future__ import annotations

import math
from typing import Any

import polars as pl

from trajscope.errors import TrajscopeError
from trajscope.escaping import html_text
from trajscope.studies.registry import Result
from trajscope.studies.serving.sections import ci, num


def _steps(v: Any) -> str:
    return "not reached" if v is None or (isinstance(v, float) and math.isinf(v)) else num(v)


def _ttd(r: dict) -> str:
    if r["n_shifted"] == 0 or r["ttd_median"] is None or (isinstance(r["ttd_median"], float) and math.isnan(r["ttd_median"])):
        return "–"
    return f"{_steps(r['ttd_median'])} [{_steps(r['ttd_lo'])}, {_steps(r['ttd_hi'])}]"


def summary_rows(summary: pl.DataFrame) -> str:
    """The summary as HTML table rows (one per arm and monitor)."""
    head = ("<tr><th>shift</th><th>monitor</th><th>n prompts</th><th>AUROC [95% CI]</th><th>detected</th>"
            "<th>time-to-detect, steps (KM median [95% CI])</th><th>FPR held-out [Wilson 95%]</th>"
            "<th>FPR fitting runs</th></tr>")
    rows = []
    for r in summary.iter_rows(named=True):
        cells = [html_text(r["label"]), html_text(r["monitor"]), num(r["n_prompts"]),
                 ci(r["value"], r["lo"], r["hi"], r["n_prompts"]), f"{r['n_detected']}/{r['n_shifted']}", _ttd(r),
                 f"{ci(r['fpr_heldout'], r['fpr_heldout_lo'], r['fpr_heldout_hi'])} (n = {r['n_heldout_runs']})",
                 f"{num(r['fpr_fit'])} (n = {r['n_fit_runs']})"]
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    return f"<div class='scroll'><table>{head}{''.join(rows)}</table></div>"


def pairs_rows(pairs: pl.DataFrame) -> str:
    """Each monitor's AUROC minus the reference monitor's, per arm, as an HTML table."""
    if pairs.height == 0:
        return ""
    ref = html_text(str(pairs["reference"][0]))
    head = f"<tr><th>shift</th><th>monitor</th><th>n prompts</th><th>AUROC − AUROC({ref}) [95% CI]</th></tr>"
    rows = "".join(f"<tr><td>{html_text(r['label'])}</td><td>{html_text(r['monitor'])}</td><td>{num(r['n_prompts'])}</td>"
                   f"<td>{ci(r['value'], r['lo'], r['hi'], r['n_prompts'])}</td></tr>" for r in pairs.iter_rows(named=True))
    return (f"<p>Each monitor against the prefill-calibrated {ref} monitor on the same runs (paired bootstrap over "
            f"prompts): an interval that excludes 0 says the two differ.</p><div class='scroll'><table>{head}{rows}"
            "</table></div>")


def null_rows(vs_null: pl.DataFrame) -> str:
    """Each shifted arm's AUROC against its own null arm, per monitor, as an HTML table (empty without rows)."""
    if vs_null.height == 0:
        return ""
    head = "<tr><th>shift</th><th>null</th><th>monitor</th><th>n prompts</th><th>AUROC vs null [95% CI]</th></tr>"
    rows = "".join(f"<tr><td>{html_text(r['label'])}</td><td>{html_text(r['null'])}</td><td>{html_text(r['monitor'])}"
                   f"</td><td>{num(r['n_prompts'])}</td><td>{ci(r['value'], r['lo'], r['hi'], r['n_prompts'])}</td></tr>"
                   for r in vs_null.iter_rows(named=True))
    return ("<p>Each shifted arm against its own null arm on the same prompts (same seed; topic and forced share "
            "the replay's first k tokens): an interval above 0.5 says the monitor sees the shift beyond what the "
            f"machinery that carries it does.</p><div class='scroll'><table>{head}{rows}</table></div>")


def auroc_figure(summary: pl.DataFrame) -> Any:
    """AUROC per arm (x: the arm's label, in the summary's order), one marker per monitor (whiskers: the 95%
    interval), chance dashed."""
    from bokeh.models import ColumnDataSource, Span, Whisker
    from bokeh.palettes import Category10_10
    from bokeh.plotting import figure
    from bokeh.transform import dodge

    labels = summary.sort("order")["label"].unique(maintain_order=True).to_list()
    monitors = summary["monitor"].unique(maintain_order=True).to_list()[:10]
    fig = figure(title="Detection AUROC by shift (evaluate prompts)", width=760, height=320, x_range=labels,
                 x_axis_label="shifted arm", y_axis_label="AUROC (shifted vs clean runs)", y_range=(0, 1.05))
    width = 0.8 / max(1, len(monitors))
    for i, m in enumerate(monitors):
        g = summary.filter(pl.col("monitor") == m).sort("order")
        src = ColumnDataSource({"label": g["label"].to_list(),
                                **{c: g[c].fill_nan(None).to_list() for c in ("value", "lo", "hi")}})
        x = dodge("label", -0.4 + width * (i + 0.5), range=fig.x_range)
        color = Category10_10[i % 10]
        fig.scatter(x=x, y="value", source=src, color=color, size=7, legend_label=m)
        fig.add_layout(Whisker(source=src, base=x, lower="lo", upper="hi", line_color=color))
    fig.add_layout(Span(location=0.5, dimension="width", line_dash="dashed", line_color="black"))
    fig.xaxis.major_label_orientation = 0.5
    fig.legend.location = "bottom_right"
    fig.legend.click_policy = "hide"
    return fig


def shift_text(cfg: dict, vec: dict | None) -> str:
    """The planted shifts in words (escaped), from the Result's config and setup."""
    kinds = list(cfg.get("shifts") or ["steer"])
    parts = []
    if "steer" in kinds and vec:
        parts.append(f"<i>steer</i>: steering vector {html_text(str(vec.get('name', '?')))} "
                     f"({html_text(str(cfg.get('vector')))}, layer {num(vec.get('layer'))}) added at strength s "
                     "from step k; at s = 0 the arms differ only by seed (its null)")
    if "topic" in kinds:
        parts.append(f"<i>topic</i>: the tokens produced from step k are forced to the switch text "
                     f"“{html_text(str(cfg.get('switch_text')))}”, then the model continues freely")
    if "forced" in kinds:
        parts.append(f"<i>forced</i>: {num(cfg.get('forced_tokens'))} tokens drawn uniformly from the vocabulary "
                     "are forced from step k, then free generation")
    if {"topic", "forced"} & set(kinds):
        parts.append("<i>replay</i> (their null): the run's first k tokens and then free generation, through the "
                     "same two captures, nothing forced; a forced token first enters as the query of step k + 1")
    return "Arms: " + "; ".join(parts) + ". "


def section(result: Result) -> tuple[str, str, list]:
    """``(title, html, figures)`` of the monitor study."""
    summary = result.table("monitor_summary")
    cfg, split, setup = result.config, result.summaries.get("split", {}), result.summaries.get("setup", {})
    vec = setup.get("vector") or {}
    files = {p: ", ".join(split.get(f"{p}_files", [])) for p in ("fit", "evaluate")}
    intro = (
        "<p><b>Question.</b> A monitor tuned on prefill (the drift profile, an SAE) or on clean decode (attention "
        "telemetry): does it catch a shift planted into decode, and how fast, at a fixed false-positive rate?</p>"
        f"<p class='note'><b>Setup.</b> Model {html_text(setup.get('model_id', '?'))}. Shifts from decode step k = "
        f"{num(cfg.get('start_step'))}; {num(cfg.get('new_tokens'))} tokens sampled at temperature "
        f"{num(cfg.get('temperature'))}. Per evaluate prompt, one clean run (seed {num(cfg.get('seed'))}) and one "
        f"run per shifted arm (seed {num((cfg.get('seed') or 0) + 1)}). " + shift_text(cfg, vec) +
        "A run's score is the max of its step scores over steps ≥ k. "
        f"Drift layers {html_text(str(setup.get('drift_layers')))}, attention layer "
        f"{num(setup.get('attention_layer'))}, SAEs {html_text(str(setup.get('saes')))}.</p>"
        f"<p class='note'><b>Split by source file.</b> Fit ({num(split.get('n_fit_prompts'))} prompts, one clean run "
        f"each: thresholds at FPR {num(cfg.get('fpr'))} and the attention baseline): {html_text(files['fit'])}. "
        f"Evaluate ({num(split.get('n_evaluate_prompts'))} prompts: AUROC, detection, held-out FPR): "
        f"{html_text(files['evaluate'])}. Runs left out (ended before step k): {num(setup.get('dropped_runs', 0))}."
        "</p>")
    notes = (
        "<p class='note'>AUROC: shifted vs clean run scores on the evaluate prompts; interval: 95% percentile "
        "bootstrap over prompts (a prompt's runs resampled together). Prompts of one file are not independent, "
        "so with few files the intervals are optimistic. Time-to-detect: steps from k to the first step above "
        "the threshold; undetected runs censored at their last step (Kaplan–Meier median, Brookmeyer–Crowley "
        "interval; 'not reached' where the curve never falls to 0.5). A held-out FPR above the target says the "
        "threshold does not transfer from the fitting files.</p>"
        "<p class='note'><b>What this does not show.</b> One start step, one vector, one switch text, one draw of "
        "random tokens per prompt; an AUROC near 1 for a shift whose text is visibly broken says the monitor sees a "
        "large push, not that it would catch a subtle failure. The null rows (steer s = 0, replay) should have "
        "intervals containing 0.5; an arm whose interval contains 0.5 is not detected.</p>")
    try:
        pairs = pairs_rows(result.table("monitor_pairs"))
    except TrajscopeError:  # a Result written before the paired table existed
        pairs = ""
    try:
        pairs += null_rows(result.table("monitor_vs_null"))
    except TrajscopeError:  # a Result written before the table existed
        pass
    return "Monitor transfer", intro + summary_rows(summary) + pairs + notes, [auroc_figure(summary)]
