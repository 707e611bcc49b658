"""The SAE card's two figures, built once per session: Bokeh figures whose data sources change, nothing else.

As for the Overview (:mod:`trajscope.ui.step_figures`): a new run, SAE or label
replaces the sources' data, the axis ranges and the row labels. No Bokeh model is
created or removed, so putting a run on screen costs the server milliseconds where
building the equivalent HoloViews overlays cost about a second
(``benchmarks/card_apply.py``), and the browser redraws glyphs it already has.

The data comes from :func:`trajscope.ui.feature_plots.timeline_data` and
:func:`~trajscope.ui.feature_plots.error_data`; x is the step (0 = prefill) and the
dashed line at x = 0.5 is where decode starts. The view adds the step cursor
(:class:`~trajscope.ui.views._cursor.Cursor`).
"""

from __future__ import annotations

import numpy as np
from bokeh.models import BoxAnnotation, ColorBar, ColumnDataSource, FixedTicker, HoverTool, LinearColorMapper, Range1d, Span
from bokeh.plotting import figure

from trajscope.ui.analysis_plots import FIGURE_TOOLS
from trajscope.ui.feature_plots import DECODE_START
from trajscope.ui.plots import PREFILL_COLOR

STEP_LABEL = "step (0 = prefill)"
REFERENCE_COLOR = "#2ca02c"
TIMELINE_TITLE = "Feature timeline — the {n} features most often active (dashed: decode starts)"
ERROR_TITLE = "SAE reconstruction error by step (green: prefill mean ± s.d.; dashed: decode starts)"


def _decode_start(color: str = PREFILL_COLOR, width: float = 2) -> Span:
    return Span(dimension="height", location=DECODE_START, line_color=color, line_dash="dashed", line_width=width)


class TimelineFigure:
    """Feature × step rectangles coloured by activation (colour bar beside them), one row per feature.

    Call :meth:`show` with a :func:`~trajscope.ui.feature_plots.timeline_data` dict. The figure is as
    tall as its rows need (22 px a row, at least 260 px); its height changes only when the number of
    rows does.
    """

    def __init__(self):
        self.source = ColumnDataSource({c: [] for c in ("x0", "y0", "x1", "y1", "activation", "step", "feature")})
        self.mapper = LinearColorMapper(palette="Viridis256", low=0.0, high=1.0)
        self.ticker = FixedTicker(ticks=[])
        fig = figure(height=260, sizing_mode="stretch_width", title=TIMELINE_TITLE.format(n=0),
                     x_axis_label=STEP_LABEL, y_axis_label="feature", x_range=Range1d(-0.5, 1.5),
                     y_range=Range1d(0.5, -0.5), tools=FIGURE_TOOLS, toolbar_location="right")
        rects = fig.quad(left="x0", right="x1", bottom="y0", top="y1", source=self.source, line_alpha=0,
                         fill_color={"field": "activation", "transform": self.mapper})
        fig.add_tools(HoverTool(renderers=[rects], tooltips=[("step", "@step"), ("feature", "@feature"),
                                                             ("activation", "@activation{0.00}")]))
        fig.yaxis.ticker = self.ticker
        fig.ygrid.visible = False
        fig.add_layout(_decode_start())
        fig.add_layout(ColorBar(color_mapper=self.mapper, width=10, title="activation", title_text_font_size="8pt"),
                       "right")
        self.figure = fig

    def show(self, data: dict) -> None:
        """Replace the rectangles, the row labels and the ranges with ``data``'s."""
        rows, act = data["rows"], np.asarray(data["rects"]["activation"], dtype=np.float64)
        lo, hi = (float(act.min()), float(act.max())) if len(act) else (0.0, 1.0)
        self.mapper.update(low=lo, high=hi if hi > lo else lo + 1e-9)
        self.source.data = data["rects"]
        n = max(1, len(rows))
        self.ticker.ticks = list(range(len(rows)))
        self.figure.yaxis.major_label_overrides = {i: name for i, name in enumerate(rows)}
        self.figure.y_range.update(start=n - 0.5, end=-0.5)
        self.figure.x_range.update(start=-0.5, end=data["last_step"] + 0.5)
        self.figure.title.text = TIMELINE_TITLE.format(n=len(rows))
        height = max(260, 22 * n + 90)
        if self.figure.height != height:
            self.figure.height = height


class ErrorFigure:
    """Relative reconstruction error by step, with the prefill mean (dashed) ± s.d. (the green band).

    Call :meth:`show` with an :func:`~trajscope.ui.feature_plots.error_data` dict.
    """

    def __init__(self):
        self.source = ColumnDataSource({"step": [], "error": []})
        self.band = BoxAnnotation(bottom=0, top=0, fill_color=REFERENCE_COLOR, fill_alpha=0.15, line_alpha=0,
                                  editable=False)
        self.mean = Span(dimension="width", location=0, line_color=REFERENCE_COLOR, line_dash="dashed")
        fig = figure(height=260, sizing_mode="stretch_width", title=ERROR_TITLE, x_axis_label=STEP_LABEL,
                     y_axis_label="‖x − x̂‖² ÷ ‖x‖²", tools="xpan,xwheel_zoom,box_zoom,reset,save",
                     toolbar_location="right")
        line = fig.line("step", "error", source=self.source, color="#1f77b4", line_width=1.8)
        self.extent = ColumnDataSource({"step": [], "y": []})  # invisible: keeps the band inside the auto y range
        fig.scatter("step", "y", source=self.extent, alpha=0)
        fig.add_tools(HoverTool(renderers=[line], mode="vline",
                                tooltips=[("step", "@step"), ("relative error", "@error{0.000}")]))
        for a in (self.band, self.mean, _decode_start(width=1)):
            fig.add_layout(a)
        self.figure = fig

    def show(self, data: dict) -> None:
        """Replace the curve and the prefill reference with ``data``'s."""
        self.source.data = {"step": data["step"], "error": data["error"]}
        m, s = data["mean"], data["sd"]
        self.band.update(bottom=m - s, top=m + s)
        self.mean.location = m
        self.extent.data = {"step": [0, 0], "y": [m - s, m + s]}


__all__ = ["TimelineFigure", "ErrorFigure"]
