"""Attention at the current step: query × key heatmap, layer × head grid, top attended tokens.

The heatmap uses the full attention rows when the run kept them for the layer
(``attention_layers`` at capture); otherwise it is rebuilt from each row's top-8
keys in the ``attention`` table, and says so in its title
(:func:`trajscope.ui.plots.attention_heatmap_data`). Both figures are Bokeh
figures built once per view (:mod:`trajscope.ui.attention_figures`) in fixed
panes: a new run replaces both figures' data, a layer or head the heatmap's
(and moves the grid's outline), a grid statistic the grid's; a step change
replaces only the grid's values and moves the heatmap's row cursor (a
:class:`~trajscope.ui.views._cursor.Cursor`), and a click on a grid cell selects
its layer and head. While the card's tab is hidden, a new run or selection (and
the grid of a new step) waits until the tab is shown (:meth:`StateView.defer`).
"""

from __future__ import annotations

import panel as pn
import polars as pl

from trajscope.escaping import html_text
from trajscope.ui import plots
from trajscope.ui.attention_figures import HeadGridFigure, HeatmapFigure
from trajscope.ui.state import MEAN
from trajscope.ui.views._base import StateView
from trajscope.ui.views._cursor import Cursor, box
from trajscope.ui.views.staged import StagedRow


def html_table(df) -> str:
    """The :func:`~trajscope.ui.plots.top_attended` frame as a small HTML table."""
    rows = "".join(
        f"<tr><td>{r['rank']}</td><td>{r['pos']}</td><td>{r['phase']}</td>"
        f"<td><code>{html_text(r['token'] or '')}</code></td><td>{r['weight']:.3f}</td></tr>"
        for r in df.iter_rows(named=True))
    return ("<table class='ts-top'><thead><tr><th>#</th><th>pos</th><th>phase</th><th>token</th><th>weight</th>"
            f"</tr></thead><tbody>{rows}</tbody></table>")


def _head(head: int) -> int | None:
    return None if head == MEAN else head


