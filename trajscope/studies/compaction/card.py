"""Compaction card (the app's Compaction tab, registered by :mod:`trajscope.studies.compaction`): one compacted
session run with T1/T2 masked (A), restarted (B) and in full (C).

The card shows a session ``<sys> <T1> <T2> <summary> <T3>`` — a synthetic one from the study's
generator by default (a 4-digit number only T1 states; **New synthetic** picks another), or one
typed into the five fields — and **Run** measures it with the app's model through the study's
own run on that one session (:func:`trajscope.studies.compaction.state.run_session`, a Result), off the event loop:
the three setups' greedy continuations after T3 side by side (and the control D), the per-layer
divergence of T3's hidden states from C, the attention mass of T3's queries on the summary, and
the probe's held-out accuracy by layer read from the shipped study of the same model. Only
models the server's operator allows run (the app's model choice). One session takes about a
second on the sample model, so the card has no Stop; a result that arrives after the fields
changed is still shown, for the session that ran (its id is in the summary line). The figures are built once per
card (:mod:`trajscope.studies.compaction.figures`): a result replaces their data.
"""

from __future__ import annotations


import panel as pn
import param

from trajscope.errors import TrajscopeError
from trajscope.escaping import html_text, md_text
from trajscope.studies.compaction import plots as cp
from trajscope.studies.compaction.figures import AttentionFigure, DivergenceFigure, ProbeFigure
from trajscope.studies.compaction.state import CompactionSettings, run_session, summary_line
from trajscope.ui.views._base import StateView, any_of, in_background
from trajscope.ui.views.spinner import Spinner
from trajscope.ui.views.staged import StagedColumn

NOTE = ("A masks T1 and T2 from T3's first query on through the model's key mask (the summary's states, computed "
        "while T1/T2 were visible, are kept); B recomputes `<sys> <summary> <T3>` with fresh positions; C keeps "
        "everything; D masks T1/T2 from the summary on (control). The probe needs many sessions, so its accuracy "
        "comes from the shipped study tables (`trajscope study compaction`), not from this one session.")


