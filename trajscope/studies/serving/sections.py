"""Report sections for the serving studies: determinism floor, batch composition, chunked prefill,
prefix cache and SAE stability.

Each ``*_section(result)`` reads the tables of the study's
:class:`~trajscope.studies.registry.Result` (what ``trajscope study …`` wrote, or what the study
just returned) and returns ``(title, html, figures)``: an HTML
fragment with the setup (model dtype, device, threads, prompts, rows), the study's numbers with
their 95 % intervals (prompt-clustered bootstrap, :func:`trajscope.stats.cluster_bootstrap`),
what is read against the determinism floor, and a list of Bokeh figures. Nothing is recomputed
from the model: a section renders from the tables alone. :mod:`trajscope.reports.studies`
detects which studies a directory holds and assembles the sections into one offline HTML file.

None of these studies fits anything, so they have no held-out split: the floor is measured on
the same prompts. The SAE-stability study splits prompts into train and eval; its section says
how many of each.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import polars as pl

from trajscope.escaping import html_text
from trajscope.interval_text import format_interval
from trajscope.studies.registry import Result

INTERVAL_NOTE = ("Intervals: 95 % percentile bootstrap over prompts (each prompt's mean first; "
                 "<code>trajscope.stats.cluster_bootstrap</code>).")


def read(result: Result, name: str) -> pl.DataFrame:
    """The Result's table ``name``; one clear error when it is missing or unreadable."""
    return result.table(name)


def num(v: Any, digits: int = 3) -> str:
    """A number for a table: integers as is, floats with ``digits`` significant digits, blanks for null."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if isinstance(v, bool) or isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "0" if v == 0 else f"{v:.{digits}g}"
    return html_text(str(v))


def ci(v: Any, lo: Any, hi: Any, n_clusters: int | None = None) -> str:
    """``value [lo, hi]`` (:func:`trajscope.interval_text.format_interval`, numbers written by :func:`num`)."""
    return format_interval(v, lo, hi, n_clusters=n_clusters, number=num)


def table(df: pl.DataFrame, cols: Sequence[str] | None = None, ci_of: Sequence[str] = ()) -> str:
    """An HTML table of ``df``; for each column ``c`` in ``ci_of`` one cell ``c [c_lo, c_hi]``."""
    cols = list(cols or [c for c in df.columns if not c.endswith(("_lo", "_hi"))])
    head = "".join(f"<th>{html_text(c + (' [95% CI]' if c in ci_of else ''))}</th>" for c in cols)
    rows = []
    for r in df.iter_rows(named=True):
        cells = (ci(r[c], r.get(f"{c}_lo"), r.get(f"{c}_hi"), r.get("n_prompts")) if c in ci_of else num(r[c])
                 for c in cols)
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    return f"<div class='scroll'><table><tr>{head}</tr>{''.join(rows)}</table></div>"


def setup_line(long: pl.DataFrame, extra: str = "") -> str:
    """Model dtype, device, threads and the prompt / row counts of a long study table."""
    def first(c: str) -> str:
        return str(long[c][0]) if c in long.columns and long.height else "?"

    n_prompts = long["prompt_id"].n_unique() if "prompt_id" in long.columns else "?"
    return (f"<p class='note'><b>Setup.</b> dtype {html_text(first('dtype'))}, device {html_text(first('device'))}, "
            f"{html_text(first('threads'))} CPU thread(s); n = {n_prompts} prompts, {long.height:,} rows "
            f"(prompt × condition × layer × position). {extra} No fitted quantity, so no held-out split: the floor "
            f"is measured on the same prompts. {INTERVAL_NOTE}</p>")


def layer_figure(summary: pl.DataFrame, group: Sequence[str], title: str, floor: pl.DataFrame | None = None,
                 floor_dtype: str = "float32") -> Any:
    """Mean relative L2 by layer, one line per group (whiskers: the 95 % interval), the floor dashed."""
    from bokeh.models import HoverTool, Whisker, ColumnDataSource
    from bokeh.palettes import Category10_10
    from bokeh.plotting import figure

    fig = figure(title=title, width=640, height=300, y_axis_type="log", x_axis_label="layer",
                 y_axis_label="relative L2 ‖Δ‖/‖x‖")
    keys = summary.select(group).unique(maintain_order=True).rows() if group else [()]
    for i, key in enumerate(keys[:10]):
        g = summary
        for c, v in zip(group, key):
            g = g.filter(pl.col(c) == v)
        g = g.sort("layer").with_columns(pl.col("rel_l2_mean", "rel_l2_mean_lo", "rel_l2_mean_hi").clip(1e-12))
        src = ColumnDataSource({"layer": g["layer"].to_list(), "y": g["rel_l2_mean"].to_list(),
                                "lo": g["rel_l2_mean_lo"].fill_nan(None).fill_null(1e-12).to_list(),
                                "hi": g["rel_l2_mean_hi"].fill_nan(None).fill_null(1e-12).to_list()})
        label = " / ".join(str(v) for v in key) or "mean"
        color = Category10_10[i % 10]
        fig.line("layer", "y", source=src, color=color, legend_label=label, line_width=2)
        fig.scatter("layer", "y", source=src, color=color, size=5)
        fig.add_layout(Whisker(source=src, base="layer", lower="lo", upper="hi", line_color=color))
    if floor is not None and floor.height:
        f = floor.filter(pl.col("dtype") == floor_dtype).sort("layer")
        fig.line(f["layer"].to_list(), f["floor_rel_l2"].to_list(), color="black", line_dash="dashed",
                 legend_label=f"{floor_dtype} floor", line_width=2)
    fig.add_tools(HoverTool(tooltips=[("layer", "@layer"), ("mean rel L2", "@y{0.000e}")]))
    fig.legend.location = "bottom_right"
    fig.legend.click_policy = "hide"
    fig.legend.label_text_font_size = "9pt"
    return fig


def headline_html(result: Result) -> str:
    """The study's headline numbers (:func:`trajscope.studies.serving.summary.summaries_of`) as one line."""
    from trajscope.studies.serving.summary import summaries_of

    parts = []
    for label, e in summaries_of(result).items():
        extra = ", ".join(html_text(f"{k} {v}") for k, v in e.items() if k not in ("value", "lo", "hi", "n") and v != "")
        parts.append(f"{html_text(label)}: {ci(e.get('value'), e.get('lo'), e.get('hi'), e.get('n'))}"
                     + (f" ({extra})" if extra else ""))
    return f"<p class='ts-headline'><b>Headline.</b> {'; '.join(parts)}.</p>" if parts else ""


