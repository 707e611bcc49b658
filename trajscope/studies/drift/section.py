"""The drift study's report section: a function of its :class:`~trajscope.studies.registry.Result` only.

It shows the headline numbers as the Result holds them (:mod:`trajscope.studies.drift.summary`),
the split they were measured on, the held-out prefill false-positive rate per layer, the
flagged share by decode-depth band per regime and the drift score and flagged share by chat segment,
with their 95 % intervals; nothing is recomputed.
"""

from __future__ import annotations

import polars as pl

from trajscope.errors import TrajscopeError
from trajscope.escaping import html_text
from trajscope.studies.drift.summary import lines
from trajscope.studies.registry import Result, Section
from trajscope.studies.serving.sections import num, table

PROXY = ("Drift score = diagonal Mahalanobis distance of the residual to the prefill mean, ÷ √d (≈ 1 for prefill "
         "positions): dimensions are treated independently, a triage signal, not a claim about the joint geometry.")


def headline_html(summaries: dict) -> str:
    """The headline numbers as an HTML list (read from ``summaries``)."""
    items = "".join(f"<li>{html_text(label)}: <b>{html_text(text)}</b></li>" for label, text in lines(summaries))
    return f"<ul class='ts-headline'>{items}</ul>" if items else "<p class='note'>No headline numbers.</p>"


def drift_section(result: Result) -> Section:
    """``(title, html, figures)`` of a drift Result."""
    s = result.summaries
    split = s.get("split") or {}
    sizes = split.get("sizes") or {}
    fpr = (s.get("profile") or {}).get("fpr")
    nf = split.get("n_files") or {}
    files = lambda k: f" from {num(nf[k])} files" if k in nf else ""  # noqa: E731
    shared = split.get("shared_fit_calibrate") or []
    parts = [f"<p class='note'><b>Setup.</b> Split by {html_text(str(split.get('by', 'prompt id')))} (seed "
             f"{num(split.get('seed'))}): fit {num(sizes.get('fit'))} prompts{files('fit')} (profile moments), "
             f"calibrate {num(sizes.get('calibrate'))}{files('calibrate')} (threshold at nominal false-positive rate "
             f"{num(fpr)}), evaluate {num(sizes.get('evaluate'))}{files('evaluate')} (every number here). "
             + (f"The profile's fit and calibrate prompts share {len(shared)} file(s) (it was split by prompt id). "
                if shared else "") +
             f"Intervals: 95 % bootstrap, resampling by {html_text(str(split.get('cluster', 'prompt')))}. "
             f"{html_text(PROXY)}</p>", headline_html(s)]
    parts += [f"<p class='note'>{html_text(n)}</p>" for n in s.get("notes") or []]
    fpr_table = result.table("drift_heldout_fpr")
    parts.append("<h3>Held-out prefill false-positive rate by layer</h3>"
                 + table(fpr_table, ["layer", "fpr", "n_positions", "n_prompts"], ci_of=["fpr"]))
    depth = result.table("drift_by_depth").filter(pl.col("regime") != "prefill")
    parts.append("<h3>Flagged share by regime, decode depth and layer</h3>"
                 + table(depth, ["regime", "depth_band", "layer", "flagged_frac", "n_prompts"], ci_of=["flagged_frac"]))
    parts.append(segment_html(result))
    return "Drift: decode vs the prefill profile", "".join(parts), []


SEGMENT_NOTE = ("Rows by the chat segment of their position: in prefill the prompt's turns (system, user, and the "
                "generation prompt, which is assistant), in decode the generated answer (assistant, or thinking "
                "inside a thought). A plain-text prompt is all user. Text every prompt shares (a template's default "
                "system turn) gives the same residuals in every prompt: those rows are one sample repeated, and "
                "their interval is narrow for that reason, not because the rate is known.")


def segment_html(result: Result) -> str:
    """The drift score and flagged share by regime, chat segment and layer (empty for a Result without
    ``drift_by_segment``: one written before segments were recorded)."""
    try:
        seg = result.table("drift_by_segment")
    except TrajscopeError:
        return ""
    return (f"<h3>Drift by chat segment</h3><p class='note'>{html_text(SEGMENT_NOTE)}</p>"
            + table(seg, ["regime", "segment", "layer", "score", "flagged_frac", "n_prompts"],
                    ci_of=["score", "flagged_frac"]))
