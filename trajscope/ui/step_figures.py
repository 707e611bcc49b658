"""The Overview's figures, built once per session: Bokeh figures whose data sources change, nothing else.

The token strip, the attention-telemetry curves and the next-token curves are on
screen when a generated run arrives. Each is one Bokeh figure over
``ColumnDataSource`` s, built once; a new run or selection *replaces the sources'
data* (and a title, a colour range, the axis extents). No Bokeh model is
created or removed, so the document's model graph is not recomputed and the
browser redraws glyphs it already has: putting a run on screen costs a few
milliseconds of server time, where re-rendering the equivalent HoloViews
overlays cost about 0.2 s (measured in ``benchmarks/app_generate.py``).

The data comes from pure functions (:func:`trajscope.ui.plots.token_layout`,
:func:`trajscope.metrics.attention.step_telemetry`,
:func:`trajscope.metrics.next_token.step_outputs`); every x axis here is the
step (0 = prefill), with integer hovers. The views add the step cursors
(:class:`~trajscope.ui.views._cursor.Cursor`) and route clicks to a step.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import polars as pl
from bokeh.events import Tap
from bokeh.models import BasicTicker, ColorBar, ColumnDataSource, FixedTicker, HoverTool, LinearColorMapper, Range1d
from bokeh.plotting import figure

from trajscope.metrics.next_token import step_outputs
from trajscope.ui.plots import CURSOR_COLOR, CURVE_COLORS, CURVE_LABELS, JUMP_COLOR, text_colors

FIELDS = ("entropy_norm", "prefix_mass", "generated_mass", "sink_mass")
OVERLAP_LABEL = "top-8 overlap with previous step (Jaccard)"
JUMP_LABEL = "sharp jump (overlap < 0.5 and far below this run's typical)"
STRIP_LINES = 8  # lines of tokens shown before the strip scrolls (y pan)


def _floats(s: pl.Series) -> np.ndarray:
    return s.cast(pl.Float64).fill_null(float("nan")).to_numpy()


def _on_tap(fig, fn: Callable[[float, float], None]) -> None:
    fig.on_event(Tap, lambda e: fn(e.x, e.y))


class TelemetryFigure:
    """Attention statistics over steps (all in [0, 1]), the top-8 overlap curve and the sharp phase jumps.

    Call :meth:`show` with a :func:`~trajscope.metrics.attention.step_telemetry` frame
    (``step, <FIELDS>…, jaccard, sharp_jump``).
    """

    def __init__(self, fields: tuple[str, ...] = FIELDS):
        self.fields = fields
        self.source = ColumnDataSource({c: [] for c in ("step", *fields, "jaccard")})
        self.jumps = ColumnDataSource({"step": [], "y": []})
        fig = figure(height=300, sizing_mode="stretch_width", title="Attention telemetry over steps",
                     x_axis_label="step (0 = prefill)", y_axis_label="fraction", y_range=Range1d(0, 1.05),
                     tools="xpan,xwheel_zoom,box_zoom,reset,save", toolbar_location="right")
        lines = [fig.line("step", f, source=self.source, color=CURVE_COLORS.get(f, "black"), line_width=1.8,
                          legend_label=CURVE_LABELS.get(f, f)) for f in fields]
        fig.line("step", "jaccard", source=self.source, color=JUMP_COLOR, line_width=1.2, line_dash="dotted",
                 legend_label=OVERLAP_LABEL)
        fig.scatter("step", "y", source=self.jumps, marker="inverted_triangle", size=9, color=JUMP_COLOR,
                    legend_label=JUMP_LABEL)
        fig.add_tools(HoverTool(renderers=lines[:1], mode="vline", tooltips=[("step", "@step{0}")] + [
            (CURVE_LABELS.get(f, f), f"@{{{f}}}{{0.000}}") for f in fields] + [("top-8 overlap", "@jaccard{0.000}")]))
        fig.legend.label_text_font_size = "8pt"
        fig.legend.click_policy = "hide"
        fig.add_layout(fig.legend[0], "right")
        self.figure = fig

    def show(self, tele: pl.DataFrame, title: str) -> None:
        """Replace the curves with ``tele``'s (one data change per source) and the title."""
        self.source.data = {"step": tele["step"].cast(pl.Int64).to_numpy(),
                            **{f: _floats(tele[f]) for f in self.fields}, "jaccard": _floats(tele["jaccard"])}
        col = "sharp_jump" if "sharp_jump" in tele.columns else "jump"
        jumps = tele.filter(pl.col(col))["step"].cast(pl.Int64).to_numpy()
        self.jumps.data = {"step": jumps, "y": np.full(len(jumps), 1.02)}
        self.figure.title.text = title

    def on_click(self, fn: Callable[[float, float], None]) -> None:
        """Call ``fn(x, y)`` (data coordinates) when the plot is clicked."""
        _on_tap(self.figure, fn)