def _deepest(summary: pl.DataFrame) -> pl.DataFrame:
    return summary.filter(pl.col("layer") == summary["layer"].max())


def _vs_floor(summary: pl.DataFrame) -> str:
    above = summary["frac_above_floor"].max() if "frac_above_floor" in summary.columns else None
    greedy = summary["frac_greedy_diverged"].max() if "frac_greedy_diverged" in summary.columns else None
    ratio = (summary["rel_l2_max"] / summary["floor_rel_l2"]).max() if "floor_rel_l2" in summary.columns else None
    return (f"<p><b>Against the floor:</b> largest share of positions above the float32 floor in any group "
            f"{num(above)}; largest delta = {num(ratio)} × the floor; largest share of greedy next-token changes "
            f"{num(greedy)}.</p>")


SUMMARY_COLS = ["layer", "n_prompts", "rel_l2_mean", "rel_l2_max", "floor_rel_l2", "frac_above_floor",
                "frac_greedy_diverged"]


def determinism_section(result: Result) -> tuple[str, str, list]:
    """The determinism floor: per dtype and layer, and what choosing a lower precision does."""
    fl, summ = read(result, "determinism_floor"), read(result, "determinism_summary")
    long = result.scan("determinism").select(
        "prompt_id", "dtype", "device", "threads").collect()
    noise = summ.filter(pl.col("condition").is_in(["repeat", "deterministic", "threads", "tf32"]))
    choice = summ.filter(pl.col("condition").is_in(["vs_float32", "vs_float64"]))
    body = (headline_html(result) + setup_line(long, "Conditions: " + ", ".join(sorted(summ["condition"].unique().to_list())) + ".")
            + "<p>floor_rel_l2 = max(measured noise over repeat / deterministic / threads, 2 × rounding vs a "
              "float64 copy), per dtype and layer (max over prompts and positions).</p>"
            + table(fl.sort("dtype", "layer"), ["dtype", "layer", "n_prompts", "noise_rel_l2", "rounding_rel_l2",
                                                "floor_rel_l2"])
            + "<h3>Noise conditions and precision choices, deepest layer</h3>"
            + table(_deepest(summ).sort("dtype", "condition"), ["dtype", "condition", *SUMMARY_COLS],
                    ci_of=["rel_l2_mean"]))
    figs = [layer_figure(noise.filter(pl.col("dtype") == "float32"), ["condition"],
                         "float32 noise conditions vs the float32 floor", fl),
            layer_figure(choice, ["dtype", "condition"], "Precision: each dtype vs float64 / float32", fl)]
    return "Determinism floor", body, figs


