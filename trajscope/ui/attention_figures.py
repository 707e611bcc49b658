"""The Attention card's two figures, built once per session: Bokeh figures whose data sources change, nothing else.

As for the Overview (:mod:`trajscope.ui.step_figures`): a new run or selection
replaces the images, the colour ranges, the axis extents, the split lines, the
hover labels and the titles; no Bokeh model is created or removed, so putting a
run on screen costs the server milliseconds (``benchmarks/card_apply.py``)
where re-rendering the HoloViews heatmap and grid cost a few hundred, and the
browser redraws glyphs it already has. On a step change only the grid's image
changes (and the view moves the heatmap's row cursor).

The data comes from :func:`trajscope.ui.plots.attention_heatmap_data` and
:func:`~trajscope.ui.plots.head_grid_data`. Both images are drawn with the
first row on top (inverted y range): query position 0 on the heatmap, layer 0
on the grid; cell centres are at integer coordinates, and the hovers show
integers (the heatmap's with each position's phase and token text, which Bokeh
escapes as it fills the tooltip).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from bokeh.models import BoxAnnotation, ColorBar, ColumnDataSource, FixedTicker, LinearColorMapper, LogColorMapper, Range1d, Span
from bokeh.plotting import figure
from holoviews.plotting.util import process_cmap

from trajscope.ui.analysis_plots import FIGURE_TOOLS
from trajscope.ui.plots import CURSOR_COLOR, integer_hover
from trajscope.ui.step_figures import _on_tap

HEATMAP_X = "key position (attended token)"
HEATMAP_Y = "query position (step 0 = prompt rows)"
SELECTION_COLOR = "#ff4136"


def _image(fig, mapper) -> tuple[ColumnDataSource, object]:
    source = ColumnDataSource({"image": [np.zeros((1, 1))], "x": [-0.5], "y": [-0.5], "dw": [1], "dh": [1]})
    return source, fig.image(image="image", x="x", y="y", dw="dw", dh="dh", source=source, color_mapper=mapper)


class HeatmapFigure:
    """Query × key image of attention weights on a log colour scale (white below 0.001), query 0 on top,
    dashed red lines between prompt and generated positions (keys: vertical; queries: horizontal).

    Call :meth:`show` with an :func:`~trajscope.ui.plots.attention_heatmap_data` dict.
    """

    def __init__(self):
        self.mapper = LogColorMapper(palette=process_cmap("Blues", 256), low=1e-3, high=1e-2, low_color="white",
                                     nan_color="white")
        fig = figure(height=420, sizing_mode="stretch_width", title="Attention weights (no run yet)",
                     x_axis_label=HEATMAP_X, y_axis_label=HEATMAP_Y, x_range=Range1d(-0.5, 0.5),
                     y_range=Range1d(0.5, -0.5), tools=FIGURE_TOOLS, toolbar_location="right")
        self.source, image = _image(fig, self.mapper)
        self.hover = integer_hover([("query pos", "$y{custom}"), ("key pos", "$x{custom}"),
                                    ("weight", "@image{0.0000}")], {"$x": None, "$y": None})
        self.hover.renderers = [image]
        fig.add_tools(self.hover)
        fig.grid.visible = False
        line = dict(line_dash="dashed", line_color=CURSOR_COLOR, line_width=1.5, location=0.5)
        self.key_split = Span(dimension="height", **line)  # x = P − 0.5: prompt keys to the left
        self.query_split = Span(dimension="width", **line)  # y = P − 0.5: prefill query rows above
        fig.add_layout(self.key_split)
        fig.add_layout(self.query_split)
        fig.add_layout(ColorBar(color_mapper=self.mapper, width=10, title="weight (log)", title_text_font_size="8pt"),
                       "right")
        self.figure = fig

    def show(self, data: dict) -> None:
        """Replace the image, its colour range, the axes, the split lines, the hover labels and the title."""
        m = data["matrix"]
        nq, nk = m.shape
        vmax = float(m.max()) if m.size else 1.0
        self.mapper.high = max(vmax, 1e-2)
        self.source.data = {"image": [m], "x": [-0.5], "y": [-0.5], "dw": [nk], "dh": [nq]}
        split = data["prompt_len"] - 0.5
        self.key_split.location = split
        self.query_split.location = split
        labels = data["labels"]
        for field in ("$x", "$y"):
            self.hover.formatters[field].args = {"labels": labels, "origin": 0}
        self.figure.x_range.update(start=-0.5, end=nk - 0.5)
        self.figure.y_range.update(start=nq - 0.5, end=-0.5)  # inverted: query 0 on top
        self.figure.title.text = data["title"]


class HeadGridFigure:
    """Layer × head image of one attention statistic at the current step (viridis), layer 0 on top, with the
    selected layer / head outlined (the whole layer row for the mean over heads).

    Call :meth:`show` with a :func:`~trajscope.ui.plots.head_grid_data` dict, :meth:`set_values` with a
    step's :func:`~trajscope.ui.plots.head_grid_values` (only the image changes), :meth:`select` with a
    :func:`~trajscope.ui.plots.head_box`.
    """

    def __init__(self):
        self.mapper = LinearColorMapper(palette=process_cmap("viridis", 256), low=0.0, high=1.0, nan_color="white")
        self.xticker, self.yticker = FixedTicker(ticks=[0]), FixedTicker(ticks=[0])
        fig = figure(height=300, sizing_mode="stretch_width", title="Layer × head grid (no run yet)",
                     x_axis_label="head", y_axis_label="layer", x_range=Range1d(-0.5, 0.5),
                     y_range=Range1d(0.5, -0.5), tools="", toolbar_location=None)
        self.source, image = _image(fig, self.mapper)
        self.source.data = {**self.source.data, "image": [np.full((1, 1), np.nan)]}
        self.hover = integer_hover([("layer", "$y{custom}"), ("head", "$x{custom}"), ("value", "@image{0.000}")],
                                   {"$x": None, "$y": None})
        self.hover.renderers = [image]
        fig.add_tools(self.hover)
        fig.xaxis.ticker, fig.yaxis.ticker = self.xticker, self.yticker
        fig.grid.visible = False
        self.colorbar = ColorBar(color_mapper=self.mapper, width=10, title="", title_text_font_size="8pt")
        fig.add_layout(self.colorbar, "right")
        self.selection = BoxAnnotation(fill_alpha=0.0, line_color=SELECTION_COLOR, line_width=3, left=0, right=0, top=0,
                                       bottom=0, level="overlay", editable=False)
        fig.add_layout(self.selection)
        self.n_heads = 1  # columns of the image shown
        self.figure = fig

    def show(self, data: dict) -> None:
        """Replace the image, its colour range, axes, ticks, labels and title (and the height if the layer count
        asks for another)."""
        nl, nh = data["n_layers"], data["n_heads"]
        self.n_heads = nh
        self.mapper.update(low=data["clim"][0], high=data["clim"][1])
        self.source.data = {"image": [data["grid"]], "x": [-0.5], "y": [-0.5], "dw": [nh], "dh": [nl]}
        self.xticker.ticks, self.yticker.ticks = data["xticks"], data["yticks"]
        self.figure.x_range.update(start=-0.5, end=nh - 0.5)
        self.figure.y_range.update(start=nl - 0.5, end=-0.5)  # inverted: layer 0 on top
        self.colorbar.title = data["label"]
        self.hover.tooltips = self.hover.tooltips[:2] + [(data["label"], "@image{0.000}")]
        self.figure.title.text = data["title"]
        if self.figure.height != data["height"]:
            self.figure.height = data["height"]

    def set_values(self, grid: np.ndarray) -> None:
        """Replace the image's values only (same shape: a step change)."""
        self.source.data["image"] = [grid]

    def select(self, cell: dict) -> None:
        """Move the selection outline to ``cell`` (``left, right, bottom, top``)."""
        self.selection.update(**cell)

    def on_click(self, fn: Callable[[float, float], None]) -> None:
        """Call ``fn(x, y)`` (data coordinates: head, layer) when the grid is clicked."""
        _on_tap(self.figure, fn)


__all__ = ["HeatmapFigure", "HeadGridFigure"]
