"""The Eviction card's figures, built once per card: Bokeh figures whose data sources change, nothing else.

As for the Overview (:mod:`trajscope.ui.step_figures`) and the Drift card: a study
result replaces the sources' data, the ranges, the labels and the titles; no Bokeh
model is created or removed, so putting a result on screen costs the server
milliseconds (building the equivalent HoloViews overlays cost about a second) and the
browser redraws glyphs it already has. The data comes from the pure functions of
:mod:`trajscope.studies.eviction.plots` and :mod:`~trajscope.studies.eviction.plots_more`.
The step figures share x = the decode step; the card adds the step cursor.

- :class:`KeptFigure` — kept (blue) and evicted (grey) prompt positions, one image row per layer and head;
- :class:`CostsFigure` — recall@k of decode attention in the kept set, and the mass on evicted keys;
- :class:`RerunFigure` — the masked re-run's KL per step, the steps whose greedy token differs, the first
  divergence;
- :class:`SplitFigure` — the per-step and accumulated arms with their depth-band means;
- :func:`needle_figure` — a model's shipped needle table (it does not change with the run: built once per model).
"""

from __future__ import annotations

import polars as pl
from bokeh.models import (
    BoxAnnotation,
    ColumnDataSource,
    FixedTicker,
    HoverTool,
    LinearColorMapper,
    Range1d,
    Whisker,
)
from bokeh.plotting import figure

from trajscope.studies.eviction.plots import EVICTED, KEPT
from trajscope.studies.eviction.plots_more import ACCUMULATED, PER_STEP
from trajscope.ui.analysis_plots import FIGURE_TOOLS, LAYER_COLORS, side_legend
from trajscope.ui.plots import integer_hover

STEP_AXIS = "step (decode)"
DIFFERS = "#d62728"


def _step_figure(title: str, y_label: str, **kw):
    return figure(height=260, sizing_mode="stretch_width", title=title, x_axis_label=STEP_AXIS,
                  y_axis_label=y_label, tools=FIGURE_TOOLS, toolbar_location="right", **kw)


class KeptFigure:
    """Kept and evicted prompt positions: ``pos`` on x (the hover gives its token), a row per layer and head on y
    (layer 0, head 0 at the top). Call :meth:`show` with a :func:`~trajscope.studies.eviction.plots.kept_data` dict.

    One image, not a glyph per cell: SmolLM2's 270 query heads over a 41-token chat prompt made 11,070
    rectangles, which took the browser's main thread about half a second to draw.
    """

    def __init__(self):
        self.source = ColumnDataSource({"image": [], "x": [], "y": [], "dw": [], "dh": []})
        self.ticker = FixedTicker(ticks=[])
        fig = figure(height=300, sizing_mode="stretch_width", title="Kept prompt keys",
                     x_axis_label="prompt position (pos, prefill)", y_axis_label="layer and head",
                     x_range=Range1d(-0.5, 0.5), y_range=Range1d(0.5, -0.5), tools=FIGURE_TOOLS, toolbar_location="right")
        image = fig.image(image="image", x="x", y="y", dw="dw", dh="dh", source=self.source,
                          color_mapper=LinearColorMapper(palette=[EVICTED, KEPT], low=0, high=1))
        self.hover = integer_hover([("pos", "$x{custom}"), ("layer/head", "$y{custom}"), ("key", "@image{custom}")],
                                   {"$x": [], "$y": [], "@image": ["evicted", "kept"]})
        self.hover.renderers = [image]
        fig.add_tools(self.hover)
        fig.yaxis.ticker = self.ticker
        fig.grid.visible = False
        self.figure = fig

    def show(self, data: dict) -> None:
        grid = data["grid"]
        n, P = grid.shape
        self.source.data = {"image": [grid], "x": [-0.5], "y": [-0.5], "dw": [P], "dh": [n]}
        self.hover.formatters["$x"].args = {"labels": data["token_labels"], "origin": 0}
        self.hover.formatters["$y"].args = {"labels": data["heads"], "origin": 0}
        self.ticker.ticks = [y for y, _ in data["yticks"]]
        self.figure.yaxis.major_label_overrides = {y: label for y, label in data["yticks"]}
        self.figure.x_range.update(start=-0.5, end=P - 0.5)
        self.figure.y_range.update(start=n - 0.5, end=-0.5)  # inverted: layer 0, head 0 on top
        self.figure.title.text = data["title"]
        height = min(600, 90 + 14 * n)
        if self.figure.height != height:
            self.figure.height = height


