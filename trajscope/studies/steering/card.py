"""The Steering card: steer the run on screen, and the steering study's depth sweep on its prompt.

:class:`SteeringView` builds a CAA vector from contrast pairs, steers the current prompt from a
chosen decode step and shows base and steered continuations aligned by step. Its depth sweep
runs the registered steering study (:func:`trajscope.studies.steering.study.run`) on the current
prompt and shows what the :class:`~trajscope.studies.registry.Result` holds: the effect by step
for each start depth, the decay of the effect with depth (equal windows) and the summary table
with the headline numbers. Work runs on a worker thread; the view stays responsive and a Stop
button ends a sweep after the current run. :func:`card` is the registered card factory.
"""

from __future__ import annotations

import threading

import panel as pn
import param

from trajscope.escaping import html_text
from trajscope.studies.steering import plots as ap
from trajscope.studies.steering.section import effect_rows
from trajscope.studies.steering.state import (
    SteeringSettings,
    parse_depths,
    skipped_depths,
)
from trajscope.ui.tables import table_pane
from trajscope.ui.views._base import StateView, any_of, dispatcher, in_slot
from trajscope.ui.views.spinner import Spinner

SWEEP_WINDOW = 10  # steered steps per depth in the card's sweep (every depth the same)


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
        """A new run clears the results; a run of another model takes that model's shipped CAA setting
        (contrast pairs and layer, :func:`~trajscope.ui.artefacts.find_steering`), else a middle layer."""
        from trajscope.ui.artefacts import find_steering, model_facts

        self.settings.clear()
        traj = self.state.trajectory
        facts = model_facts(traj.meta if traj is not None else {})
        if facts["n_layers"] and facts["model_id"] != self._model_id:
            self._model_id = facts["model_id"]
            shipped = find_steering(facts)
            if shipped is not None:
                self.settings.param.update(pairs_path=str(shipped["pairs"]), layer=shipped["layer"])
            else:
                self.settings.layer = int(facts["n_layers"]) // 2

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
        in_slot(self, lambda: work(dispatch), dispatch,
                lambda n_ahead: setattr(s, "status", f"Waiting for a free generation slot: {n_ahead} ahead."),
                self._finish, self._cancel, what="Steering", name="trajscope-steer")

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
        """The steering study on the current prompt (one base run, one steered run per depth)."""
        from trajscope.studies.steering import study

        base = self.state.trajectory
        kw = self._capture_kwargs()

        def work(dispatch):
            s = self.settings
            depths = parse_depths(s.depths, kw["max_new_tokens"])
            model = self._model()
            vec = self._vector(model)
            config = study.SteeringConfig(pairs=s.pairs_path, layer=int(s.layer), mode=s.mode, depths=tuple(depths),
                                          strengths=(float(s.strength),), window=SWEEP_WINDOW,
                                          max_new_tokens=kw["max_new_tokens"], seeds=(kw["seed"],),
                                          temperature=kw["temperature"])
            res = study.run(model, [base.token_ids[: base.prompt_len]], config, vector=vec, cancel=self._cancel)
            dispatch(lambda: self._show(base, sweep=res))
            done = (f"Sweep of run {base.run_id} stopped early; finished depths are shown."
                    if not res.summaries.get("complete", True) else f"Sweep of run {base.run_id} finished.")
            return " ".join(filter(None, [done, skipped_depths(self.settings.depths, kw["max_new_tokens"])]))

        self._launch(work)

    def stop(self, *_) -> None:
        self._cancel.set()

    def release(self) -> None:
        """The session has gone: stop a sweep after its current run and drop the results."""
        self._cancel.set()
        self.settings.clear()

    # -- display ------------------------------------------------------------------------
    def _texts(self, base, steered):
        if base is None or steered is None:
            return pn.pane.Markdown("Press **Steer** to compare base and steered continuations of this prompt.")
        html = ap.aligned_continuations(base.tokens, steered.tokens, base.prompt_len, self.settings.start_step)
        return pn.pane.HTML(html, sizing_mode="stretch_width")

    def _sweep_plots(self, result):
        if result is None:
            return pn.pane.Markdown("Press **Depth sweep** to measure the effect for each start depth.")
        steps, summary = result.table("steering"), result.table("steering_summary")
        return pn.Column(table_pane(effect_rows(result.summaries), css_class="ts-sweep-headline"),
                         pn.pane.Bokeh(ap.effect_figure(steps), sizing_mode="stretch_width"),
                         pn.pane.Bokeh(ap.decay_figure(summary), sizing_mode="stretch_width"),
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
        busy = Spinner(value=s.param.busy, css_classes=["ts-busy"])
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
            pn.bind(self._sweep_plots, s.param.sweep),
            sizing_mode="stretch_width")


def card(state) -> SteeringView:
    """The registered Steering card for the app's ``state``."""
    return SteeringView(state=state)
