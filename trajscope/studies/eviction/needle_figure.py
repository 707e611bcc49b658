"""The Eviction card's passkey retrieval figure: a model's shipped needle table as one Bokeh figure.

The table (``needle_summary`` of the ``needle`` study, shipped under the model's sample data) does
not change with the run on screen, so the card builds this figure once per model and session and
keeps it while runs change (building it through HoloViews cost about a second of server time
at every new run). Accuracy against budget (log x: kept share of the prompt), one line per
policy with its 95% Wilson interval over prompts as whiskers; the uncompressed cache
('full') as a dashed line inside its interval band.
"""

from __future__ import annotations

import polars as pl
from bokeh.models import BoxAnnotation, ColumnDataSource, FixedTicker, HoverTool, Legend, LegendItem, Range1d, Whisker
from bokeh.plotting import figure

from trajscope.ui.analysis_plots import LAYER_COLORS

TITLE = "Passkey retrieval vs budget — {model}'s shipped needle study ({n} prompts)"
FULL_COLOR = "#555555"


def needle_figure(table: pl.DataFrame, model_id: str):
    """Accuracy against budget, a line and whiskers per policy (the table's ``lo`` … ``hi``), 'full' as a band.

    Each policy's source holds its rows sorted by budget: ``budget, accuracy, lo, hi, n``; the hover reads them.
    """
    n = int(table["n"].max()) if table.height else 0
    budgets = sorted(set(table["budget"].to_list())) or [1.0]
    x0, x1 = budgets[0] / 1.3, budgets[-1] * 1.3
    fig = figure(height=280, sizing_mode="stretch_width", title=TITLE.format(model=model_id, n=n),
                 x_axis_type="log", x_axis_label="budget (kept share of the prompt)", y_axis_label="accuracy",
                 x_range=Range1d(x0, x1), y_range=Range1d(-0.05, 1.05), tools="pan,wheel_zoom,box_zoom,reset,save",
                 toolbar_location="right")
    fig.xaxis.ticker = FixedTicker(ticks=budgets)  # the budgets the study ran (a log axis labels few of them)
    items, lines = [], []
    full = table.filter(pl.col("policy") == "full")
    if full.height:
        f = full.row(0, named=True)
        fig.add_layout(BoxAnnotation(bottom=f["lo"], top=f["hi"], fill_color="#bbbbbb", fill_alpha=0.3, line_alpha=0,
                                     editable=False))
        ref = fig.line([x0, x1], [f["accuracy"]] * 2, color=FULL_COLOR, line_dash="dashed")
        items.append(LegendItem(label=f"full cache {f['accuracy']:.2f}", renderers=[ref]))
    rest = table.filter(pl.col("policy") != "full").sort("policy", "budget")
    for i, name in enumerate(rest["policy"].unique(maintain_order=True).to_list()):
        g = rest.filter(pl.col("policy") == name)
        src = ColumnDataSource({c: g[c].to_list() for c in ("budget", "accuracy", "lo", "hi", "n")}
                               | {"policy": [name] * g.height})
        color = LAYER_COLORS[i % len(LAYER_COLORS)]
        line = fig.line("budget", "accuracy", source=src, color=color, line_width=2)
        dots = fig.scatter("budget", "accuracy", source=src, color=color, size=5)
        fig.add_layout(Whisker(base="budget", lower="lo", upper="hi", source=src, line_color=color,
                               upper_head=None, lower_head=None))
        items.append(LegendItem(label=str(name), renderers=[line, dots]))
        lines.append(line)
    fig.add_tools(HoverTool(renderers=lines, tooltips=[
        ("policy", "@policy"), ("budget", "@budget"), ("accuracy", "@accuracy{0.00} [@lo{0.00}, @hi{0.00}]"),
        ("n prompts", "@n")]))
    fig.add_layout(Legend(items=items, click_policy="hide", label_text_font_size="8pt"), "right")
    return fig


__all__ = ["needle_figure"]
