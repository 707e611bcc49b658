"""The Eviction card without a browser: settings checks, the study on the run's prompt, plots, cursors."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from bokeh.document import Document

from trajscope.studies.eviction.engine import eviction
from trajscope.studies.eviction import plots as ep
from trajscope.studies.eviction.state import EvictionSettings, budget_error
from trajscope.ui.state import AppState
from trajscope.studies.eviction.card import EvictionView


@pytest.fixture
def view(short_run, sample_model):
    state = AppState()
    state.set_trajectory(short_run, step=0)
    v = EvictionView(state=state, model_loader=lambda source: sample_model)
    v.__panel__().get_root(Document())
    return v


@pytest.mark.parametrize("bad", [0, -0.2, 1.5, float("nan"), "abc"])
def test_bad_budget_gives_one_clear_message(bad):
    assert budget_error(bad).startswith("Budget must be a fraction of the prompt in (0, 1]")
    assert budget_error(0.2) is None and budget_error(1) is None


def test_bad_settings_stop_before_any_work(view, short_run):
    s = view.settings
    s.budget = 1.5
    assert s.status.startswith("Budget must be a fraction") and "1.5" in s.status
    view.run()
    assert s.result is None and not s.busy and s.status.count("Budget must") == 1
    s.budget = 0.5
    assert s.status == ""  # the message goes once the input is fixed
    s.window = short_run.prompt_len + 1
    assert f"longer than this run's prompt ({short_run.prompt_len} tokens)" in s.status
    s.window = -3  # the field sends what was typed (a bound made the browser keep the old window, unsaid)
    assert s.status == "The window must be at least 1 prompt position; got -3."
    view.run()
    assert s.result is None and not s.busy
    s.policy = "streamingllm"  # no window: nothing to complain about
    assert EvictionSettings(policy="streamingllm", window=999).check(short_run.prompt_len) is None
    assert EvictionSettings(policy="streamingllm", window=0).check(short_run.prompt_len) is None


def test_card_result_matches_the_study_and_plots_carry_it(view, short_run, sample_model):
    s = view.settings
    s.param.update(policy="h2o", budget=0.5, window=3)
    view.run()
    res = s.result
    assert res is not None, s.status
    P = short_run.prompt_len
    n_new = len(short_run.token_ids) - P
    ref = eviction(sample_model, [{"prompt": short_run.token_ids[:P], "id": short_run.run_id}], policies=["h2o"],
                   budgets=[0.5], max_new_tokens=n_new, window=3)
    assert res.tables["eviction_kept"]["kept_pos"].to_list() == ref.tables["eviction_kept"]["kept_pos"].to_list()
    np.testing.assert_allclose(res.tables["eviction_steps"]["recall_at_k"].to_numpy(), ref.tables["eviction_steps"]["recall_at_k"].to_numpy())
    np.testing.assert_allclose(res.tables["eviction_rerun"]["kl_to_full"].to_numpy(), ref.tables["eviction_rerun"]["kl_to_full"].to_numpy(), atol=1e-6)
    # heatmap: one cell per layer × head × prompt position, kept as the table says (drawn by the card's figure)
    src = view.kept.source.data
    grid = src["image"][0]  # row i: y = i, layer 0 head 0 on top (inverted y range)
    kept = res.tables["eviction_kept"].sort("layer", "head")
    assert grid.shape == (kept.height, P) and grid.sum() == kept["kept_pos"].list.len().sum()
    for i, row in enumerate(kept["kept_pos"].to_list()):  # row i is that head's kept set
        assert np.flatnonzero(grid[i]).tolist() == sorted(row), i
    assert (src["x"], src["y"], src["dw"], src["dh"]) == ([-0.5], [-0.5], [P], [kept.height])
    y = view.kept.figure.y_range
    assert (y.start, y.end) == (kept.height - 0.5, -0.5)
    texts = short_run.tokens.sort("pos")["text"].to_list()  # the hover names each position's token
    assert view.kept.hover.formatters["$x"].args["labels"] == [f"{p} «{ep.visible(texts[p])}»" for p in range(P)]
    assert view.kept.hover.formatters["$y"].args["labels"][:2] == ["L0 H0", "L0 H1"]
    assert "h2o, budget 0.5" in view.kept.figure.title.text
    # step curves: mean over layers and heads, x = decode steps 1..n
    costs = view.costs.source.data
    want = res.tables["eviction_steps"].group_by("step").agg(pl.col("recall_at_k").mean()).sort("step")
    assert list(costs["step"]) == want["step"].to_list() and want["step"][0] == 1
    np.testing.assert_allclose(costs["recall"], want["recall_at_k"].to_numpy(), rtol=1e-6)
    assert costs["token"][0] == ep.visible(short_run.tokens.sort("pos")["text"][P])  # step 1's query
    assert view.costs.figure.xaxis[0].axis_label == "step (decode)"
    rr = res.tables["eviction_rerun"].filter(pl.col("step") >= 1).sort("step")
    np.testing.assert_allclose(view.rerun.kl.data["kl_to_full"], rr["kl_to_full"])
    differs = rr.filter(~pl.col("token_agrees"))["step"].to_list()
    assert list(view.rerun.differs.data["step"]) == differs
    # the first divergence: a dotted vertical line at the first step whose greedy token differs, or none
    assert list(view.rerun.first.data["x"]) == ([float(differs[0])] * 2 if differs else [])
    assert view.rerun.legend.items[2].visible == bool(differs)
    assert view._result.visible and not view._empty.visible
    assert "h2o, budget 0.5" in s.summary and "recall@8" in s.summary and "no prompt-clustered interval" in s.summary


def test_cursor_follows_the_step_and_a_new_run_clears(view, short_run):
    view.settings.param.update(policy="streamingllm", budget=0.6, window=-3)  # its window field is off and unread
    view.run()
    assert view.settings.result is not None, view.settings.status
    assert len(view.cursor.annotations) == 3  # one line on each step figure
    view.state.step = 7
    assert {a[0].location for a in view.cursor.annotations} == {7.0}
    view.state.set_trajectory(short_run)
    assert view.settings.result is None and view.settings.summary == ""
    assert not view._result.visible and view._empty.visible


def test_a_second_result_replaces_the_data_and_creates_no_model(view):
    """The figures are built once: a second result changes their sources, not the set of Bokeh models."""
    doc = Document()
    doc.add_root(view.__panel__().get_root(doc))
    figures = {view.kept.figure.id, view.costs.figure.id, view.rerun.figure.id, view.split.figure.id}
    assert not figures & {m.id for m in doc.models}  # no result yet: the page builds none of them
    view.settings.param.update(policy="streamingllm", budget=0.6)
    view.run()
    first = {m.id for m in doc.models}
    assert figures <= first
    kept_first = view.kept.source.data["image"][0].copy()
    view.settings.param.update(policy="h2o", budget=0.8, window=3)
    view.run()
    assert view.settings.result is not None, view.settings.status
    assert {m.id for m in doc.models} == first
    assert not np.array_equal(view.kept.source.data["image"][0], kept_first)
    assert "h2o, budget 0.8" in view.kept.figure.title.text


def test_app_has_the_eviction_tab_before_export(short_run):
    from trajscope.ui.views.app import TrajScope

    app = TrajScope(trajectory=short_run)
    app.main()
    names = list(app.tabs._names)
    assert names.index("Eviction") < names.index("Export")
    assert app.study_cards["eviction"].state is app.state and names[names.index("Eviction") + 1] == "Compaction"


def test_an_ndif_model_is_refused_in_one_sentence(view):
    """Eviction masks keys, which runs on a local model only (the same refusal as the Compaction card)."""
    view.state.remote = True
    view.run()
    s = view.settings
    assert s.result is None and not s.busy
    assert s.status.startswith("The eviction card needs key masks, which run on a local model only")
