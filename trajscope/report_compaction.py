"""The study report's compaction section: masking vs restart, read from a study's Parquet tables.

A folder **holds a compaction study** when it has ``compaction_summary.parquet`` (written by
``trajscope study compaction … --out DIR``, :meth:`trajscope.studies.compaction.CompactionResult.save`),
usually beside ``compaction_probe``, ``compaction_decode``, ``compaction_attention`` and
``settings.json``; a ``planted/`` sub-folder with the same files is the planted-signal run.

:func:`section` follows the study-report contract — ``section(study_dir) -> (title, html, figures)``:
an HTML fragment of tables (every number with its 95% interval, the setup, n and the held-out split)
and a list of Bokeh figures:

- per-layer divergence of T3's hidden states, A (mask), B (restart) and D (mask from the summary on,
  the control) each against C (full context): relative L2 and cosine;
- next-token KL and top-1 agreement for every pair; the greedy continuation's first divergence;
- attention mass from T3's queries onto the summary, per layer and setup;
- held-out probe accuracy by layer under each setup against the majority baseline, chance and the
  shuffled-label control, and the same for the planted run (the check that the probe can see a
  signal when one is there).

Intervals: the tables' own (percentile bootstrap over sessions, :mod:`trajscope.stats`), and for
the first-divergence depth a session-level :func:`trajscope.stats.cluster_bootstrap` here.
"""

from __future__ import annotations

import json
import pathlib

import polars as pl

from trajscope.errors import TrajscopeError
from trajscope.escaping import html_text
from trajscope.interval_text import format_interval
from trajscope.stats import cluster_bootstrap

TITLE = "Context compaction: masking vs restart"
VS_C = ("A_vs_C", "B_vs_C", "D_vs_C")
SETUP_NAMES = {"A": "A mask", "B": "B restart", "C": "C full", "D": "D mask early"}
COLORS = {"A": "#1f77b4", "B": "#ff7f0e", "C": "#2ca02c", "D": "#9467bd"}
NOTE = ("Sessions <code>&lt;sys&gt; &lt;T1&gt; &lt;T2&gt; &lt;summary&gt; &lt;T3&gt;</code>. <b>A</b>: T1/T2 masked "
        "from T3's first query on (the summary's states, computed while T1/T2 were visible, are kept); <b>B</b>: "
        "restarted from <code>&lt;sys&gt; &lt;summary&gt; &lt;T3&gt;</code>; <b>C</b>: nothing masked (reference); "
        "<b>D</b> (control): T1/T2 masked from the summary's first query on. Rows are aligned by T3 token index.")


def _fmt(e, lo, hi, digits: int = 3) -> str:
    return format_interval(e, lo, hi, digits)


