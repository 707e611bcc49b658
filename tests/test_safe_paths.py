"""Paths out of data: run ids from meta.json never climb out, archives hold safe names only, links out
of a run are not followed, and a NUL byte or an over-long path gets one sentence."""

from __future__ import annotations

import copy
import io
import os
import tempfile
import zipfile

import pytest

import trajscope as ts
from trajscope.errors import TrajscopeError
from trajscope.export import export
from trajscope.safe_paths import check_path_text, inside, safe_name
from trajscope.ui import operator, saved_runs
from trajscope.ui.export import run_zip_bytes

EVIL_IDS = ["../../x", "/abs/x", "..", ".hidden", "a/../../x", "x\0y"]


@pytest.fixture(scope="module")
def run(sample_model):
    return ts.capture(sample_model, "def f(x):\n", max_new_tokens=3)


def with_id(traj, run_id):
    t = copy.copy(traj)
    t.meta = dict(traj.meta, run_id=run_id)
    return t


@pytest.mark.parametrize("text, name", [("../../x", "x"), ("/etc/passwd", "etc_passwd"), ("..", "run"),
                                        ("20261124-183858-13082c", "20261124-183858-13082c"),
                                        (".a..b", "a.b"), ("x" * 300, "x" * 100), ("", "run")])
def test_safe_name(text, name):
    assert safe_name(text) == name


@pytest.mark.parametrize("run_id", EVIL_IDS)
def test_download_zip_writes_nothing_outside_and_holds_safe_entries(run, run_id, tmp_path, monkeypatch):
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    monkeypatch.setattr(tempfile, "tempdir", str(deep))  # "../../x" from the zip's temporary directory: tmp_path/x
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "keep.txt").write_text("mine")
    data = run_zip_bytes(with_id(run, run_id))
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["a", "b", "keep.txt", "x"]  # nothing written or deleted
    assert not os.path.exists("/abs")
    names = zipfile.ZipFile(io.BytesIO(data)).namelist()
    assert "meta.json" in {n.split("/")[-1] for n in names}
    top = safe_name(run_id)
    for n in names:
        assert ".." not in n.split("/") and not n.startswith("/") and n.startswith(top + "/"), n


@pytest.mark.parametrize("run_id", EVIL_IDS)
def test_app_saves_inside_its_runs_directory(run, run_id, tmp_path):
    runs = tmp_path / "a" / "runs"
    path = saved_runs.save_run(with_id(run, run_id), runs)
    assert path.parent == runs and path.name == safe_name(run_id)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]


def test_links_out_of_a_run_directory_are_not_followed(run, tmp_path):
    d = run.save(tmp_path / "runs" / "r")
    outside = tmp_path / "secret.parquet"
    (d / "tokens.parquet").rename(outside)
    (d / "tokens.parquet").symlink_to(outside)
    with pytest.raises(TrajscopeError, match="leads outside"):
        ts.Trajectory.load(d)
    with pytest.raises(TrajscopeError, match="leads outside"):
        export([d], tmp_path / "out", progress=False)
    with pytest.raises(TrajscopeError, match="leads outside"):
        inside(d / "tokens.parquet", d)


def test_a_list_in_meta_json_is_one_sentence(tmp_path):
    d = tmp_path / "r"
    d.mkdir()
    (d / "meta.json").write_text("[1, 2]")
    with pytest.raises(TrajscopeError, match="not a run's settings"):
        ts.Trajectory.load(d)


@pytest.mark.parametrize("text, says", [("runs/a\0b", "NUL byte"), ("a/" * 3000, "too long"), ("x" * 300, "too long")])
def test_nul_and_over_long_paths_are_one_sentence(text, says, tmp_path, monkeypatch):
    monkeypatch.setenv("TRAJSCOPE_DATA_DIRS", str(tmp_path))
    operator.configure(None)
    try:
        for call in (lambda: check_path_text(text, "run directory"),
                     lambda: operator.config().path(str(tmp_path / text), "run directory"),
                     lambda: ts.Trajectory.load(tmp_path / text)):
            with pytest.raises(TrajscopeError, match=says) as err:
                call()
            msg = str(err.value)
            assert msg.endswith(".") and msg.count(". ") == 0 and "\0" not in msg and len(msg) < 200
    finally:
        operator.configure(None)
