"""Drift and Steering views of the app.

:class:`DriftView` shows, for the run on screen, the residual drift score of every
position and layer against a prefill reference profile (heatmap and per-layer
curves with calibrated thresholds), and adds ``drift_flagged_layers`` and
``drift_score_max`` to the run's tokens so the token strip can be coloured by them. The per-dimension Gaussian KL behind the
batch report is a triage proxy, and the view says so.

:class:`SteeringView` builds a CAA vector from contrast pairs, steers the current
prompt from a chosen decode step and shows base and steered continuations
aligned by step; its depth sweep plots the effect by step for several start
depths and the decay of the effect with depth. Work runs on a worker thread; the
view stays responsive and a Stop button ends a sweep after the current run.
"""

from __future__ import annotations

import logging
import threading

import panel as pn
import param

from trajscope.errors import TrajscopeError
from trajscope.escaping import html_text, md_text
from trajscope.logs import failure_sentence
from trajscope.ui import analysis_plots as ap
from trajscope.ui import artefacts
from trajscope.ui import openmp
from trajscope.ui.analysis_state import DriftSettings, SteeringSettings, parse_depths, skipped_depths
from trajscope.ui.tables import table_pane
from trajscope.ui.views._base import StateView, any_of, dispatcher, in_background
from trajscope.ui.views._cursor import Cursor, vline

log = logging.getLogger(__name__)

PROXY_NOTE = ("Drift score = diagonal Mahalanobis distance of the residual to the prefill mean, ÷ √d (≈ 1 for "
              "prefill positions). It treats dimensions independently: a triage signal for where to look, "
              "not a claim about the joint geometry of the residual stream.")


class DriftView(StateView):
    """Residual drift of the current run against a prefill profile."""

    settings = param.ClassSelector(class_=DriftSettings, doc="Profile choice and the drift table.")

    def __init__(self, **params):
        params.setdefault("settings", DriftSettings())
        super().__init__(**params)
        self._ticket = 0
        self.cursor: Cursor | None = None
        self.state.param.watch(self._recompute, "revision")
        self.state.param.watch(lambda e: self.cursor and self.cursor.set_step(e.new), "step")
        self.settings.param.watch(self._recompute, "profile_path")
        self._recompute()

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
            s.param.update(drift=None, message=str(exc))
            return
        if traj is None:
            s.param.update(drift=None, message="No run yet.")
            return
        if self.defer(self._recompute):  # the Drift tab is hidden: score the run when it is opened
            s.param.update(drift=None, message="Scoring the run against the profile…")
            return
        s.param.update(drift=None, message="Scoring the run against the profile…")
        in_background(lambda: s.score(traj, prof), lambda res: self._apply(ticket, traj, res),
                      lambda msg: self._apply(ticket, traj, (None, msg)), what="Drift scoring")

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
        s.param.update(drift=None, message=artefacts.no_profile(facts, why))
        return True

    def _apply(self, ticket: int, traj, result) -> None:
        """Show the drift table; put per-token flags on the token strip (``drift_flagged_layers``, ``drift_score_max``)."""
        import polars as pl

        if ticket != self._ticket:
            return
        drift, message = result
        if drift is not None:
            per = drift.group_by("pos").agg(pl.col("score").max().alias("drift_score_max"),
                                            pl.col("flagged").sum().cast(pl.Int32).alias("drift_flagged_layers"))
            if self.state.trajectory is traj:  # the run's own tables are shared: the view adds columns beside them
                self.state.add_token_columns(per)
        self.settings.param.update(drift=drift, message=message)

    def _plots(self, drift, message):
        st = self.state
        if drift is None:
            return pn.pane.Alert(md_text(message or "No drift to show."), alert_type="secondary")
        traj = st.trajectory
        P, texts = traj.prompt_len, traj.tokens["text"].to_list()
        self.cursor = Cursor([vline()], lambda step: [{"location": step}])  # one line on each figure
        self.cursor.step = st.step
        heat = ap.drift_heatmap(drift, P, texts).opts(hooks=[self.cursor.hook])
        curves = ap.drift_curves(drift, self.settings.thresholds, P, texts).opts(hooks=[self.cursor.hook])
        note = [pn.pane.Alert(message, alert_type="info", css_classes=["ts-drift-note"])] if message else []
        return pn.Column(*note, pn.pane.HoloViews(heat, sizing_mode="stretch_width"),
                         pn.pane.HoloViews(curves, sizing_mode="stretch_width"), sizing_mode="stretch_width")

    def __panel__(self):
        path = pn.widgets.TextInput.from_param(self.settings.param.profile_path, name="Profile", sizing_mode="stretch_width")
        return pn.Column(pn.pane.Markdown(PROXY_NOTE, styles={"font-size": "12px"}), path,
                         pn.bind(self._plots, self.settings.param.drift, self.settings.param.message),
                         sizing_mode="stretch_width")