class CompactionView(StateView):
    """Run one compacted session three ways and show continuations, divergence, attention and the probe."""

    settings = param.ClassSelector(class_=CompactionSettings, doc="The session's segments and the card's result.")
    model_loader = param.Callable(default=None, doc="``(source) -> ModelHandle``; default: the app's shared model cache.")

    def __init__(self, **params):
        params.setdefault("settings", CompactionSettings())
        super().__init__(**params)
        self._ticket = 0
        # the result's figures, built once (figures.py); a result replaces their data
        self.divergence, self.attention, self.probe = DivergenceFigure(), AttentionFigure(), ProbeFigure()
        self._empty = pn.pane.Markdown("Edit the session or keep the synthetic one, then press **Run**.",
                                       css_classes=["ts-cp-empty"])
        self._continuations = pn.pane.HTML("", sizing_mode="stretch_width", css_classes=["ts-cp-cont"])
        # a Bokeh pane's `visible` follows its figure: the probe is shown or hidden by its Column
        self._probe = pn.Column(pn.pane.Bokeh(self.probe.figure, sizing_mode="stretch_width"), sizing_mode="stretch_width")
        self._probe_note = pn.pane.Markdown("", styles={"font-size": "12px", "color": "#555"})
        # the result's panes join its Column with the first result: opening the card builds no hidden figure's views
        self._result_parts = [self._continuations, pn.pane.Bokeh(self.divergence.figure, sizing_mode="stretch_width"),
                              pn.pane.Bokeh(self.attention.figure, sizing_mode="stretch_width"), self._probe,
                              self._probe_note]
        self._result = StagedColumn(sizing_mode="stretch_width", visible=False)  # its parts a tick apart (staged.py)
        self.state.param.watch(self._new_run, "revision")
        self.settings.param.watch(self._draw, "result")

    def _new_run(self, *_) -> None:
        """A new run (maybe on another model) replaces the page's: a session result of the old one is dropped."""
        self._ticket += 1
        self.settings.clear()
        self.settings.busy = False

    def _model(self):
        from trajscope.ui.runner import local_model

        return local_model(self.state, "compaction", self.model_loader)

    def new_synthetic(self, *_) -> None:
        """Fill the fields with the next synthetic session."""
        if not self.settings.busy:
            self.settings.use_synthetic((self.settings.seed + 1) % 10000)

    def run(self, *_) -> None:
        """Run the session in the fields (on a worker thread when served)."""
        s = self.settings
        if s.busy:
            return
        if self.state.busy:
            s.status = "A new run is generating on the model this card uses; run the session once it is done."
            return
        try:
            session = s.session()
            from trajscope.ui.operator import config

            n_new = config().new_tokens(int(s.max_new_tokens))
        except TrajscopeError as exc:
            s.param.update(status=str(exc), result=None, summary="")
            return
        self._ticket += 1
        ticket = self._ticket
        s.param.update(busy=True, result=None, summary="", status=f"Running session {session.session_id} as A, B, C "
                                                                   f"and D ({n_new} greedy tokens each)…")

        def work():
            model = self._model()
            return run_session(model, session, n_new), model.model_id

        in_background(work, lambda out: self._finish(ticket, *out), lambda msg: self._finish(ticket, None, msg),
                      name="trajscope-compaction", what="The compaction run")

    def _finish(self, ticket: int, res, message: str) -> None:
        """Show the result (``message``: the model it ran on) or why there is none (``message``: one sentence)."""
        if ticket != self._ticket:
            return
        s = self.settings
        if res is None:
            s.param.update(busy=False, result=None, summary="", status=message)
            return
        s.param.update(busy=False, result=res, summary=f"On model `{message}`: {summary_line(res)}", status="")

    def _draw(self, *_) -> None:
        """Put the session's result on screen (the figures' data replaced), or the hint to press **Run**."""
        result = self.settings.result
        self._empty.visible = result is None
        self._result.visible = result is not None
        if result is None:
            return
        self._continuations.object = cp.continuations_html(result)
        self.divergence.show(result)
        self.attention.show(result)
        probe = cp.probe_data(result)
        if probe is not None:
            self.probe.show(probe)
        self._probe.visible = probe is not None
        self._probe_note.object = md_text(result.probe_note) if probe is None else result.probe_note
        if not self._result.objects:
            self._result.objects = self._result_parts

    def __panel__(self):
        s = self.settings
        def area(p, name: str, rows: int):  # text areas keep the segments' newlines (inputs drop them)
            # as tall as the segment's lines (up to 12); a fixed height clipped the box under its label
            return pn.widgets.TextAreaInput.from_param(p, name=name, sizing_mode="stretch_width", rows=rows,
                                                       auto_grow=True, max_rows=12)

        fields = [area(s.param.sys, "sys", 1), area(s.param.t1, "T1", 2), area(s.param.t2, "T2", 2),
                  area(s.param.summary_text, "summary", 1), area(s.param.t3, "T3", 1)]
        n_new = pn.widgets.IntInput.from_param(s.param.max_new_tokens, name="New tokens", width=110)
        syn = pn.widgets.Button(label="New synthetic", width=120, css_classes=["ts-cp-synthetic"], disabled=pn.bind(any_of, s.param.busy, self.state.param.busy))
        syn.on_click(self.new_synthetic)
        run_btn = pn.widgets.Button(label="Run", color="primary", width=80, css_classes=["ts-cp-run"],
                                    disabled=pn.bind(any_of, s.param.busy, self.state.param.busy))
        run_btn.on_click(self.run)
        busy = Spinner(value=s.param.busy, css_classes=["ts-busy"])
        return pn.Column(
            pn.pane.Markdown(NOTE, styles={"font-size": "12px", "color": "#555"}),
            *fields, pn.Row(n_new, syn, run_btn, busy),
            pn.pane.Str(pn.bind(html_text, s.param.status), css_classes=["ts-cp-status"]),
            pn.pane.Markdown(pn.bind(md_text, s.param.summary), css_classes=["ts-cp-summary"]),
            self._empty, self._result, sizing_mode="stretch_width")
