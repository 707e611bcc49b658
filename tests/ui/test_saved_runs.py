"""The saved-runs list: one bad ``meta.json`` is listed with its reason and never breaks the app."""

from __future__ import annotations

import json

from trajscope.ui import saved_runs
from trajscope.ui.views.app import TrajScope

BAD = {"list": ("[1, 2]", "holds a JSON list"), "garbage": ("{not json", "is not valid JSON"),
       "number": ("3", "holds a JSON number")}


def fill(runs, short_run):
    good = saved_runs.save_run(short_run, runs)
    for name, (text, _) in BAD.items():
        (runs / name).mkdir()
        (runs / name / "meta.json").write_text(text)
    html_dir = runs / "<img src=x onerror=alert(1)>"
    short_run.save(html_dir)
    meta = json.loads((html_dir / "meta.json").read_text())
    (html_dir / "meta.json").write_text(json.dumps(dict(meta, schema_version="<script>alert(1)</script>")))
    (runs / ".short.abc123").mkdir()  # a save in progress: hidden
    (runs / ".short.abc123" / "meta.json").write_text("{}")
    return good


def test_bad_meta_files_are_listed_with_their_reason(short_run, _runs_dir):
    good = fill(_runs_dir, short_run)
    labels = saved_runs.list_runs(_runs_dir)
    assert len(labels) == 5 and not any(".short" in v for v in labels.values())
    for name, (_, reason) in BAD.items():
        label = next(k for k, v in labels.items() if v.endswith(name))
        assert label.startswith(f"{name} · not readable: meta.json ") and label.endswith(reason + ", not a run's settings."
                                                                                         if "holds" in reason else reason + ".")
    assert any(v == str(good) for v in labels.values())


def test_the_app_stays_usable_with_bad_runs_in_its_folder(short_run, _runs_dir):
    good = fill(_runs_dir, short_run)
    app = TrajScope(trajectory=short_run)  # builds the saved-runs list (a JSON list there used to raise)
    app.controls.__panel__()
    st = app.state
    for name in [*BAD, "<img src=x onerror=alert(1)>"]:
        app.controls.saved.value = str(_runs_dir / name)
        assert st.error.endswith(".") and str(_runs_dir / name) in st.error, st.error
    assert "schema version <script>" in st.error
    app.controls.saved.value = str(good)
    assert st.trajectory is not None and st.trajectory.run_id == short_run.run_id and "Opened run" in st.status