def _table(header: list[str], rows: list[list[str]], cls: str = "compaction") -> str:
    head = "".join(f"<th>{html_text(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f"<div class='scroll'><table class='{cls}'><tr>{head}</tr>{body}</table></div>"


def _read(folder: pathlib.Path, name: str) -> pl.DataFrame | None:
    f = folder / f"compaction_{name}.parquet"
    if not f.exists():
        return None
    try:
        return pl.read_parquet(f)
    except Exception as exc:
        raise TrajscopeError(f"The compaction table '{f}' is unreadable ({type(exc).__name__}).") from exc


def load(study_dir: str | pathlib.Path) -> dict:
    """The study's tables and settings: ``{"summary", "probe", "decode", "sessions", "settings"}`` (None if absent).

    Raises:
        TrajscopeError: when the folder holds no ``compaction_summary.parquet``.
    """
    d = pathlib.Path(study_dir)
    summary = _read(d, "summary")
    if summary is None:
        raise TrajscopeError(f"'{d}' holds no compaction study (no compaction_summary.parquet); run "
                             "'trajscope study compaction … --out DIR' first.")
    s = d / "settings.json"
    settings = json.loads(s.read_text(encoding="utf-8")) if s.exists() else {}
    return dict(summary=summary, probe=_read(d, "probe"), decode=_read(d, "decode"), sessions=_read(d, "sessions"),
                settings=settings)


def _metric(summary: pl.DataFrame, metric: str) -> pl.DataFrame:
    return summary.filter(pl.col("metric") == metric)


def divergence_by_layer(summary: pl.DataFrame) -> pl.DataFrame:
    """Per layer and pair (A/B/D vs C): rel_l2 and cosine with their intervals (wide: one row per layer × pair)."""
    parts = []
    for m in ("rel_l2", "cosine"):
        parts.append(_metric(summary, m).filter(pl.col("pair").is_in(VS_C))
                     .select("pair", "layer", pl.col("estimate").alias(m), pl.col("lo").alias(f"{m}_lo"),
                             pl.col("hi").alias(f"{m}_hi"), "n_sessions"))
    if parts[0].is_empty():
        return parts[0]
    return parts[0].join(parts[1].drop("n_sessions"), on=["pair", "layer"], how="left").sort("layer", "pair")


def first_divergence(decode: pl.DataFrame | None, n_boot: int = 1000) -> list[dict]:
    """Per setup (A, B, D vs C's greedy tokens): share of sessions that diverge and mean first divergence.

    The first divergence counts ``n_new`` for a continuation that never leaves C's. Intervals: percentile
    bootstrap over sessions (:func:`trajscope.stats.cluster_bootstrap`, one value per session).
    """
    if decode is None or decode.is_empty():
        return []
    out = []
    for setup, g in decode.group_by("setup", maintain_order=True):
        fd = g.select(pl.col("first_divergence").fill_null(pl.col("n_new")).cast(pl.Float64))["first_divergence"]
        div = g["first_divergence"].is_not_null().cast(pl.Float64)
        out.append(dict(setup=setup[0], diverged=cluster_bootstrap(div.to_numpy(), n_boot=n_boot),
                        depth=cluster_bootstrap(fd.to_numpy(), n_boot=n_boot), n=g.height, n_new=int(g["n_new"][0])))
    return sorted(out, key=lambda r: r["setup"])


def _split_text(probe: pl.DataFrame | None, sessions: pl.DataFrame | None, settings: dict) -> str:
    n = settings.get("n_sessions", sessions.height if sessions is not None else "?")
    if probe is None or probe.is_empty():
        return f"{n} sessions; no probe."
    r = probe.row(0, named=True)
    return (f"{n} sessions; probe fitted on {r['n_train']} and scored on {r['n_test']} held-out sessions (a disjoint "
            f"split seeded by {settings.get('seed', 0)}).")


def probe_rows(probe: pl.DataFrame | None) -> list[list[str]]:
    """Rows ``layer, A, B, C, D (real labels), C shuffled, shuffled (range over setups), majority, chance`` (HTML table)."""
    if probe is None or probe.is_empty():
        return []
    rows = []
    same = probe.filter(pl.col("train_setup") == pl.col("test_setup"))
    for layer, g in same.group_by("layer", maintain_order=True):
        real = {r["train_setup"]: r for r in g.filter(pl.col("control") == "real").iter_rows(named=True)}
        sh = g.filter(pl.col("control") == "shuffled")
        first = g.row(0, named=True)
        rows.append([str(layer[0]), *[_fmt(real[s]["accuracy"], real[s]["lo"], real[s]["hi"]) if s in real else "—"
                                      for s in ("A", "B", "C", "D")],
                     _fmt(*[shc[c] for c in ("accuracy", "lo", "hi")]) if (shc := next(
                         (r for r in sh.iter_rows(named=True) if r["train_setup"] == "C"), None)) else "—",
                     f"{sh['accuracy'].min():.3f}–{sh['accuracy'].max():.3f}" if sh.height else "—",
                     f"{first['majority']:.3f}", f"{first['chance']:.3f}"])
    return sorted(rows, key=lambda r: int(r[0]))


def _probe_html(probe: pl.DataFrame | None, label: str) -> str:
    rows = probe_rows(probe)
    if not rows:
        return f"<p class='note'>{label}: no probe table.</p>"
    return _table(["layer", "A (mask)", "B (restart)", "C (full)", "D (mask early)", "C, shuffled labels",
                   "shuffled labels (range over setups)", "majority baseline", "1 / classes"], rows)


def _figures(tables: dict, planted: dict | None) -> list:
    from bokeh.models import ColumnDataSource, HoverTool, Whisker
    from bokeh.plotting import figure

    figs = []
    div = divergence_by_layer(tables["summary"])
    if not div.is_empty():
        fig = figure(width=900, height=280, title="Compaction: T3 hidden states vs full context (rel. L2, 95% CI)",
                     x_axis_label="layer (block output)", y_axis_label="‖x − x_C‖ / ‖x_C‖", tools="pan,box_zoom,reset,save")
        for pair in VS_C:
            sub = div.filter(pl.col("pair") == pair)
            s = pair[0]
            src = ColumnDataSource({k: sub[c].to_list() for k, c in
                                    (("layer", "layer"), ("y", "rel_l2"), ("lo", "rel_l2_lo"), ("hi", "rel_l2_hi"))})
            fig.varea("layer", "lo", "hi", source=src, color=COLORS[s], alpha=0.2)
            fig.line("layer", "y", source=src, color=COLORS[s], line_width=2, legend_label=f"{SETUP_NAMES[s]} vs C")
        fig.add_tools(HoverTool(tooltips=[("layer", "@layer"), ("rel L2", "@y{0.000} [@lo{0.000}, @hi{0.000}]")]))
        fig.legend.location = "top_left"
        figs.append(fig)
    att = _metric(tables["summary"], "attention_summary_mass")
    if not att.is_empty():
        fig = figure(width=900, height=280, title="Compaction: attention mass of T3's queries on the summary (95% CI)",
                     x_axis_label="layer", y_axis_label="mass on summary keys", tools="pan,box_zoom,reset,save")
        for s in ("A", "B", "C", "D"):
            sub = att.filter(pl.col("pair") == s).sort("layer")
            src = ColumnDataSource({"layer": sub["layer"].to_list(), "y": sub["estimate"].to_list(),
                                    "lo": sub["lo"].to_list(), "hi": sub["hi"].to_list()})
            fig.varea("layer", "lo", "hi", source=src, color=COLORS[s], alpha=0.15)
            fig.line("layer", "y", source=src, color=COLORS[s], line_width=2, legend_label=SETUP_NAMES[s])
        fig.add_tools(HoverTool(tooltips=[("layer", "@layer"), ("mass", "@y{0.000} [@lo{0.000}, @hi{0.000}]")]))
        fig.legend.location = "top_left"
        figs.append(fig)
    for t, label in ((tables, "real labels"), (planted, "planted fact")):
        probe = None if t is None else t["probe"]
        if probe is None or probe.is_empty():
            continue
        fig = figure(width=900, height=280, title=f"Compaction probe ({label}): held-out accuracy by layer (95% CI)",
                     x_axis_label="layer", y_axis_label="accuracy", y_range=(0, 1), tools="pan,box_zoom,reset,save")
        same = probe.filter(pl.col("train_setup") == pl.col("test_setup"))
        for i, s in enumerate(("A", "B", "C", "D")):
            sub = same.filter((pl.col("train_setup") == s) & (pl.col("control") == "real")).sort("layer")
            x = [v + (i - 1.5) * 0.06 for v in sub["layer"].to_list()]
            src = ColumnDataSource({"x": x, "y": sub["accuracy"].to_list(), "lo": sub["lo"].to_list(),
                                    "hi": sub["hi"].to_list()})
            fig.scatter("x", "y", source=src, color=COLORS[s], size=7, legend_label=SETUP_NAMES[s])
            fig.add_layout(Whisker(source=src, base="x", lower="lo", upper="hi", line_color=COLORS[s]))
        sh = same.filter(pl.col("control") == "shuffled").group_by("layer").agg(pl.col("accuracy").mean()).sort("layer")
        fig.line(sh["layer"].to_list(), sh["accuracy"].to_list(), color="#888", line_dash="dashed",
                 legend_label="shuffled labels (mean over setups)")
        maj = same.group_by("layer").agg(pl.col("majority").first()).sort("layer")
        fig.line(maj["layer"].to_list(), maj["majority"].to_list(), color="black", line_dash="dotted",
                 legend_label="majority baseline")
        fig.legend.location = "top_left"
        figs.append(fig)
    return figs


def section(study_dir: str | pathlib.Path) -> tuple[str, str, list]:
    """The compaction section of a study report (contract: ``(title, html_fragment, bokeh_figures)``).

    Args:
        study_dir: a folder written by ``trajscope study compaction --out`` (a ``planted/`` sub-folder,
            when present, is the planted-signal run).
    Raises:
        TrajscopeError: the folder holds no compaction study, or a table is unreadable.
    """
    d = pathlib.Path(study_dir)
    t = load(d)
    planted = load(d / "planted") if (d / "planted" / "compaction_summary.parquet").exists() else None
    st, summary = t["settings"], t["summary"]
    model = st.get("model", {})
    parts = [f"<p class='note'>{NOTE}</p>",
             f"<p class='note'>Model <code>{html_text(str(model.get('model_id', '?')))}</code> "
             f"({model.get('n_layers', '?')} layers, {html_text(str(model.get('attn_implementation', '?')))} "
             f"attention). {html_text(_split_text(t['probe'], t['sessions'], st))} Intervals: 95% percentile "
             "bootstrap over sessions (each session contributes its mean over T3 tokens); probe intervals over "
             "held-out sessions.</p>"]
    if st.get("plant_strength"):
        parts.append(f"<p class='note'><b>Planted run</b>: {st['plant_strength']:g} × a per-class direction added to "
                     f"block {st.get('plant_layer', 0)}'s output at T1's positions.</p>")
    div = divergence_by_layer(summary)
    if not div.is_empty():
        rows = []
        for layer, g in div.group_by("layer", maintain_order=True):
            r = {x["pair"]: x for x in g.iter_rows(named=True)}
            rows.append([str(layer[0])] + [_fmt(r[p]["rel_l2"], r[p]["rel_l2_lo"], r[p]["rel_l2_hi"]) if p in r else "—"
                                           for p in VS_C]
                        + [_fmt(r[p]["cosine"], r[p]["cosine_lo"], r[p]["cosine_hi"], 4) if p in r else "—" for p in VS_C])
        parts.append("<h3>T3 hidden states vs the full context, per layer</h3>" + _table(
            ["layer", "rel. L2 A vs C", "rel. L2 B vs C", "rel. L2 D vs C", "cosine A vs C", "cosine B vs C",
             "cosine D vs C"], rows))
    kl, top1 = _metric(summary, "next_token_kl"), _metric(summary, "next_token_top1_agrees")
    if not kl.is_empty():
        agree = {r["pair"]: r for r in top1.iter_rows(named=True)}
        rows = [[html_text(r["pair"].replace("_vs_", " vs ")), _fmt(r["estimate"], r["lo"], r["hi"]),
                 _fmt(agree[r["pair"]]["estimate"], agree[r["pair"]]["lo"], agree[r["pair"]]["hi"])
                 if r["pair"] in agree else "—", str(r["n_sessions"])] for r in kl.iter_rows(named=True)]
        parts.append("<h3>Next-token distribution over T3 (KL(p_ref ‖ p_x), nats)</h3>"
                     + _table(["x vs ref", "KL", "top-1 agrees", "n sessions"], rows))
    fd = first_divergence(t["decode"])
    if fd:
        rows = [[SETUP_NAMES[r["setup"]], r["diverged"].fmt(unit="session"), r["depth"].fmt(2, unit="session"),
                 str(r["n"])] for r in fd]
        parts.append(f"<h3>Greedy continuation ({fd[0]['n_new']} tokens after T3) vs C's</h3>"
                     + _table(["setup", "share of sessions that diverge", f"first divergence (index; {fd[0]['n_new']} "
                               "= never)", "n sessions"], rows))
    att = _metric(summary, "attention_summary_mass")
    if att.is_empty():
        parts.append("<p class='note'>Attention mass onto the summary: not in these tables (study run before it "
                     "was measured).</p>")
    else:
        mx = {(r["pair"], r["layer"]): r for r in _metric(summary, "attention_summary_mass_max").iter_rows(named=True)}
        rows = []
        for layer, g in att.sort("layer").group_by("layer", maintain_order=True):
            r = {x["pair"]: x for x in g.iter_rows(named=True)}
            rows.append([str(layer[0])] + [_fmt(r[s]["estimate"], r[s]["lo"], r[s]["hi"]) if s in r else "—"
                                           for s in ("A", "B", "C", "D")]
                        + [_fmt(mx[("A", layer[0])]["estimate"], mx[("A", layer[0])]["lo"], mx[("A", layer[0])]["hi"])
                           if ("A", layer[0]) in mx else "—"])
        parts.append("<h3>Attention mass of T3's queries on the summary's keys (mean over heads)</h3>" + _table(
            ["layer", "A (mask)", "B (restart)", "C (full)", "D (mask early)", "A, most summary-reading head"], rows))
    parts.append("<h3>Probe: the masked fact read from T3's last hidden state (held-out accuracy)</h3>"
                 + _probe_html(t["probe"], "Real labels"))
    if planted is not None:
        ps = planted["settings"]
        parts.append(f"<h3>Planted-signal check ({ps.get('plant_strength', 0):g} × a class direction at block "
                     f"{ps.get('plant_layer', 0)}, T1 positions)</h3><p class='note'>The same probe on a run where "
                     "the fact is written into T1's residual stream: where it beats the majority baseline under C, "
                     "the machinery can see a fact that is there. "
                     f"{html_text(_split_text(planted['probe'], planted['sessions'], ps))}</p>"
                     + _probe_html(planted["probe"], "Planted"))
    else:
        parts.append("<p class='note'>No planted-signal run beside this study (<code>planted/</code>).</p>")
    return TITLE, "\n".join(parts), _figures(t, planted)
