"""Attention at the current step: query × key heatmap, layer × head grid, top attended tokens.

The heatmap uses the full attention rows when the run kept them for the layer
(``attention_layers`` at capture); otherwise it is rebuilt from each row's top-8
keys in the ``attention`` table, and says so in its title. The current query row
and the selected grid cell are Bokeh annotations moved in place (see
:mod:`trajscope.ui.views._cursor`).
"""

from __future__ import annotations


import holoviews as hv
import numpy as np
import panel as pn

from trajscope.errors import TrajscopeError
from trajscope.escaping import html_text
from trajscope.ui import plots
from trajscope.ui.state import MEAN
from trajscope.ui.views._base import StateView
from trajscope.ui.views._cursor import Cursor, box


def html_table(df) -> str:
    """The :func:`~trajscope.ui.plots.top_attended` frame as a small HTML table."""
    rows = "".join(
        f"<tr><td>{r['rank']}</td><td>{r['pos']}</td><td>{r['phase']}</td>"
        f"<td><code>{html_text(r['token'] or '')}</code></td><td>{r['weight']:.3f}</td></tr>"
        for r in df.iter_rows(named=True))
    return ("<table class='ts-top'><thead><tr><th>#</th><th>pos</th><th>phase</th><th>token</th><th>weight</th>"
            f"</tr></thead><tbody>{rows}</tbody></table>")


def _empty(height: int):
    return hv.Overlay([hv.Text(0, 0, "No run yet")]).opts(height=height, responsive=True, xaxis=None, yaxis=None)


class AttentionView(StateView):
    """Layer / head selectors, heatmap with the current query row outlined, head grid, top keys."""

    def __init__(self, **params):
        super().__init__(**params)
        self.row_cursor: Cursor | None = None
        self._panes: list = []
        self.state.param.watch(self._move, "step")

    def _move(self, event) -> None:
        if self.row_cursor is not None:
            self.row_cursor.set_step(event.new, *self._panes)

    def heatmap(self, revision: int, layer: int, head: int):
        """Query × key heatmap of ``layer`` / ``head`` with the current-row cursor hooked in (updated in place)."""
        st = self.state
        traj = st.trajectory
        if traj is None:
            self._P, self._nk = 1, 1
            base = plots.attention_heatmap(np.zeros((1, 1)), 1, "Attention weights (no run yet)")
        else:
            h = None if head == MEAN else head
            n = int(traj.attention["pos"].max() or 0) + 1  # positions that were queries
            try:
                rows = traj.attention_rows(layer)
                matrix = (rows.float().mean(0) if h is None else rows[h].float()).numpy()  # saved runs: float16
                sparse = False
            except TrajscopeError:
                matrix = plots.attention_matrix(traj.attention, layer, h, n)
                sparse = True
            who = "mean over heads" if h is None else f"head {h}"
            self._P, self._nk = traj.prompt_len, matrix.shape[1]
            base = plots.attention_heatmap(matrix, traj.prompt_len, f"Attention weights, layer {layer}, {who}",
                                           sparse, texts=traj.tokens["text"].to_list())
        if self.row_cursor is None:
            self.row_cursor = Cursor([box(line_width=2, fill_alpha=0.12, fill_color="#d62728")],
                                     lambda s: [plots.attention_cursor_box(s, self._P, self._nk)])
        self.row_cursor.step = st.step
        return base.opts(hooks=[self.row_cursor.hook])

    def grid(self, revision: int, stat: str, layer: int, head: int):
        """Layer × head grid at the current step (a DynamicMap on ``step``), selection outlined."""
        st = self.state
        if st.trajectory is None:
            return _empty(300)
        queries = st.queries
        n_heads = int(queries["head"].max() or 0) + 1
        sel = Cursor([box(line_width=3, line_color="#ff4136")],
                     lambda s: [plots.head_box(layer, None if head == MEAN else head, n_heads)])
        dmap = hv.DynamicMap(lambda step: plots.head_grid(queries, step, stat).opts(hooks=[sel.hook]),
                             streams=[hv.streams.Params(st, ["step"])])
        tap = hv.streams.Tap(source=dmap)
        tap.add_subscriber(self._on_grid_tap)
        return dmap

    def _on_grid_tap(self, x=None, y=None, **_):
        if x is None or y is None:
            return
        layer, head = int(round(y)), int(round(x))
        st = self.state
        if layer in st.param.layer.objects and head in st.param.head.objects.values():
            st.param.update(layer=layer, head=head)

    def top_keys(self, step: int, revision: int, layer: int, head: int) -> str:
        st = self.state
        if st.trajectory is None:
            return ""
        df = plots.top_attended(st.queries, st.trajectory.tokens, step, layer, None if head == MEAN else head)
        return html_table(df)

    def __panel__(self):
        st = self.state
        layer = pn.widgets.Select.from_param(st.param.layer, name="Layer", width=110)
        head = pn.widgets.Select.from_param(st.param.head, name="Head", width=160)
        stat = pn.widgets.Select.from_param(st.param.grid_stat, name="Grid statistic", width=270)  # its longest option fits
        dm = hv.DynamicMap(self.heatmap, streams=[hv.streams.Params(st, ["revision", "layer", "head"])])
        heat = pn.pane.HoloViews(dm, sizing_mode="stretch_width", linked_axes=False, css_classes=["ts-attention-heatmap"])
        self._panes.append(heat)
        grid = pn.pane.HoloViews(pn.bind(self.grid, st.param.revision, st.param.grid_stat, st.param.layer, st.param.head),
                                 sizing_mode="stretch_width", linked_axes=False)
        top = pn.pane.HTML(pn.bind(self.top_keys, st.param.step, st.param.revision, st.param.layer, st.param.head),
                           css_classes=["ts-top-keys"],
                           stylesheets=[":host table.ts-top{border-collapse:collapse;font-size:0.85em}"
                                        ":host td,:host th{padding:2px 8px;border-bottom:1px solid #ddd;text-align:left}"])
        explain = pn.pane.Markdown(
            "**Heatmap**: row = query position, column = attended key position; dashed red lines split prompt from "
            "generated tokens, the red box is the row(s) queried at the current step (all prompt rows at step 0). "
            "**Grid**: the chosen statistic for every layer × head at the current step (click a cell to select it). "
            "Entropy is −Σ a log a over the keys the query sees; masses are the attention on the prompt (prefix), "
            "on generated tokens, and on position 0 (sink).",
            styles={"color": "#555", "font-size": "0.85em"}, margin=(0, 10))
        return pn.Column(
            pn.Row(layer, head, stat),
            pn.Row(pn.Column(heat, sizing_mode="stretch_width"),
                   pn.Column(grid, pn.pane.Markdown("**Top attended tokens at this step**", margin=(0, 10)), top,
                             sizing_mode="stretch_width"),
                   sizing_mode="stretch_width"),
            explain, sizing_mode="stretch_width")
