"""Every card names the run and model its result belongs to; actions wait while Generate replaces the run."""

import panel as pn

from trajscope.escaping import md_text
from trajscope.trajectory import Trajectory
from trajscope.ui.state import AppState
from trajscope.studies.steering.card import SteeringView
from trajscope.studies.compaction.card import CompactionView
from trajscope.studies.eviction.card import EvictionView


def _buttons(view, label: str):
    return [w for w in view.__panel__().select(pn.widgets.Button) if w.label == label]


def test_provenance_names_run_and_model_and_says_when_it_is_being_replaced(short_run):
    st = AppState(trajectory=short_run)
    line = st.provenance()
    assert md_text(short_run.run_id) in line and "on model sample" in line and "6 layers × 4 heads" in line
    assert "replaced" not in line
    st.param.update(busy=True, model_source="other")
    assert "being replaced" in st.provenance() and "a new run on other" in st.provenance()
    assert AppState().provenance().startswith("No run yet")


def test_provenance_shows_ids_from_files_as_text(short_run):
    """A run id (from meta.json) that closes a code span and carries markup stays text."""
    payload = "x`<img src=x onerror=alert(1)>`*b*"
    meta = {**short_run.meta, "run_id": payload}
    st = AppState(trajectory=Trajectory(meta, short_run.tokens, short_run.attention, short_run.activations))
    line = st.provenance()
    assert "<img" not in line and "`" not in line.replace("\\`", "") and md_text(payload) in line


def test_actions_on_a_run_are_disabled_and_refused_while_generate_runs(short_run):
    st = AppState(trajectory=short_run)
    steer, ev, cp = SteeringView(state=st), EvictionView(state=st), CompactionView(state=st)
    buttons = [*_buttons(steer, "Steer"), *_buttons(steer, "Depth sweep"), *_buttons(ev, "Run"), *_buttons(cp, "Run")]
    assert len(buttons) == 4 and not any(b.disabled for b in buttons)
    st.busy = True
    assert all(b.disabled for b in buttons)
    steer.steer()
    ev.run()
    cp.run()  # a click that reached the server before the button went grey does nothing either
    assert not (steer.settings.busy or ev.settings.busy or cp.settings.busy)
    assert all("generating" in s.status for s in (steer.settings, ev.settings, cp.settings))
    st.busy = False
    assert not any(b.disabled for b in buttons)


def test_a_steering_result_of_a_replaced_run_is_dropped(short_run, sample_model):
    st = AppState(trajectory=short_run)
    view = SteeringView(state=st)
    view._show(short_run, base=short_run, steered=short_run)
    assert view.settings.steered is short_run
    st.set_trajectory(short_run)  # a new run (revision) clears the card…
    assert view.settings.steered is None
    other = type(short_run)(dict(short_run.meta, run_id="x"), short_run.tokens, short_run.attention,
                            short_run.activations)
    st.set_trajectory(other)
    view._show(short_run, base=short_run, steered=short_run)  # …and a result computed on the old one never lands
    assert view.settings.steered is None


def test_a_compaction_result_is_cleared_by_a_new_run_and_names_its_model(short_run):
    st = AppState(trajectory=short_run)
    view = CompactionView(state=st)
    view.settings.param.update(summary="On model `sample`: …", status="x")
    st.set_trajectory(short_run)
    assert view.settings.summary == "" and view.settings.result is None


def test_an_error_goes_stale_when_a_setting_or_the_run_changes(short_run):
    st = AppState()
    st.report("Max new tokens must be at least 1 (it is 0).")
    st.max_new_tokens = 8
    assert st.error == ""
    st.report("Something about the last run.")
    st.set_trajectory(short_run)
    assert st.error == ""
