"""The compaction study's report section: masking vs restart, from the study's Result only.

:func:`section` follows the registry's contract — ``section(result) -> (title, html, figures)``:
an HTML fragment of tables (every number with its 95% interval, the setup, n and the held-out split)
and a list of Bokeh figures, all read from the Result's ``compaction_summary`` (computed once by
:func:`trajscope.studies.compaction.summary.summarize`), ``compaction_probe`` and config:

- the headline: A (mask) against C (full context) at the deepest layer;
- per-layer divergence of T3's hidden states, A (mask), B (restart) and D (mask from the summary on,
  the control) each against C (full context): relative L2 and cosine;
- next-token KL and top-1 agreement for every pair; the greedy continuation's first divergence;
- attention mass from T3's queries onto the summary, per layer and setup;
- held-out probe accuracy by layer under each setup against the majority baseline, chance and the
  shuffled-label control. A planted-signal run (``--plant-strength``, its own Result, e.g. in a
  ``planted/`` folder passed to ``trajscope study-report`` beside the real-label run) is titled as the
  check that the probe can see a signal when one is there.
"""

from __future__ import annotations

import polars as pl

from trajscope.errors import TrajscopeError
from trajscope.escaping import html_text
from trajscope.interval_text import format_interval
from trajscope.studies.compaction.summary import headline
from trajscope.studies.registry import Result

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


def decode_divergence(summary: pl.DataFrame) -> list[dict]:
    """Per setup (A, B, D vs C's greedy tokens): the summary's rows of the share of sessions that diverge and of
    the first divergence (``n_new`` = never), each ``{"setup", "diverged", "depth"}`` (rows with estimate, lo,
    hi, n_sessions); empty without a decode table."""
    div = {r["pair"]: r for r in _metric(summary, "decode_diverged").iter_rows(named=True)}
    depth = {r["pair"]: r for r in _metric(summary, "decode_first_divergence").iter_rows(named=True)}
    return [{"setup": s, "diverged": div[s], "depth": depth.get(s)} for s in sorted(div)]


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


def _figures(summary: pl.DataFrame, probe: pl.DataFrame | None, label: str) -> list:
    from bokeh.models import ColumnDataSource, HoverTool, Whisker
    from bokeh.plotting import figure

    figs = []
    div = divergence_by_layer(summary)
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
    att = _metric(summary, "attention_summary_mass")
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
    if probe is not None and not probe.is_empty():
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
        sh = same.filter(pl.col("control") == "shuffled").group_by("layer", maintain_order=True).agg(pl.col("accuracy").mean()).sort("layer")
        fig.line(sh["layer"].to_list(), sh["accuracy"].to_list(), color="#888", line_dash="dashed",
                 legend_label="shuffled labels (mean over setups)")
        maj = same.group_by("layer", maintain_order=True).agg(pl.col("majority").first()).sort("layer")
        fig.line(maj["layer"].to_list(), maj["majority"].to_list(), color="black", line_dash="dotted",
                 legend_label="majority baseline")
        fig.legend.location = "top_left"
        figs.append(fig)
    return figs


def _optional(result: Result, name: str) -> pl.DataFrame | None:
    try:
        return result.table(name)
    except TrajscopeError:
        return None


def headline_html(summary: pl.DataFrame) -> str:
    """The headline sentence: A (mask) vs C (full context) relative L2 at the deepest layer, with its interval."""
    h = headline(summary)
    if h is None:
        return ""
    return (f"<p class='headline'><b>Divergence of T3's hidden states, A (mask) vs C (full context), block "
            f"{h['layer']}</b>: rel. L2 {_fmt(h['estimate'], h['lo'], h['hi'])} (n = {h['n_sessions']} sessions).</p>")


def section(result: Result) -> tuple[str, str, list]:
    """The compaction study's report section (contract: ``(title, html_fragment, bokeh_figures)``), from its Result.

    A planted-signal run (``plant_strength`` in its config) is titled as the planted-signal check.

    Raises:
        TrajscopeError: the Result has no ``compaction_summary``, or a table is unreadable.
    """
    summary = result.table("compaction_summary")
    probe, sessions = _optional(result, "compaction_probe"), _optional(result, "compaction_sessions")
    st = result.config
    planted = bool(st.get("plant_strength"))
    model = st.get("model", {}) if isinstance(st.get("model"), dict) else {}
    parts = [f"<p class='note'>{NOTE}</p>", headline_html(summary),
             f"<p class='note'>Model <code>{html_text(str(model.get('model_id', '?')))}</code> "
             f"({model.get('n_layers', '?')} layers, {html_text(str(model.get('attn_implementation', '?')))} "
             f"attention). {html_text(_split_text(probe, sessions, st))} Intervals: 95% percentile "
             "bootstrap over sessions (each session contributes its mean over T3 tokens); probe intervals over "
             "held-out sessions.</p>"]
    if planted:
        parts.append(f"<h3>Planted-signal check ({st['plant_strength']:g} × a class direction at block "
                     f"{st.get('plant_layer', 0)}, T1 positions)</h3><p class='note'>The probe on a run where the fact "
                     "is written into T1's residual stream: where it beats the majority baseline under C, the "
                     "machinery can see a fact that is there.</p>")
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
    fd = decode_divergence(summary)
    if fd:
        n_new = st.get("max_new_tokens", "n_new")

        def iv(r, digits=3):
            return "—" if r is None else _fmt(r["estimate"], r["lo"], r["hi"], digits)

        rows = [[SETUP_NAMES[r["setup"]], iv(r["diverged"]), iv(r["depth"], 2), str(r["diverged"]["n_sessions"])]
                for r in fd]
        parts.append(f"<h3>Greedy continuation ({n_new} tokens after T3) vs C's</h3>"
                     + _table(["setup", "share of sessions that diverge", f"first divergence (index; {n_new} "
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
                 + _probe_html(probe, "Planted" if planted else "Real labels"))
    return TITLE + (" (planted signal)" if planted else ""), "\n".join(p for p in parts if p), _figures(
        summary, probe, "planted fact" if planted else "real labels")
