"""The steering-success study's report section: a function of its :class:`~trajscope.studies.registry.Result` only.

It states the setup (held-out files, n, the vector, the SAE feature), the headline numbers as the
Result's summaries hold them (success rate, fluency cost, anti-steerable fraction), and the
per-arm, per-layer, anti-steerable and by-depth tables as written. Nothing is recomputed.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from trajscope.escaping import html_text
from trajscope.interval_text import format_interval
from trajscope.studies.registry import Result, Section
from trajscope.studies.serving.sections import num
from trajscope.studies.steering.section import half_life_text


def _iv(d: dict[str, Any], digits: int = 3) -> str:
    return format_interval(d.get("value"), d.get("lo"), d.get("hi"), digits, n_clusters=d.get("n"))


def _cell(r: dict[str, Any], c: str, digits: int = 3) -> str:
    return format_interval(r.get(c), r.get(f"{c}_lo"), r.get(f"{c}_hi"), digits, n_clusters=r.get("n"))


def arm_rows(df: pl.DataFrame) -> pl.DataFrame:
    """Display rows of a per-arm (or per-depth) summary table: rates and the NLL difference with intervals."""
    rows = []
    for r in df.iter_rows(named=True):
        row = {k: r[k] for k in ("arm", "layer", "strength", "start_step", "feature") if k in r and r[k] is not None}
        row.update({"n": r["n"], "success [95% CI]": _cell(r, "success"), "French steered": _cell(r, "french"),
                    "French unsteered": _cell(r, "base_french"), "wrong way": _cell(r, "wrong_way"),
                    "NLL steered − unsteered (nats/token)": _cell(r, "nll_diff"),
                    "perplexity ratio": _cell(r, "ppl_ratio", 2)})
        if "onset_kl" in r:
            half_label = "half-life (median [95% CI])" if "half_life_lo" in r else "half-life (median)"
            row.update({"onset KL": _cell(r, "onset_kl", 4), "effect (mean KL)": _cell(r, "effect", 4),
                        "same steps, on since step 1": _cell(r, "from_step1_kl", 4),
                        half_label: half_life_text(r.get("half_life_median"), r.get("half_life_lo"),
                                                   r.get("half_life_hi"), interval="half_life_lo" in r)})
        if "loops" in r:
            row["repetition loops"] = num(r["loops"])
        rows.append({k: str(v) for k, v in row.items()})
    return pl.DataFrame(rows)


def section(result: Result) -> Section:
    """``(title, html, figures)`` of a steering-success Result."""
    from trajscope.studies.serving.sections import table

    s = result.summaries
    setup = s.get("setup") or {}
    succ, flu, anti = s.get("success") or {}, s.get("fluency") or {}, s.get("anti_steerable") or {}
    parts = [
        "<p class='note'><b>Setup.</b> "
        f"{num(setup.get('n_heldout'))} held-out prompts from "
        f"{html_text(', '.join(setup.get('heldout_files') or []))} (left out: "
        f"{html_text(', '.join(setup.get('excluded_files') or []) or 'none')}); greedy, "
        f"{num(setup.get('new_tokens'))} tokens, steering from decode step 1. Headline vector: layer "
        f"{num(setup.get('vector_layer'))}, strength {num(setup.get('vector_strength'))}. Layer sweep: CAA from "
        f"{num(setup.get('n_pairs'))} pairs ({html_text(str(setup.get('pairs')))}) on {num(setup.get('n_sweep'))} "
        f"prompts; SAE arm: {html_text(str(setup.get('sae')))} feature {num(setup.get('sae_feature'))} at the CAA "
        "vector's norm. Success: the steered text meets the French function-word criterion and the unsteered one "
        "does not; rates with Wilson intervals, means with a 95 % bootstrap over prompts.</p>",
        "<p><b>Success</b> " + html_text(_iv(succ)) + f" (n {num(succ.get('n'))}); <b>fluency cost</b> (NLL per "
        "token under the unsteered model, steered − unsteered) " + html_text(_iv(flu)) + " nats; <b>anti-steerable</b> "
        + html_text(_iv(anti)) + ".</p>"]
    summary = result.table("steering_success_summary")
    parts.append("<h4>By arm</h4>" + table(arm_rows(summary)))
    parts.append("<h4>Anti-steerable fraction</h4>" + table(pl.DataFrame([
        {"vector": r["vector"], "layer": str(r["layer"]), "strengths": ", ".join(f"{x:g}" for x in r["strengths"]),
         "n": str(r["n"]), "anti-steerable [95% CI]": _cell(r, "anti"), "flat": num(r["flat"]),
         "mean slope": num(r["slope_mean"])} for r in result.table("steering_success_anti").iter_rows(named=True)])))
    if "steering_success_depth" in result.tables or result._dir is not None and \
            (result._dir / "steering_success_depth.parquet").is_file():
        parts.append("<h4>By start depth (equal windows)</h4>" + table(arm_rows(result.table("steering_success_depth"))))
    return "Steering success", "".join(parts), []
