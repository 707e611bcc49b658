"""The token strip: prompt and generated tokens, coloured by a per-token metric; click to jump.

Whitespace is made visible (· space, ↵ newline, → tab); a red bar marks the
prefill/decode boundary; the current step's query token has a thick outline and
the token it produced a dashed one (Bokeh annotations moved in place on a step
change, see :mod:`trajscope.ui.views._cursor`).
"""

from __future__ import annotations

import panel as pn
import polars as pl
from holoviews.plotting.util import process_cmap

from trajscope import positions
from trajscope.metrics.position_zscore import position_zscore
from trajscope.ui import plots
from trajscope.ui.state import TOKEN_METRICS
from trajscope.ui.step_figures import TokenStripFigure
from trajscope.ui.views._base import StateView
from trajscope.ui.views._cursor import Cursor, box

_LABELS = {v: k for k, v in TOKEN_METRICS.items()}


class TokenStrip(StateView):
    """Token strip with a metric selector; clicking a token moves the step to it.

    One figure for the session (:class:`~trajscope.ui.step_figures.TokenStripFigure`): a new run or
    colouring replaces its data and colour range only.
    """

    def __init__(self, **params):
        super().__init__(**params)
        self.layout_df: pl.DataFrame | None = None
        self.prompt_len = 0
        self.strip = TokenStripFigure()
        self.cursor = Cursor([box(line_width=3), box(line_width=2, line_dash="dashed")], self._cursor_props)
        self.cursor.attach(self.strip.figure)
        self.strip.on_click(self.click)
        self._panes: list = []
        st = self.state
        st.param.watch(self._move, "step")
        st.param.watch(lambda *_: self.redraw(), ["revision", "token_metric", "layer", "token_extra"])
        self.redraw()

    def _move(self, event) -> None:
        self.cursor.set_step(event.new, *self._panes)
        self._follow(event.new)

    def _follow(self, step: int) -> None:
        """Keep the line of the step's query token in view (long runs have more lines than the strip shows)."""
        if self.layout_df is None or not len(self.layout_df):
            return
        row = self.layout_df.filter(pl.col("pos") == positions.query_pos(step, self.prompt_len))
        if len(row):
            self.strip.follow(int(-float(row["y1"][0]) + 0.5))

    def redraw(self) -> None:
        """Lay out the current run's tokens, coloured by the chosen metric, and move the cursor to the step."""
        st = self.state
        traj, metric, layer = st.trajectory, st.token_metric, st.layer
        tokens = st.tokens() if traj is not None else plots.empty_tokens()
        drift = position_zscore(traj.activations, layer) if metric == "drift" and traj is not None else None
        values = plots.token_metric_values(tokens, metric, drift)
        self.layout_df = plots.token_layout(tokens, values)
        self.prompt_len = traj.prompt_len if traj is not None else 0
        label = _LABELS.get(metric, metric) + (f", layer {layer}" if metric == "drift" else "")
        if metric == "segment":  # a category: one colour per segment, named on the colour bar
            self.strip.show(self.layout_df, self.prompt_len, label, list(plots.SEGMENT_COLORS.values()),
                            categories=list(plots.SEGMENT_COLORS))
        else:
            cmap = plots.METRIC_CMAPS.get(metric, "viridis")
            self.strip.show(self.layout_df, self.prompt_len, label, process_cmap(cmap, ncolors=256),
                            centred=cmap == "RdBu_r")
        self.cursor.set_step(st.step, *self._panes)
        self._follow(st.step)

    def _cursor_props(self, step: int) -> list[dict]:
        P = self.prompt_len
        if self.layout_df is None:
            return [{"visible": False}, {"visible": False}]
        return plots.token_cursor_boxes(self.layout_df, positions.query_pos(step, P), positions.produced_pos(step, P))

    def click(self, x: float | None, y: float | None = None) -> None:
        """A click at ``(x, y)`` in strip coordinates: on a token, jump to the step that reads it."""
        if self.layout_df is None or x is None or y is None:
            return
        pos = plots.token_at(self.layout_df, x, y)
        if pos is not None:
            self.state.go(self.state.step_for_pos(pos))

    def __panel__(self):
        st = self.state
        metric = pn.widgets.Select.from_param(st.param.token_metric, name="Colour tokens by", width=240)
        pane = pn.pane.Bokeh(self.strip.figure, sizing_mode="stretch_width")
        self._panes.append(pane)
        strip = pn.Column(pane, sizing_mode="stretch_width", css_classes=["ts-token-strip"])  # (a Bokeh pane shows
        # its figure as is: the class goes on a wrapper)
        note = pn.pane.Markdown(
            "Each box is one token (· space, ↵ newline). Left of the red bar: the prompt (read at step 0, prefill); "
            "right: generated tokens. Thick outline: the current step's query; dashed: the token it produced. "
            "Grey boxes have no value (the last token has no next-token distribution).",
            styles={"color": "#555", "font-size": "0.85em"}, margin=(0, 10))
        return pn.Column(metric, strip, note, sizing_mode="stretch_width")