class CostsFigure:
    """Per decode step: recall@k of the step's top attended prompt keys in the kept set (blue) and the attention
    mass on evicted prompt keys (red). Call :meth:`show` with a :func:`~trajscope.studies.eviction.plots.costs_data`
    dict."""

    def __init__(self):
        self.source = ColumnDataSource({c: [] for c in ("step", "recall", "evicted", "token")})
        fig = _step_figure("Decode attention vs the kept set", "share (0–1)", y_range=Range1d(-0.02, 1.02))
        rec = fig.line("step", "recall", source=self.source, color=KEPT, line_width=2)
        evi = fig.line("step", "evicted", source=self.source, color=DIFFERS, line_width=2)
        hover = [("step", "@step{0}"), ("query token", "@token")]
        fig.add_tools(HoverTool(renderers=[rec], tooltips=hover + [("recall", "@recall{0.000}")]),
                      HoverTool(renderers=[evi], tooltips=hover + [("evicted mass", "@evicted{0.000}")]))
        self.legend = side_legend(fig, [("recall@8 of decode attention in the kept set", [rec]),
                                        ("attention mass on evicted prompt keys", [evi])])
        self.figure = fig

    def show(self, data: dict) -> None:
        self.source.data = data["source"]
        self.legend.items[0].label = {"value": f"recall@{data['k']} of decode attention in the kept set"}
        self.figure.title.text = data["title"]


class RerunFigure:
    """The masked re-run against the full cache per decode step: KL (teacher-forced, purple), a red × at y = 0
    where the free-running masked run's greedy token differs, the first divergence as a dotted line. Call
    :meth:`show` with a :func:`~trajscope.studies.eviction.plots.rerun_data` dict."""

    def __init__(self):
        self.kl = ColumnDataSource({c: [] for c in ("step", "kl_to_full", "agrees", "token")})
        self.differs = ColumnDataSource({c: [] for c in ("step", "y", "token")})
        fig = _step_figure("Masked re-run vs full cache", "KL (nats)")
        line = fig.line("step", "kl_to_full", source=self.kl, color="#9467bd", line_width=2)
        marks = fig.scatter("step", "y", source=self.differs, marker="x", size=8, color=DIFFERS)
        # the first divergence: a vertical dotted segment from 0 to the largest KL (a glyph, so it has a legend entry)
        self.first = ColumnDataSource({"x": [], "y": []})
        first_item = fig.line("x", "y", source=self.first, color=DIFFERS, line_dash="dotted", line_width=1.5)
        hover = [("step", "@step{0}"), ("query token", "@token")]
        fig.add_tools(HoverTool(renderers=[line], tooltips=hover + [("KL (nats)", "@kl_to_full{0.0000}"),
                                                                    ("same greedy token", "@agrees{0}")]),
                      HoverTool(renderers=[marks], tooltips=hover))
        self.legend = side_legend(fig, [("KL(p_full ‖ p_masked), teacher-forced", [line]),
                                        ("greedy token differs (free-running)", [marks]),
                                        ("first divergence", [first_item])])
        self.figure = fig

    def show(self, data: dict) -> None:
        self.kl.data = data["kl"]
        self.differs.data = data["differs"]
        first, kl = data["first"], [v for v in data["kl"]["kl_to_full"] if v == v]
        top = max(kl) if kl else 1.0
        self.first.data = {"x": [float(first)] * 2, "y": [0.0, top]} if first is not None else {"x": [], "y": []}
        self.legend.items[2].visible = first is not None
        self.figure.title.text = data["title"]


