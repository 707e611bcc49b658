"""The calibration report on the sample model: every section's numbers are its study's, the report is the same
after a kill and a resume, and bad input is one sentence."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest
import torch

from trajscope.calibration import calibrate, report, verdict
from trajscope.calibration.plan import SECTIONS, study_of
from trajscope.errors import TrajscopeError
from trajscope.reports import page
from trajscope.studies.registry import Result
from test_report_studies import _fetched

pytestmark = pytest.mark.slow
REPO = pathlib.Path(__file__).resolve().parents[1]
# every study of the report on settings small enough for a test (about a minute on two cores)
TINY = {
    "drift": {"max_new_tokens": 6, "n_boot": 50, "max_prompts": 8, "max_tokens": 48},
    "sae-drift": {"max_new_tokens": 6, "n_boot": 50, "n_null": 10, "max_prompts": 4, "max_tokens": 32},
    "sae-bench": {"max_per_file": 1, "max_prompt_tokens": 32, "new_tokens": 4, "ks": (1,), "n_boot": 50},
    "steering": {"depths": (1, 3), "window": 2, "max_prompts": 3, "max_tokens": 24},
    "steering-success": {"heldout_prompts": 4, "sweep_layers": (3,), "strengths": (2.0,), "sweep_prompts": 2,
                         "new_tokens": 4, "depths": (1, 2), "window": 2, "depth_prompts": 2, "max_prompts": 8,
                         "max_tokens": 24},
    "monitor": {"n_boot": 50, "new_tokens": 8, "fpr": 0.25, "strengths": (0.0, 4.0), "start_step": 3, "shifts": ("steer",), "forced_tokens": 2,
                "max_prompts": 16, "max_tokens": 24},
    "eviction": {"max_new_tokens": 4, "policies": ("snapkv",), "budgets": (0.5,), "window": 4, "max_prompts": 3,
                 "max_tokens": 40},
    "needle": {"context": 128, "n_prompts": 2, "policies": ("snapkv",), "budgets": (1.0,), "window": 8},
}


def _timeless(summaries: dict) -> dict:
    """Summaries without wall times (a study's setup may record how long it ran; the report never shows it)."""
    return {k: ({kk: vv for kk, vv in v.items() if kk != "seconds"} if isinstance(v, dict) else v)
            for k, v in summaries.items()}


def _set_flags(settings: dict) -> list[str]:
    out = []
    for study, kv in settings.items():
        for k, v in kv.items():
            out += ["--set", f"{study}.{k}=" + (",".join(map(str, v)) if isinstance(v, tuple) else str(v))]
    return out


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    out = tmp_path_factory.mktemp("calib")
    return calibrate("sample", out, settings=TINY, threads=1), out


def test_the_report_has_every_section_and_a_verdict_per_artefact(calibrated):
    cal, out = calibrated
    assert {s.state for s in cal.states} == {"done"}, [(s.job.key, s.state, s.why) for s in cal.states]
    html = cal.report.read_text(encoding="utf-8")
    for sec in SECTIONS:
        assert f"id='sec-{sec.key}'" in html
    kinds = {v["kind"] for v in cal.verdicts}
    assert kinds == {"sae", "sae-ce", "vector", "vector-success", "monitor"}
    assert all(v["verdict"] in ("transfers", "degrades", "fails", "undecided") for v in cal.verdicts)
    assert not _fetched(html)  # opens offline: the page loads nothing
    assert (out / "prompts.jsonl").is_file() and (out / "summary.json").is_file()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["verdicts"] == cal.verdicts


@pytest.mark.parametrize("section", [s.key for s in SECTIONS])
def test_each_section_is_its_studies_own_and_equals_the_study_run_alone(calibrated, section, sample_model):
    """The section's HTML is the study's section of the Result on disk (numbers from its Parquet tables), and
    running the study alone with the job's config and prompts gives the same summaries."""
    from trajscope.calibration.runner import job_prompts

    cal, out = calibrated
    html = cal.report.read_text(encoding="utf-8")
    states = [s for s in cal.states if s.job.section == section]
    assert states
    for state in states:
        study = study_of(state.job)
        res = Result.load(out / state.job.folder, state.job.study)
        _, body, _ = study.section(res)
        assert body in html, state.job.key
        config = state.job.config()
        prompts = job_prompts(sample_model, cal.inputs, state.job, config)
        with sample_model.numerics(threads=1):
            alone = study.run(sample_model, prompts, config)
        stored = json.loads((out / state.job.folder / f"{state.job.study}.result.json").read_text())["summaries"]
        assert _timeless(json.loads(json.dumps(alone.summaries, default=str))) == _timeless(stored), state.job.key


def test_verdict_evidence_is_the_tables_numbers(calibrated):
    cal, out = calibrated
    arms = Result.load(out / "studies" / "monitor", "monitor").table("monitor_vs_null")
    rows = [v for v in cal.verdicts if v["kind"] == "monitor"]
    assert rows and len(rows) == arms.height
    for v in rows:
        r = arms.filter((arms["monitor"] == v["artefact"]) & (arms["label"] == v["regime"])).row(0, named=True)
        assert v["evidence"].startswith(f"AUROC vs {r['null']} {verdict.interval(r['value'], r['lo'], r['hi'])}")
    sae = json.loads((out / "studies" / "sae-drift" / "sae-drift.result.json").read_text())["summaries"]
    for v in (v for v in cal.verdicts if v["kind"] == "sae"):
        d = sae[f"fvu decode {v['artefact']}"]
        assert verdict.interval(d["value"], d["lo"], d["hi"]) in v["evidence"]


@pytest.mark.parametrize("pre,dec,expect", [
    ((0.10, 0.08, 0.12, 0.09, 0.13), (0.11, 0.09, 0.125), "transfers"),
    ((0.10, 0.08, 0.12, 0.09, 0.13), (0.20, 0.15, 0.25), "degrades"),
    ((0.10, 0.08, 0.12, 0.09, 0.13), (0.70, 0.55, 0.80), "fails"),
    ((0.10, 0.08, 0.12, 0.09, 0.13), (0.14, 0.10, 0.30), "undecided"),
])
def test_the_sae_rule(pre, dec, expect):
    s = {"fvu prefill m": dict(zip(("value", "lo", "hi", "seed_min", "seed_max"), pre)),
         "fvu decode m": dict(zip(("value", "lo", "hi"), dec))}
    (v,) = verdict.sae_verdicts(Result("sae-drift", summaries=s), "job")
    assert v.verdict == expect


@pytest.mark.parametrize("dec,expect", [((0.99, 0.985, 0.995), "transfers"), ((0.95, 0.93, 0.96), "degrades"),
                                        ((0.6, 0.5, 0.7), "fails"), ((0.98, 0.96, 0.99), "undecided")])
def test_the_sae_ce_rule(dec, expect):
    s = {"ce recovered prefill m": {"value": 0.99, "lo": 0.98, "hi": 0.995},
         "ce recovered decode m": dict(zip(("value", "lo", "hi"), dec)),
         "ce recovered decode m − base": {"value": 0.0, "lo": -0.1, "hi": 0.1}}
    (v,) = verdict.sae_ce_verdicts(Result("sae-bench", summaries=s), "job")
    assert v.verdict == expect


@pytest.mark.parametrize("succ,expect", [((0.5, 0.3, 0.7), "transfers"), ((0.1, 0.02, 0.2), "degrades"),
                                         ((0.0, 0.0, 0.05), "fails"), ((0.0, 0.0, 0.49), "undecided"),
                                         ((0.3, 0.1, 0.5), "undecided")])
def test_the_success_rule(succ, expect):
    rows = [{"start_step": 1, "n": 16, "success": {"value": 0.5, "lo": 0.3, "hi": 0.7}},
            {"start_step": 8, "n": 16, "success": dict(zip(("value", "lo", "hi"), succ))}]
    (v,) = verdict.success_verdicts(Result("steering-success", summaries={"by_depth": rows}), "job", "vec")
    assert v.verdict == expect and v.regime == "success from step 8"


def test_no_success_at_the_reference_decides_nothing():
    rows = [{"start_step": 1, "n": 4, "success": {"value": 0.0, "lo": 0.0, "hi": 0.49}},
            {"start_step": 4, "n": 4, "success": {"value": 0.0, "lo": 0.0, "hi": 0.49}}]
    (v,) = verdict.success_verdicts(Result("steering-success", summaries={"by_depth": rows}), "job", "vec")
    assert v.verdict == "undecided"


@pytest.mark.parametrize("k,expect", [((1.0, 0.9, 1.1), "transfers"), ((0.5, 0.4, 0.6), "degrades"),
                                      ((0.3, -0.1, 0.7), "fails"), ((0.9, 0.6, 1.2), "undecided")])
def test_the_vector_rule(k, expect):
    eff = [{"start_step": 1, "strength": 2.0, "value": 1.0, "lo": 0.8, "hi": 1.2},
           {"start_step": 8, "strength": 2.0, **dict(zip(("value", "lo", "hi"), k))}]
    (v,) = verdict.vector_verdicts(Result("steering", summaries={"effect": eff}), "job", "vec")
    assert v.verdict == expect


@pytest.mark.parametrize("auroc,fpr_lo,expect", [((0.9, 0.8, 0.97), 0.0, "transfers"), ((0.6, 0.55, 0.65), 0.0, "degrades"),
                                                 ((0.5, 0.4, 0.6), 0.0, "fails"), ((0.9, 0.8, 0.97), 0.2, "fails"),
                                                 ((0.7, 0.6, 0.8), 0.0, "undecided"), ((0.6, 0.3, 0.9), 0.0, "undecided")])
def test_the_monitor_rule(auroc, fpr_lo, expect):
    import polars as pl

    t = pl.DataFrame([{"monitor": "m", "shift": "steer", "strength": 0.0, "measure": "AUROC", "value": 0.5,
                       "lo": 0.4, "hi": 0.6, "n_prompts": 9, "fpr_target": 0.05, "fpr_heldout": fpr_lo,
                       "fpr_heldout_lo": fpr_lo, "fpr_heldout_hi": 0.3}])
    arm = pl.DataFrame([{"shift": "steer", "label": "steer s=1", "strength": 1.0, "monitor": "m", "null": "steer s=0",
                         "n_prompts": 9, "value": auroc[0], "lo": auroc[1], "hi": auroc[2]}])
    (v,) = verdict.monitor_verdicts(Result("monitor", tables={"monitor_summary": t, "monitor_vs_null": arm}), "job")
    assert v.regime == "steer s=1"
    assert v.verdict == expect


def test_ids_are_renumbered_in_order():
    a = '<div id="0f8e1c2a-1111-4222-8333-444455556666" data-root-id="p1234"></div>{"id":"p1234"},{"id":"p1240"}'
    b = a.replace("p1234", "p2001").replace("p1240", "p2002").replace("0f8e1c2a", "aaaaaaaa")
    assert page.canonical_ids(a) == page.canonical_ids(b) and "p1001" in page.canonical_ids(a)


@pytest.mark.soak
def test_a_kill_mid_run_then_resume_reruns_only_the_unfinished_study(calibrated, tmp_path):
    """kill -9 once the first study is done; the second call resumes it and the report equals the
    straight-through one byte for byte."""
    cal, _ = calibrated
    out = tmp_path / "resumed"
    cmd = [sys.executable, "-m", "trajscope.cli", "calibrate", "--model", "sample", "--threads", "1", "--out",
           str(out), *_set_flags(TINY)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stderr=subprocess.PIPE, text=True)
    first = out / "studies" / "drift" / "drift.result.json"
    deadline = time.time() + 600
    while not first.is_file() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)  # at once: a fixed wait let a fast second study finish before the kill
    proc.wait()
    assert first.is_file() and not (out / "report.html").exists()
    done = run = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "drift: resumed" in done.stderr and "sae-drift: done" in done.stderr, done.stderr[-2000:]
    assert (out / "report.html").read_bytes() == cal.report.read_bytes()
    assert not [p for p in (out / "studies").rglob(".*")]  # no temporary leftovers
    again = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and ": done" not in again.stderr, again.stderr[-2000:]  # every study resumed