def batch_section(result: Result) -> tuple[str, str, list]:
    """Batch composition: alone vs co-batched (neighbours, padding side, slot), against the floor."""
    summ, fl = read(result, "batch_summary"), read(result, "batch_floor")
    long = result.scan("batch").select(
        "prompt_id", "dtype", "device", "threads", "batch_size").collect()
    bands = read(result, "batch_bands")
    spread = bands.group_by("layer").agg(pl.col("rel_spread").max().alias("max_rel_spread"),
                                         pl.col("n_conditions").max().alias("max_conditions")).sort("layer")
    body = (headline_html(result) + setup_line(long, f"Batch of {long['batch_size'].max()}: the prompt with shorter / longer / mixed "
                             "neighbours or identical copies, left and right padding, first and last row; the "
                             "reference is the prompt alone.")
            + _vs_floor(summ)
            + "<h3>Per condition, deepest layer</h3>"
            + table(_deepest(summ), ["neighbours", "padding_side", "slot", *SUMMARY_COLS], ci_of=["rel_l2_mean"])
            + "<h3>Variance band across all conditions of a prompt (max over prompts and positions)</h3>"
            + table(spread))
    by_side = summ.group_by("padding_side", "layer").agg(
        pl.col("rel_l2_mean").mean(), pl.col("rel_l2_mean_lo").min(), pl.col("rel_l2_mean_hi").max())
    return "Batch composition", body, [layer_figure(summ.filter(pl.col("slot") == "first"), ["neighbours", "padding_side"],
                                                    "Co-batched vs alone (prompt in the first row)", fl),
                                       layer_figure(by_side, ["padding_side"], "Left vs right padding "
                                                    "(mean over conditions; whiskers: widest interval)", fl)]


def chunked_prefill_section(result: Result) -> tuple[str, str, list]:
    """Chunked vs monolithic prefill per chunk size and layer."""
    summ, fl = read(result, "chunked-prefill_summary"), read(result, "chunked-prefill_floor")
    long = result.scan("chunked-prefill").select(
        "prompt_id", "dtype", "device", "threads").collect()
    body = (headline_html(result) + setup_line(long, "Chunk sizes " + ", ".join(map(str, sorted(summ["chunk"].unique()))) + " tokens vs one "
                       "pass (chunk ≥ prompt length is one pass and bitwise identical).")
            + _vs_floor(summ) + "<h3>Per chunk size, deepest layer</h3>"
            + table(_deepest(summ).sort("chunk"), ["chunk", *SUMMARY_COLS], ci_of=["rel_l2_mean"]))
    return "Chunked vs monolithic prefill", body, [layer_figure(summ.sort("chunk"), ["chunk"],
                                                                "Chunked prefill vs one pass, by chunk size", fl)]


def prefix_cache_section(result: Result) -> tuple[str, str, list]:
    """Prefix cache: the coverage map (what a cache-heavy harvest never produces) and reuse deltas."""
    from trajscope.studies.serving.summary import summaries_of

    cov, summ = read(result, "prefix-cache_coverage_summary"), read(result, "prefix-cache_summary")
    fl = read(result, "prefix-cache_floor")
    share = summaries_of(result).get("share of a prompt's positions never computed") or {}
    long = result.scan("prefix-cache").select(
        "prompt_id", "dtype", "device", "threads", "reused").collect()
    overall = cov.filter(pl.col("by") == "all").row(0, named=True)
    body = (headline_html(result) + setup_line(long, f"Shared prefix served from a warm cache; prompts reused {long['reused'].min()}–"
                             f"{long['reused'].max()} tokens.")
            + f"<p><b>Coverage:</b> {overall['n_reused']:,} of {overall['n_positions']:,} positions "
              f"({num(overall['share_never_produced'])}) are never computed, so a cache-heavy harvest has no rows "
              f"there; per prompt {ci(share.get('value'), share.get('lo'), share.get('hi'), share.get('n'))} "
              f"(n = {num(share.get('n'))} prompts).</p>"
            + table(cov, ["by", "group", "n_positions", "n_reused", "share_never_produced"])
            + "<h3>Continuation on the cached prefix vs a full recompute</h3>" + _vs_floor(summ)
            + table(summ.sort("layer"), SUMMARY_COLS, ci_of=["rel_l2_mean"]))
    return "Prefix cache", body, [layer_figure(summ, [], "Cached-prefix continuation vs full recompute", fl)]


