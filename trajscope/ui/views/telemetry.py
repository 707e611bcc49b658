"""Telemetry over steps: attention statistics, phase jumps and the next-token distribution.

Curves are for the selected layer and head (or mean over heads), or averaged
over all layers and heads; the red line is the current step and clicking a plot
jumps there. The dotted curve is the top-8 overlap (Jaccard) with the previous
step; orange triangles mark only *sharp* phase jumps (see
:mod:`trajscope.metrics.attention`), so they stay rare and mean something.
"""

from __future__ import annotations

import holoviews as hv
import panel as pn

from trajscope.metrics.attention import step_telemetry
from trajscope.ui import plots
from trajscope.ui.state import MEAN
from trajscope.ui.views._base import StateView
from trajscope.ui.views._cursor import Cursor, vline


class TelemetryView(StateView):
    """Attention telemetry and next-token curves, both with the current-step line; click to jump."""

    def __init__(self, **params):
        super().__init__(**params)
        self.cursors: dict[str, Cursor] = {}
        self.taps: dict[str, hv.streams.Tap] = {}
        self._panes: list = []
        self.state.param.watch(self._move, "step")

    def _move(self, event) -> None:
        for c in self.cursors.values():
            c.set_step(event.new, *self._panes)

    def _cursor(self, name: str, base):
        """``base`` with the (one, persistent) step cursor of plot ``name`` hooked in."""
        c = self.cursors.get(name)
        if c is None:
            c = self.cursors[name] = Cursor([vline()], lambda s: [{"location": float(s)}])
        c.step = self.state.step
        return base.opts(hooks=[c.hook])

    def _tap(self, name: str):
        """A click stream for plot ``name`` that jumps to the clicked step (given to its DynamicMap: HoloViews
        does not link a Tap whose source is a DynamicMap of overlays)."""
        tap = hv.streams.Tap(transient=True)
        tap.add_subscriber(lambda x=None, **_: None if x is None else self.state.go(int(round(x))))
        self.taps[name] = tap
        return tap

    @staticmethod
    def _cached(build):
        """``build`` for a DynamicMap that also gets a Tap: a click re-sends the last element, no rebuild."""
        last = {}

        def fn(x=None, y=None, **kw):
            key = tuple(sorted(kw.items()))
            if last.get("key") != key:
                last.update(key=key, element=build(**kw))
            return last["element"]
        return fn

    def attention_curves(self, revision: int, layer: int, head: int, average: bool):
        """Telemetry curves of the selection (same elements with or without a run: the plot is updated in place)."""
        st = self.state
        if st.trajectory is None:
            tele, who = plots.empty_telemetry(), "no run yet"
        elif average:
            tele, who = step_telemetry(st.trajectory.attention), "mean over all layers and heads"
        else:
            h = None if head == MEAN else head
            tele = step_telemetry(st.trajectory.attention, layer, h)
            who = f"layer {layer}, " + ("mean over heads" if h is None else f"head {h}")
        return self._cursor("attention", plots.telemetry_plot(tele, title=f"Attention telemetry over steps — {who}"))

    def token_curves(self, revision: int):
        st = self.state
        traj = st.trajectory
        base = (plots.next_token_plot(traj.tokens, traj.prompt_len) if traj is not None
                else plots.next_token_plot(plots.empty_tokens(), 1))
        return self._cursor("tokens", base)

    def __panel__(self):
        st = self.state
        avg = pn.widgets.Checkbox.from_param(st.param.telemetry_average, name="Average over all layers and heads")
        # DynamicMaps: a new run or selection updates the same Bokeh figures (data and title), none is rebuilt
        dm_a = hv.DynamicMap(self._cached(self.attention_curves), streams=[hv.streams.Params(
            st, ["revision", "layer", "head", "telemetry_average"], rename={"telemetry_average": "average"}),
            self._tap("attention")])
        dm_t = hv.DynamicMap(self._cached(self.token_curves), streams=[hv.streams.Params(st, ["revision"]),
                                                                       self._tap("tokens")])
        a = pn.pane.HoloViews(dm_a, sizing_mode="stretch_width", linked_axes=False)
        t = pn.pane.HoloViews(dm_t, sizing_mode="stretch_width", linked_axes=False)
        self._panes += [a, t]
        note = pn.pane.Markdown(
            "Step 0 is the prefill pass (its last prompt query); step s ≥ 1 is the decode pass that reads the token at "
            "position P+s−1. Entropy is normalised by log(#keys) so all attention curves share the 0–1 axis. "
            "Orange dotted: how much of the top-8 attended set the step shares with the previous step (Jaccard). "
            "Orange triangles: sharp phase jumps, where that overlap is below 0.5 (for most selected heads) and "
            "far below this run's typical overlap (median − 3 MAD). Click a plot to jump to that step.",
            styles={"color": "#555", "font-size": "0.85em"}, margin=(0, 10))
        return pn.Column(avg, a, note, t, sizing_mode="stretch_width")
