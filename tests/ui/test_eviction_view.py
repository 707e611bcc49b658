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
    s.policy = "streamingllm"  # no window: nothing to complain about
    assert EvictionSettings(policy="streamingllm", window=999).check(short_run.prompt_len) is None


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
    # heatmap: one cell per layer × head × prompt position, kept as the table says
    img = ep.kept_heatmap(res, short_run.tokens, P)
    kept = res.tables["eviction_kept"].sort("layer", "head")
    grid = img.dimension_values("kept", flat=False)  # row i: y = i
    assert grid.shape == (kept.height, P) and grid.sum() == kept["kept_pos"].list.len().sum()
    for i, row in enumerate(kept["kept_pos"].to_list()):  # row i (top = layer 0, head 0) is that head's kept set
        assert np.flatnonzero(grid[i]).tolist() == sorted(row), i
    hover = img.opts.get().kwargs["tools"][0]  # the hover names each position's token
    texts = short_run.tokens.sort("pos")["text"].to_list()
    assert hover.formatters["$x"].args["labels"] == [f"{p} «{ep.visible(texts[p])}»" for p in range(P)]
    # step curves: mean over layers and heads, x = decode steps 1..n
    costs = ep.step_costs_plot(res, short_run.tokens, P)
    rec = costs.get(0)
    want = res.tables["eviction_steps"].group_by("step").agg(pl.col("recall_at_k").mean()).sort("step")
    assert rec.dimension_values("step").tolist() == want["step"].to_list() and want["step"][0] == 1
    np.testing.assert_allclose(rec.dimension_values("recall"), want["recall_at_k"].to_numpy(), rtol=1e-6)
    assert rec.dimension_values("token")[0] == ep.visible(short_run.tokens.sort("pos")["text"][P])  # step 1's query
    assert costs.opts.get().kwargs["xlabel"] == "step (decode)"
    kl = ep.rerun_plot(res, short_run.tokens, P).get(0)
    np.testing.assert_allclose(kl.dimension_values("kl_to_full"), res.tables["eviction_rerun"].filter(pl.col("step") >= 1)["kl_to_full"])
    assert "h2o, budget 0.5" in s.summary and "recall@8" in s.summary and "no prompt-clustered interval" in s.summary


def test_cursor_follows_the_step_and_a_new_run_clears(view, short_run):
    view.settings.param.update(policy="streamingllm", budget=0.6)
    view.run()
    assert view.settings.result is not None, view.settings.status
    view._plots(view.settings.result).get_root(Document())  # draw the plots: the cursors join their figures
    assert set(view.cursors) == {"costs", "rerun", "split"}
    view.state.step = 7
    assert {a[0].location for c in view.cursors.values() for a in c.annotations} == {7.0}
    view.state.set_trajectory(short_run)
    assert view.settings.result is None and view.settings.summary == ""


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
