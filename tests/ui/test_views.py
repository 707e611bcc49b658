"""Views without a browser: render the app into a Bokeh document and drive it through the state."""

from __future__ import annotations

import io
import json
import os
import threading
import zipfile

import polars as pl
import pytest
from bokeh.document import Document

import trajscope as ts
from trajscope.ui import runner
from trajscope.ui.export import csv_ready, run_zip_bytes, table_bytes
from trajscope.ui.views.app import TrajScope


def render(app: TrajScope) -> Document:
    doc = Document()
    app.__panel__().get_root(doc)
    app.attention.__panel__().get_root(doc)  # tabs are drawn when shown: draw the attention tab too
    return doc


def wait_job(job, timeout=120):
    job.thread.join(timeout)
    assert not job.thread.is_alive(), "generation did not finish"


def test_step_change_moves_every_cursor(short_run):
    app = TrajScope(trajectory=short_run)
    render(app)
    tok = app.tokens.cursor.annotations[0][0]
    span = app.telemetry.cursors["attention"].annotations[0][0]
    row = app.attention.row_cursor.annotations[0][0]
    top_before = app.attention.top_keys(app.state.step, 0, 0, -1)
    assert (span.location, row.bottom, row.top) == (0, -0.5, short_run.prompt_len - 0.5)
    left0 = tok.left
    app.state.step = 5
    assert span.location == 5
    assert row.bottom == short_run.prompt_len + 4 - 0.5
    assert tok.left != left0
    assert app.attention.top_keys(5, 0, 0, -1) != top_before
    app.state.next()
    assert span.location == 6 and app.telemetry.cursors["tokens"].annotations[0][0].location == 6


def test_token_telemetry_and_grid_clicks(short_run):
    app = TrajScope(trajectory=short_run)
    render(app)
    lay = app.tokens.layout_df
    P = short_run.prompt_len
    r = lay.filter(pl.col("pos") == P + 3).row(0, named=True)
    app.tokens.click(r["xc"], r["yc"])  # what a click on that token sends
    assert app.state.step == 4
    app.tokens.click(-50.0, 3.0)  # a click beside the tokens changes nothing
    assert app.state.step == 4
    app.telemetry.click(7.3)
    assert app.state.step == 7
    app.telemetry.click(1.6)
    assert app.state.step == 2
    app.attention._on_grid_tap(x=2.1, y=3.2)
    assert (app.state.layer, app.state.head) == (3, 2)


def test_layer_without_full_rows_falls_back_to_top_keys(short_run):
    """The figure's values: tests/ui/test_attention_card.py."""
    app = TrajScope(trajectory=short_run)
    fig = app.attention.heatmap(1, 4, -1)  # layer 4's rows were not kept
    assert fig is app.attention.heatmap_fig.figure and "top-8 keys only" in fig.title.text
    assert app.attention.heatmap(1, 0, -1) is fig and "top-8" not in fig.title.text


def test_generate_streams_then_finishes(sample_model):
    app = TrajScope(max_new_tokens=6, keep_attention="0")
    seen = []
    app.state.param.watch(lambda e: seen.append(e.new), "progress")
    job = app.controls.generate(dispatch=lambda fn: fn())
    assert app.state.busy
    wait_job(job)
    assert seen == sorted(seen) and seen[-1] == 6  # batched: a few updates, in order, ending at the last step
    st = app.state
    assert not st.busy and st.trajectory is not None and st.trajectory.n_steps == 6
    assert st.step == 5 and "Done" in st.status
    assert st.trajectory.meta["attention_layers"] == [0, 3]  # the typed layer and the middle one it opens on
    assert len(st.live_text) > 0
    data = app.live.source.data  # steps not yet streamed when the run ended are drawn with the finished run
    assert data["step"] == list(range(6)) and app.live.figure.x_range.end == 5


