"""The Drift card: the drift study on the run on screen, as an app tab (a Viewer reading a Result).

:class:`DriftView` runs :func:`~trajscope.studies.drift.study.score_run` on the app's current run
(off the event loop) and shows what its :class:`~trajscope.studies.registry.Result` holds: the
headline numbers (:mod:`trajscope.studies.drift.summary`), a layer × position heatmap of the
drift score against the prefill profile and per-layer curves with the calibrated thresholds
(figures built once per session, :mod:`trajscope.studies.drift.figures`: a new run replaces
their data).
It adds ``drift_flagged_layers`` and ``drift_score_max`` to the run's tokens so the token strip
can be coloured by them. The drift score treats dimensions independently (a triage proxy), and
the card says so. :func:`card` is the registered card factory.
"""

from __future__ import annotations

import panel as pn
import param

from trajscope.errors import TrajscopeError
from trajscope.escaping import md_text
from trajscope.studies.drift import plots as dp
from trajscope.studies.drift.figures import CurvesFigure, HeatmapFigure
from trajscope.studies.drift.section import PROXY, headline_html
from trajscope.studies.drift.state import DriftSettings
from trajscope.ui import artefacts
from trajscope.ui.views._base import StateView, in_background, short_run
from trajscope.ui.views._cursor import Cursor, vline
from trajscope.ui.views.staged import StagedColumn

PROXY_NOTE = PROXY


class DriftView(StateView):
    """Residual drift of the current run against a prefill profile."""

    settings = param.ClassSelector(class_=DriftSettings, doc="Profile choice and the drift study's Result on the run.")

    def __init__(self, **params):
        params.setdefault("settings", DriftSettings())
        super().__init__(**params)
        self._ticket = 0
        self.heatmap, self.curves = HeatmapFigure(), CurvesFigure()  # built once; a run replaces their data
        self.cursor = Cursor([vline()], lambda step: [{"location": float(step)}])  # one line on each figure
        self.cursor.step = self.state.step
        for fig in (self.heatmap, self.curves):
            self.cursor.attach(fig.figure)
        heat = pn.pane.Bokeh(self.heatmap.figure, sizing_mode="stretch_width")
        curves = pn.pane.Bokeh(self.curves.figure, sizing_mode="stretch_width")
        self._panes = [heat, curves]  # pushed to Jupyter when the cursor moves
        self.alert = pn.pane.Alert("", alert_type="secondary")  # why there is no drift to show
        self.note = pn.pane.Alert("", alert_type="info", css_classes=["ts-drift-note"], visible=False)
        self.head = pn.pane.HTML("", sizing_mode="stretch_width", css_classes=["ts-drift-headline"])
        # a Bokeh pane shows its figure as is: the classes (for tests and styling) go on wrappers
        self.figures = StagedColumn(self.head, pn.Column(heat, css_classes=["ts-drift-heatmap"], sizing_mode="stretch_width"),
                                    pn.Column(curves, css_classes=["ts-drift-curves"], sizing_mode="stretch_width"),
                                    sizing_mode="stretch_width", visible=False)
        self.state.param.watch(self._recompute, "revision")
        self.state.param.watch(lambda e: self.cursor.set_step(e.new, *self._panes), "step")
        self.settings.param.watch(self._recompute, "profile_path")
        self.settings.param.watch(self._draw, ["drift", "message"])
        self._recompute()
        self._draw()

    def _recompute(self, *_) -> None:
        """Score the run off the event loop; tell the state which layers the profile scores."""
        s = self.settings
        self._ticket += 1
        ticket, traj = self._ticket, self.state.trajectory
        if traj is not None and self._misfit(traj):
            return
        try:
            prof = s.profile()
            self.state.param.update(drift_layers=artefacts.drift_layers(prof.n_layers), drift_width=prof.d_model)
        except TrajscopeError as exc:
            self.state.param.update(drift_layers=[], drift_width=None)
            s.show(None, str(exc))
            return
        if traj is None:
            s.show(None, "No run yet.")
            return
        if self.defer(self._recompute):  # the Drift tab is hidden: score the run when it is opened
            s.show(None, "Scoring the run against the profile…")
            return
        # being opened, a short run is scored at once (tens of ms), so the tab is drawn once, with its result
        inline = self.opening and short_run(traj)
        if not inline:
            s.show(None, "Scoring the run against the profile…")
        in_background(lambda: s.score(traj, prof), lambda res: self._apply(ticket, traj, res),
                      lambda msg: self._apply(ticket, traj, (None, msg)), what="Drift scoring", inline=inline)

    def _misfit(self, traj) -> bool:
        """When the profile does not fit the run's model: switch to a shipped one that does, or say none does.
        True when the profile at ``profile_path`` is not used."""
        s = self.settings
        facts = artefacts.model_facts(traj.meta)
        try:
            why = artefacts.profile_misfit(s.profile().info, facts)
        except TrajscopeError:
            why = None  # no profile there: _recompute says so
        if why is None:
            return False
        other = artefacts.find_profile(facts)
        if other is not None:
            s.profile_path = str(other)  # its watcher recomputes with it
            return True
        s.show(None, artefacts.no_profile(facts, why))
        return True

    def _apply(self, ticket: int, traj, result) -> None:
        """Show the Result; put per-token flags on the token strip (``drift_flagged_layers``, ``drift_score_max``)."""
        import polars as pl

        if ticket != self._ticket:
            return
        res, message = result
        if res is not None:
            drift = res.table("drift_run")
            per = drift.group_by("pos").agg(pl.col("score").max().alias("drift_score_max"),
                                            pl.col("flagged").sum().cast(pl.Int32).alias("drift_flagged_layers"))
            if self.state.trajectory is traj:  # the run's own tables are shared: the view adds columns beside them
                self.state.add_token_columns(per)
        self.settings.show(res, message)

    def _draw(self, *_) -> None:
        """Put the scored run in the figures and the headline, or say why there is none (the figures then keep
        their last data, hidden)."""
        s, traj = self.settings, self.state.trajectory
        drift, message = s.drift, s.message
        if drift is not None and traj is not None:
            P, texts = traj.prompt_len, traj.tokens["text"].to_list()
            self.heatmap.show(dp.heatmap_data(drift, P, texts))
            self.curves.show(dp.curves_data(drift, s.thresholds, P, texts))
            self.cursor.set_step(self.state.step, *self._panes)
            self.head.object = headline_html(s.result.summaries if s.result is not None else {})
            self.note.object = md_text(message)
        else:
            self.alert.object = md_text(message or "No drift to show.")
        shown = drift is not None and traj is not None
        self.note.visible = shown and bool(message)
        self.alert.visible = not shown
        self.figures.visible = shown

    def __panel__(self):
        path = pn.widgets.TextInput.from_param(self.settings.param.profile_path, name="Profile", sizing_mode="stretch_width")
        return pn.Column(pn.pane.Markdown(PROXY_NOTE, styles={"font-size": "12px"}), path, self.alert, self.note,
                         self.figures, sizing_mode="stretch_width")


def card(state) -> DriftView:
    """The registered Drift card for the app's ``state``."""
    return DriftView(state=state)
