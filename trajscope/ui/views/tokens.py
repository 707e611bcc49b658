"""The token strip: prompt and generated tokens, coloured by a per-token metric; click to jump.

Whitespace is made visible (· space, ↵ newline, → tab); a red bar marks the
prefill/decode boundary; the current step's query token has a thick outline and
the token it produced a dashed one (Bokeh annotations moved in place on a step
change, see :mod:`trajscope.ui.views._cursor`).
"""

from __future__ import annotations

import holoviews as hv
import panel as pn
import polars as pl

from trajscope import positions
from trajscope.metrics.position_zscore import position_zscore
from trajscope.ui import plots
from trajscope.ui.state import TOKEN_METRICS
from trajscope.ui.views._base import StateView
from trajscope.ui.views._cursor import Cursor, box

_LABELS = {v: k for k, v in TOKEN_METRICS.items()}


class TokenStrip(StateView):
    """Token strip with a metric selector; clicking a token moves the step to it."""

    def __init__(self, **params):
        super().__init__(**params)
        self.layout_df: pl.DataFrame | None = None
        self.prompt_len = 0
        self.cursor: Cursor | None = None
        self._panes: list = []
        self.state.param.watch(self._move, "step")

    def _move(self, event) -> None:
        if self.cursor is not None:
            self.cursor.set_step(event.new, *self._panes)

    def build(self, revision: int, metric: str, layer: int):
        """The strip for the current run and metric, with the step cursor hooked in (updated in place)."""
        st = self.state
        traj = st.trajectory
        tokens = st.tokens() if traj is not None else plots.empty_tokens()
        drift = position_zscore(traj.activations, layer) if metric == "drift" and traj is not None else None
        values = plots.token_metric_values(tokens, metric, drift)
        self.layout_df = plots.token_layout(tokens, values)
        self.prompt_len = traj.prompt_len if traj is not None else 0
        label = _LABELS.get(metric, metric) + (f", layer {layer}" if metric == "drift" else "")
        base = plots.token_strip(self.layout_df, self.prompt_len, label, plots.METRIC_CMAPS.get(metric, "viridis"))
        if self.cursor is None:
            self.cursor = Cursor([box(line_width=3), box(line_width=2, line_dash="dashed")], self._cursor_props)
        self.cursor.step = st.step
        return base.opts(hooks=[self.cursor.hook])

    def _cursor_props(self, step: int) -> list[dict]:
        P = self.prompt_len
        return plots.token_cursor_boxes(self.layout_df, positions.query_pos(step, P), positions.produced_pos(step, P))

    def _on_tap(self, x=None, y=None, **_):
        if self.layout_df is None:
            return
        pos = plots.token_at(self.layout_df, x, y)
        if pos is not None:
            self.state.go(self.state.step_for_pos(pos))

    def __panel__(self):
        st = self.state
        metric = pn.widgets.Select.from_param(st.param.token_metric, name="Colour tokens by", width=240)
        # a DynamicMap: a new run or colouring updates the same figure in place
        # the Tap is one of the DynamicMap's streams (HoloViews does not link a Tap whose source is a
        # DynamicMap of overlays); a click re-sends the cached strip, so it costs no rebuild
        self.tap = hv.streams.Tap(transient=True)
        self.tap.add_subscriber(self._on_tap)
        built = {}

        def strip(revision, metric, layer, token_extra, x=None, y=None):
            key = (revision, metric, layer, id(token_extra))
            if built.get("key") != key:
                built.update(key=key, element=self.build(revision, metric, layer))
            return built["element"]

        dm = hv.DynamicMap(strip, streams=[hv.streams.Params(st, ["revision", "token_metric", "layer", "token_extra"],
                                                             rename={"token_metric": "metric"}), self.tap])
        pane = pn.pane.HoloViews(dm, sizing_mode="stretch_width", linked_axes=False, css_classes=["ts-token-strip"])
        self._panes.append(pane)
        note = pn.pane.Markdown(
            "Each box is one token (· space, ↵ newline). Left of the red bar: the prompt (read at step 0, prefill); "
            "right: generated tokens. Thick outline: the current step's query; dashed: the token it produced. "
            "Grey boxes have no value (the last token has no next-token distribution).",
            styles={"color": "#555", "font-size": "0.85em"}, margin=(0, 10))
        return pn.Column(metric, pane, note, sizing_mode="stretch_width")
