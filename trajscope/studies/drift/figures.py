"""The Drift card's two figures, built once per session: Bokeh figures whose data sources change, nothing else.

As for the Overview (:mod:`trajscope.ui.step_figures`): a new run or profile
replaces the heatmap's image, the curves' data, the ranges and the labels; no Bokeh
model is created or removed, so putting a scored run on screen costs the server
milliseconds (``benchmarks/card_apply.py``) and the browser redraws glyphs it
already has. The data comes from :func:`trajscope.studies.drift.plots.heatmap_data`
and :func:`~trajscope.studies.drift.plots.curves_data`. Both figures share the page's
step axis (decode positions at their step, the prompt to the left of the dashed line
at 0.5); the card adds the step cursor.
"""

from __future__ import annotations

from bokeh.models import (
    ColorBar,
    ColumnDataSource,
    FixedTicker,
    HoverTool,
    Legend,
    LegendItem,
    LinearColorMapper,
    Range1d,
    Span,
)
from bokeh.plotting import figure
from holoviews.plotting.util import process_cmap

from trajscope.ui.analysis_plots import FIGURE_TOOLS, LAYER_COLORS, STEP_AXIS
from trajscope.ui.plots import integer_hover

HEATMAP_TITLE = "Residual drift vs prefill profile (diag. Mahalanobis / √d; 1 = typical, red = further){note}"
CURVES_TITLE = "Drift by layer{some}; dotted = that layer's threshold, calibrated on held-out prefill"


class HeatmapFigure:
    """Layer × step image of the drift score: blue below 1, red above, clipped at the 99th percentile of |score − 1|.

    Call :meth:`show` with a :func:`~trajscope.studies.drift.plots.heatmap_data` dict. Layer 0 is at the
    top; the hover names the position's token, its step and the layer.
    """

    def __init__(self):
        self.source = ColumnDataSource({"image": [], "x": [], "y": [], "dw": [], "dh": []})
        self.mapper = LinearColorMapper(palette=process_cmap("RdBu_r", 256), low=0.0, high=2.0, low_color="#053061",
                                        high_color="#67001f", nan_color="white")
        self.ticker = FixedTicker(ticks=[])
        fig = figure(height=230, sizing_mode="stretch_width", title=HEATMAP_TITLE.format(note=""),
                     x_axis_label=STEP_AXIS, y_axis_label="layer", x_range=Range1d(-0.5, 0.5),
                     y_range=Range1d(0.5, -0.5), tools=FIGURE_TOOLS, toolbar_location="right")
        image = fig.image(image="image", x="x", y="y", dw="dw", dh="dh", source=self.source, color_mapper=self.mapper)
        self.hover = integer_hover([("pos", "$x{custom}"), ("layer", "$y{custom}"), ("drift score", "@image{0.00}")],
                                   {"$x": [], "$y": []})
        self.hover.renderers = [image]
        fig.add_tools(self.hover)
        fig.yaxis.ticker = self.ticker
        fig.grid.visible = False
        fig.add_layout(Span(dimension="height", location=0.5, line_color="black", line_dash="dashed", line_width=1.5))
        fig.add_layout(ColorBar(color_mapper=self.mapper, width=10, title="drift score (clipped at p99)",
                                title_text_font_size="8pt"), "right")
        self.figure = fig

    def show(self, data: dict) -> None:
        """Replace the image, its colour range, the axes and the hover's labels with ``data``'s."""
        grid, x0, x1, y0 = data["grid"], data["x_min"], data["x_max"], data["y0"]
        n = grid.shape[0]
        self.mapper.update(low=data["clim"][0], high=data["clim"][1])
        self.source.data = {"image": [grid], "x": [x0 - 0.5], "y": [y0 - 0.5], "dw": [x1 - x0 + 1], "dh": [n]}
        self.hover.formatters["$x"].args = {"labels": data["x_labels"], "origin": x0}
        self.hover.formatters["$y"].args = {"labels": data["y_labels"], "origin": y0}
        self.ticker.ticks = [y for y, _ in data["yticks"]]
        self.figure.yaxis.major_label_overrides = {y: label for y, label in data["yticks"]}
        self.figure.x_range.update(start=x0 - 0.5, end=x1 + 0.5)
        self.figure.y_range.update(start=y0 + n - 0.5, end=y0 - 0.5)  # inverted: the first layer on top
        sink = data["sink_max"]
        self.figure.title.text = HEATMAP_TITLE.format(
            note="" if sink is None else f"; pos 0 (attention sink) left out: score up to {sink:.0f}")
        height = max(230, 14 * n + 90)
        if self.figure.height != height:
            self.figure.height = height


class CurvesFigure:
    """Drift score over steps, one line per shown layer (up to ``len(LAYER_COLORS)``), each with its threshold
    as a dotted line of the same colour and its value in the legend.

    Call :meth:`show` with a :func:`~trajscope.studies.drift.plots.curves_data` dict; the lines it does not
    use are hidden, with their legend entries.
    """

    def __init__(self):
        fig = figure(height=300, sizing_mode="stretch_width", title=CURVES_TITLE.format(some=""),
                     x_axis_label=STEP_AXIS, y_axis_label="drift score", y_range=Range1d(0, 1), tools=FIGURE_TOOLS,
                     toolbar_location="right")
        self.sources, self.lines, self.thresholds, items = [], [], [], []
        for color in LAYER_COLORS:
            src = ColumnDataSource({c: [] for c in ("x", "score", "pos", "step", "token", "layer")})
            line = fig.line("x", "score", source=src, color=color, line_width=1.5, visible=False)
            span = Span(dimension="width", location=0, line_color=color, line_dash="dotted", line_width=1.5,
                        visible=False)
            fig.add_layout(span)
            self.sources.append(src)
            self.lines.append(line)
            self.thresholds.append(span)
            items.append(LegendItem(label="", renderers=[line], visible=False))
        fig.add_tools(HoverTool(renderers=self.lines, tooltips=[
            ("layer", "@layer"), ("pos", "@pos"), ("step", "@step"), ("token", "@token"), ("drift score", "@score{0.00}")]))
        fig.add_layout(Span(dimension="height", location=0.5, line_color="#6c757d", line_dash="dashed"))
        self.legend = Legend(items=items, click_policy="hide", label_text_font_size="8pt")
        fig.add_layout(self.legend, "right")
        self.figure = fig

    def show(self, data: dict) -> None:
        """Replace the lines, thresholds, legend labels and y range with ``data``'s."""
        series = data["series"]
        for i, (src, line, span, item) in enumerate(zip(self.sources, self.lines, self.thresholds, self.legend.items)):
            s = series[i] if i < len(series) else None
            src.data = s["data"] if s else {c: [] for c in src.data}
            line.visible = item.visible = s is not None
            item.label = {"value": s["label"]} if s else {"value": ""}
            t = None if s is None else s["threshold"]
            span.update(visible=t is not None, location=t if t is not None else 0)
        self.figure.y_range.update(start=data["ylim"][0], end=data["ylim"][1])
        some = "" if len(series) == data["n_layers"] else f" ({len(series)} of {data['n_layers']} layers; pos 0 left out)"
        self.figure.title.text = CURVES_TITLE.format(some=some)
        height = max(300, 26 * len(series) + 90)
        if self.figure.height != height:
            self.figure.height = height


__all__ = ["HeatmapFigure", "CurvesFigure"]