class AttentionView(StateView):
    """Layer / head selectors, heatmap with the current query row outlined, head grid, top keys.

    The heatmap and the grid are built once (:mod:`trajscope.ui.attention_figures`); a new run or
    selection only replaces their data, so putting a run on screen draws no new figure.
    """

    def __init__(self, **params):
        super().__init__(**params)
        st = self.state
        self.heatmap_fig, self.grid_fig = HeatmapFigure(), HeadGridFigure()  # built once; a run replaces their data
        self._P, self._nk = 1, 1  # the heatmap's prompt length and key count, for the row cursor
        self.row_cursor = Cursor([box(line_width=2, fill_alpha=0.12, fill_color="#d62728")],
                                 lambda s: [plots.attention_cursor_box(s, self._P, self._nk)])
        self.row_cursor.step = st.step
        self.row_cursor.attach(self.heatmap_fig.figure)
        self.grid_fig.on_click(lambda x, y: self._on_grid_tap(x=x, y=y))
        self._panes = [pn.pane.Bokeh(self.heatmap_fig.figure, sizing_mode="stretch_width"),
                       pn.pane.Bokeh(self.grid_fig.figure, sizing_mode="stretch_width")]  # pushed to Jupyter
        self.top = pn.pane.HTML("", css_classes=["ts-top-keys"],
                                stylesheets=[":host table.ts-top{border-collapse:collapse;font-size:0.85em}"
                                             ":host td,:host th{padding:2px 8px;border-bottom:1px solid #ddd;"
                                             "text-align:left}"])
        st.param.watch(self._changed, ["revision", "layer", "head", "grid_stat", "step"])
        self.redraw()

    def _changed(self, *events) -> None:
        """Redraw what the changed parameters show: a step moves (:meth:`_move`), a grid statistic redraws the
        grid, a layer / head the heatmap, the grid's outline and the top keys, anything else all of it."""
        names = {e.name for e in events}
        if names == {"step"}:
            self._move(events[0])
            return
        if self.defer(self.redraw):
            return
        st = self.state
        if names == {"grid_stat"}:
            self.grid(st.revision, st.grid_stat, st.layer, st.head)
        elif names <= {"layer", "head"}:
            self.heatmap(st.revision, st.layer, st.head)
            self.grid_fig.select(plots.head_box(st.layer, _head(st.head), self.grid_fig.n_heads))
            self.top.object = self.top_keys(st.step, st.revision, st.layer, st.head)
        else:
            self.redraw()

    def _move(self, event) -> None:
        """A step change: the row cursor moves; the grid's values and the top keys follow (when shown)."""
        self.row_cursor.set_step(event.new, *self._panes)
        if self.defer(self.redraw):
            return
        st = self.state
        if st.trajectory is not None:
            self.grid_fig.set_values(plots.head_grid_values(st.queries, event.new, st.grid_stat))
        self.top.object = self.top_keys(event.new, st.revision, st.layer, st.head)

    def redraw(self) -> None:
        """Put the state's run, selection and step in the figures and the top-keys table.

        While the card is hidden this waits until it is shown (:meth:`defer`).
        """
        if self.defer(self.redraw):
            return
        st = self.state
        self.heatmap(st.revision, st.layer, st.head)
        self.grid(st.revision, st.grid_stat, st.layer, st.head)
        self.top.object = self.top_keys(st.step, st.revision, st.layer, st.head)

    def heatmap(self, revision: int, layer: int, head: int):
        """Put the query × key map of ``layer`` / ``head`` (of the state's run) in the heatmap figure; move the
        row cursor to the state's step. Returns the figure (the same one every time).

        ``revision`` is accepted for the earlier call form; the figure shows the state's run."""
        st = self.state
        data = plots.attention_heatmap_data(st.trajectory, layer, _head(head))
        self._P, self._nk = data["prompt_len"], data["matrix"].shape[1]
        self.heatmap_fig.show(data)
        self.row_cursor.set_step(st.step, *self._panes)
        return self.heatmap_fig.figure

    def grid(self, revision: int, stat: str, layer: int, head: int):
        """Put ``stat`` for every layer × head at the state's step in the grid figure, with the ``layer`` /
        ``head`` cell outlined. Returns the figure (the same one every time)."""
        st = self.state
        queries = st.queries if st.trajectory is not None else pl.DataFrame()
        data = plots.head_grid_data(queries, st.step, stat)
        self.grid_fig.show(data)
        self.grid_fig.select(plots.head_box(layer, _head(head), data["n_heads"]))
        return self.grid_fig.figure

    def _on_grid_tap(self, x=None, y=None, **_):
        if x is None or y is None:
            return
        layer, head = int(round(y)), int(round(x))
        st = self.state
        if layer in st.param.layer.objects and head in st.param.head.objects.values():
            st.param.update(layer=layer, head=head)

    def top_keys(self, step: int, revision: int, layer: int, head: int) -> str:
        """The top attended keys at ``step`` for ``layer`` / ``head`` as an HTML table ("" without a run)."""
        st = self.state
        if st.trajectory is None:
            return ""
        df = plots.top_attended(st.queries, st.trajectory.tokens, step, layer, _head(head))
        return html_table(df)

    def __panel__(self):
        st = self.state
        layer = pn.widgets.Select.from_param(st.param.layer, name="Layer", width=110)
        head = pn.widgets.Select.from_param(st.param.head, name="Head", width=160)
        stat = pn.widgets.Select.from_param(st.param.grid_stat, name="Grid statistic", width=270)  # its longest option fits
        heat_pane, grid_pane = self._panes
        # a Bokeh pane shows its figure as is: the classes (for tests and styling) go on wrappers
        heat = pn.Column(heat_pane, sizing_mode="stretch_width", css_classes=["ts-attention-heatmap"])
        grid = pn.Column(grid_pane, sizing_mode="stretch_width", css_classes=["ts-attention-grid"])
        explain = pn.pane.Markdown(
            "**Heatmap**: row = query position, column = attended key position; dashed red lines split prompt from "
            "generated tokens, the red box is the row(s) queried at the current step (all prompt rows at step 0). "
            "**Grid**: the chosen statistic for every layer × head at the current step (click a cell to select it). "
            "Entropy is −Σ a log a over the keys the query sees; masses are the attention on the prompt (prefix), "
            "on generated tokens, and on position 0 (sink).",
            styles={"color": "#555", "font-size": "0.85em"}, margin=(0, 10))
        return pn.Column(
            pn.Row(layer, head, stat),
            StagedRow(pn.Column(heat, sizing_mode="stretch_width"),
                      pn.Column(grid, pn.pane.Markdown("**Top attended tokens at this step**", margin=(0, 10)), self.top,
                                sizing_mode="stretch_width"),
                      sizing_mode="stretch_width"),  # the two figures a tick apart (staged.py)
            explain, sizing_mode="stretch_width")
