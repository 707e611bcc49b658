"""Report sections of the eviction and needle studies: functions of their Result only.

:func:`section` (``trajscope study-report`` of a folder written by ``trajscope study eviction``) shows,
per policy and budget, the headline row over every decode step and the rows by decode-depth band,
straight from the Result's ``eviction_summary`` table (:mod:`trajscope.studies.eviction.summary`,
the one function that computes those means and their prompt-clustered intervals), the first
divergence as a censored time-to-event (``eviction_survival``) and, when present, the per-step vs
accumulated split (``eviction_split_summary``); plus a figure of KL by depth band.

:func:`needle_section` shows the passkey retrieval accuracy per policy and budget with its Wilson
interval, from the ``needle_summary`` table (:func:`trajscope.studies.eviction.needle.accuracy_table`).

:func:`perplexity_section` shows the held-out NLL per policy and budget and its paired increase over the full
cache, from the ``eviction_ppl_summary`` table (:func:`trajscope.studies.eviction.perplexity.perplexity_summary`).
"""

from __future__ import annotations

import polars as pl

from trajscope.errors import TrajscopeError
from trajscope.escaping import html_text
from trajscope.interval_text import format_interval
from trajscope.studies.eviction.summary import ALL, METRICS
from trajscope.studies.registry import Result

TITLE = "KV-cache eviction: what the kept prompt keys cost decode"
NEEDLE_TITLE = "Passkey retrieval under KV eviction"
PPL_TITLE = "Held-out perplexity under KV eviction"
NOTE = ("Per policy and budget (kept prompt positions per head, a fraction of the prompt or a count): recall@k = share "
        "of a decode step's top-k attended prompt positions that were kept; evicted mass = the step's attention on "
        "evicted prompt keys; KL = KL(p_full ‖ p_masked) of the next-token distribution, teacher-forced; token "
        "agreement = the free-running masked run's greedy token equals the full run's; forced agreement = the same, "
        "teacher-forced. Means over layers, heads and decode steps; 95% prompt-clustered bootstrap intervals.")
LABELS = {"recall_at_k": "recall@k", "evicted_mass": "evicted mass", "kl_to_full": "KL to full (nats)",
          "token_agreement": "token agreement", "forced_agreement": "forced agreement"}


def _cell(r: dict, metric: str) -> str:
    return html_text(format_interval(r.get(metric), r.get(f"{metric}_lo"), r.get(f"{metric}_hi"),
                                     n_clusters=r.get("n_prompts")))


