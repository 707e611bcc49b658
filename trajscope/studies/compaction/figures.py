"""The Compaction card's three figures, built once per card: Bokeh figures whose data sources change, nothing else.

As for the Eviction card (:mod:`trajscope.studies.eviction.figures`): a session result replaces the
sources' data; no Bokeh model is created or removed, so putting a result on screen costs the server
milliseconds and the browser redraws glyphs it already has. The data comes from the pure functions of
:mod:`trajscope.studies.compaction.plots`; x is the layer (block output) in all three.

- :class:`DivergenceFigure` — per layer, the relative L2 of T3's hidden states under A, B and D to C's;
- :class:`AttentionFigure` — per layer, the attention mass of T3's queries on the summary's keys, per setup;
- :class:`ProbeFigure` — the shipped study's held-out probe accuracy by layer per setup (95% intervals as
  whiskers), the shuffled-label control and the majority baseline.
"""

from __future__ import annotations

import polars as pl
from bokeh.models import ColumnDataSource, HoverTool, Range1d, Whisker
from bokeh.plotting import figure

from trajscope.studies.compaction.plots import COLORS, PAIRS, SETUPS, attention_by_layer, divergence_by_layer
from trajscope.studies.compaction.state import SETUP_LABELS, CardResult
from trajscope.ui.analysis_plots import FIGURE_TOOLS, side_legend


def _figure(title: str, x_label: str, y_label: str, height: int = 260, **kw):
    return figure(height=height, sizing_mode="stretch_width", title=title, x_axis_label=x_label, y_axis_label=y_label,
                  tools=FIGURE_TOOLS, toolbar_location="right", **kw)


def _columns(df: pl.DataFrame, cols: tuple[str, ...]) -> dict:
    return {c: df[c].to_list() for c in cols}


class DivergenceFigure:
    """Relative L2 of T3's block outputs to C's, per layer, a line with markers per setup (A, B, D).
    Call :meth:`show` with the card's result."""

    COLS = ("layer", "rel_l2", "cosine")

    def __init__(self):
        fig = _figure("T3 hidden states vs the full context C (rel. L2, mean over T3 tokens)", "layer (block output)",
                      "‖x − x_C‖ / ‖x_C‖")
        self.sources, items, lines = {}, [], []
        for pair in PAIRS:
            s = pair[0]
            src = self.sources[pair] = ColumnDataSource({c: [] for c in self.COLS})
            line = fig.line("layer", "rel_l2", source=src, color=COLORS[s], line_width=2)
            dots = fig.scatter("layer", "rel_l2", source=src, color=COLORS[s], size=6)
            items.append((SETUP_LABELS[s], [line, dots]))
            lines.append(line)
        fig.add_tools(HoverTool(renderers=lines, tooltips=[("layer", "@layer"), ("rel. L2", "@rel_l2{0.0000}"),
                                                           ("cosine", "@cosine{0.0000}")]))
        side_legend(fig, items)
        self.figure = fig

    def show(self, res: CardResult) -> None:
        df = divergence_by_layer(res.summary)
        for pair, src in self.sources.items():
            src.data = _columns(df.filter(pl.col("pair") == pair), self.COLS)


class AttentionFigure:
    """Attention mass of T3's queries on the summary's keys, per layer, one line per setup (A–D).
    Call :meth:`show` with the card's result."""

    def __init__(self):
        fig = _figure("Attention of T3's queries on the summary's keys (mean over T3 tokens and heads)", "layer",
                      "attention mass", y_range=Range1d(-0.02, 1.02))
        self.sources, items, lines = {}, [], []
        for s in SETUPS:
            src = self.sources[s] = ColumnDataSource({"layer": [], "summary_mass": []})
            line = fig.line("layer", "summary_mass", source=src, color=COLORS[s], line_width=2)
            items.append((SETUP_LABELS[s], [line]))
            lines.append(line)
        fig.add_tools(HoverTool(renderers=lines, tooltips=[("layer", "@layer"), ("on summary", "@summary_mass{0.000}")]))
        side_legend(fig, items)
        self.figure = fig

    def show(self, res: CardResult) -> None:
        df = attention_by_layer(res.summary)
        for s, src in self.sources.items():
            src.data = _columns(df.filter(pl.col("setup") == s), ("layer", "summary_mass"))


class ProbeFigure:
    """Held-out probe accuracy by layer per setup (markers, 95% intervals as whiskers; each setup nudged along x),
    the shuffled-label control (dashed) and the majority baseline (dotted). Call :meth:`show` with a
    :func:`~trajscope.studies.compaction.plots.probe_data` dict."""

    COLS = ("x", "layer", "accuracy", "lo", "hi")

    def __init__(self):
        fig = _figure("Probe of the masked fact by layer (shipped study, held-out accuracy, 95% CI)", "layer",
                      "accuracy", height=280, y_range=Range1d(0, 1))
        self.sources, items, dots = {}, [], []
        for s in SETUPS:
            src = self.sources[s] = ColumnDataSource({c: [] for c in self.COLS})
            fig.add_layout(Whisker(base="x", lower="lo", upper="hi", source=src, line_color=COLORS[s],
                                   upper_head=None, lower_head=None))
            d = fig.scatter("x", "accuracy", source=src, color=COLORS[s], size=7)
            items.append((SETUP_LABELS[s], [d]))
            dots.append(d)
        self.shuffled = ColumnDataSource({"layer": [], "accuracy": []})
        self.majority = ColumnDataSource({"layer": [], "majority": []})
        sh = fig.line("layer", "accuracy", source=self.shuffled, color="#888888", line_dash="dashed")
        mj = fig.line("layer", "majority", source=self.majority, color="black", line_dash="dotted")
        fig.add_tools(HoverTool(renderers=dots, tooltips=[("layer", "@layer"),
                                                          ("accuracy", "@accuracy{0.000} [@lo{0.000}, @hi{0.000}]")]))
        side_legend(fig, items + [("shuffled labels (mean over setups)", [sh]), ("majority baseline", [mj])])
        self.figure = fig

    def show(self, data: dict) -> None:
        for s, src in self.sources.items():
            src.data = data["setups"][s]
        self.shuffled.data = data["shuffled"]
        self.majority.data = data["majority"]


__all__ = ["DivergenceFigure", "AttentionFigure", "ProbeFigure"]
