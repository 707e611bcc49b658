"""An SAE or profile of another model is not loaded; the card says what fits; runs keep what fits their model."""

import json

import trajscope as ts
from trajscope.ui import artefacts
from trajscope.ui.state import AppState
from trajscope.studies.drift.card import DriftView
from trajscope.ui.views.features import SAMPLE_SAE, FeaturesView

DEEP = {"model_id": "other-576", "n_layers": 30, "d_model": 576}


def _as_deep_model(run: ts.Trajectory) -> ts.Trajectory:
    meta = dict(run.meta, model=dict(run.meta["model"], **DEEP))
    return ts.Trajectory(meta, run.tokens, run.attention, run.activations, run.tensors)


def test_misfits_name_what_differs():
    sample = artefacts.model_facts({"model": {"model_id": "sample", "n_layers": 6, "d_model": 256}})
    assert artefacts.sae_misfit(SAMPLE_SAE, sample) is None
    assert "576 wide" in artefacts.sae_misfit(SAMPLE_SAE, DEEP)
    assert "not on this run's model 'gpt2'" in artefacts.sae_misfit(SAMPLE_SAE, dict(sample, model_id="gpt2"))
    info = {"model_id": "sample", "n_layers": 6, "d_model": 256}
    assert artefacts.profile_misfit(info, sample) is None and "30 layers" in artefacts.profile_misfit(info, DEEP)
    assert artefacts.same_model("smollm2", "/models/SmolLM2-135M-Instruct")
    assert artefacts.same_model("trajscope-tiny", "sample") and not artefacts.same_model("gpt2", "sample")


def test_find_sae_picks_the_one_that_fits(tmp_path):
    for name, width in (("a", 256), ("b", 576)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "cfg.json").write_text(json.dumps({"d_in": width, "metadata": {"model_name": "other-576",
                                                                                           "layer": 14}}))
    assert artefacts.find_sae(DEEP, tmp_path) == tmp_path / "b"
    assert artefacts.find_sae(dict(DEEP, d_model=64), tmp_path) is None
    assert "trajscope harvest --model other-576" in artefacts.no_sae(DEEP) and "--layer 15" in artefacts.no_sae(DEEP)


def test_sae_card_on_another_model_shows_nothing_of_the_sample_sae(short_run):
    st = AppState()
    view = FeaturesView(state=st, shown=True)
    st.set_trajectory(short_run)
    assert view.card.index is not None  # the sample SAE on the sample run
    st.set_trajectory(_as_deep_model(short_run))
    assert view._enc is None and view.message.startswith("No SAE for this model ('other-576')")
    assert "576 wide" in view.message and "train-sae" in view.message
    assert view.card.index is None and view.card.feature is None and view.card.run_density is None
    assert view.chooser.options == {} and "<td>" not in view.top_html.object


def test_drift_card_on_another_model_says_which_profile_is_missing(short_run):
    st = AppState()
    view = DriftView(state=st, shown=True)
    st.set_trajectory(_as_deep_model(short_run))
    s = view.settings
    assert s.drift is None and s.message.startswith("No drift profile for this model ('other-576')")
    assert "trajscope profile --model other-576" in s.message


def test_a_run_keeps_the_residuals_of_artefacts_that_fit_its_model_only():
    st = AppState(sae_layer=3, sae_width=256, drift_layers=list(range(6)), drift_width=256)
    plan = st.capture_plan()
    assert plan.for_model(6, 256, "sample").residual_layers == tuple(range(6))
    assert plan.for_model(30, 576, "other-576").residual_layers is None  # not the sample's layers 0–5
    assert artefacts.drift_layers(30) == [0, 4, 8, 12, 17, 21, 25, 29] and artefacts.drift_layers(6) == list(range(6))


def test_the_steering_card_takes_each_models_shipped_vector_setting(short_run):
    from trajscope.studies.steering.card import SteeringView

    smollm2 = {"model_id": "smollm2", "n_layers": 30, "d_model": 576}
    found = artefacts.find_steering(smollm2)
    assert found["pairs"].name == "steer_french_pairs.jsonl" and found["layer"] == 6
    sample = artefacts.find_steering({"model_id": "trajscope-tiny", "n_layers": 6})
    assert sample["pairs"].name == "quotes_pairs.jsonl" and sample["layer"] == 3
    assert artefacts.find_steering(DEEP) is None  # nothing shipped for it
    assert artefacts.find_steering(dict(smollm2, n_layers=4)) is None  # the shipped layer is not in this model
    st = AppState()
    view = SteeringView(state=st)
    st.set_trajectory(_as_deep_model(short_run))  # no shipped vector: a middle layer
    assert view.settings.layer == 15
    st.set_trajectory(ts.Trajectory(dict(short_run.meta, model=dict(short_run.meta["model"], **smollm2)),
                                    short_run.tokens, short_run.attention, short_run.activations, short_run.tensors))
    assert view.settings.layer == 6 and view.settings.pairs_path.endswith("steer_french_pairs.jsonl")
    st.set_trajectory(short_run)
    assert view.settings.layer == 3 and view.settings.pairs_path.endswith("quotes_pairs.jsonl")