def test_stop_keeps_captured_steps(sample_model):
    app = TrajScope(max_new_tokens=300)
    first = threading.Event()
    app.state.param.watch(lambda e: first.set(), "progress")
    job = app.controls.generate(dispatch=lambda fn: fn())
    assert first.wait(120)
    app.controls.stop()
    wait_job(job)
    traj = app.state.trajectory
    assert traj.meta["stop_reason"] == "cancelled" and 1 <= traj.n_steps < 300


def test_bad_input_is_reported_and_app_stays_usable(sample_model, tmp_path, fresh_models, monkeypatch):
    from trajscope.ui import operator

    runner._MODELS[("sample", False, None)] = sample_model
    monkeypatch.setenv("TRAJSCOPE_MODELS", "sample,no-such-model-xyz,some/remote-model")
    operator.configure(None)
    app = TrajScope(max_new_tokens=3)
    st = app.state
    errors = []
    st.param.watch(lambda e: errors.append(e.new) if e.new else None, "error")
    st.prompt = "  "
    assert app.controls.generate(dispatch=lambda fn: fn()) is None
    assert "prompt is empty" in st.error and not st.busy
    st.prompt = "def f(x):"
    st.model_source = "not-on-the-list"  # refused before anything is loaded
    assert app.controls.generate(dispatch=lambda fn: fn()) is None
    assert "not on this server's list" in st.error and "--models" in st.error
    st.model_source = "no-such-model-xyz"
    wait_job(app.controls.generate(dispatch=lambda fn: fn()))
    assert "Unknown model 'no-such-model-xyz'" in st.error and not st.busy
    st.param.update(model_source="some/remote-model", remote=True)
    env = os.environ.pop("NDIF_API_KEY", None)
    try:
        wait_job(app.controls.generate(dispatch=lambda fn: fn()))
    finally:
        if env is not None:
            os.environ["NDIF_API_KEY"] = env
    assert "API key" in st.error
    st.run_path = str(tmp_path / "missing")
    app.controls.open_run()
    assert "No run directory" in st.error
    st.run_path = ""
    app.controls.open_run()
    assert "path of a run directory" in st.error
    assert len(errors) == 6
    # still usable: a good generation after all that
    st.param.update(model_source="sample", remote=False, error="")
    wait_job(app.controls.generate(dispatch=lambda fn: fn()))
    assert st.error == "" and st.trajectory.n_steps == 3


def test_api_key_never_leaves_memory(sample_model, fresh_models, monkeypatch, caplog):
    from trajscope.ui import operator

    monkeypatch.delenv("NDIF_API_KEY", raising=False)
    monkeypatch.setenv("TRAJSCOPE_MODELS", "bad,good")
    operator.configure(None)
    secret = "ndif-SECRET-key-0123456789"
    seen_env = {}

    def loader(source, remote=False, api_key=None):
        seen_env["key"], seen_env["env"] = api_key, dict(os.environ)  # the key is an argument, never in os.environ
        if source == "bad":
            raise ts.TrajscopeError(f"Cannot reach NDIF with key {secret}.")
        return sample_model

    import logging

    caplog.set_level(logging.DEBUG)  # every log line of the app, at every level
    app = TrajScope(max_new_tokens=3)
    app.state.param.update(model_source="bad", remote=True, ndif_api_key=secret)
    wait_job(app.controls.generate(dispatch=lambda fn: fn(), loader=loader))
    assert secret not in app.state.error and "***" in app.state.error
    app.state.model_source = "good"
    wait_job(app.controls.generate(dispatch=lambda fn: fn(), loader=loader))
    assert seen_env["key"] == secret and secret not in json.dumps(seen_env["env"]) and "NDIF_API_KEY" not in os.environ
    traj = app.state.trajectory
    assert secret not in json.dumps(traj.meta, default=str)
    for table in ("tokens", "attention", "activations"):
        for fmt in ("parquet", "csv"):
            assert secret.encode() not in table_bytes(traj, table, fmt)
    assert secret.encode() not in run_zip_bytes(traj)
    from trajscope.ui.export import report_bytes

    assert secret.encode() not in report_bytes(traj)
    assert caplog.records and not [r for r in caplog.records if secret in r.getMessage()]
    assert all(secret not in k for key in runner._MODELS for k in map(str, key))


