"""The comparison report's eviction section: what KV-cache eviction policies cost each run's decode.

**A run has an eviction study** when its run directory holds ``eviction/``, the eviction study's
:class:`~trajscope.studies.registry.Result` on that run's prompt. ``trajscope eviction --runs
RUN_DIR …`` writes it there (:mod:`trajscope.studies.eviction.cli`). Runs given as in-memory
trajectories, or whose directory has no such folder, contribute nothing; when no run has one, the
report has no eviction section.

The section shows, per run, policy, budget and decode-depth band (and ``all`` decode steps), the
rows of the run's ``eviction_summary`` table — read, not recomputed
(:func:`trajscope.studies.eviction.summary.summarize` made them) — recall@k of the decode-time top
attended prompt keys in the kept set, the attention mass on evicted prompt keys, the masked
re-run's KL to the full cache (teacher-forced) and its greedy token agreement (free-running); and,
per decode step, curves of recall and KL (mean over layers and heads), one line per run × policy × budget.
"""

from __future__ import annotations

import os
import pathlib
from typing import Sequence

import polars as pl

from trajscope.errors import TrajscopeError
from trajscope.escaping import html_text
from trajscope.studies.eviction.summary import RERUN_SCHEMA, summarize

EVICTION_DIR = "eviction"
MAX_LINES = 12
NOTE = ("Eviction study of each run's prompt (<code>trajscope eviction --runs</code>): rows of the study's summary per policy and "
        "budget (kept prompt positions per head, as a fraction of the prompt); recall@k = share of a decode step's "
        "top-k attended prompt positions that were kept; evicted mass = the step's attention on evicted prompt keys; KL = KL(p_full ‖ "
        "p_masked) of the next-token distribution, teacher-forced; token agreement = the free-running masked run's "
        "greedy token equals the full run's. Means over layers, heads and the decode steps of each depth band.")


def run_eviction_dir(run_dir: str | os.PathLike) -> pathlib.Path:
    """Where a run's eviction tables live: ``<run_dir>/eviction``."""
    return pathlib.Path(run_dir) / EVICTION_DIR


def _read(folder: pathlib.Path, name: str, run_id: str) -> pl.DataFrame | None:
    f = folder / f"{name}.parquet"
    if not f.exists():
        return None
    try:
        df = pl.read_parquet(f)
    except Exception as exc:
        raise TrajscopeError(f"The eviction table '{f}' is unreadable ({exc}).") from exc
    return df.with_columns(pl.lit(run_id).alias("run_id"))  # one run directory = one run


def eviction_tables(runs: Sequence, paths: Sequence[str | None]) -> dict[str, pl.DataFrame]:
    """``eviction_by_depth`` and ``eviction_by_step`` over the runs whose directory has an eviction study.

    Args:
        runs: the report's trajectories (their ``run_id`` names the rows).
        paths: each run's directory, or None (then the run has no eviction study).
    Returns:
        ``{}`` when no run has one; else ``eviction_by_depth`` (run_id, policy, budget, depth_band,
        recall_at_k, evicted_mass, kl_to_full, token_agreement: the run's ``eviction_summary`` rows)
        and ``eviction_by_step`` (run_id, policy, budget, step, recall_at_k, evicted_mass, kl_to_full,
        token_agrees).
    """
    steps, reruns, depth = [], [], []
    for t, path in zip(runs, paths):
        if path is None:
            continue
        folder = run_eviction_dir(path)
        st = _read(folder, "eviction_steps", t.run_id)
        if st is None:
            continue
        steps.append(st)
        rr = _read(folder, "eviction_rerun", t.run_id)
        if rr is not None:
            reruns.append(rr)
        summ = _read(folder, "eviction_summary", t.run_id)
        if summ is None:  # a folder written before the summary was saved beside the tables
            summ = summarize(st, rr if rr is not None else pl.DataFrame(schema=RERUN_SCHEMA)).with_columns(pl.lit(t.run_id).alias("run_id"))
        depth.append(summ)
    if not steps:
        return {}
    keys = ["run_id", "policy", "budget"]
    by_step = (pl.concat(steps, how="diagonal_relaxed").group_by(*keys, "step")
               .agg(pl.col("recall_at_k", "evicted_mass").mean().cast(pl.Float64)))
    if reruns:
        rr = pl.concat(reruns, how="diagonal_relaxed").filter(pl.col("step") >= 1).select(
            *keys, pl.col("step").cast(by_step.schema["step"]), "kl_to_full", "token_agrees")
        by_step = by_step.join(rr, on=[*keys, "step"], how="left")
    else:
        by_step = by_step.with_columns(pl.lit(None, pl.Float64).alias("kl_to_full"),
                                       pl.lit(None, pl.Boolean).alias("token_agrees"))
    by_step = by_step.sort(*keys, "step")
    by_depth = pl.concat(depth, how="diagonal_relaxed").select(
        *keys, "depth_band", "recall_at_k", "evicted_mass", "kl_to_full", "token_agreement")
    return {"eviction_by_depth": by_depth, "eviction_by_step": by_step}


