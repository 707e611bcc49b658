"""Controls: which model, what prompt, how to sample, what to keep; Generate / Stop; open a run.

Generate freezes the settings (and the layers the cards on screen need) into a
:class:`~trajscope.ui.plan.CapturePlan` and runs load + capture on a worker
thread (:class:`~trajscope.ui.runner.GenerationJob`); the step counter, the
text so far and the live figure get the new steps in batches a few times a
second, and the full views are drawn once, when the run is finished. Stop sets
the capture's cancel event: the run ends after the current step and keeps it.
"""

from __future__ import annotations

import logging
import time

import panel as pn
import param

from trajscope.errors import TrajscopeError
from trajscope.escaping import md_text
from trajscope.trajectory import Trajectory
from trajscope.ui.plots import visible
from trajscope.ui.runner import GenerationJob
from trajscope.ui import openmp, saved_runs
from trajscope.ui.operator import config
from trajscope.ui.views._base import StateView, dispatcher, in_background, redraw_once, served
from trajscope.ui.views.ticker import Ticker

log = logging.getLogger(__name__)


class Controls(StateView):
    """Model / prompt / sampling widgets, Generate and Stop, progress, and open-a-run."""

    models_loaded = param.Integer(default=0, doc="Bumped when the page's warm-up has loaded the model (the size "
                                  "estimate needs its shape).")

    def __init__(self, **params):
        super().__init__(**params)
        self.job: GenerationJob | None = None
        self._give_back = lambda: None  # ends the UI thread's OpenMP hold of the running generation
        self.listeners: list = []  # ``fn(events)`` called with each batch of streamed steps (the live view)
        self.on_start: list = []  # ``fn()`` called when a generation starts
        self.ticker = Ticker(css_classes=["ts-ticker", "ts-status"], sizing_mode="stretch_width", height=96,
                             status=self.state.status)
        self.state.param.watch(lambda e: setattr(self.ticker, "status", e.new), "status")
        self.saved = pn.widgets.Select(name="Runs saved here (newest first)", options=self._saved_options(),
                                       css_classes=["ts-saved-runs"], sizing_mode="stretch_width",
                                       description=f"Every run generated in the app is saved to "
                                       f"{saved_runs.runs_dir().resolve()} (set TRAJSCOPE_RUNS_DIR to change it); "
                                       "choose one to open it, after a reload too.")
        self.saved.param.watch(self._open_saved, "value")

    def _saved_options(self) -> dict[str, str]:
        return {"—": "", **saved_runs.list_runs()}

    def _open_saved(self, event) -> None:
        if event.new:
            self.state.run_path = event.new
            self.open_run()

    # -- generation --------------------------------------------------------------------------------
    def generate(self, event=None, dispatch=None, loader=None) -> GenerationJob | None:
        """Start a generation with the current settings (ignored while one runs). Returns the job.

        The settings are frozen into a :class:`~trajscope.ui.plan.CapturePlan` now; changing a widget
        while the model loads or generates does not change this run.
        """
        st = self.state
        if st.busy:
            return None
        try:
            plan = st.capture_plan()
            source, remote = st.model_key()
        except TrajscopeError as exc:
            st.report(str(exc))
            return None
        n = plan.config.max_new_tokens
        with redraw_once():  # one message to the browser
            st.param.update(busy=True, progress=0, progress_max=n, live_text="", error="",
                            status=f"Loading '{source}' and generating up to {n} tokens…")
            self.ticker.param.update(active=True, step=-1, max_steps=n, text="", message="")
            for fn in self.on_start:
                fn()
        dispatch = dispatch or dispatcher()
        self._give_back = openmp.lend(dispatch)  # the UI thread's OpenMP team steps aside until the run ends
        self.job = GenerationJob(
            source, st.prompt, plan, dispatch, remote=remote, api_key=st.ndif_api_key or None, chat=st.chat,
            on_progress=self._on_progress, on_done=self._on_done, on_error=self._on_error, loader=loader,
            on_wait=self._on_wait)
        return self.job.start()

    def warm_up(self) -> None:
        """Load the model for Generate on a background thread (page load), so the first click does not wait for it."""
        import threading

        from trajscope.ui.runner import get_model

        try:
            source, remote = self.state.model_key()
        except TrajscopeError:
            return
        if remote:
            return

        dispatch = dispatcher()

        def load():
            try:
                get_model(source)
            except Exception:  # Generate reports a failing model when it is pressed
                return
            dispatch(lambda: setattr(self, "models_loaded", self.models_loaded + 1))  # the estimate can be shown

        threading.Thread(target=load, name="trajscope-warm-up", daemon=True).start()

    def stop(self, event=None) -> None:
        """Ask the running generation to stop after its current step."""
        if self.job is not None and self.state.busy:
            self.job.stop()
            self.ticker.message = "Stopping after the current step…"

    def size_text(self, *_) -> str:
        """The size estimate shown under the settings (needs the model loaded: the page loads it at start)."""
        from trajscope.ui.runner import loaded_model

        st = self.state
        try:
            source, remote = st.model_key()
            model = None if remote else loaded_model(source)
            if model is None:
                return "Saved run size: shown once the model is loaded."
            return st.size_estimate(model, len(model.encode(st.prompt)))
        except TrajscopeError as exc:  # may echo what the page sent (a model name): text, never markup
            return md_text(str(exc))

    def _on_wait(self, n_ahead: int) -> None:
        self.ticker.message = (f"Waiting for a free generation slot: {n_ahead} generation{'s' if n_ahead > 1 else ''} "
                               "ahead of yours (Stop leaves the queue).")

    def _on_progress(self, events) -> None:
        # only the ticker shows these while streaming: a Markdown / HTML pane change re-lays the page out
        st, last = self.state, events[-1]
        text = (st.live_text + "".join(e.text for e in events))[-2000:]
        stopping = self.job is not None and self.job.cancel.is_set()
        with redraw_once():  # one message to the browser
            st.param.update(progress=last.step + 1, live_text=text)
            self.ticker.param.update(step=last.step, max_steps=last.max_steps, text=visible(text[-400:]),
                                     message=self.ticker.message if stopping else "")  # no longer waiting
            for fn in self.listeners:
                fn(events)

    def _on_done(self, traj) -> None:
        self._give_back()
        st = self.state
        t0 = time.monotonic()
        if self.job is not None and getattr(self.job, "t_captured", None) is not None:
            self.job.timings["to_loop_s"] = t0 - self.job.t_captured  # the event loop's backlog at the end
        done = (f"Done: {traj.meta.get('n_generated')} tokens in {traj.n_steps} steps "
                f"(stopped by {traj.meta.get('stop_reason')}). Step with the player or the arrow keys.")
        with redraw_once():  # the run, the buttons and the status reach the browser as one message
            st.set_trajectory(traj, step=max(0, traj.n_steps - 1))
            self.ticker.active = False
            st.param.update(busy=False, progress=st.progress_max, error="", status=done)
        log.info("new run on screen in %.2f s", time.monotonic() - t0)
        if self.job is not None:
            self.job.timings["on_screen_s"] = time.monotonic() - t0
        self._save(traj, done)

    def _save(self, traj, done: str) -> None:
        """Save the run to the runs directory off the event loop; list it, or say why it was not saved."""
        float16 = getattr(getattr(self.job, "plan", None), "float16", True)  # the plan Generate froze

        def failed(err: str) -> None:  # the run stays on screen; only the copy on disk is missing
            self.state.report(f"{err} The run stays on screen; export it from the Export tab.")

        def apply(path):
            self.saved.options = self._saved_options()
            if self.state.trajectory is traj:
                self.state.param.update(run_path=str(path), status=f"{done} Saved to {path}.")

        in_background(lambda: saved_runs.save_run(traj, float16=float16), apply, failed, what="Saving the run")

    def _on_error(self, message: str) -> None:
        self._give_back()
        self.ticker.active = False
        self.state.busy = False
        self.state.report(message)

    # -- open a saved run ----------------------------------------------------------------------------
    def open_run(self, event=None) -> None:
        """Load the run directory at ``state.run_path``."""
        st = self.state
        path = st.run_path.strip()
        if not path:
            st.report("Type the path of a run directory (it holds meta.json and the .parquet tables).")
            return
        try:
            traj = Trajectory.load(config().path(path, "run directory"))
        except TrajscopeError as exc:
            st.report(str(exc))
            return
        with redraw_once():
            st.set_trajectory(traj, step=0)
        st.param.update(error="", status=f"Opened run {traj.run_id} ({traj.n_steps} steps) from {path}.")

    def __panel__(self):
        st = self.state
        choices = list(dict.fromkeys((*config().models, *st.trusted_models, st.model_source)))
        source = pn.widgets.Select(label="Model", options=choices, value=st.model_source, css_classes=["ts-model"],
                                   description="The models this server offers (its operator adds more with "
                                   "--models): 'sample' is the tiny shipped model, 'smollm2' SmolLM2-135M-Instruct.")
        source.link(st, value="model_source")
        st.param.watch(lambda e: setattr(source, "value", e.new) if e.new in source.options else None, "model_source")
        remote = pn.widgets.Checkbox.from_param(st.param.remote, name="NDIF remote")
        key = pn.widgets.PasswordInput.from_param(st.param.ndif_api_key, name="NDIF API key",
                                                  placeholder="only for NDIF remote; never saved")
        key.visible = st.remote
        st.param.watch(lambda e: setattr(key, "visible", e.new), "remote")
        prompt = pn.widgets.TextAreaInput.from_param(st.param.prompt, name="Prompt", height=90, css_classes=["ts-prompt"],
                                                     max_length=config().max_prompt_chars)  # the server checks it too
        mnt = pn.widgets.IntInput.from_param(st.param.max_new_tokens, name="Max new tokens", width=105)
        temp = pn.widgets.FloatInput.from_param(st.param.temperature, name="Temperature", step=0.1, width=110,
                                          description="0 = greedy (argmax); above 0 samples with the seed.")
        seed = pn.widgets.IntInput.from_param(st.param.seed, name="Seed", width=75)
        keep = pn.widgets.TextInput.from_param(st.param.keep_attention, name="Keep full attention rows of layers",
                                               description="'all', 'none' or indices like '0,3'. The layer shown in "
                                               "the heatmap is always kept; other layers show their top-8 keys only. "
                                               "Full rows cost heads × n² numbers per layer (see the estimate below).")
        chat = pn.widgets.Checkbox.from_param(st.param.chat, name="Chat: the prompt is a user message",
                                              css_classes=["ts-chat"])
        keep_res = pn.widgets.TextInput.from_param(
            st.param.keep_residuals, name="Keep residuals of layers", css_classes=["ts-keep-residuals"],
            description="'all', 'none' or indices like '0,3'. The SAE's layer and the Drift card's layers are "
                        "always kept; add layers here to export their residuals or to switch SAE / profile later.")
        f16 = pn.widgets.Checkbox.from_param(st.param.attention_float16, name="Save attention rows and residuals in float16")
        size = pn.pane.Markdown(pn.bind(self.size_text, st.param.max_new_tokens, st.param.keep_attention,
                                        st.param.keep_residuals, st.param.attention_float16, st.param.layer,
                                        st.param.model_source, st.param.prompt, st.param.busy,
                                        self.param.models_loaded),
                                css_classes=["ts-size-estimate"], styles={"font-size": "0.8em", "color": "#555"},
                                sizing_mode="stretch_width")
        # Generate and Stop are made in the state they show, and change only once the browser has drawn them
        # (the ticker, drawn after them, reports it): BokehJS throws on a `disabled` change that reaches a button
        # it has not rendered yet, and drops the rest of that message (a run that starts as the page is drawn
        # once left Stop enabled after it ended). Without a browser session (a script, a test) they follow at once.
        gen = pn.widgets.Button(label="Generate", color="primary", width=130, disabled=st.busy,
                                css_classes=["ts-generate"])
        stop = pn.widgets.Button(label="Stop", color="danger", width=90, disabled=not st.busy, css_classes=["ts-stop"])
        gen.on_click(self.generate)
        stop.on_click(self.stop)

        def busy(*_):
            if self.ticker.drawn or not served(pn.state.curdoc):
                gen.disabled, stop.disabled = st.busy, not st.busy

        st.param.watch(busy, "busy")
        self.ticker.param.watch(busy, "drawn")
        alert = pn.pane.Alert(pn.bind(md_text, st.param.error), alert_type="danger", visible=pn.bind(bool, st.param.error),
                              css_classes=["ts-error"], sizing_mode="stretch_width")
        path = pn.widgets.TextInput.from_param(st.param.run_path, name="Open a saved run directory",
                                               placeholder="e.g. sample_data/runs/demo")
        open_btn = pn.widgets.Button(label="Open run", width=110, css_classes=["ts-open"])
        open_btn.on_click(self.open_run)
        return pn.Column(
            "### Model & run", source, remote, key, prompt, chat, pn.Row(mnt, temp, seed), keep, keep_res, f16, size,
            pn.Row(gen, stop), self.ticker, alert,
            pn.pane.HTML("<hr style='border: none; border-top: 1px solid #ddd'>", sizing_mode="stretch_width"), self.saved, path, open_btn, sizing_mode="stretch_width")