class NextTokenFigure:
    """Next-token entropy and the produced token's −logprob over steps (the model's own uncertainty).

    Both are computed by step s and drawn at x = s (:func:`~trajscope.metrics.next_token.step_outputs`).
    """

    def __init__(self):
        self.source = ColumnDataSource({"step": [], "entropy": [], "nll": [], "token": []})
        fig = figure(height=220, sizing_mode="stretch_width", title="Next-token distribution over steps",
                     x_axis_label="step (0 = prefill)", y_axis_label="nats",
                     tools="xpan,xwheel_zoom,box_zoom,reset,save", toolbar_location="right")
        ent = fig.line("step", "entropy", source=self.source, color="#1f77b4", line_width=1.8,
                       legend_label="next-token entropy")
        fig.line("step", "nll", source=self.source, color="#ff7f0e", line_width=1.8,
                 legend_label="−logprob of produced token")
        fig.add_tools(HoverTool(renderers=[ent], mode="vline", tooltips=[
            ("step", "@step{0}"), ("produced token", "@token"), ("next-token entropy", "@entropy{0.000} nats"),
            ("−logprob", "@nll{0.000} nats")]))
        fig.legend.label_text_font_size = "8pt"
        fig.legend.click_policy = "hide"
        fig.add_layout(fig.legend[0], "right")
        self.figure = fig

    def show(self, tokens: pl.DataFrame, prompt_len: int) -> None:
        """Replace the curves with those of a run's ``tokens`` table."""
        from trajscope.ui.plots import visible

        df = step_outputs(tokens, prompt_len)
        self.source.data = {"step": df["step"].cast(pl.Int64).to_numpy(), "entropy": _floats(df["entropy"]),
                            "nll": -_floats(df["logprob"]), "token": [visible(t) for t in df["text"].to_list()]}

    def on_click(self, fn: Callable[[float, float], None]) -> None:
        """Call ``fn(x, y)`` (data coordinates) when the plot is clicked."""
        _on_tap(self.figure, fn)