def test_bad_input_is_one_sentence_and_writes_nothing(tmp_path, sample_model):
    from safetensors.torch import save_file

    from trajscope.steering import SteeringVector

    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(TrajscopeError, match="holds no prompts"):
        calibrate(sample_model, tmp_path / "o1", prompts=[str(empty)])
    sae = tmp_path / "sae"
    sae.mkdir()
    (sae / "cfg.json").write_text(json.dumps({"d_in": 999, "metadata": {"layer": 3, "model_name": "other"}}))
    with pytest.raises(TrajscopeError, match="999"):
        calibrate(sample_model, tmp_path / "o2", saes=[str(sae)])
    vec = tmp_path / "v.safetensors"
    SteeringVector(layer=2, direction=torch.ones(7)).save(vec)
    with pytest.raises(TrajscopeError, match="is 7 wide"):
        calibrate(sample_model, tmp_path / "o3", vectors=[str(vec)])
    deep = tmp_path / "deep.safetensors"
    SteeringVector(layer=40, direction=torch.ones(sample_model.d_model)).save(deep)
    with pytest.raises(TrajscopeError, match="steers layer 40"):
        calibrate(sample_model, tmp_path / "o4", vectors=[str(deep)])
    prof = tmp_path / "p.safetensors"
    save_file({"mean": torch.zeros(3)}, str(prof), metadata={"info": json.dumps(
        {"model_id": "some-other-model", "n_layers": 12, "d_model": 768})})
    with pytest.raises(TrajscopeError, match="not on this run's model|built on 'some-other-model'"):
        calibrate(sample_model, tmp_path / "o5", profile=str(prof))
    with pytest.raises(TrajscopeError, match="has no setting 'nope'"):
        calibrate(sample_model, tmp_path / "o6", settings={"steering": {"nope": 1}})
    assert not any((tmp_path / f"o{i}").exists() for i in range(1, 7))