class SplitFigure:
    """Both arms of the per-step vs accumulated split per decode step, with their depth-band means as pale bars.
    Call :meth:`show` with a :func:`~trajscope.studies.eviction.plots_more.split_data` dict."""

    def __init__(self):
        self.lines = ColumnDataSource({c: [] for c in ("step", "kl_per_step", "kl_accumulated")})
        self.bands = ColumnDataSource({c: [] for c in ("x0", "x1", "y", "arm", "color")})
        fig = _step_figure("Per-step vs accumulated damage", "KL to full model (nats)")
        fig.segment("x0", "y", "x1", "y", source=self.bands, color="color", alpha=0.35, line_width=6)
        per = fig.line("step", "kl_per_step", source=self.lines, color=PER_STEP, line_width=2)
        acc = fig.line("step", "kl_accumulated", source=self.lines, color=ACCUMULATED, line_width=2)
        fig.add_tools(HoverTool(renderers=[per, acc], tooltips=[
            ("step", "@step{0}"), ("per-step KL", "@kl_per_step{0.0000}"), ("accumulated KL", "@kl_accumulated{0.0000}")]))
        side_legend(fig, [("per-step arm (history unmasked)", [per]),
                          ("accumulated arm (every decode query masked)", [acc])])
        self.figure = fig

    def show(self, data: dict) -> None:
        self.lines.data = data["lines"]
        colors = {"kl_per_step": PER_STEP, "kl_accumulated": ACCUMULATED}
        self.bands.data = {**data["bands"], "color": [colors[a] for a in data["bands"]["arm"]]}
        self.figure.title.text = data["title"]


NEEDLE_TITLE = "Passkey retrieval vs budget — {model}'s shipped needle study ({n} prompts)"
FULL_COLOR = "#555555"


def needle_figure(table: pl.DataFrame, model_id: str):
    """Accuracy against budget (log x: kept share of the prompt), a line and whiskers per policy (the table's 95%
    Wilson interval over prompts, ``lo`` … ``hi``); the uncompressed cache ('full') as a dashed line in its band.

    Each policy's source holds its rows sorted by budget: ``budget, accuracy, lo, hi, n, policy``; the hover reads them.
    """
    n = int(table["n"].max()) if table.height else 0
    budgets = sorted(set(table["budget"].to_list())) or [1.0]
    x0, x1 = budgets[0] / 1.3, budgets[-1] * 1.3
    fig = figure(height=280, sizing_mode="stretch_width", title=NEEDLE_TITLE.format(model=model_id, n=n),
                 x_axis_type="log", x_axis_label="budget (kept share of the prompt)", y_axis_label="accuracy",
                 x_range=Range1d(x0, x1), y_range=Range1d(-0.05, 1.05), tools=FIGURE_TOOLS, toolbar_location="right")
    fig.xaxis.ticker = FixedTicker(ticks=budgets)  # the budgets the study ran (a log axis labels few of them)
    items, lines = [], []
    full = table.filter(pl.col("policy") == "full")
    if full.height:
        f = full.row(0, named=True)
        fig.add_layout(BoxAnnotation(bottom=f["lo"], top=f["hi"], fill_color="#bbbbbb", fill_alpha=0.3, line_alpha=0,
                                     editable=False))
        ref = fig.line([x0, x1], [f["accuracy"]] * 2, color=FULL_COLOR, line_dash="dashed")
        items.append((f"full cache {f['accuracy']:.2f}", [ref]))
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
        items.append((str(name), [line, dots]))
        lines.append(line)
    fig.add_tools(HoverTool(renderers=lines, tooltips=[
        ("policy", "@policy"), ("budget", "@budget"), ("accuracy", "@accuracy{0.00} [@lo{0.00}, @hi{0.00}]"),
        ("n prompts", "@n")]))
    side_legend(fig, items)
    return fig


__all__ = ["KeptFigure", "CostsFigure", "RerunFigure", "SplitFigure", "needle_figure"]