def test_sessions_have_their_own_state_and_share_the_model(sample_model, fresh_models):
    a, b = TrajScope(max_new_tokens=2), TrajScope(max_new_tokens=3)
    assert a.state is not b.state
    wait_job(a.controls.generate(dispatch=lambda fn: fn()))
    wait_job(b.controls.generate(dispatch=lambda fn: fn()))
    assert (a.state.trajectory.n_steps, b.state.trajectory.n_steps) == (2, 3)
    assert len(runner._MODELS) == 1
    a.state.step = 1
    assert b.state.step == 2


def test_concurrent_generations_take_turns(sample_model, fresh_models, monkeypatch):
    """Two sessions generating at once: their generation traces never overlap on the shared model, and
    each session gets its own prompt's tokens. (The same check without the lock overlaps:
    tests/model/test_forward_ops.py::test_the_overlap_check_sees_an_unlocked_handle.)"""
    import time

    import trajscope.model.handle as handle_mod

    spans, real = [], handle_mod.run_generation

    def timed(*a, **k):
        t0 = time.monotonic()
        out = real(*a, **k)
        spans.append((t0, time.monotonic()))
        return out

    monkeypatch.setattr(handle_mod, "run_generation", timed)
    runner._MODELS[("sample", False, None)] = sample_model
    apps = [TrajScope(max_new_tokens=4, prompt=p) for p in ("import os\n", "class A:\n")]
    jobs = [a.controls.generate(dispatch=lambda fn: fn()) for a in apps]
    for j in jobs:
        wait_job(j)
    (a0, a1), (b0, b1) = sorted(spans)
    assert b0 >= a1, "two generations ran on the shared model at the same time"
    solo = ts.capture(sample_model, "class A:\n", max_new_tokens=4)
    assert apps[1].state.trajectory.token_ids == solo.token_ids
    assert apps[0].state.trajectory.meta["prompt"] == "import os\n"


def test_exports_read_back(short_run, tmp_path):
    for table in ("tokens", "attention", "activations"):
        df = getattr(short_run, table)
        back = pl.read_parquet(io.BytesIO(table_bytes(short_run, table, "parquet")))
        assert back.equals(df)
        csv = pl.read_csv(io.BytesIO(table_bytes(short_run, table, "csv")))
        assert csv.shape == df.shape and csv.columns == df.columns
    csv_tok = pl.read_csv(io.BytesIO(table_bytes(short_run, "tokens", "csv")))
    assert json.loads(csv_tok["top_texts"][0]) == short_run.tokens["top_texts"][0].to_list()
    assert csv_ready(short_run.tokens)["top_ids"].dtype == pl.String
    with pytest.raises(ts.TrajscopeError):
        table_bytes(short_run, "nope", "csv")
    z = zipfile.ZipFile(io.BytesIO(run_zip_bytes(short_run)))
    z.extractall(tmp_path)
    back = ts.Trajectory.load(tmp_path / short_run.run_id)
    assert back.tokens.equals(short_run.tokens)
    assert back.attention_rows(1).shape == short_run.attention_rows(1).shape


def test_open_run_directory(short_run_dir):
    app = TrajScope()
    app.state.run_path = str(short_run_dir)
    app.controls.open_run()
    assert app.state.trajectory is not None and app.state.error == ""
    assert app.state.trajectory.run_id == ts.Trajectory.load(short_run_dir).run_id


def test_export_view_downloads(short_run):
    app = TrajScope(trajectory=short_run)
    app.export.param.update(table="attention", fmt="parquet")
    data = app.export._table().getvalue()
    assert pl.read_parquet(io.BytesIO(data)).height == short_run.attention.height
    assert app.export._filename() == f"{short_run.run_id}-attention.parquet"


