"""Run directories: round trip, atomic writes, dataset scans, and clear errors for broken runs."""

from __future__ import annotations

import json

import polars as pl
import pytest
import torch

import trajscope as ts


@pytest.fixture(scope="module")
def traj(tiny_models):
    return ts.capture(tiny_models["llama"], "def f(x):\n    return", max_new_tokens=6, stop_at_eos=False,
                      residual_layers=[0, 1], attention_layers=[1])


def test_round_trip(traj, tmp_path):
    path = traj.save(tmp_path / "run")
    back = ts.Trajectory.load(path)
    assert back.token_ids == traj.token_ids and back.prompt_len == traj.prompt_len
    for name in ("tokens", "attention", "activations"):
        assert getattr(back, name).equals(getattr(traj, name))
    torch.testing.assert_close(back.residual(1), traj.residual(1))
    torch.testing.assert_close(back.attention_rows(1), traj.attention_rows(1))
    meta = json.loads((path / "meta.json").read_text())
    for key in ("model", "sampling", "versions", "prompt", "stop_reason", "schema_version"):
        assert key in meta
    assert meta["model"]["attn_implementation"] == "rows" and meta["model"]["dtype"] == "float32"
    assert meta["sampling"]["seed"] == 0 and "torch" in meta["versions"]


def test_overwrite_is_atomic_and_leaves_no_temporaries(traj, tmp_path):
    traj.save(tmp_path / "run")
    traj.save(tmp_path / "run")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_folder_of_runs_scans_as_one_dataset(tiny_models, tmp_path):
    ids = []
    for i, prompt in enumerate(["import os\n", "class A:\n    "]):
        t = ts.capture(tiny_models["gpt2"], prompt, max_new_tokens=3, stop_at_eos=False, run_id=f"r{i}")
        t.save(tmp_path / t.run_id)
        ids.append(t)
    att = pl.scan_parquet(str(tmp_path / "*" / "attention.parquet")).collect()
    assert set(att["run_id"]) == {"r0", "r1"}
    assert att.height == sum(t.attention.height for t in ids)
    tok = pl.scan_parquet(str(tmp_path / "*" / "tokens.parquet")).group_by("run_id").len().sort("run_id")
    assert tok.collect()["len"].to_list() == [len(t.token_ids) for t in ids]


def test_missing_tensor_layer_is_explained(traj):
    with pytest.raises(ts.TrajscopeError, match=r"layer 0 were not kept \(kept: \[1\]\) in this run"):
        traj.attention_rows(0)


@pytest.mark.parametrize("damage, fragment", [
    (lambda p: (p / "meta.json").unlink(), "has no meta.json"),
    (lambda p: (p / "meta.json").write_text("{not json"), "corrupt meta.json"),
    (lambda p: (p / "attention.parquet").unlink(), "incomplete: attention.parquet is missing"),
    (lambda p: (p / "tokens.parquet").write_bytes(b"PAR1garbage"), "unreadable tokens.parquet"),
    (lambda p: (p / "tensors.safetensors").unlink(), "tensors.safetensors is missing"),
    (lambda p: (p / "tensors.safetensors").write_bytes((p / "tensors.safetensors").read_bytes()[:100]),
     "unreadable tensors.safetensors"),
    (lambda p: (p / "meta.json").write_text(json.dumps({"schema_version": 99})), "schema version 99"),
])
def test_broken_run_directories(traj, tmp_path, damage, fragment):
    path = traj.save(tmp_path / "run")
    damage(path)
    with pytest.raises(ts.TrajscopeError, match=fragment):
        ts.Trajectory.load(path)


def test_not_a_directory(tmp_path):
    with pytest.raises(ts.TrajscopeError, match="No run directory"):
        ts.Trajectory.load(tmp_path / "nope")


def test_unwritable_destination(traj, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ts.TrajscopeError, match="Cannot write the run"):
        traj.save(blocker / "run")


@pytest.mark.soak
def test_a_killed_save_leaves_whole_runs_or_none(tmp_path):
    """Kill a process while it saves runs, at several points: every run directory left is complete."""
    import random
    import signal
    import subprocess
    import sys
    import time

    from trajscope.model import sample_data_dir
    from trajscope.ui.saved_runs import list_runs

    demo = sample_data_dir() / "runs" / "demo"
    script = (f"import trajscope as ts, itertools\nt = ts.Trajectory.load({str(demo)!r})\n"
              f"print('ready', flush=True)\n"
              f"for i in itertools.count(): t.save({str(tmp_path)!r} + f'/run{{i % 3}}')\n")
    rng = random.Random(0)
    for _ in range(4):
        proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.05, 0.6))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    runs = [d for d in tmp_path.iterdir() if not d.name.startswith(".")]
    assert runs, "the saver never finished one run"
    for d in runs:  # a visible run directory always loads whole
        t = ts.Trajectory.load(d)
        assert t.n_steps == ts.Trajectory.load(demo).n_steps and t.residual(3).shape[0] > 0
    assert len(list_runs(tmp_path)) == len(runs)  # the app lists exactly those (temporary ones are hidden)
