"""What a run generated in the app writes to disk: the layers shown only, float16 rows, and the estimate shown before."""

import pathlib

import pytest
import torch

import trajscope as ts
from trajscope.ui import saved_runs
from trajscope.ui.state import AppState
from trajscope.ui.storage import RunShape, compact_tensors, estimate_bytes, human


def _bytes(path: pathlib.Path) -> int:
    return sum(f.stat().st_size for f in path.iterdir())


def _run(model, state: AppState) -> ts.Trajectory:
    config = state.capture_plan().for_model(model.n_layers, model.d_model, model.model_id).replace(stop_at_eos=False)
    return ts.capture(model, state.prompt, config)


def test_default_run_keeps_the_shown_layer_in_float16_and_matches_its_estimate(sample_model, short_run, tmp_path):
    st = AppState(max_new_tokens=40, trajectory=short_run)  # a run of this model on screen, layer 2 shown
    st.layer = 2
    traj = _run(sample_model, st)
    path = saved_runs.save_run(traj, tmp_path, float16=st.capture_plan().float16)
    saved = ts.Trajectory.load(path)
    assert sorted(k for k in saved.tensors if k.startswith("attention.")) == ["attention.2"]
    assert saved.tensors["attention.2"].dtype == torch.float16
    assert (saved.tensors["attention.2"].float() - traj.tensors["attention.2"]).abs().max() < 5e-4
    assert traj.tensors["attention.2"].dtype == torch.float32  # the run on screen is not changed
    m = sample_model
    est = estimate_bytes(RunShape(m.n_layers, m.n_heads, m.d_model), traj.prompt_len, 40, 1,
                         len(traj.meta["residual_layers"] or ()))
    assert 0.7 < _bytes(path) / est < 1.3, (human(_bytes(path)), human(est))


def test_full_rows_are_a_choice_and_cost_what_the_estimate_says(sample_model, tmp_path):
    st = AppState(max_new_tokens=40, keep_attention="all", attention_float16=False)
    traj = _run(sample_model, st)
    small = saved_runs.save_run(traj, tmp_path / "small")
    full = saved_runs.save_run(traj, tmp_path / "full", float16=False)
    assert ts.Trajectory.load(full).tensors["attention.0"].dtype == torch.float32
    numbers = sum(v.numel() for v in traj.tensors.values())
    assert _bytes(full) - _bytes(small) == pytest.approx(2 * numbers, rel=0.01)  # float32 minus float16
    text = st.size_estimate(sample_model, traj.prompt_len)
    m = sample_model
    est = estimate_bytes(RunShape(m.n_layers, m.n_heads, m.d_model), traj.prompt_len, 40, m.n_layers,
                         len(traj.meta["residual_layers"] or ()), False)
    assert human(est) in text and f"{m.n_layers} layers" in text and "float32" in text
    assert 0.7 < _bytes(full) / est < 1.3


def test_compact_tensors_halves_floats_only_when_asked():
    t = {"attention.0": torch.rand(2, 3, 3), "residual.0": torch.rand(3, 4)}
    out = compact_tensors(t)
    assert out["attention.0"].dtype == out["residual.0"].dtype == torch.float16
    assert compact_tensors(t, float16=False)["attention.0"].dtype == torch.float32


def test_saved_runs_list_names_the_model_and_shows_no_prompt(short_run, tmp_path):
    path = saved_runs.save_run(short_run, tmp_path)
    (label, where), = saved_runs.list_runs(tmp_path).items()
    assert where == str(path) and label == f"{short_run.run_id} · sample · {short_run.n_steps} steps"
    assert "fibonacci" not in label  # another session's prompt is not listed
