"""Drift and Steering views: their settings objects, pure plots, and a steering job on a tiny model."""

from __future__ import annotations

import time

import numpy as np
import polars as pl
import pytest

import trajscope as ts
from trajscope.studies.drift.build import build_profile
from trajscope.studies.drift import plots as dp
from trajscope.studies.drift.card import DriftView
from trajscope.studies.drift.state import DriftSettings
from trajscope.studies.steering import plots as sp
from trajscope.studies.steering.card import SteeringView
from trajscope.studies.steering.state import parse_depths, skipped_depths
from trajscope.ui.state import AppState

PROMPTS = [f"def f{i}(x):\n    return x + {i}" for i in range(6)]


@pytest.fixture(scope="module")
def llama(tiny_models):
    return tiny_models["llama"]


@pytest.fixture(scope="module")
def profile_path(llama, tmp_path_factory):
    return build_profile(llama, PROMPTS, fpr=0.05, progress=False).save(tmp_path_factory.mktemp("p") / "p.safetensors")


def test_parse_depths():
    assert parse_depths("1, 10,50,200", 60) == [1, 10, 50]
    assert skipped_depths("1, 10,50,200", 60) == "Skipped depth 200: the run has 60 decode steps (depths must be 1..59)."
    assert skipped_depths("1,10", 60) == ""
    with pytest.raises(ts.TrajscopeError, match="No depth"):
        parse_depths("100", 20)
    with pytest.raises(ts.TrajscopeError, match="comma-separated"):
        parse_depths("a", 20)


def test_drift_settings_compute_and_explain(llama, profile_path):
    traj = ts.capture(llama, "import os\n", max_new_tokens=6, stop_at_eos=False, residual_layers="all")
    ds = DriftSettings(profile_path=str(profile_path))
    ds.compute(traj)
    assert ds.drift is not None and ds.drift.height == 2 * (len(traj.token_ids) - 1)
    assert set(ds.thresholds) == {0, 1} and ds.fpr == 0.05
    ds.compute(ts.capture(llama, "import os\n", max_new_tokens=2))
    assert ds.drift is None and "Keep residuals of layers" in ds.message  # a control that exists
    ds.profile_path = str(profile_path.parent / "nope.safetensors")
    ds.compute(traj)
    assert "No profile at" in ds.message


def test_drift_plots_carry_the_scores(llama, profile_path):
    traj = ts.capture(llama, "import os\n", max_new_tokens=6, stop_at_eos=False, residual_layers="all")
    view = DriftView(state=AppState(), settings=DriftSettings(profile_path=str(profile_path)))
    view.state.set_trajectory(traj, step=0)
    drift = view.settings.drift
    data = dp.heatmap_data(drift, traj.prompt_len, traj.tokens["text"].to_list())
    # every score but the sink's (pos 0, shown apart: it would set the colour scale), each in its cell
    shown = drift.filter(pl.col("pos") > 0)
    grid = data["grid"]
    assert np.isfinite(grid).sum() == shown.height
    for r in shown.iter_rows(named=True):  # the cell at x = the step axis of pos, y = layer
        x = r["pos"] - traj.prompt_len + 1
        assert grid[r["layer"] - data["y0"], x - data["x_min"]] == pytest.approx(r["score"], rel=1e-6)
    # the card's heatmap draws that grid, its cells centred on integer x (step axis) and y (layer), layer 0 on top
    heat = view.heatmap
    src = heat.source.data
    assert np.array_equal(src["image"][0], grid, equal_nan=True)
    assert src["x"][0] == 1 - traj.prompt_len + 1 - 0.5  # pos 1, the first shown, at its step axis
    assert src["x"][0] + src["dw"][0] == int(drift["pos"].max()) - traj.prompt_len + 1 + 0.5
    assert (src["y"][0], src["dh"][0]) == (-0.5, llama.n_layers)
    yr = heat.figure.y_range
    assert (yr.start, yr.end) == (llama.n_layers - 0.5, -0.5)
    first = heat.hover.formatters["$x"].args  # the hover names the position, its token and its step
    assert first["origin"] == 2 - traj.prompt_len and first["labels"][0].startswith("1 ")
    lo, hi = heat.mapper.low, heat.mapper.high
    assert abs((lo + hi) / 2 - 1.0) < 1e-9  # diverging around 1 (the prefill-typical score)
    curves = view.curves
    used = [i for i, line in enumerate(curves.lines) if line.visible]
    assert sorted(curves.thresholds[i].location for i in used) == sorted(view.settings.thresholds.values())
    labels = [curves.legend.items[i].label["value"] for i in used]  # each layer's threshold in its legend entry
    assert labels == [f"layer {k} (threshold {t:.2f})" for k, t in sorted(view.settings.thresholds.items())]
    for i in used:
        d = curves.sources[i].data
        layer = int(d["layer"][0])
        want = shown.filter(pl.col("layer") == layer).sort("pos")
        assert list(d["pos"]) == want["pos"].to_list() and np.allclose(d["score"], want["score"].to_numpy())
    assert not any(item.visible for i, item in enumerate(curves.legend.items) if i not in used)
    # flags on the token strip: a per-token colouring metric
    assert "drift_flagged_layers" not in traj.tokens.columns  # the shared run is not modified
    flags = view.state.tokens().sort("pos")["drift_flagged_layers"].to_list()
    want = drift.group_by("pos").agg(pl.col("flagged").sum()).sort("pos")["flagged"].to_list()
    assert flags[: len(want)] == want
    assert "drift_flagged_layers" in view.state.param.token_metric.objects.values()


