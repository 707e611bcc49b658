"""AppState: the step cursor, selections and settings, without Panel."""

import polars as pl
import pytest

import trajscope as ts
from trajscope.ui.state import MEAN, AppState, parse_layers, token_metric_choices


def test_state_module_does_not_import_panel():
    import ast
    import pathlib

    src = pathlib.Path(ts.__file__).parent / "ui" / "state.py"
    names = {a.name.split(".")[0] for n in ast.walk(ast.parse(src.read_text()))
             if isinstance(n, (ast.Import, ast.ImportFrom)) for a in getattr(n, "names", [])}
    mods = {n.module.split(".")[0] for n in ast.walk(ast.parse(src.read_text()))
            if isinstance(n, ast.ImportFrom) and n.module}
    assert "panel" not in names | mods


def test_set_trajectory_sets_bounds_and_choices(short_run):
    st = AppState()
    assert st.n_steps == 0
    st.set_trajectory(short_run)
    assert st.n_steps == short_run.n_steps == 12
    assert st.param.step.bounds == (0, 11)
    assert st.param.layer.objects == list(range(6))
    assert list(st.param.head.objects.values()) == [MEAN, 0, 1, 2, 3]
    assert st.revision == 1
    assert len(st.queries) == 12 * 6 * 4


def test_step_navigation_and_positions(short_run):
    st = AppState(trajectory=short_run)
    P = short_run.prompt_len
    assert st.step == 0 and st.query_pos == P - 1
    st.next()
    assert st.step == 1 and st.query_pos == P
    st.go(100)
    assert st.step == 11
    st.next()
    assert st.step == 11
    st.prev()
    assert st.step == 10
    st.go(-5)
    assert st.step == 0
    assert st.step_for_pos(0) == 0 and st.step_for_pos(P - 1) == 0
    assert st.step_for_pos(P) == 1 and st.step_for_pos(P + 5) == 6
    assert st.step_for_pos(len(short_run.tokens) - 1) == 11  # the last token was never a query: clamp


def test_new_run_keeps_valid_selection(short_run, sample_model):
    st = AppState(trajectory=short_run)
    st.param.update(layer=3, head=2, step=9)
    shorter = ts.capture(sample_model, "import os", max_new_tokens=4)
    st.set_trajectory(shorter)
    assert (st.layer, st.head) == (3, 2)
    assert st.step == 3  # clamped into the shorter run


def test_capture_plan_and_errors():
    st = AppState(max_new_tokens=7, temperature=0.5, seed=3, keep_attention="0, 2", keep_residuals="1")
    plan = st.capture_plan()
    c = plan.config
    assert (c.max_new_tokens, c.temperature, c.seed, c.attention_layers, c.residual_layers) == (7, 0.5, 3, (0, 2), (1,))
    st.param.update(prompt="   ")
    with pytest.raises(ts.TrajscopeError, match="empty"):
        st.capture_plan()
    st.param.update(prompt="x", max_new_tokens=0)
    with pytest.raises(ts.TrajscopeError, match="at least 1"):
        st.capture_plan()
    for bad in (-1.0, 5.5, float("nan")):  # the field passes what was typed; the plan refuses it with one sentence
        st.param.update(max_new_tokens=5, temperature=bad)
        with pytest.raises(ts.TrajscopeError, match=r"Temperature must be from 0 \(greedy\) to 5 \(it is"):
            st.capture_plan()
    st.param.update(temperature=5.0)
    assert st.capture_plan().config.temperature == 5.0
    st.param.update(max_new_tokens=5, temperature=0.0, keep_attention="0,9")
    with pytest.raises(ts.TrajscopeError, match="layer 9 is out of range"):
        st.capture_plan().for_model(6)
    assert parse_layers("all") == "all" and parse_layers("none") is None and parse_layers("") is None
    with pytest.raises(ts.TrajscopeError, match="'first'"):
        parse_layers("first")
    st.model_source = " "
    with pytest.raises(ts.TrajscopeError, match="model source"):
        st.model_key()


def test_plan_keeps_what_the_cards_need_and_is_frozen(short_run):
    # before any run of a model, its run keeps the rows of the middle layer it opens on
    assert AppState().capture_plan().for_model(30).attention_layers == (15,)
    st = AppState(keep_attention="none", keep_residuals="none", trajectory=short_run)  # the model on screen
    st.param.update(sae_layer=3, drift_layers=[0, 1, 2, 3, 4, 5], layer=4)
    plan = st.capture_plan()
    cfg = plan.for_model(6)
    assert cfg.residual_layers == (0, 1, 2, 3, 4, 5) and cfg.attention_layers == (4,)
    # a smaller model: wanted layers it lacks are dropped, not an error
    assert plan.for_model(2).residual_layers == (0, 1) and plan.for_model(2).attention_layers is None
    # the plan is a snapshot: later edits of the state do not reach it
    st.param.update(sae_layer=None, drift_layers=[], keep_residuals="all", max_new_tokens=99)
    assert plan.for_model(6).residual_layers == (0, 1, 2, 3, 4, 5) and plan.config.max_new_tokens == 64
    assert st.capture_plan().for_model(6).residual_layers == "all"


def test_report_and_repr_hide_the_key():
    st = AppState(ndif_api_key="sk-secret-123")
    st.report("Something went wrong.")
    assert st.error == "Something went wrong." and st.status == ""  # shown once, in the error box
    assert "sk-secret" not in repr(st)


def test_extra_token_columns_become_metrics(short_run):
    tokens = short_run.tokens.with_columns(pl.lit(0.5).alias("sae_error"))
    assert token_metric_choices(tokens)["sae error"] == "sae_error"
    drift = tokens.with_columns(pl.lit(1.0).alias("drift_score_max"))
    assert token_metric_choices(drift)["drift score (max over layers)"] == "drift_score_max"
    assert "pos" not in token_metric_choices(tokens).values()


def test_step_box_says_when_a_typed_step_is_outside_the_run():
    """Issue: "Jump to step" accepted 999 and did nothing."""
    from trajscope.ui.views.player import check_step

    assert check_step("12", 40) == (12, "")
    assert check_step("999", 40) == (None, "Step 999 is outside this run: it has steps 0 to 39.")
    assert check_step("x", 40)[1] == "Type a step number from 0 to 39."
    assert check_step("3", 0)[0] is None
