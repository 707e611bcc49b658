"""Eviction card (the app's Eviction tab, registered by :mod:`trajscope.studies.eviction`): what a KV-cache
eviction policy's choice of prompt keys costs this run's decode.

For the run on screen, pick a policy (SnapKV, H2O, StreamingLLM, PyramidKV, lookahead,
pseudo queries, oracle), a budget (fraction of the prompt kept per head) and, where the
policy has one, the observation / recent window; **Run** runs the registered study's run
function on this run's prompt with the app's model, off the event loop, and the card reads
the :class:`~trajscope.studies.registry.Result` it returns (its summaries for the headline line). The card then shows which prompt positions each layer and head keeps,
per decode step the recall of the decode-time top attended prompt keys in the kept set and
the attention mass on evicted keys, and the real masked re-run's KL and greedy token
agreement against the full cache, with the app's step as a red line; then the per-step vs accumulated split
of this run's damage (both arms per step, their depth-band means and intervals), and passkey retrieval: the
model's shipped needle table by policy and budget when it has one, and, when this prompt hides a passkey, each
needle policy's masked answer at the card's budget and whether it retrieves the key. The study has no
cancel point inside one prompt (a run of the sample model takes about a second), so the
card has no Stop; a result that arrives after the run on screen changed is dropped.

The figures are built once per card (:mod:`trajscope.studies.eviction.figures`): a result replaces their data,
and the shipped needle figure is built once per model.
"""

from __future__ import annotations


import panel as pn
import param

from trajscope.escaping import html_text, md_text
from trajscope.studies.eviction import plots as ep
from trajscope.studies.eviction import plots_more as pm
from trajscope.studies.eviction.figures import CostsFigure, KeptFigure, RerunFigure, SplitFigure, needle_figure
from trajscope.studies.eviction.state import LABELS, EvictionSettings, passkey_of, run_study, shipped_needle
from trajscope.ui.views._base import StateView, any_of, in_background
from trajscope.ui.views._cursor import Cursor, vline
from trajscope.ui.views.spinner import Spinner
from trajscope.ui.views.staged import StagedColumn

NOTE = ("The study captures its own greedy run of this prompt (as many steps as this run) with every layer's "
        "attention, chooses the kept prompt keys after prefill, then re-runs decode with the evicted keys masked "
        "out of attention in the real model. Budget = kept prompt positions per head (fraction of the prompt, "
        "window included). Recall@k = share of a decode step's top-k attended prompt positions that were kept.")


CAPTION = {"font-size": "12px", "color": "#555"}


def _table(head: list[str], rows: list[list[str]]) -> str:
    """A small HTML table; every cell escaped."""
    th = "".join(f"<th style='text-align:left;padding:2px 8px'>{html_text(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td style='padding:2px 8px'>{html_text(c)}</td>" for c in r) + "</tr>"
                   for r in rows)
    return f"<table style='font-size:12px;border-collapse:collapse'><tr>{th}</tr>{body}</table>"