def test_aligned_continuations_marks_first_divergence():
    base = pl.DataFrame({"pos": list(range(6)), "text": ["a", "b", "c", "d", "e", "f"]})
    steered = pl.DataFrame({"pos": list(range(6)), "text": ["a", "b", "c", "d", "X", "Y"]})
    out = sp.aligned_continuations(base, steered, prompt_len=2, start_step=1)
    rows = out.split("<tr")[2:]
    assert "first divergence" in rows[2] and "first divergence" not in "".join(rows[:2] + rows[3:])
    assert "steering on" in rows[1]


def test_effect_and_decay_figures():
    from bokeh.models import GlyphRenderer, Span, Whisker

    steps = pl.DataFrame({"run_id": ["a"] * 6 + ["b"] * 6, "start_step": [1, 1, 1, 2, 2, 2] * 2,
                          "strength": [2.0] * 12, "step": [0, 1, 2] * 4,
                          "kl_to_base": [0.0, 0.5, 0.25, 0.0, 0.0, 0.4, 0.0, 0.3, 0.05, 0.0, 0.0, 0.2],
                          "token_changed": [False, True, True, False, False, True] * 2})
    from trajscope.studies.steering.summary import decay_summary

    fig = sp.effect_figure(steps)
    lines = [r for r in fig.renderers if isinstance(r, GlyphRenderer)]
    assert [r.data_source.data["start_step"][0] for r in lines] == [1, 2]
    first = lines[0].data_source.data
    assert first["step"] == [0, 1, 2]
    assert first["kl"] == pytest.approx([1e-6, 0.4, 0.15])  # the mean over the two runs, floored for the log axis
    assert sorted(a.location for a in fig.center if isinstance(a, Span)) == [1, 2]  # each depth's onset
    assert [item.label["value"] for item in fig.right[0].items] == ["start at step 1", "start at step 2"]
    assert fig.y_scale.__class__.__name__ == "LogScale" and "strength 2" in fig.title.text

    one = sp.decay_figure(decay_summary(steps.filter(pl.col("run_id") == "a"), window=1))  # one steered step each
    pts = [r for r in one.renderers if r.glyph.__class__.__name__ == "Scatter"][0].data_source.data
    assert pts["start_step"] == [1, 2] and pts["effect"] == pytest.approx([0.5, 0.4])
    assert "1 prompt" in one.title.text and not [a for a in one.center if isinstance(a, Whisker)]
    assert one.xaxis[0].ticker.ticks == [1, 2]  # the swept depths, not a log axis's fractional steps
    two = sp.decay_figure(decay_summary(steps.with_columns(prompt_idx=pl.col("run_id")), window=1))
    assert "across 2 prompts" in two.title.text
    assert [a for a in two.center if isinstance(a, Whisker)]  # the interval across prompts, as whiskers
    assert sp.decay_figure(decay_summary(steps.head(0), window=1)).renderers == []  # nothing swept: an empty figure


