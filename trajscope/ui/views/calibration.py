"""The Export card's calibration report: the decode-regime calibration report for the run's model.

One button runs :func:`trajscope.calibrate` on the run's model with ``--quick`` settings, on the model's shipped
evaluation prompts or on a prompt file from the operator's data directories, with the model's shipped SAEs,
steering vector and drift profile. It writes into ``<runs folder>/calibration/<model>-quick/``, so a second
press (in any session) resumes or reuses what is finished there; the status line names each study as it
ends. The report is a generation: it waits for, and holds, one slot of Generate's queue (the operator's
``--max-generations``), and one report is written at a time in the process. When it is written, a download
button offers ``report.html`` (one offline page).
"""

from __future__ import annotations

import threading

import panel as pn
import param

from trajscope.errors import TrajscopeError
from trajscope.safe_paths import safe_name
from trajscope.ui.views._base import StateView, dispatcher, in_slot
from trajscope.ui.views.download import Download

_ONE_AT_A_TIME = threading.Lock()


class CalibrationPanel(StateView):
    """Write the calibration report for the run's model, then offer it for download."""

    prompts_file = param.String(default="", doc="A prompt file (JSON lines) from the data directories; empty: the "
                                "model's shipped evaluation prompts.")
    status = param.String(default="", doc="What the report is doing, or why it did not run.")
    busy = param.Boolean(default=False, doc="A report is being written by this session.")
    report_path = param.String(default="", doc="The last report written, for the download.")

    def _out(self, model_id: str):
        from trajscope.ui.saved_runs import runs_dir

        return runs_dir() / "calibration" / f"{safe_name(model_id)}-quick"

    def start(self, *_) -> None:
        """Press of the button: check, then run on a worker thread holding a generation slot."""
        if self.busy:
            return
        if self.state.trajectory is None:
            self.status = "Generate or open a run first: the report is for the run's model."
            return
        dispatch = dispatcher()
        prompts = self.prompts_file.strip()
        try:
            if prompts:
                from trajscope.ui.operator import config

                prompts = str(config().path(prompts, "prompt file"))
        except TrajscopeError as exc:
            self.status = str(exc)
            return
        if not _ONE_AT_A_TIME.acquire(blocking=False):
            self.status = "A calibration report is being written by another session; press again when it ends."
            return
        self.busy, self.status, self._cancel = True, "Waiting for a free generation slot…", threading.Event()
        in_slot(self, lambda: self._work(dispatch, prompts), dispatch,
                lambda n: setattr(self, "status", f"Waiting for a free generation slot: {n} ahead."),
                self._done, self._cancel, what="The calibration report", name="trajscope-calibrate")

    def _work(self, dispatch, prompts: str) -> str:
        """The report (worker thread, in a generation slot); returns the status line."""
        from trajscope.calibration import calibrate
        from trajscope.ui.runner import get_model

        model = get_model(self.state.model_key()[0])
        dispatch(lambda: setattr(self, "status", f"Writing the calibration report for {model.model_id} "
                                                 "(quick settings; minutes)…"))
        done: list[str] = []

        def on_state(state) -> None:
            done.append(f"{state.job.key} {state.state}")
            dispatch(lambda text=f"Calibration report: {', '.join(done)}…": setattr(self, "status", text))

        cal = calibrate(model, self._out(model.model_id), prompts=[prompts] if prompts else (), quick=True,
                        on_state=on_state)
        self._written = str(cal.report)
        ran = sum(s.state in ("done", "resumed") for s in cal.states)
        return f"Calibration report written: {ran} of {len(cal.states)} studies, {len(cal.verdicts)} verdicts."

    def _done(self, msg: str) -> None:
        """On the event loop, whatever the outcome: release the one-at-a-time lock and show the result."""
        _ONE_AT_A_TIME.release()
        path, self._written = getattr(self, "_written", ""), ""
        self.param.update(busy=False, status=msg, report_path=path or self.report_path)

    def _download(self):
        import io
        import pathlib

        if not self.report_path or not pathlib.Path(self.report_path).is_file():
            self.status = "No calibration report has been written in this session yet."
            return None
        return io.BytesIO(pathlib.Path(self.report_path).read_bytes())

    def release(self) -> None:
        """The session has gone: stop waiting for a slot (a running report finishes for the next press)."""
        if getattr(self, "_cancel", None) is not None:
            self._cancel.set()

    def __panel__(self):
        from trajscope.escaping import html_text

        field = pn.widgets.TextInput.from_param(self.param.prompts_file, name="Calibration prompts (optional)",
                                                placeholder="the model's shipped prompts", width=280)
        button = pn.widgets.Button(label="Write calibration report (quick)", width=280, css_classes=["ts-calibrate"])
        button.on_click(self.start)
        down = Download(callback=self._download, filename="calibration-report.html", width=280,
                        label="Download calibration report (HTML)", css_classes=["ts-download-calibration"])

        def status(text, busy, path):
            button.disabled = busy
            down.disabled = not path
            return pn.pane.HTML(f"<span class='ts-calibration-status'>{html_text(text)}</span>", width=280)

        return pn.Column(pn.pane.HTML("<b>Decode-regime calibration report</b>"), field, button,
                         pn.bind(status, self.param.status, self.param.busy, self.param.report_path), down)
