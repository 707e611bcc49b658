"""An NDIF key set to a marker string reaches no page, log, saved run, export or report (grepped for)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

from bokeh.document import Document

from trajscope.ui import operator
from trajscope.ui.export import report_bytes, run_zip_bytes
from trajscope.ui.views.app import TrajScope

MARKER = "MARKERndifKEY7f3a9c"  # letters and digits only: no escaping may hide it from the grep


def page_json(app: TrajScope) -> str:
    """Every property of every model of the rendered page, but the key field's own value."""
    doc, seen = Document(), []
    for view in (app, app.attention, app.features, app.study_cards["drift"], app.study_cards["steering"], app.study_cards["eviction"], app.study_cards["compaction"], app.export):
        for m in view.__panel__().get_root(doc).references():
            if type(m).__name__ == "PasswordInput":  # the one field that holds what the user typed
                continue
            seen.append(m.properties_with_values(include_defaults=False))
    assert len(seen) > 100  # the whole page
    return json.dumps(seen, default=str)


def test_the_key_reaches_no_page_log_run_or_report(sample_model, fresh_models, monkeypatch, caplog, capfd,
                                                  _runs_dir, tmp_path):
    from tests.ui.test_views import wait_job

    monkeypatch.delenv("NDIF_API_KEY", raising=False)
    monkeypatch.setenv("TRAJSCOPE_MODELS", "bad,good")
    operator.configure(None)

    def loader(source, remote=False, api_key=None):
        assert api_key == MARKER
        if source == "bad":
            raise RuntimeError(f"NDIF said 401 for key {MARKER}")  # an unexpected failure echoing the key
        return sample_model

    caplog.set_level(logging.DEBUG)
    app = TrajScope(max_new_tokens=3)
    app.state.param.update(model_source="bad", remote=True, ndif_api_key=MARKER)
    wait_job(app.controls.generate(dispatch=lambda fn: fn(), loader=loader))
    assert "NDIF said 401" in app.state.error and MARKER not in page_json(app), app.state.error
    app.state.model_source = "good"
    wait_job(app.controls.generate(dispatch=lambda fn: fn(), loader=loader))
    traj = app.state.trajectory
    assert traj is not None and str(_runs_dir) in app.state.status  # saved by the app
    assert MARKER not in page_json(app)
    saved = [p for p in _runs_dir.rglob("*") if p.is_file()]
    assert saved and not [p for p in saved if MARKER.encode() in p.read_bytes()]
    assert MARKER.encode() not in run_zip_bytes(traj) and MARKER.encode() not in report_bytes(traj)
    run_dir = next(p.parent for p in saved if p.name == "meta.json")
    out = tmp_path / "report.html"
    cli = subprocess.run([sys.executable, "-m", "trajscope.cli", "report", str(run_dir), "-o", str(out)],
                         capture_output=True, text=True)
    assert cli.returncode == 0, cli.stderr
    files = [out, *out.with_name(out.stem + "_files").rglob("*")]
    assert not [f for f in files if f.is_file() and MARKER.encode() in f.read_bytes()]
    assert MARKER not in cli.stdout + cli.stderr
    logged = "\n".join(r.getMessage() + str(r.exc_info or "") for r in caplog.records)
    assert logged and MARKER not in logged
    captured = capfd.readouterr()
    assert MARKER not in captured.out + captured.err