def test_steering_view_runs_off_the_event_loop(llama, tmp_path):
    import json

    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("\n".join(json.dumps({"positive": f"x{i} = \"", "negative": f"x{i} = '"}) for i in range(4)))
    state = AppState()
    state.set_trajectory(ts.capture(llama, "def f(x):", max_new_tokens=8, stop_at_eos=False), step=0)
    view = SteeringView(state=state, model_loader=lambda source: llama)
    view.settings.param.update(pairs_path=str(pairs), layer=1, strength=30.0, start_step=3, depths="1,3,20")
    view.steer()
    deadline = time.time() + 60
    while view.settings.busy and time.time() < deadline:
        time.sleep(0.05)
    assert view.settings.steered is not None, view.settings.status
    P = view.settings.base.prompt_len
    assert view.settings.steered.token_ids[: P + 3] == view.settings.base.token_ids[: P + 3]
    view.sweep()
    deadline = time.time() + 60
    while view.settings.busy and time.time() < deadline:
        time.sleep(0.05)
    assert view.settings.sweep.table("steering_summary")["start_step"].to_list() == [1, 3], view.settings.status
    view.settings.pairs_path = str(tmp_path / "missing.jsonl")
    view._vectors.clear()
    view.steer()
    while view.settings.busy:
        time.sleep(0.05)
    assert "No contrast-pair file" in view.settings.status
    for field, bad, sentence in (("layer", -1, "Steering layer -1 is out of range; the model has layers 0..1."),
                                 ("start_step", -1, "start_step must be ≥ 0, not -1."),
                                 # "1e400" typed in the strength field reaches the server as inf
                                 ("strength", float("inf"), "The steering strength must be a finite number, not inf.")):
        # the fields send what was typed (a bound made the browser keep the old value, unsaid): one sentence, no run
        view.settings.param.update(**{"pairs_path": str(pairs), "layer": 1, "start_step": 3, "strength": 30.0,
                                      "steered": None, field: bad})
        view.steer()
        while view.settings.busy:
            time.sleep(0.05)
        assert sentence in view.settings.status and view.settings.steered is None, view.settings.status
    view.settings.param.update(pairs_path=str(pairs), layer=1, start_step=3, strength=30.0, mode="clamp")
    view.steer()
    while view.settings.busy:
        time.sleep(0.05)
    assert view.settings.steered.meta["steering"][0]["mode"] == "clamp", view.settings.status


def test_features_view_follows_the_step(sample_model, tmp_path):
    from trajscope.ui.feature_plots import top_features_table
    from trajscope.ui.views.features import SAMPLE_SAE, FeaturesView, comparison_table

    traj = ts.capture(sample_model, "def fibonacci(n):\n    ", max_new_tokens=10, residual_layers=[3])
    state = AppState()
    state.set_trajectory(traj, step=0)
    view = FeaturesView(state=state)
    enc = view._enc
    assert enc is not None and enc["f"].shape[0] == traj.residual(3).shape[0]
    P = traj.prompt_len
    at = {s: sorted(top_features_table(enc["features"], P + s - 1)["feature"]) for s in (3, 7)}
    assert at[3] != at[7]
    table = comparison_table(enc, P)
    assert table["positions"].to_list() == ["prefill (pos ≥ 1)", "decode", "prefill vs decode overlap"]
    assert table["jaccard_top64"].null_count() == 2 and 0 <= table["jaccard_top64"][2] <= 1
    state.set_trajectory(ts.capture(sample_model, "x = 1", max_new_tokens=3), step=0)
    assert view._enc is None and "not kept" in view.message
    view.sae_path = str(tmp_path)
    assert "cfg.json" in view.message or "SAE" in view.message
    assert SAMPLE_SAE.exists()


def test_steering_mode_reaches_the_vector_and_results_clear_on_a_new_run(short_run):
    import torch

    from trajscope.steering import SteeringVector
    from trajscope.ui.views.app import TrajScope

    app = TrajScope(trajectory=short_run)
    s = app.study_cards["steering"].settings
    s.param.update(mode="clamp", strength=2.5, start_step=4)
    vec = s.vector(SteeringVector(direction=torch.ones(8), layer=3))
    assert (vec.mode, vec.strength, vec.start_step, vec.layer) == ("clamp", 2.5, 4, 3)
    s.param.update(base=short_run, steered=short_run, status="Steered.")
    app.state.set_trajectory(short_run)
    assert s.base is None and s.steered is None and s.status == ""
