"""Telemetry over steps: attention statistics, phase jumps and the next-token distribution.

Curves are for the selected layer and head (or mean over heads), or averaged
over all layers and heads; the red line is the current step and clicking a plot
jumps there. The dotted curve is the top-8 overlap (Jaccard) with the previous
step; orange triangles mark only *sharp* phase jumps (see
:mod:`trajscope.metrics.attention`), so they stay rare and mean something.
"""

from __future__ import annotations

import panel as pn

from trajscope.metrics.attention import step_telemetry
from trajscope.ui import plots
from trajscope.ui.state import MEAN
from trajscope.ui.step_figures import NextTokenFigure, TelemetryFigure
from trajscope.ui.views._base import StateView
from trajscope.ui.views._cursor import Cursor, vline
from trajscope.ui.views.staged import StagedColumn


class TelemetryView(StateView):
    """Attention telemetry and next-token curves, both with the current-step line; click to jump.

    The two figures are built once (:mod:`trajscope.ui.step_figures`); a new run or selection only
    replaces their data, so putting a run on screen draws no new figure.
    """

    def __init__(self, **params):
        super().__init__(**params)
        self.attention_fig, self.tokens_fig = TelemetryFigure(), NextTokenFigure()
        self.cursors: dict[str, Cursor] = {}
        for name, fig in (("attention", self.attention_fig), ("tokens", self.tokens_fig)):
            c = self.cursors[name] = Cursor([vline()], lambda s: [{"location": float(s)}])
            c.attach(fig.figure)
            fig.on_click(lambda x, y=None: self.click(x))
        self._panes: list = []
        st = self.state
        st.param.watch(self._move, "step")
        st.param.watch(lambda *_: self.redraw(), "revision")
        st.param.watch(lambda *_: self.redraw(tokens=False), ["layer", "head", "telemetry_average"])
        self.redraw()

    def _move(self, event) -> None:
        for c in self.cursors.values():
            c.set_step(event.new, *self._panes)

    def click(self, x: float | None) -> None:
        """A click on either plot at step ``x`` (data coordinate) jumps there."""
        if x is not None:
            self.state.go(int(round(x)))

    def redraw(self, tokens: bool = True) -> None:
        """Put the run and selection in the figures (the next-token curves too, unless ``tokens`` is False).

        While the Overview tab is hidden this waits until it is shown (:meth:`defer`).
        """
        if self.defer(self.redraw):
            return
        st = self.state
        if st.trajectory is None:
            tele, who = plots.empty_telemetry(), "no run yet"
        elif st.telemetry_average:
            tele, who = step_telemetry(st.trajectory.attention), "mean over all layers and heads"
        else:
            h = None if st.head == MEAN else st.head
            tele = step_telemetry(st.trajectory.attention, st.layer, h)
            who = f"layer {st.layer}, " + ("mean over heads" if h is None else f"head {h}")
        self.attention_fig.show(tele, f"Attention telemetry over steps — {who}")
        traj = st.trajectory
        if tokens:
            self.tokens_fig.show(plots.empty_tokens() if traj is None else traj.tokens,
                                 1 if traj is None else traj.prompt_len)
        for c in self.cursors.values():
            c.set_step(st.step, *self._panes)

    def __panel__(self):
        st = self.state
        avg = pn.widgets.Checkbox.from_param(st.param.telemetry_average, name="Average over all layers and heads")
        a = pn.pane.Bokeh(self.attention_fig.figure, sizing_mode="stretch_width")
        t = pn.pane.Bokeh(self.tokens_fig.figure, sizing_mode="stretch_width")
        self._panes += [a, t]
        # a Bokeh pane shows its figure as is: the classes (for tests and styling) go on wrappers
        a = pn.Column(a, sizing_mode="stretch_width", css_classes=["ts-telemetry"])
        t = pn.Column(t, sizing_mode="stretch_width", css_classes=["ts-next-token"])
        note = pn.pane.Markdown(
            "Step 0 is the prefill pass (its last prompt query); step s ≥ 1 is the decode pass that reads the token at "
            "position P+s−1. Entropy is normalised by log(#keys) so all attention curves share the 0–1 axis. "
            "Orange dotted: how much of the top-8 attended set the step shares with the previous step (Jaccard). "
            "Orange triangles: sharp phase jumps, where that overlap is below 0.5 (for most selected heads) and "
            "far below this run's typical overlap (median − 3 MAD). Click a plot to jump to that step.",
            styles={"color": "#555", "font-size": "0.85em"}, margin=(0, 10))
        return StagedColumn(avg, a, note, t, first=3, sizing_mode="stretch_width")  # the second figure a tick later