def test_default_page_opens_a_run_or_captures_one(sample_model, short_run_dir, fresh_models):
    from trajscope.ui.views.app import default_page

    opened = default_page(short_run_dir)._trajscope
    assert opened.state.trajectory is not None and not opened.autostart
    runner._MODELS[("sample", False, None)] = sample_model
    app = default_page("/nonexistent-run", max_new_tokens=3)._trajscope
    assert app.state.trajectory is None and app.autostart
    app._autostart()
    first = app.controls.job
    wait_job(first)
    assert app.state.trajectory is not None, (app.state.error, app.controls.ticker.message, runner.QUEUE._line)
    assert app.state.trajectory.n_steps == 3 and app.state.trajectory.meta["prompt"] == app.state.prompt
    app._autostart()
    assert app.controls.job is first  # only once per session


def test_export_view_offers_a_comparison_report(short_run, short_run_dir):
    from trajscope.ui.state import AppState
    from trajscope.ui.views.export import ExportView

    view = ExportView(state=AppState())
    view.state.set_trajectory(short_run, step=0)
    html = view._report().getvalue().decode()
    assert "Generated tokens by step" in html and html.count("<h2>") >= 3
    view.compare_with = str(short_run_dir)
    two = view._report()
    assert two is not None, view.state.error  # the sentence, when the comparison is refused
    two = two.getvalue().decode()
    assert two.count(short_run.run_id) >= 2
    view.compare_with = str(short_run_dir.parent / "no-such-run")
    assert view._report() is None and "No run directory" in view.state.error


def test_new_run_from_the_app_feeds_sae_and_drift(sample_model, fresh_models):
    runner._MODELS[("sample", False, None)] = sample_model
    app = TrajScope(max_new_tokens=8, prompt="import os\n", keep_residuals="none", keep_attention="none")
    assert app.state.sae_layer == 3 and app.state.drift_layers == list(range(6))
    wait_job(app.controls.generate(dispatch=lambda fn: fn()))
    traj = app.state.trajectory
    assert sorted(int(k.split(".")[1]) for k in traj.tensors if k.startswith("residual.")) == list(range(6))
    assert app.features._enc is not None and app.features.message == ""
    assert app.study_cards["drift"].settings.drift is not None and set(app.study_cards["drift"].settings.drift["layer"]) == set(range(6))
    assert app.study_cards["drift"].settings.drift["pos"].max() >= traj.prompt_len  # decode positions are scored


def test_settings_changed_after_generate_do_not_reach_the_running_job(sample_model, fresh_models):
    app = TrajScope(max_new_tokens=5, prompt="import os\n", keep_attention="all")
    gate = threading.Event()
    job = app.controls.generate(dispatch=lambda fn: fn(), loader=lambda *a, **k: (gate.wait(10), sample_model)[1])
    app.state.param.update(max_new_tokens=2, keep_attention="none", prompt="something else")
    gate.set()
    wait_job(job)
    traj = app.state.trajectory
    assert traj.n_steps == 5 and traj.meta["attention_layers"] == list(range(sample_model.n_layers))
    assert traj.meta["prompt"] == "import os\n"


def test_generated_runs_are_saved_and_listed_for_a_reload(sample_model, fresh_models, _runs_dir):
    """Issue: reloading the page lost the run just generated."""
    runner._MODELS[("sample", False, None)] = sample_model
    app = TrajScope(max_new_tokens=3, prompt="import os\n")
    wait_job(app.controls.generate(dispatch=lambda fn: fn()))
    traj = app.state.trajectory
    saved = _runs_dir / traj.run_id
    assert (saved / "meta.json").is_file() and f"Saved to {saved}" in app.state.status
    again = TrajScope()  # a new session (a reload) lists it and opens it
    label = next(k for k, v in again.controls.saved.options.items() if v == str(saved))
    assert label.startswith(traj.run_id) and "3 steps" in label
    again.controls.saved.value = str(saved)
    assert again.state.trajectory.run_id == traj.run_id and again.state.trajectory.n_steps == traj.n_steps
    # an unwritable runs directory: a clear message, and the run stays on screen
    import os

    (_runs_dir.parent / "a-file").write_text("")  # a runs directory below a file cannot exist, even for root
    os.environ["TRAJSCOPE_RUNS_DIR"] = str(_runs_dir.parent / "a-file" / "runs")
    wait_job(app.controls.generate(dispatch=lambda fn: fn()))
    assert "Cannot write the run" in app.state.error and "stays on screen" in app.state.error
    assert app.state.trajectory.run_id != traj.run_id