class EvictionView(StateView):
    """Run one eviction policy and budget on the current run's prompt and show what it costs, step by step."""

    settings = param.ClassSelector(class_=EvictionSettings, doc="Policy, budget, window and the study's result.")
    model_loader = param.Callable(default=None, doc="``(source) -> ModelHandle``; default: the app's shared model cache.")

    def __init__(self, **params):
        params.setdefault("settings", EvictionSettings())
        super().__init__(**params)
        self._ticket = 0
        # the result's figures, built once (figures.py); a result replaces their data
        self.kept, self.costs, self.rerun, self.split = KeptFigure(), CostsFigure(), RerunFigure(), SplitFigure()
        self.cursor = Cursor([vline()], lambda step: [{"location": float(step)}])  # one line on each step figure
        self.cursor.step = self.state.step
        for fig in (self.costs, self.rerun, self.split):
            self.cursor.attach(fig.figure)
        panes = {name: pn.pane.Bokeh(getattr(self, name).figure, sizing_mode="stretch_width")
                 for name in ("kept", "costs", "rerun", "split")}
        self._panes = [panes["costs"], panes["rerun"], panes["split"]]  # pushed to Jupyter when the cursor moves
        self._empty = pn.pane.Markdown("Choose a policy and a budget, then press **Run**.", css_classes=["ts-ev-empty"])
        self._split_table = pn.pane.HTML("", css_classes=["ts-ev-split"])
        self._split = pn.Column(pn.pane.Markdown(pm.SPLIT_CAPTION, styles=CAPTION, css_classes=["ts-ev-split-caption"]),
                                panes["split"], self._split_table, sizing_mode="stretch_width", visible=False)
        self._passkey = pn.pane.HTML("", css_classes=["ts-ev-passkey"], visible=False)
        # a Bokeh pane's `visible` follows its figure: the result is shown or hidden by its Column. Its panes join
        # the Column with the first result, so that opening the card does not build five hidden figures' views
        self._result_parts = [panes["kept"], panes["costs"], panes["rerun"], self._split, self._passkey]
        self._result = StagedColumn(sizing_mode="stretch_width", visible=False)  # its parts a tick apart (staged.py)
        # passkey retrieval: fixed panes; the figure is rebuilt only when the run's model changes
        self._needle = {"model_id": None, "figure": False,
                        "caption": pn.pane.Markdown("", styles=CAPTION, css_classes=["ts-ev-needle-caption"]),
                        # the pane inside a Column that shows or hides it (a Bokeh pane's `visible` follows its figure)
                        "plot": pn.Column(pn.pane.Bokeh(None, sizing_mode="stretch_width", css_classes=["ts-ev-needle"]),
                                          sizing_mode="stretch_width", visible=False),
                        "hint": pn.pane.Markdown("This prompt hides a pass key: **Run** also answers it under every "
                                                 "needle policy at the chosen budget.", styles=CAPTION, visible=False)}
        self._retrieval()
        self.state.param.watch(self._new_run, "revision")
        self.state.param.watch(self._move, "step")
        self.settings.param.watch(self._validate, ["budget", "window", "policy"])
        self.settings.param.watch(self._draw, "result")

    # -- events -------------------------------------------------------------------------
    def _new_run(self, *_) -> None:
        self._ticket += 1  # a study still running belongs to the previous run: its result is dropped
        self.settings.clear()
        self.settings.busy = False
        self._retrieval()

    def _move(self, event) -> None:
        self.cursor.set_step(event.new, *self._panes)

    def _validate(self, *_) -> None:
        traj = self.state.trajectory
        msg = self.settings.check(traj.prompt_len) if traj is not None else None
        if msg or self.settings.status.startswith(("Budget must", "The window")):
            self.settings.status = msg or ""

    # -- work (worker thread) -----------------------------------------------------------
    def _model(self):
        from trajscope.ui.runner import local_model

        return local_model(self.state, "eviction", self.model_loader)

    def run(self, *_) -> None:
        """Run the study for the chosen policy and budget on the run on screen (on a worker thread when served)."""
        s, traj = self.settings, self.state.trajectory
        if s.busy:
            return
        if self.state.busy:
            s.status = "A new run is generating; run the study on it once it is on screen."
            return
        if traj is None:
            s.status = "Generate or open a run first: the study uses the run's prompt."
            return
        bad = s.check(traj.prompt_len)
        if bad:
            s.param.update(status=bad, result=None, summary="")
            return
        self._ticket += 1
        ticket, policy, budget, window = self._ticket, s.policy, float(s.budget), int(s.window)
        s.param.update(busy=True, result=None, summary="",
                       status=f"Running {LABELS[policy]} at budget {budget:g} on run {traj.run_id}'s prompt…")

        in_background(lambda: run_study(self._model(), traj, policy, budget, window),
                      lambda res: self._finish(ticket, traj, res, ""), lambda msg: self._finish(ticket, traj, None, msg),
                      name="trajscope-eviction", what="The eviction study")

    def _finish(self, ticket: int, traj, res, message: str) -> None:
        if ticket != self._ticket:
            return
        s = self.settings
        if res is None:
            s.param.update(busy=False, result=None, summary="", status=message)
            return
        s.param.update(busy=False, result=res, summary=ep.summary_line(res, traj.prompt_len), status="")

    # -- display ------------------------------------------------------------------------
    def _hover_tokens(self):
        """The run's tokens when the study's greedy full run is this run (greedy, unsteered), else None."""
        traj = self.state.trajectory
        samp = traj.meta.get("sampling", {})
        return traj.tokens if not samp.get("do_sample") and not traj.meta.get("steering") else None

    def _draw(self, *_) -> None:
        """Put the study's result on screen (the figures' data replaced), or the hint to press **Run**."""
        result, traj = self.settings.result, self.state.trajectory
        shown = result is not None and traj is not None
        self._empty.visible = not shown
        if not shown:
            self._result.visible = False
            return
        P, toks = traj.prompt_len, self._hover_tokens()
        self.kept.show(ep.kept_data(result, traj.tokens, P))
        self.costs.show(ep.costs_data(result, toks, P))
        self.rerun.show(ep.rerun_data(result, toks, P))
        has_split = "eviction_split" in result.tables
        if has_split:
            self.split.show(pm.split_data(result))
            self._split_table.object = _table(["depth band", "per-step KL", "accumulated KL", "carried (paired)"],
                                              pm.split_rows(result))
        self._split.visible = has_split
        if "needle_answers" in result.tables:
            pk = result.config.get("passkey", {})
            notes = "".join(f"<br>{html_text(n)}" for n in pk.get("notes", []))
            self._passkey.object = (
                f"<b>This prompt hides pass key {html_text(pk.get('key', '?'))}</b>: each policy's greedy answer "
                f"with the evicted keys masked, at budget {html_text(result.config['budgets'][0])}.{notes}"
                + _table(["policy", "budget", "kept tokens", "answer", "retrieves the key"],
                         pm.passkey_rows(result.table("needle_answers"))))
        self._passkey.visible = "needle_answers" in result.tables
        if not self._result.objects:
            self._result.objects = self._result_parts
        self._result.visible = True

    def _retrieval(self, *_) -> None:
        """Show the model's shipped needle table (a figure built once per model) and, when this prompt hides a
        passkey, say that **Run** answers it."""
        traj = self.state.trajectory
        model_id = None if traj is None else traj.meta.get("model", {}).get("model_id")
        r = self._needle
        if model_id != r["model_id"] or r["figure"] is False:  # False: not read yet
            table = shipped_needle(model_id)
            r.update(model_id=model_id, figure=None if table is None else needle_figure(table, model_id))
            if r["figure"] is not None:
                r["caption"].object = pm.NEEDLE_CAPTION
                r["plot"][0].object = r["figure"]
            else:
                r["caption"].object = (f"Passkey retrieval: {md_text(model_id or 'this model')} ships no needle "
                                       "table (`trajscope study needle` writes one).")
            r["plot"].visible = r["figure"] is not None
        r["hint"].visible = traj is not None and bool(passkey_of(self._prompt_text(traj)))

    @staticmethod
    def _prompt_text(traj) -> str:
        toks = traj.tokens
        return "".join(toks.filter(toks["pos"] < traj.prompt_len)["text"].to_list())

    def __panel__(self):
        s, r = self.settings, self._needle
        policy = pn.widgets.Select.from_param(s.param.policy, name="Policy", width=230,
                                              options={LABELS[p]: p for p in s.param.policy.objects})
        budget = pn.widgets.FloatInput.from_param(s.param.budget, name="Budget (fraction of prompt)", step=0.05,
                                                  width=170, css_classes=["ts-ev-budget"])
        window = pn.widgets.IntInput.from_param(s.param.window, name="Window", width=90,
                                                disabled=pn.bind(lambda p: p == "streamingllm", s.param.policy))
        run_btn = pn.widgets.Button(label="Run", color="primary", width=80, css_classes=["ts-ev-run"],
                                    disabled=pn.bind(any_of, s.param.busy, self.state.param.busy))
        run_btn.on_click(self.run)
        busy = Spinner(value=s.param.busy, css_classes=["ts-busy"])
        return pn.Column(
            pn.pane.Markdown(NOTE, styles={"font-size": "12px", "color": "#555"}),
            pn.Row(policy, budget, window, run_btn, busy),
            pn.pane.Str(pn.bind(html_text, s.param.status), css_classes=["ts-ev-status"]),
            pn.pane.Markdown(pn.bind(md_text, s.param.summary), css_classes=["ts-ev-summary"]),
            self._empty, self._result, pn.Column(r["caption"], r["plot"], r["hint"], sizing_mode="stretch_width"),
            sizing_mode="stretch_width")
