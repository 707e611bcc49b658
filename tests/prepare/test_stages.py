"""``trajscope prepare``'s stage runner: finished stages are skipped, killed ones re-run from a clean directory."""

from __future__ import annotations

import json

import pytest

from trajscope.prepare import sae_name, stages
from trajscope.prepare.config import PrepareConfig
from trajscope.prepare.stages import MARKER, Stage, is_done, run_stages


def _recorder(calls: list, fail: bool = False):
    def fn(ctx, d):
        calls.append(d.name)
        (d / "out.txt").write_text("x")
        if fail:
            raise RuntimeError("killed")
        return {"n": 1}
    return fn


def test_finished_stage_is_skipped(tmp_path):
    calls: list = []
    st = [Stage("a", _recorder(calls)), Stage("b", _recorder(calls))]
    assert run_stages(tmp_path, st, None, log=lambda s: None) == {"a": "ran", "b": "ran"}
    assert json.loads((tmp_path / "a" / MARKER).read_text())["n"] == 1
    assert run_stages(tmp_path, st, None, log=lambda s: None) == {"a": "skipped", "b": "skipped"}
    assert calls == ["a", "b"]


def test_killed_stage_reruns_from_a_clean_directory(tmp_path):
    calls: list = []
    with pytest.raises(RuntimeError):
        run_stages(tmp_path, [Stage("a", _recorder(calls)), Stage("b", _recorder(calls, fail=True))], None,
                   log=lambda s: None)
    assert is_done(tmp_path, "a") and not is_done(tmp_path, "b")
    (tmp_path / "b" / "partial.bin").write_text("half-written")
    status = run_stages(tmp_path, [Stage("a", _recorder(calls)), Stage("b", _recorder(calls))], None,
                        log=lambda s: None)
    assert status == {"a": "skipped", "b": "ran"}
    assert not (tmp_path / "b" / "partial.bin").exists() and is_done(tmp_path, "b")
    assert calls == ["a", "b", "b"]


def test_a_marked_stage_is_skipped_even_without_outputs(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / MARKER).write_text("{}")
    calls: list = []
    assert run_stages(tmp_path, [Stage("a", _recorder(calls))], None, log=lambda s: None) == {"a": "skipped"}
    assert calls == []


def test_stage_names_follow_the_config():
    names = [s.name for s in stages(PrepareConfig(seeds=(0, 1, 2)))]
    assert names[:4] == ["collect", "profile", "harvest-prefill", "harvest-decode"]
    assert names[-2:] == ["sae-eval", "steer"]
    assert sae_name("hybrid", 2) in names and len(names) == 4 + 6 + 2
