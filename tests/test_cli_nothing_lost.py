"""Nothing lost, nothing half-written (issue 35): colliding run names, atomic export, bad vector files,
folders of runs."""

from __future__ import annotations

import json
import shutil

import numpy as np
import polars as pl
import pytest
import torch

import trajscope as ts
from trajscope.cli import main
from trajscope.export import scan
from trajscope.io import find_runs


@pytest.fixture(scope="module")
def runs_root(tiny_dirs, tmp_path_factory):
    """``runs/code``: two runs whose ids flatten to the same folder name, captured by one command."""
    root = tmp_path_factory.mktemp("nl") / "runs"
    prompts = root.parent / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": p, "id": i}) for p, i in
                                 (("import os", "a/b:c"), ("def f(x):", "a_b_c"))) + "\n")
    assert main(["capture", "--model", str(tiny_dirs["gpt2"]), "--prompts", str(prompts), "--max-new-tokens", "2",
                 "--out", str(root / "code"), "--quiet"]) == 0
    return root


def _one_sentence(err: str) -> None:
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err


def test_colliding_ids_both_survive_and_the_cli_says_so(runs_root, tiny_dirs, tmp_path, capsys):
    folders = sorted(p.name for p in (runs_root / "code").iterdir())
    assert folders == ["a_b_c", "a_b_c-2"]
    ids = {ts.Trajectory.load(runs_root / "code" / f).run_id for f in folders}
    assert ids == {"a/b:c", "a_b_c"}
    # the same prompt file again replaces each run in place (same id, same folder): still two
    out = tmp_path / "again"
    shutil.copytree(runs_root / "code", out)
    prompts = runs_root.parent / "p.jsonl"
    capsys.readouterr()
    assert main(["capture", "--model", str(tiny_dirs["gpt2"]), "--prompts", str(prompts), "--max-new-tokens", "2",
                 "--out", str(out), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == folders
    notes = [ln for ln in err.splitlines() if ln.startswith("note:")]
    assert len(notes) == 1 and "'a_b_c-2'" in notes[0] and "'a/b:c'" in notes[0], err


def test_report_and_export_take_a_folder_of_run_folders(runs_root, tmp_path, capsys):
    assert find_runs([runs_root]) == [runs_root / "code" / "a_b_c", runs_root / "code" / "a_b_c-2"]
    assert main(["export", str(runs_root), "--out", str(tmp_path / "ds"), "--quiet"]) == 0
    assert set(scan(tmp_path / "ds", "tokens").collect()["run_id"]) == {"a/b:c", "a_b_c"}
    assert main(["report", str(runs_root), "-o", str(tmp_path / "r.html")]) == 0
    assert "(2 runs;" in capsys.readouterr().err
    empty = tmp_path / "empty"
    (empty / "sub").mkdir(parents=True)
    assert main(["export", str(empty), "--out", str(tmp_path / "ds2")]) == 2
    err = capsys.readouterr().err
    _one_sentence(err)
    assert "holds none" in err


def _corrupt_copy(run, dest):
    shutil.copytree(run, dest)
    data = (dest / "attention.parquet").read_bytes()
    (dest / "attention.parquet").write_bytes(data[: len(data) // 2])  # tokens fine, attention truncated
    return dest


def test_export_with_a_corrupt_run_says_one_sentence_and_leaves_no_partial_dataset(runs_root, tmp_path, capsys):
    good = runs_root / "code" / "a_b_c"
    bad = _corrupt_copy(good, tmp_path / "bad")
    ds = tmp_path / "ds"
    capsys.readouterr()
    assert main(["export", str(good), str(bad), "--out", str(ds), "--quiet"]) == 2
    err = capsys.readouterr().err
    _one_sentence(err)
    assert str(bad) in err and "attention.parquet" in err and "corrupt" in err
    assert not ds.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    # an earlier dataset stays exactly as it was
    assert main(["export", str(good), "--out", str(ds), "--quiet"]) == 0
    before = sorted(str(p.relative_to(ds)) for p in ds.rglob("*"))
    assert main(["export", str(runs_root), str(bad), "--out", str(ds), "--quiet"]) == 2
    assert sorted(str(p.relative_to(ds)) for p in ds.rglob("*")) == before
    # --skip-bad: the bad run is named and left out, none of its files remain
    capsys.readouterr()
    assert main(["export", str(runs_root), str(bad), "--skip-bad", "--out", str(tmp_path / "ds3"), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert f"left out {bad}" in err and "(2 runs)" in err
    tok = scan(tmp_path / "ds3", "tokens").collect()
    assert tok["run_id"].n_unique() == 2


@pytest.mark.parametrize("name, write, fragment", [
    ("missing.safetensors", None, "No steering vector file"),
    ("text.safetensors", lambda p: p.write_text("not a tensor file"), "not a readable safetensors file"),
    ("text.npy", lambda p: p.write_text("not a tensor file"), "not a plain numeric .npy array"),
    ("matrix.npy", lambda p: np.save(p, np.ones((2, 3), dtype=np.float32)), "shape (2, 3)"),
    ("ints.safetensors", lambda p: _st(p, torch.ones(16, dtype=torch.int64), {"layer": "1"}), "dtype int64"),
    ("meta.safetensors", lambda p: _st(p, torch.ones(16), {"layer": "one"}), "layer='one'"),
    ("zero.npy", lambda p: np.save(p, np.zeros(16, dtype=np.float32)), "non-zero"),
    ("vector.pt", lambda p: p.write_text("x"), "not '.pt'"),
])
def test_a_malformed_steering_vector_file_gives_one_sentence(tmp_path, capsys, name, write, fragment):
    path = tmp_path / name
    if write is not None:
        write(path)
    rc = main(["capture", "--prompt", "x", "--max-new-tokens", "1", "--steer", str(path), "--steer-layer", "1",
               "--out", str(tmp_path / "o"), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2
    _one_sentence(err)
    assert fragment in err and str(path) in err, err


def test_a_vector_of_the_wrong_width_gives_one_sentence(tiny_dirs, tmp_path, capsys):
    path = tmp_path / "wide.npy"
    np.save(path, np.ones(999, dtype=np.float32))
    rc = main(["capture", "--model", str(tiny_dirs["gpt2"]), "--prompt", "x", "--max-new-tokens", "1",
               "--steer", str(path), "--steer-layer", "1", "--out", str(tmp_path / "o"), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2
    _one_sentence(err)
    assert "999" in err


def _st(path, tensor, metadata):
    from safetensors.torch import save_file

    save_file({"direction": tensor}, str(path), metadata=metadata)


def test_find_runs_says_what_is_wrong(tmp_path):
    with pytest.raises(ts.TrajscopeError, match="does not exist"):
        find_runs([tmp_path / "nope"])
    (tmp_path / "f.txt").write_text("")
    with pytest.raises(ts.TrajscopeError, match="is a file"):
        find_runs([tmp_path / "f.txt"])
    run = tmp_path / "x" / "r1"
    run.mkdir(parents=True)
    (run / "meta.json").write_text("{}")
    (run / "inner").mkdir()
    (run / "inner" / "meta.json").write_text("{}")  # inside a run: not searched
    (tmp_path / "x" / ".r1.tmp").mkdir()
    (tmp_path / "x" / ".r1.tmp" / "meta.json").write_text("{}")  # a temporary folder: skipped
    assert find_runs([tmp_path, run]) == [run]


def test_export_keeps_runs_that_share_every_partition_key(runs_root, tmp_path):
    twin = tmp_path / "steered" / "a_b_c"
    shutil.copytree(runs_root / "code" / "a_b_c", twin)  # same model, same run id, another folder
    ds = tmp_path / "ds"
    assert main(["export", str(runs_root), str(tmp_path / "steered"), "--out", str(ds), "--quiet"]) == 0
    tok = scan(ds, "tokens").collect()
    twin_tokens = ts.Trajectory.load(twin).tokens
    assert twin_tokens["run_id"][0] == "a/b:c"
    assert tok.filter(pl.col("run_id") == "a/b:c").height == 2 * twin_tokens.height
    assert sorted(p.name for p in (ds / "tokens").rglob("*.parquet")) == ["part-0.parquet"] * 2 + ["part-1.parquet"]
