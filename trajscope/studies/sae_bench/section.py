"""The SAE bench study's report section, read from its Result only.

Headline numbers come from ``result.summaries`` (:mod:`~trajscope.studies.sae_bench.summary`, computed
once when the study ran); the detail tables are the Result's own tables, printed as they are. No
figure: every number is a table cell with its interval.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from trajscope.escaping import html_text
from trajscope.interval_text import format_interval
from trajscope.studies.registry import Result

TITLE = "SAE bench: SAEBench's metrics by phase and segment, k-sparse probing, reproducibility"


def _table(head: list[str], rows: list[list[str]]) -> str:
    th = "".join(f"<th>{html_text(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table class='ts-table'><tr>{th}</tr>{body}</table>"


def _ci(v: Any, lo: Any, hi: Any, n_files: Any = None) -> str:
    return format_interval(v, lo, hi, n_clusters=n_files, unit="file")


def _seeds(s: dict[str, Any]) -> str:
    lo, hi = s.get("seed_min"), s.get("seed_max")
    return f"{lo:.3f}–{hi:.3f}" if lo is not None and hi is not None else f"one seed ({s.get('n_seeds', 1)})"


def _setup(setup: dict[str, Any]) -> str:
    if not setup:
        return ""
    mixes = ", ".join(f"{html_text(m)} (seeds {', '.join(map(str, v))})" for m, v in setup.get("mixes", {}).items())
    probe = setup.get("probe") or {}
    return (f"<p>{html_text(str(setup.get('model_id')))}, layer {setup.get('layer')}: {setup.get('n_prompts')} "
            f"prompts from {setup.get('n_files')} source files ({html_text(', '.join(setup.get('kinds', [])))}), "
            f"{setup.get('n_rows')} rows (position 0 left out), {setup.get('new_tokens')} greedy decode steps each. "
            f"SAEs: {mixes}. Intervals: 95% percentile bootstrap over source files ({setup.get('n_boot')} "
            f"resamples). Probes fitted on prefill rows of {len(probe.get('fit_files', []))} files, scored on "
            f"{len(probe.get('evaluate_files', []))} others (split by source file).</p>" + (
                f"<p>Rows of {len(setup['sae_train_files'])} source files the SAEs were trained on "
                f"({html_text(', '.join(setup['sae_train_files']))}) are reported apart: kinds marked "
                f"(unseen) hold the other {len(setup.get('unseen_files', []))} files only, and the headline "
                f"numbers use them.</p>" if setup.get("sae_train_files") else ""))


def _headlines(summ: dict[str, Any]) -> str:
    rows = [[html_text(k), f"{int(s['value'])} of {s.get('n')} features" if s.get("count") and s.get("value") is not None
             else _ci(s.get("value"), s.get("lo"), s.get("hi"), s.get("n_files")), _seeds(s),
             html_text(str(s.get("n", "")))] for k, s in summ.items() if k != "setup" and isinstance(s, dict)]
    return "<h3>Headline numbers</h3>" + _table(["summary", "value [95% CI]", "seed range", "n"], rows)


def _core(core: pl.DataFrame) -> str:
    if not core.height:
        return ""
    rows = [[html_text(f"{r['mix']} s{r['seed']}"), html_text(r["kind"]), html_text(r["phase"]),
             html_text(r["segment"]), f"{r['n_rows']} ({r['n_distinct']} distinct)", str(r["n_files"]),
             _ci(r["ce_recovered"], r["ce_recovered_lo"], r["ce_recovered_hi"], r["n_files"]),
             _ci(r["explained_variance"], r["explained_variance_lo"], r["explained_variance_hi"], r["n_files"]),
             f"{r['l0']:.1f}", f"{r['dead']:.3f}", f"{r['dense']:.3f}"] for r in core.iter_rows(named=True)]
    return "<h3>Core metrics by phase and segment</h3>" + _table(
        ["SAE", "prompts", "phase", "segment", "rows", "files", "CE recovered", "explained var.", "L0", "dead",
         "dense"], rows)


def _diffs(diffs: pl.DataFrame) -> str:
    if not diffs.height:
        return ""
    rows = [[html_text(f"{r['mix']} − {r['base']} (s{r['seed']})"), html_text(r["metric"]), html_text(r["kind"]),
             html_text(r["phase"]), html_text(r["segment"]), _ci(r["diff"], r["lo"], r["hi"], r["n_files"])]
            for r in diffs.iter_rows(named=True)]
    return "<h3>Mix differences, paired over files</h3>" + _table(
        ["difference", "metric", "prompts", "phase", "segment", "value [95% CI]"], rows)


def _probes(probes: pl.DataFrame) -> str:
    if not probes.height:
        return "<p>No probes: the prompts hold fewer than two code source files.</p>"
    rows = [[html_text(r["label"]), html_text(r["probe"] if r["probe"] == "residual" else f"{r['probe']} s{r['seed']}"),
             str(r["k"]), html_text(r["eval_phase"]), f"{r['n_rows']} ({r['n_pos']} positive)",
             _ci(r["auroc"], r["auroc_lo"], r["auroc_hi"], r["n_files"]),
             _ci(r["accuracy"], r["accuracy_lo"], r["accuracy_hi"], r["n_files"])] for r in probes.iter_rows(named=True)]
    return "<h3>k-sparse probing (fitted on prefill, held-out files)</h3>" + _table(
        ["label", "probe", "k", "scored on", "rows", "AUROC", "balanced accuracy"], rows)


def _repro(repro: pl.DataFrame) -> str:
    if not repro.height:
        return "<p>Reproducibility: one SAE only.</p>"
    rows = [[html_text(r["comparison"]), html_text(f"{r['mix']} s{r['seed']} → {r['other_mix']} s{r['other_seed']}"),
             f"{r['n_reproduced']} / {r['n_features']}", f"{r['n_reproduced_alive']} / {r['n_alive']}",
             f"{r['median_best_cos']:.3f}"] for r in repro.iter_rows(named=True)]
    return "<h3>Features with a decoder match (cosine ≥ threshold)</h3>" + _table(
        ["comparison", "SAE → other", "reproduced", "of alive", "median best cosine"], rows)


def section(result: Result) -> tuple[str, str, list]:
    """``(title, html, figures)`` of one SAE bench Result."""
    summ = result.summaries
    body = _setup(summ.get("setup", {})) + _headlines(summ)
    body += _core(result.table("sae-bench_core")) + _diffs(result.table("sae-bench_diff"))
    body += _probes(result.table("sae-bench_probe")) + _repro(result.table("sae-bench_repro"))
    return TITLE, body, []