def _label(r: dict) -> str:
    return f"{r['run_id']} · {r['policy']} @ {r['budget']:g}"


def eviction_figures(tables: dict[str, pl.DataFrame]) -> list:
    """Bokeh figures: recall@k and KL by decode step, one line per run × policy × budget (the first 12)."""
    if "eviction_by_step" not in tables:
        return []
    from bokeh.models import ColumnDataSource, HoverTool
    from bokeh.palettes import Category10_10
    from bokeh.plotting import figure

    df = tables["eviction_by_step"]
    groups = df.select("run_id", "policy", "budget").unique(maintain_order=True).head(MAX_LINES).to_dicts()
    shown = "" if df.select("run_id", "policy", "budget").n_unique() <= MAX_LINES else f" (first {MAX_LINES})"
    out = []
    for col, title, ylabel in (("recall_at_k", "Eviction: recall@k of decode attention in the kept set", "recall"),
                               ("kl_to_full", "Eviction: KL(p_full ‖ p_masked) of the masked re-run", "KL (nats)")):
        fig = figure(width=900, height=260, title=title + shown, x_axis_label="step (decode)", y_axis_label=ylabel,
                     tools="pan,wheel_zoom,box_zoom,reset,save")
        for i, g in enumerate(groups):
            sub = df.filter((pl.col("run_id") == g["run_id"]) & (pl.col("policy") == g["policy"])
                            & (pl.col("budget") == g["budget"])).drop_nulls(col)
            if sub.is_empty():
                continue
            src = ColumnDataSource({"step": sub["step"].to_list(), "y": sub[col].to_list(),
                                    "line": [_label(g)] * sub.height})
            fig.line("step", "y", source=src, color=Category10_10[i % 10], line_width=1.5, legend_label=_label(g))
        fig.add_tools(HoverTool(tooltips=[("line", "@line"), ("step", "@step{0}"), (ylabel, "@y{0.000}")]))
        if fig.legend:
            fig.add_layout(fig.legend[0], "right")
        out.append(fig)
    return out


def eviction_html(tables: dict[str, pl.DataFrame]) -> str:
    """The section's table of means by run, policy, budget and depth band (empty without a study)."""
    if "eviction_by_depth" not in tables:
        return ""
    df = tables["eviction_by_depth"]
    head = "".join(f"<th>{html_text(c)}</th>" for c in df.columns)

    def cell(v) -> str:
        return "—" if v is None else (f"{v:.4f}" if isinstance(v, float) else html_text(str(v)))

    rows = "".join("<tr>" + "".join(f"<td>{cell(v)}</td>" for v in r) + "</tr>" for r in df.iter_rows())
    return f"<div class='scroll'><table class='eviction'><tr>{head}</tr>{rows}</table></div>"
