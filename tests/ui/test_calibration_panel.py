"""The Export card's calibration report: it runs the report for the run's model in a generation slot, one at a
time, refuses a prompt file outside the data directories in one sentence, and offers the page it wrote."""

from __future__ import annotations

import pathlib

import pytest

from trajscope.ui.state import AppState
from trajscope.ui.views import calibration
from trajscope.ui.views.calibration import CalibrationPanel


@pytest.fixture
def panel(short_run, sample_model, fresh_models, monkeypatch):
    from trajscope.ui import runner

    runner._MODELS[("sample", False, None)] = sample_model
    p = CalibrationPanel(state=AppState())
    p.state.set_trajectory(short_run, step=0)
    return p


def test_the_report_is_written_for_the_run_s_model_and_offered(panel, monkeypatch, _runs_dir):
    seen = {}

    def fake(model, out, prompts=(), quick=False, on_state=None, **kw):
        seen.update(model=model.model_id, out=pathlib.Path(out), prompts=prompts, quick=quick)
        from trajscope.calibration import Calibration

        pathlib.Path(out).mkdir(parents=True, exist_ok=True)
        page = pathlib.Path(out) / "report.html"
        page.write_text("<html>report</html>")
        return Calibration(report=page, summary={"verdicts": [{"verdict": "undecided"}]}, states=[])

    monkeypatch.setattr("trajscope.calibration.calibrate", fake)
    panel._cancel = __import__("threading").Event()
    assert calibration._ONE_AT_A_TIME.acquire(blocking=False)  # what start() takes before the thread
    panel._done(panel._work(lambda fn: fn(), ""))  # what the slot's thread runs, then the event loop
    assert seen["quick"] and seen["prompts"] == () and seen["out"].parent == _runs_dir / "calibration"
    assert panel.status.startswith("Calibration report written") and not panel.busy
    assert panel._download().getvalue() == b"<html>report</html>"
    assert calibration._ONE_AT_A_TIME.acquire(blocking=False)  # released again
    calibration._ONE_AT_A_TIME.release()


def test_a_prompt_file_outside_the_data_directories_is_one_sentence(panel):
    panel.prompts_file = "/etc/passwd"
    panel.start()
    assert not panel.busy and "/etc/passwd" in panel.status and "outside the directories" in panel.status


def test_one_report_at_a_time(panel):
    calibration._ONE_AT_A_TIME.acquire()
    try:
        panel.start()
        assert not panel.busy and "another session" in panel.status
    finally:
        calibration._ONE_AT_A_TIME.release()


def test_no_run_no_report():
    p = CalibrationPanel(state=AppState())
    p.start()
    assert "Generate or open a run first" in p.status
