"""The live view: what the running generation has done so far, drawn as it streams.

While Generate runs, the full views (heatmaps, SAE, drift) wait for the finished
run; this small figure shows every step as it arrives (and keeps the last
generation until the next one): next-token entropy and
the step's attention entropy (mean over layers and heads) against the step.
Each batch of new steps is *appended* to the figure's data source with Bokeh's
``ColumnDataSource.stream`` — O(new steps) sent to the browser, no figure
rebuilt — so the page stays responsive however long the run.

The browser's drawing shares the CPU with the capture, so the figure is kept
cheap to redraw: the step axis spans the planned steps from the start (the
curve grows towards its end; no axis is re-laid out as steps arrive), and new
steps are streamed at most every :data:`STREAM_EVERY_S` seconds (the ticker
counts every step). Measured on the 2-CPU machine, in two back-to-back runs of
4 Generates of 64 tokens: the capture took 0.68–0.82 s with the live figure off,
0.83–1.01 s with it streaming every 0.2 s batch.
"""

from __future__ import annotations

import panel as pn
import time

from bokeh.models import ColumnDataSource, HoverTool, Range1d
from bokeh.plotting import figure

from trajscope.ui.views._base import StateView

COLUMNS = ("step", "next_entropy", "attn_entropy", "token")
STREAM_EVERY_S = 0.5  # the figure's update period while a generation streams


class LiveView(StateView):
    """A streaming figure of the running (or last) generation."""

    def __init__(self, **params):
        super().__init__(**params)
        self.source = ColumnDataSource({c: [] for c in COLUMNS})
        fig = figure(height=170, sizing_mode="stretch_width", toolbar_location=None, x_range=Range1d(0, 1),
                     title="The run step by step (a generation streams here as each step finishes)", x_axis_label="step (0 = prefill)",
                     y_axis_label="nats")
        fig.line("step", "next_entropy", source=self.source, color="#1f77b4", legend_label="next-token entropy")
        fig.line("step", "attn_entropy", source=self.source, color="#2ca02c",
                 legend_label="attention entropy (mean over layers × heads)")
        fig.add_tools(HoverTool(tooltips=[("step", "@step"), ("token", "@token"),
                                          ("next-token entropy", "@next_entropy{0.00}"),
                                          ("attention entropy", "@attn_entropy{0.00}")]))
        fig.legend.label_text_font_size = "8pt"
        fig.add_layout(fig.legend[0], "right")  # beside the curves, not over them
        self.figure = fig
        self.n_streamed = 0
        self._pending: list = []  # steps received but not yet streamed
        self._last_stream = 0.0
        # a new run, and the end of a generation (the run is set while still busy; its last steps may be unstreamed)
        self.state.param.watch(self.show_run, ["revision", "busy"])
        self.show_run()

    def show_run(self, *_) -> None:
        """Between generations, draw the run on screen the same way (so the figure is never empty)."""
        st = self.state
        if st.busy or st.trajectory is None:
            return
        import polars as pl

        from trajscope.metrics.next_token import step_outputs
        from trajscope.ui.plots import visible

        traj = st.trajectory
        out = step_outputs(traj.tokens, traj.prompt_len).sort("step")
        attn = st.queries.group_by("step").agg(pl.col("entropy").mean()).sort("step")
        df = out.join(attn.rename({"entropy": "attn_entropy"}), on="step", how="left")
        self._pending = []
        self.figure.x_range.update(start=0, end=max(1, traj.n_steps - 1))
        self.source.data = {"step": df["step"].to_list(),
                            "next_entropy": df["entropy"].cast(pl.Float64).fill_null(float("nan")).to_list(),
                            "attn_entropy": df["attn_entropy"].cast(pl.Float64).fill_null(float("nan")).to_list(),
                            "token": [visible(t) for t in df["text"].to_list()] if "text" in df.columns
                            else [""] * df.height}

    def reset(self) -> None:
        """Empty the figure (a new generation starts); its step axis spans the planned steps."""
        self.source.data = {c: [] for c in COLUMNS}
        self.figure.x_range.update(start=0, end=max(1, self.state.progress_max - 1))
        self.n_streamed, self._pending, self._last_stream = 0, [], time.monotonic()

    def append(self, events: list, now: float | None = None) -> None:
        """Stream new :class:`~trajscope.capture.StepEvent` s into the figure (O(len(events))), at most
        every :data:`STREAM_EVERY_S` seconds; steps in between wait for the next stream (or the finished
        run, which :meth:`show_run` draws whole)."""
        self._pending.extend(events)
        now = time.monotonic() if now is None else now
        if not self._pending or now - self._last_stream < STREAM_EVERY_S:
            return
        from trajscope.ui.plots import visible

        events, self._pending, self._last_stream = self._pending, [], now
        self.source.stream({"step": [e.step for e in events], "next_entropy": [e.next_entropy for e in events],
                            "attn_entropy": [e.mean_entropy for e in events],
                            "token": [visible(e.text) for e in events]})
        self.n_streamed += len(events)

    def __panel__(self):
        # visibility on the wrapping column: a Bokeh pane re-validates its stylesheets when a ref updates it
        # always shown (the last generation stays until the next one): showing / hiding a figure when
        # Generate is pressed would re-lay the whole page out in the browser
        return pn.Column(pn.pane.Bokeh(self.figure, sizing_mode="stretch_width"),
                         sizing_mode="stretch_width", css_classes=["ts-live-plot"])
