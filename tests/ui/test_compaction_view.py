"""The Compaction card without a browser: the session fields, the run against the study, plots, errors."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from bokeh.document import Document

from trajscope.studies.compaction.study import compaction
from trajscope.studies.sessions import synthetic_sessions
from trajscope.studies.compaction import plots as cp
from trajscope.studies.compaction.state import CompactionSettings, shipped_probe
from trajscope.ui.state import AppState
from trajscope.studies.compaction.card import CompactionView


@pytest.fixture
def view(sample_model):
    v = CompactionView(state=AppState(), model_loader=lambda source: sample_model)
    v.settings.max_new_tokens = 4
    v.__panel__().get_root(Document())
    return v


def test_default_is_the_shipped_studys_first_synthetic_session():
    s = CompactionSettings()
    first = synthetic_sessions(200, seed=0)[0]
    assert s.session() == first and s.summary_text == first.summary and first.fact.split(" = ")[1] in s.t1
    s.use_synthetic(7)
    assert s.session() == synthetic_sessions(200, seed=0)[7]
    s.t3 = "print(x"
    typed = s.session()
    assert typed.session_id == "typed" and typed.label is None and typed.t3 == "print(x"


def test_card_result_equals_the_study_and_the_plots_carry_it(view, sample_model):
    s = view.settings
    view.run()
    res = s.result
    assert res is not None, s.status
    ref = compaction(sample_model, [s.session()], probe=False, max_new_tokens=4, n_boot=50)
    key = ["pair", "layer", "t3_index"]
    np.testing.assert_array_equal(res.states.sort(key)["rel_l2"].to_numpy(), ref.tables["compaction_states"].sort(key)["rel_l2"].to_numpy())
    akey = ["setup", "layer", "t3_index"]
    np.testing.assert_array_equal(res.attention.sort(akey)["summary_mass"].to_numpy(),
                                  ref.tables["compaction_attention"].sort(akey)["summary_mass"].to_numpy())
    for r in ref.tables["compaction_decode"].iter_rows(named=True):
        assert res.continuations[r["setup"]] == r["text"] and res.continuations["C"] == r["text_full"]
        assert res.first_divergence[r["setup"]] == r["first_divergence"]
    # the card's figures: per-layer means of the session's rows, computed here from the study's own tables
    want = ref.tables["compaction_states"].filter(pl.col("pair") == "B_vs_C").group_by("layer").agg(pl.col("rel_l2").mean()).sort("layer")
    b_line = view.divergence.sources["B_vs_C"].data
    assert list(b_line["layer"]) == want["layer"].to_list()
    np.testing.assert_allclose(b_line["rel_l2"], want["rel_l2"].to_numpy())
    want = ref.tables["compaction_attention"].filter(pl.col("setup") == "A").group_by("layer").agg(pl.col("summary_mass").mean()).sort("layer")
    np.testing.assert_allclose(view.attention.sources["A"].data["summary_mass"], want["summary_mass"].to_numpy())
    probe, note = shipped_probe("sample")
    assert res.probe.equals(probe) and "held-out" in note and view._probe.visible
    real = probe.filter((pl.col("train_setup") == "C") & (pl.col("test_setup") == "C") & (pl.col("control") == "real")).sort("layer")
    c_dots = view.probe.sources["C"].data
    np.testing.assert_allclose(c_dots["accuracy"], real["accuracy"].to_numpy())
    np.testing.assert_allclose(c_dots["lo"], real["lo"].to_numpy())
    np.testing.assert_allclose(np.asarray(c_dots["x"]) - np.asarray(c_dots["layer"]), 0.03)  # C nudged right
    assert view._result.visible and not view._empty.visible
    html = cp.continuations_html(res)
    assert all(f"ts-cp-{x}" in html for x in "ABCD") and res.session.fact in html
    assert f"Session {res.session.session_id}" in s.summary and "One session: no interval" in s.summary
    doc = Document()
    doc.add_root(view.__panel__().get_root(doc))
    models = {m.id for m in doc.models}
    assert {view.divergence.figure.id, view.attention.figure.id, view.probe.figure.id} <= models
    view.settings.use_synthetic(3)  # a second session: the figures' data change, no Bokeh model is created
    view.run()
    assert view.settings.result is not None and view.settings.result is not res, view.settings.status
    assert {m.id for m in doc.models} == models
    assert list(view.divergence.sources["B_vs_C"].data["rel_l2"]) != list(b_line["rel_l2"])


def test_the_result_figures_join_the_page_with_the_first_result(view):
    doc = Document()
    doc.add_root(view.__panel__().get_root(doc))
    assert view.divergence.figure.id not in {m.id for m in doc.models} and not view._result.visible
    view.run()
    assert view.settings.result is not None, view.settings.status
    assert view.divergence.figure.id in {m.id for m in doc.models} and view._result.visible


def test_bad_input_gives_one_sentence_before_any_work(view):
    s = view.settings
    s.t2 = ""
    view.run()
    assert s.result is None and not s.busy and "missing the segment(s) t2" in s.status
    s.use_synthetic(1)
    s.max_new_tokens = 0
    view.run()
    assert s.result is None and s.status == "Ask for at least 1 new token after T3, not 0."


def test_only_models_the_operator_allows(sample_model):
    v = CompactionView(state=AppState(model_source="someone/else"))
    v.settings.max_new_tokens = 2
    v.run()
    assert v.settings.result is None and "is not on this server's list" in v.settings.status


def test_probe_comes_only_from_a_study_of_the_same_model():
    probe, note = shipped_probe("another-model")
    assert probe is None and "ran on 'sample'" in note


def test_app_has_the_compaction_tab_before_export(short_run):
    from trajscope.ui.views.app import TrajScope

    app = TrajScope(trajectory=short_run)
    app.main()
    names = list(app.tabs._names)
    assert names.index("Eviction") < names.index("Compaction") < names.index("Export")
    assert app.study_cards["compaction"].state is app.state


def test_an_ndif_model_is_refused_in_one_sentence(view):
    view.state.remote = True
    view.run()
    s = view.settings
    assert s.result is None and not s.busy
    assert s.status.startswith("The compaction card needs key masks, which run on a local model only")