class TokenStripFigure:
    """Token boxes coloured by a metric (colour bar beside them), whitespace visible, a red prefill/decode bar.

    Call :meth:`show` with a :func:`~trajscope.ui.plots.token_layout` frame. Boxes without a value are
    light grey; each label is black or white, whichever contrasts more with its box. The strip is as
    tall as the longest run it has shown (up to :data:`STRIP_LINES` lines; more scroll with y pan).
    """

    def __init__(self):
        self.source = ColumnDataSource({c: [] for c in ("x0", "x1", "y0", "y1", "xc", "yc", "value", "pos", "step",
                                                         "token", "phase", "segment", "ink")})
        self.bar = ColumnDataSource({"x0": [], "y0": [], "x1": [], "y1": []})
        self.mapper = LinearColorMapper(palette="Viridis256", low=0.0, high=1.0, nan_color="#e0e0e0")
        self.lines = 1  # lines of tokens the strip has room for
        fig = figure(height=34 + 60, sizing_mode="stretch_width", x_range=Range1d(-0.5, 20.5),
                     y_range=Range1d(-1.05, 0.05), tools="ypan,reset", toolbar_location="right",
                     title="Tokens — prompt | generated (click a token to jump to its step)")
        fig.axis.visible = False
        fig.grid.visible = False
        boxes = fig.quad(left="x0", right="x1", bottom="y0", top="y1", source=self.source, line_color="white",
                         fill_alpha=0.85, fill_color={"field": "value", "transform": self.mapper})
        fig.text("xc", "yc", text="token", source=self.source, text_color="ink", text_font={"value": "monospace"},
                 text_font_size="9pt", text_align="center", text_baseline="middle")
        fig.segment("x0", "y0", "x1", "y1", source=self.bar, color=CURSOR_COLOR, line_width=4)
        self.hover = HoverTool(renderers=[boxes], tooltips=[("pos", "@pos{0}"), ("step", "@step{0}"),
                                                            ("token", "@token"), ("phase", "@phase"),
                                                            ("segment", "@segment"), ("value", "@value{0.000}")])
        fig.add_tools(self.hover)
        # the colour bar's two tickers, made once: a new ticker model per run would add a model to the document
        self.scale_ticker, self.category_ticker = BasicTicker(), FixedTicker(ticks=[])
        self.colorbar = ColorBar(color_mapper=self.mapper, width=10, title="value", title_text_font_size="8pt",
                                 ticker=self.scale_ticker)
        fig.add_layout(self.colorbar, "right")
        self.figure = fig

    def show(self, layout: pl.DataFrame, prompt_len: int, label: str, palette: list[str], centred: bool = False,
             categories: list[str] | None = None) -> None:
        """Replace the boxes with ``layout``'s, coloured by its ``value`` with ``palette`` (centred on 0 if asked).

        With ``categories``, ``value`` is a category's index and ``palette`` holds one colour per category:
        the colour bar names the categories instead of showing a scale.
        """
        value = _floats(layout["value"]) if len(layout) else np.zeros(0)
        finite = value[np.isfinite(value)]
        lo, hi = (float(finite.min()), float(finite.max())) if len(finite) else (0.0, 1.0)
        if categories:
            lo, hi = -0.5, len(categories) - 0.5
            self.category_ticker.ticks = list(range(len(categories)))
            self.colorbar.update(ticker=self.category_ticker,
                                 major_label_overrides={i: name for i, name in enumerate(categories)})
        else:
            self.colorbar.update(ticker=self.scale_ticker, major_label_overrides={})
        if centred:
            m = max(abs(lo), abs(hi), 1e-9)
            lo, hi = -m, m
        hi = hi if hi > lo else lo + 1e-9
        self.mapper.update(palette=palette, low=lo, high=hi)
        self.colorbar.title = label
        self.hover.tooltips = self.hover.tooltips[:-1] + [(label, "@segment" if categories else "@value{0.000}")]
        cols = {c: layout[c].to_numpy() for c in ("x0", "x1", "y0", "y1", "xc", "yc")}
        self.source.data = {**cols, "value": value, "pos": layout["pos"].cast(pl.Int64).to_numpy(),
                            "step": layout["step"].cast(pl.Int64).to_numpy(), "token": layout["label"].to_list(),
                            "phase": layout["phase"].to_list(),
                            "segment": layout["segment"].to_list() if "segment" in layout.columns else [""] * len(layout),
                            "ink": text_colors(value, palette, lo, hi)}
        b = layout.filter(pl.col("pos") == prompt_len)
        if len(b):
            x, y0 = float(b["x0"][0]) - 0.05, float(b["y0"][0]) - 0.08
            self.bar.data = {"x0": [x], "y0": [y0], "x1": [x], "y1": [y0 + 1.0]}
        else:
            self.bar.data = {"x0": [], "y0": [], "x1": [], "y1": []}
        n_lines = int(-layout["y0"].min() + 0.5) if len(layout) else 1
        # the strip grows to the longest run shown (up to STRIP_LINES) and never shrinks: the page below it
        # stays in place when runs change, and the browser does not lay every plot out again (a height
        # change cost ~110 ms of main-thread layout at the end of each Generate, benchmarks/app_generate.py)
        self.lines = max(self.lines, min(n_lines, STRIP_LINES))
        self.figure.y_range.update(start=-self.lines - 0.05, end=0.05)
        self.figure.x_range.update(start=-0.5, end=max(float(layout["x1"].max() or 1) if len(layout) else 1.0, 20.0) + 0.5)
        if self.figure.height != 34 * self.lines + 60:
            self.figure.height = 34 * self.lines + 60

    def follow(self, line: int) -> None:
        """Pan so that token line ``line`` (0 = first; it spans y ∈ [−line−1, −line]) is in view.

        A long run has more lines than the strip shows; the current step's line is kept in view, a
        line or two below the top, and the strip does not move while it is already visible.
        """
        r = self.figure.y_range
        top, bottom = -float(line), -float(line) - 1.0
        if bottom >= r.start - 1e-9 and top <= r.end + 1e-9:
            return
        end = min(0.05, top + min(2.0, self.lines - 1.0) + 0.05)
        r.update(start=end - self.lines - 0.1, end=end)

    def on_click(self, fn: Callable[[float, float], None]) -> None:
        """Call ``fn(x, y)`` (data coordinates) when the strip is clicked."""
        _on_tap(self.figure, fn)


__all__ = ["TelemetryFigure", "NextTokenFigure", "TokenStripFigure", "FIELDS"]