METRIC_NOTE = {"dec_maxcos": "mean best decoder cosine of B's features with A's",
               "share_matched": "share of B's features with decoder cosine ≥ 0.9 to some A feature",
               "row_jaccard": "per eval row, Jaccard of active features (B's mapped to their best A match)",
               "fvu_delta": "FVU(B) − FVU(A) on the reference eval rows"}


def sae_stability_section(result: Result) -> tuple[str, str, list]:
    """SAE stability: serving-mode pairs vs the seed-to-seed spread, and each SAE's FVU."""
    summ, saes = read(result, "sae-stability_summary"), read(result, "sae-stability_saes")
    harv, pairs = read(result, "sae-stability_harvests"), read(result, "sae-stability_pairs")
    s0 = saes.row(0, named=True)
    seeds = sorted(saes["seed"].unique().to_list())
    body = (headline_html(result) + f"<p class='note'><b>Setup.</b> TopK SAEs (d_sae {s0['d_sae']}, k {s0['k']}, {s0['n_tokens']:,} training "
            f"rows each) on block {s0['layer']}, seeds {', '.join(map(str, seeds))}, one SAE per serving mode and seed; "
            f"held-out split by prompt: {s0['n_train_prompts']} train, {s0['n_eval_prompts']} eval prompts "
            f"({pairs['n_eval_rows'][0]:,} eval rows of the reference harvest, every SAE evaluated on them). "
            "A = the reference SAE, B = the other. " + "; ".join(f"<b>{k}</b>: {v}" for k, v in METRIC_NOTE.items())
            + ". Intervals: prompt-clustered bootstrap for row metrics (FVU denominator held fixed), features "
              "resampled for dec_maxcos, binomial for share_matched. <b>seed</b> pairs are the seed-to-seed spread; "
              "<b>same_seed</b> pairs differ only in the serving mode.</p>"
            + "<h3>Harvests</h3>"
            + table(harv.rename({"rel_l2_lo": "rel_l2_vs_reference_lo", "rel_l2_hi": "rel_l2_vs_reference_hi"}), ["mode", "dtype", "batch_size", "padding_side", "prefix_cache", "n_rows", "n_computed",
                           "n_reused", "rel_l2_vs_reference"], ci_of=["rel_l2_vs_reference"])
            + "<h3>Serving mode vs reseeding</h3>"
            + table(summ.rename({"lo": "value_lo", "hi": "value_hi"}),
                    ["mode", "kind", "metric", "n_pairs", "value", "seed_min", "seed_max", "verdict"],
                    ci_of=["value"])
            + "<h3>Reconstruction on held-out reference rows (per SAE and region)</h3>"
            + table(saes.sort("mode", "region", "seed"), ["mode", "seed", "region", "n_rows", "n_prompts", "fvu",
                                                           "fvu_uncentred", "cos", "l0", "dead"], ci_of=["fvu"]))
    return "SAE stability under serving modes", body, [_stability_figure(summ)]


def _stability_figure(summ: pl.DataFrame) -> Any:
    """Row Jaccard per mode and pair kind with its interval; the seed pairs' range shaded."""
    from bokeh.models import BoxAnnotation, ColumnDataSource, Whisker
    from bokeh.plotting import figure

    g = summ.filter(pl.col("metric") == "row_jaccard")
    labels = [f"{m} / {k}" for m, k in zip(g["mode"], g["kind"])]
    src = ColumnDataSource({"x": labels, "y": g["value"].to_list(), "lo": g["lo"].to_list(), "hi": g["hi"].to_list()})
    fig = figure(x_range=labels, title="Active-feature Jaccard with the reference SAE (shaded: seed-to-seed range)",
                 width=640, height=300, y_axis_label="row Jaccard", y_range=(0, 1.05))
    fig.scatter("x", "y", source=src, size=8)
    fig.add_layout(Whisker(source=src, base="x", lower="lo", upper="hi"))
    seed = g.filter(pl.col("kind") == "seed")
    if seed.height:
        fig.add_layout(BoxAnnotation(bottom=float(seed["seed_min"][0]), top=float(seed["seed_max"][0]),
                                     fill_alpha=0.15, fill_color="grey"))
    fig.xaxis.major_label_orientation = 0.8
    return fig