class SteeringView(StateView):
    """Steer the current prompt from a chosen step; sweep the start depth."""

    settings = param.ClassSelector(class_=SteeringSettings, doc="Vector settings and steering results.")
    model_loader = param.Callable(default=None, doc="``(source) -> ModelHandle``; default: the app's shared model cache.")

    def __init__(self, **params):
        params.setdefault("settings", SteeringSettings())
        super().__init__(**params)
        self._cancel = threading.Event()
        self._vectors: dict[tuple, object] = {}
        self._model_id = None
        self.state.param.watch(self._new_run, "revision")

    def _new_run(self, *_) -> None:
        """A new run clears the results; a run of another model steers a middle layer of it."""
        self.settings.clear()
        traj = self.state.trajectory
        model = (traj.meta.get("model", {}) if traj is not None else {})
        if model.get("n_layers") and model.get("model_id") != self._model_id:
            self._model_id = model.get("model_id")
            if self._model_id != "sample" or self.settings.layer >= model["n_layers"]:  # the sample's vector: layer 3
                self.settings.layer = int(model["n_layers"]) // 2

    # -- work (worker thread) -----------------------------------------------------------
    def _model(self):
        if self.model_loader is not None:
            return self.model_loader(self.state.model_source)
        from trajscope.ui.runner import get_model

        return get_model(self.state.model_key()[0])  # a model the operator allows

    def _vector(self, model):
        from trajscope.prompts import read_pairs
        from trajscope.steering import SteeringVector

        s = self.settings
        key = (s.pairs_path, s.layer, model.model_id)
        if key not in self._vectors:
            from trajscope.ui.operator import config

            pairs = read_pairs(config().path(s.pairs_path, "contrast pairs file"))
            self._vectors[key] = SteeringVector.from_contrast(model, pairs, s.layer, name="caa")
        return s.vector(self._vectors[key])

    def _launch(self, work) -> None:
        s, dispatch = self.settings, dispatcher()
        if s.busy:
            return
        if self.state.busy:
            s.status = "A new run is generating; steer it once it is on screen."
            return
        if self.state.trajectory is None:
            s.status = "Generate or open a run first: steering continues the run's prompt."
            return
        s.busy, self._cancel = True, threading.Event()
        give_back = openmp.lend(dispatch)  # the UI thread's OpenMP team steps aside while the model runs

        def waiting(n_ahead: int) -> None:
            dispatch(lambda: setattr(s, "status", f"Waiting for a free generation slot: {n_ahead} ahead."))

        def run():
            from trajscope.ui.runner import QUEUE

            # Steer and each depth sweep are generations too: they take a slot of Generate's queue
            # (the operator's --max-generations), for their whole run
            if not QUEUE.wait_turn(self, waiting, self._cancel):
                dispatch(lambda: (give_back(), self._finish("Stopped while waiting for a free generation slot.")))
                return
            openmp.set_threads(openmp.page_share())  # as Generate: one core stays with the page
            try:
                msg = work(dispatch)
            except TrajscopeError as exc:
                msg = str(exc)
            except Exception as exc:  # the view must stay usable; the traceback goes to the log
                msg = failure_sentence("Steering", exc, log)
            finally:
                QUEUE.leave(self)
            dispatch(lambda: (give_back(), self._finish(msg)))

        threading.Thread(target=run, name="trajscope-steer", daemon=True).start()

    def _show(self, run, **results) -> None:
        """Show results computed on ``run``, unless another run has replaced it meanwhile (then they are dropped)."""
        if self.state.trajectory is run:
            self.settings.param.update(**results)

    def _finish(self, msg: str) -> None:
        self.settings.busy, self.settings.status = False, msg

    def _capture_kwargs(self) -> dict:
        meta = self.state.trajectory.meta
        samp = meta["sampling"]
        return dict(max_new_tokens=samp["max_new_tokens"], temperature=samp["temperature"], seed=samp["seed"],
                    stop_at_eos=False)

    def steer(self, *_) -> None:
        """Capture the current prompt with the vector on from ``start_step``."""
        from trajscope.ui.runner import capture

        base = self.state.trajectory

        def work(dispatch):
            model = self._model()
            vec = self._vector(model)
            kw = self._capture_kwargs()
            steered = capture(model, base.token_ids[: base.prompt_len], steering=[vec], **kw)
            ref = capture(model, base.token_ids[: base.prompt_len], **kw)
            dispatch(lambda: self._show(base, base=ref, steered=steered))
            return f"Steered run {base.run_id} at layer {vec.layer} from step {vec.start_step} with strength {vec.strength:g}."

        self._launch(work)

    def sweep(self, *_) -> None:
        """Depth sweep on the current prompt (one base run, one steered run per depth)."""
        from trajscope.sweep import steering_sweep

        base = self.state.trajectory
        kw = self._capture_kwargs()

        def work(dispatch):
            depths = parse_depths(self.settings.depths, kw["max_new_tokens"])
            model = self._model()
            vec = self._vector(model)
            res = steering_sweep(model, [base.token_ids[: base.prompt_len]], vec, depths=depths,
                                 strengths=[self.settings.strength], max_new_tokens=kw["max_new_tokens"],
                                 window=10, temperature=kw["temperature"], seeds=[kw["seed"]],
                                 cancel=self._cancel, progress=False)
            dispatch(lambda: self._show(base, sweep_steps=res.steps, sweep_summary=res.summary))
            done = (f"Sweep of run {base.run_id} stopped early; finished depths are shown." if not res.complete
                    else f"Sweep of run {base.run_id} finished.")
            return " ".join(filter(None, [done, skipped_depths(self.settings.depths, kw["max_new_tokens"])]))

        self._launch(work)

    def stop(self, *_) -> None:
        self._cancel.set()

    # -- display ------------------------------------------------------------------------
    def _texts(self, base, steered):
        if base is None or steered is None:
            return pn.pane.Markdown("Press **Steer** to compare base and steered continuations of this prompt.")
        html = ap.aligned_continuations(base.tokens, steered.tokens, base.prompt_len, self.settings.start_step)
        return pn.pane.HTML(html, sizing_mode="stretch_width")

    def _sweep_plots(self, steps, summary):
        if steps is None:
            return pn.pane.Markdown("Press **Depth sweep** to measure the effect for each start depth.")
        return pn.Column(pn.pane.HoloViews(ap.effect_curves(steps), sizing_mode="stretch_width"),
                         pn.pane.HoloViews(ap.decay_plot(summary), sizing_mode="stretch_width"),
                         table_pane(summary.rename({c: c.replace("_", " ") for c in summary.columns}),
                                    css_class="ts-sweep-summary"),  # "effect lo / hi": the 95% interval
                         sizing_mode="stretch_width")

    def __panel__(self):
        s = self.settings
        steer_btn = pn.widgets.Button(label="Steer", color="primary", width=90)
        sweep_btn = pn.widgets.Button(label="Depth sweep", width=110)
        stop_btn = pn.widgets.Button(label="Stop", color="danger", width=70, disabled=s.param.busy.rx.not_())
        steer_btn.on_click(self.steer)
        sweep_btn.on_click(self.sweep)
        stop_btn.on_click(self.stop)
        for b in (steer_btn, sweep_btn):  # off while a steer runs, and while Generate replaces the run
            b.disabled = pn.bind(any_of, s.param.busy, self.state.param.busy)
        busy = pn.indicators.LoadingSpinner(value=s.param.busy, width=24, height=24)
        controls = pn.Row(
            pn.widgets.TextInput.from_param(s.param.pairs_path, name="CAA contrast pairs", width=330),
            pn.widgets.IntInput.from_param(s.param.layer, name="Layer", width=70),
            pn.widgets.FloatInput.from_param(s.param.strength, name="Strength", width=90),
            pn.widgets.IntInput.from_param(s.param.start_step, name="Start step", width=90),
            pn.widgets.Select.from_param(s.param.mode, name="Mode", width=80),
            pn.widgets.TextInput.from_param(s.param.depths, name="Sweep depths", width=130))
        return pn.Column(
            pn.pane.Markdown("A CAA vector (mean residual difference over contrast pairs) is added to one block's "
                             "output from the start step on; tokens before it are identical to the base run."),
            controls, pn.Row(steer_btn, sweep_btn, stop_btn, busy, pn.pane.Str(pn.bind(html_text, s.param.status))),
            pn.bind(self._texts, s.param.base, s.param.steered),
            pn.bind(self._sweep_plots, s.param.sweep_steps, s.param.sweep_summary),
            sizing_mode="stretch_width")