def test_views_build_their_layout_once(short_run):
    """Watchers registered while building a view's layout must not pile up with every render."""
    app = TrajScope(trajectory=short_run)

    def n_watchers():
        return sum(len(ws) for w in app.state.param.watchers.values() for ws in w.values())

    app.__panel__()  # builds every view once
    first = [v.__panel__() for v in (app.controls, app.player, app.tokens, app.telemetry, app.export)]
    before = n_watchers()
    for _ in range(3):
        app.__panel__()  # a notebook cell shown again, or a second page render
    again = [v.__panel__() for v in (app.controls, app.player, app.tokens, app.telemetry, app.export)]
    assert all(a is b for a, b in zip(first, again)) and n_watchers() == before


def test_unexpected_failure_shows_one_sentence_with_the_log_id(sample_model, fresh_models, caplog):
    import logging
    import re

    def loader(source, **kw):
        raise RuntimeError("CUDA out of memory\nsecond line")

    app = TrajScope(max_new_tokens=3, prompt="x = 1")
    with caplog.at_level(logging.ERROR, logger="trajscope.ui.runner"):
        wait_job(app.controls.generate(dispatch=lambda fn: fn(), loader=loader))
    err = app.state.error
    found = re.search(r"error ([0-9a-f]{8})", err)
    assert found and err.startswith("Generation failed: RuntimeError: CUDA out of memory") and "\n" not in err
    record = next(r for r in caplog.records if found.group(1) in r.getMessage())
    assert record.exc_info is not None  # the full traceback is in the server log
    assert not app.state.busy


def test_live_figure_shows_the_run_on_screen_between_generations(short_run):
    app = TrajScope(trajectory=short_run)
    data = app.live.source.data
    assert data["step"] == list(range(short_run.n_steps))
    q = app.state.queries
    want = q.filter(pl.col("step") == 3)["entropy"].mean()
    assert abs(data["attn_entropy"][3] - want) < 1e-6
    app.live.reset()  # Generate pressed: the figure empties and streams the new run
    assert app.live.source.data["step"] == []


def test_live_figure_streams_the_planned_steps_at_a_bounded_rate(short_run):
    """While a run streams, the step axis spans the planned steps and the figure is updated at most every
    STREAM_EVERY_S seconds (the browser's drawing shares the CPU with the capture); nothing is lost."""
    from types import SimpleNamespace

    from trajscope.ui.views import live

    app = TrajScope(trajectory=short_run)
    app.state.progress_max = 40
    app.live.reset()
    fig, t0 = app.live.figure, app.live._last_stream
    assert (fig.x_range.start, fig.x_range.end) == (0, 39)
    ev = [SimpleNamespace(step=i, next_entropy=0.5, mean_entropy=1.0, text="a") for i in range(5)]
    app.live.append(ev[:2], now=t0 + 0.1)  # too soon after the last stream: kept
    assert app.live.source.data["step"] == []
    app.live.append(ev[2:4], now=t0 + live.STREAM_EVERY_S)
    assert app.live.source.data["step"] == [0, 1, 2, 3] and app.live.n_streamed == 4
    app.live.append(ev[4:], now=t0 + live.STREAM_EVERY_S + 0.1)
    assert app.live.n_streamed == 4
    app.state.param.trigger("revision")  # the finished run replaces the streamed steps
    assert app.live.source.data["step"] == list(range(short_run.n_steps))
    assert fig.x_range.end == short_run.n_steps - 1