def test_the_cli_says_one_sentence(tmp_path):
    from trajscope.cli import main

    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert main(["calibrate", "--model", "sample", "--prompts", str(empty), "--out", str(tmp_path / "o")]) == 2
    assert main(["calibrate", "--model", "sample", "--set", "steering.depths", "--out", str(tmp_path / "o")]) == 2
    assert not (tmp_path / "o").exists()


def test_a_spent_budget_starts_no_further_study_and_the_page_says_so(tmp_path):
    cal = calibrate("sample", tmp_path / "b", settings=TINY, only=("drift", "steering"), budget_minutes=1e-4,
                    threads=1)
    assert [(s.job.study, s.state) for s in cal.states] == [("drift", "done"), ("steering", "budget")]
    html = cal.report.read_text(encoding="utf-8")
    assert "steering</b> not run: the budget of" in html
    status = json.loads((tmp_path / "b" / "calibration.json").read_text())
    assert [j["state"] for j in status["jobs"]] == ["done", "budget"]


def test_below_the_n_floor_a_verdict_is_undecided():
    import polars as pl

    t = pl.DataFrame([{"monitor": "m", "shift": "steer", "strength": 0.0, "measure": "AUROC", "value": 0.5, "lo": 0.4,
                       "hi": 0.6, "n_prompts": 4, "fpr_target": 0.05, "fpr_heldout": 0.0, "fpr_heldout_lo": 0.0,
                       "fpr_heldout_hi": 0.3}])
    arm = pl.DataFrame([{"shift": "steer", "label": "steer s=1", "strength": 1.0, "monitor": "m", "null": "steer s=0",
                         "n_prompts": 4, "value": 1.0, "lo": 1.0, "hi": 1.0}])  # a perfect split of 4 prompts
    (v,) = verdict.monitor_verdicts(Result("monitor", tables={"monitor_summary": t, "monitor_vs_null": arm}), "job")
    assert v.verdict == "undecided"
    s = {"ce recovered prefill m": {"value": 0.99, "lo": 0.98, "hi": 0.995},
         "ce recovered decode m": {"value": 0.99, "lo": 0.985, "hi": 0.995, "n_files": 2}}
    assert verdict.sae_ce_verdicts(Result("sae-bench", summaries=s), "job")[0].verdict == "undecided"


def test_the_page_does_not_depend_on_what_the_process_imported(calibrated, tmp_path):
    """Bokeh adds the definitions of every custom model registered in the process (Panel's, once Panel is
    imported) to a document's JSON; the page leaves them out, so drawing it with Panel imported gives the
    same bytes as the CLI's process without Panel."""
    import shutil

    import panel  # noqa: F401  (registers Panel's models with Bokeh)

    cal, out = calibrated
    copy = shutil.copytree(out, tmp_path / "copy")
    path, _ = report.write(copy, cal.inputs, cal.summary["model"], cal.states, quick=False)
    assert path.read_bytes() == cal.report.read_bytes()
    assert page.drop_defs('{"roots":[1],"defs":[{"a":"x]\\\\"},[2]],"b":2}') == '{"roots":[1],"b":2}'