def _table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html_text(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f"<div class='scroll'><table class='eviction'><tr>{head}</tr>{body}</table></div>"


def summary_rows(summary: pl.DataFrame, band: str | None = ALL) -> list[list[str]]:
    """HTML cells ``policy, budget, depth band, n prompts, metric…`` of the ``band`` rows (None: the bands)."""
    rows = summary.filter(pl.col("depth_band") == band) if band else summary.filter(pl.col("depth_band") != ALL)
    metrics = [m for m in METRICS if m in summary.columns]
    return [[html_text(r["policy"]), f"{r['budget']:g}", html_text(r["depth_band"]), str(r["n_prompts"]),
             *[_cell(r, m) for m in metrics]] for r in rows.iter_rows(named=True)]


def _figure(summary: pl.DataFrame) -> list:
    from bokeh.models import ColumnDataSource, HoverTool
    from bokeh.palettes import Category10_10
    from bokeh.plotting import figure

    df = summary.filter(pl.col("depth_band") != ALL).drop_nulls("kl_to_full")
    if df.is_empty():
        return []
    bands = list(dict.fromkeys(df["depth_band"].to_list()))
    fig = figure(width=900, height=280, x_range=bands, title="Eviction: KL(p_full ‖ p_masked) by decode-depth band "
                 "(95% prompt-clustered interval)", x_axis_label="decode-depth band", y_axis_label="KL (nats)",
                 tools="pan,box_zoom,reset,save")
    groups = df.select("policy", "budget").unique(maintain_order=True).to_dicts()
    for i, g in enumerate(groups[:10]):
        sub = df.filter((pl.col("policy") == g["policy"]) & (pl.col("budget") == g["budget"]))
        src = ColumnDataSource({"band": sub["depth_band"].to_list(), "y": sub["kl_to_full"].to_list(),
                                "lo": sub["kl_to_full_lo"].to_list(), "hi": sub["kl_to_full_hi"].to_list()})
        label = f"{g['policy']} @ {g['budget']:g}"
        fig.line("band", "y", source=src, color=Category10_10[i], line_width=2, legend_label=label)
        fig.scatter("band", "y", source=src, color=Category10_10[i], size=6)
    fig.add_tools(HoverTool(tooltips=[("band", "@band"), ("KL", "@y{0.000} [@lo{0.000}, @hi{0.000}]")]))
    fig.add_layout(fig.legend[0], "right")
    return [fig]


def section(result: Result) -> tuple[str, str, list]:
    """The eviction study's report section (``(title, html, figures)``), from its Result only.

    Raises:
        TrajscopeError: the Result has no ``eviction_summary`` table.
    """
    summary = result.table("eviction_summary")
    cfg = result.config
    model = cfg.get("model", {}) if isinstance(cfg.get("model"), dict) else {}
    metrics = [LABELS[m] for m in METRICS if m in summary.columns]
    head = ["policy", "budget", "depth band", "n prompts", *metrics]
    parts = [f"<p class='note'>{html_text(NOTE)}</p>",
             f"<p class='note'>Model <code>{html_text(str(model.get('model_id', '?')))}</code>; "
             f"{cfg.get('n_prompts', summary['n_prompts'].max())} prompts, {cfg.get('max_new_tokens', '?')} decode "
             f"steps each, window {cfg.get('window', '?')}, k = {cfg.get('k', '?')}.</p>",
             "<h3>Over every decode step</h3>" + _table(head, summary_rows(summary)),
             "<h3>By decode-depth band</h3>" + _table(head, summary_rows(summary, None))]
    try:
        surv = result.table("eviction_survival")
    except TrajscopeError:
        surv = None
    if surv is not None and surv.height:
        rows = [[html_text(r["policy"]), f"{r['budget']:g}", html_text(format_interval(
            r["km_median"], r["km_lo"], r["km_hi"], 1, n_clusters=r["n_runs"])), f"{r['n_censored']} of {r['n_runs']}"]
            for r in surv.iter_rows(named=True)]
        parts.append("<h3>First divergence of the free-running masked run (Kaplan–Meier median step, runs that never "
                     "diverge censored)</h3>" + _table(["policy", "budget", "median [95% interval]", "censored"], rows))
    try:
        split = result.table("eviction_split_summary")
    except TrajscopeError:
        split = None
    if split is not None and split.height:
        rows = [[html_text(r["policy"]), f"{r['budget']:g}", html_text(r["depth_band"]),
                 *[_cell(r, m) for m in ("kl_per_step", "kl_accumulated", "kl_carried")]]
                for r in split.iter_rows(named=True)]
        parts.append("<h3>Per-step vs accumulated damage (KL, nats; carried = accumulated − per-step, paired)</h3>"
                     + _table(["policy", "budget", "depth band", "per-step", "accumulated", "carried"], rows))
    return TITLE, "\n".join(parts), _figure(summary)


def needle_section(result: Result) -> tuple[str, str, list]:
    """The needle study's report section: retrieval accuracy per policy and budget with its Wilson interval."""
    acc = result.table("needle_summary")
    cfg = result.config
    has_key = "mean_key_kept" in acc.columns
    rows = [[html_text(r["policy"]), f"{r['budget']:g}", f"{r['mean_kept_tokens']:.0f}",
             html_text(format_interval(r["accuracy"], r["lo"], r["hi"], n_clusters=r["n"])), str(r["n"])]
            + (["—" if r['mean_key_kept'] != r['mean_key_kept'] else f"{r['mean_key_kept']:.2f}"] if has_key else [])
            for r in acc.iter_rows(named=True)]
    note = (f"Passkey prompts of about {cfg.get('context', '?')} tokens, the key at depths "
            f"{html_text(', '.join(map(str, cfg.get('depths', []))) or '?')}; an answer is correct when its first run "
            "of digits is the key. 95% Wilson intervals over prompts; <code>full</code> is the uncompressed cache; "
            "<code>_rolling</code> policies hold the whole cache at the budget during decode (1.0: no eviction). "
            "Passkey keys kept = share of (layer, head, passkey token) keys kept after prefill's cut.")
    head = ["policy", "budget", "kept tokens (mean)", "accuracy [95% Wilson]", "n prompts"]
    return NEEDLE_TITLE, f"<p class='note'>{note}</p>" + _table(
        head + (["passkey keys kept (mean)"] if has_key else []), rows), []


def perplexity_section(result: Result) -> tuple[str, str, list]:
    """The eviction-ppl study's report section: NLL and its paired increase over the full cache, per policy and
    budget, with 95% bootstrap intervals over files."""
    summ = result.table("eviction_ppl_summary")
    cfg = result.config

    def cell(r: dict, col: str) -> str:
        return html_text(format_interval(r[col], r[f"{col}_lo"], r[f"{col}_hi"], n_clusters=r["n_files"], unit="file"))

    rows = [[html_text(r["policy"]), f"{r['budget']:g}", f"{r['mean_kept_tokens']:.0f}", cell(r, "nll"),
             "—" if r["policy"] == "full" else cell(r, "delta_nll"), str(r["n_files"])]
            for r in summ.iter_rows(named=True)]
    note = (f"One text per held-out standard-library file: its first {cfg.get('prompt_len', '?')} tokens are the "
            f"prompt a policy compresses, the next {cfg.get('continuation', '?')} are teacher-forced with the evicted "
            "prompt keys hidden (window " + html_text(str(cfg.get("window", "?"))) + "). NLL = mean negative "
            "log-likelihood per continuation token (nats); increase = paired on the same file against "
            "<code>full</code>, the uncompressed cache. 95% bootstrap intervals over files; an interval containing "
            "0 means no increase was detected.")
    head = ["policy", "budget", "kept tokens (mean)", "NLL (nats)", "increase over full", "n files"]
    return PPL_TITLE, f"<p class='note'>{note}</p>" + _table(head, rows), []