def test_hidden_tabs_defer_their_analyses_until_opened(sample_model, fresh_models):
    """A new run costs the SAE and Drift tabs nothing while they are hidden; opening one runs its analysis."""
    runner._MODELS[("sample", False, None)] = sample_model
    app = TrajScope(max_new_tokens=6, prompt="import sys\n")
    app.main()  # lays out the tabs: Overview shown, the rest hidden
    assert app.telemetry.shown and not app.features.shown and not app.study_cards["drift"].shown
    wait_job(app.controls.generate(dispatch=lambda fn: fn()))
    traj = app.state.trajectory
    assert app.features._enc is None and app.study_cards["drift"].settings.drift is None  # nothing computed for hidden tabs
    titles = [t for t, _ in zip(app.tabs._names, app.tabs)]
    app.tabs.active = titles.index("SAE features")
    assert app.features._enc is not None and app.features._enc["rel_err"].shape[0] == traj.residual(3).shape[0]
    assert app.study_cards["drift"].settings.drift is None
    app.tabs.active = titles.index("Drift")
    assert app.study_cards["drift"].settings.drift is not None and app.study_cards["drift"].settings.drift["pos"].max() >= traj.prompt_len


def test_an_opened_tab_has_its_short_analysis_before_the_tabs_draw_it(sample_model, fresh_models, monkeypatch):
    """Opening the SAE or Drift tab runs its deferred analysis of a short run before the Tabs build the tab's
    models (one drawing, with the result), marked as opening; a long run would go to a thread instead."""
    import panel as pn

    from trajscope.ui.views import _base

    runner._MODELS[("sample", False, None)] = sample_model
    seen = []
    real = pn.Tabs._update_active
    monkeypatch.setattr(pn.Tabs, "_update_active", lambda self, *e: (seen.append(
        (app.features._enc is not None, app.study_cards["drift"].settings.drift is not None)), real(self, *e))[1])
    app = TrajScope(max_new_tokens=6, prompt="import sys\n")
    app.main()
    wait_job(app.controls.generate(dispatch=lambda fn: fn()))
    assert _base.short_run(app.state.trajectory)
    opening = []
    encode = _base.in_background
    monkeypatch.setattr("trajscope.ui.views.features.in_background",
                        lambda *a, **k: (opening.append((app.features.opening, k.get("inline"))), encode(*a, **k))[1])
    titles = list(app.tabs._names)
    app.tabs.active = titles.index("SAE features")
    assert seen[-1] == (True, False) and opening == [(True, True)]
    app.tabs.active = titles.index("Drift")
    assert seen[-1] == (True, True)
    assert not app.features.opening
    monkeypatch.setattr(_base, "INLINE_POSITIONS", 4)
    assert not _base.short_run(app.state.trajectory)


def test_in_background_inline_runs_now_on_the_calling_thread():
    from types import SimpleNamespace

    from trajscope.ui.views._base import in_background

    served = SimpleNamespace(session_context=object())  # a served session's document
    got = []
    in_background(lambda: threading.current_thread().name, got.append, got.append, doc=served, inline=True)
    assert got == [threading.current_thread().name]


def test_redraw_once_recomputes_the_model_graph_only_when_models_change(monkeypatch):
    """A data-only update (the Overview's figures) costs no model-graph recompute; a model swap costs one."""
    from bokeh.document import Document
    from bokeh.models import ColumnDataSource, Row, Spacer

    from trajscope.ui.views._base import redraw_once

    doc, src = Document(), ColumnDataSource({"x": [1]})
    root = Row(children=[Spacer()], tags=[src])
    doc.add_root(root)
    n_models = len(doc.models)
    calls = []
    real = doc.models.recompute
    monkeypatch.setattr(doc.models, "recompute", lambda: (calls.append(1), real())[1])
    with redraw_once(doc):
        src.data = {"x": [1, 2, 3]}
    assert calls == []
    with redraw_once(doc):
        with redraw_once(doc):  # nested: the outer block recomputes
            root.children = [Spacer(), Spacer()]
        new = Spacer()
        root.children = [new]
        assert calls == [] and doc.models.get_by_id(new.id) is None  # not yet known to the document
    assert calls == [1] and doc.models.get_by_id(new.id) is new and len(doc.models) == n_models
