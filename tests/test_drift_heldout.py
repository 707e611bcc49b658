"""Held-out drift report: named disjoint splits, the teacher-forced continuation regime against an
independent Hugging Face forward, position bins, trajectory-level calibration (known answer), the CLI."""

from __future__ import annotations

import importlib.util
import json
import pathlib

import numpy as np
import polars as pl
import pytest
import torch

import trajscope as ts
from tiny import hf_reference
from trajscope.capture import CaptureConfig
from trajscope.studies.drift.runs import continuation_residuals, prompt_regime_rows
from trajscope.studies.drift import regimes as dr
from trajscope.profile import DriftProbe, ReferenceProfile, profile_from_residuals
from trajscope.studies.drift.build import build_profile, check_file_disjoint, named_split, prompt_ids, source_files
from trajscope.prompts import read_prompts
from trajscope.conformal import calibrate_max, false_alarm_rate

ROOT = pathlib.Path(__file__).resolve().parents[1]
WORDS = ["def", "x", "=", "(", ")", "return", "if", "for", "in", "self", ":", "1", "'a'", "None", "import", "os"]


def items(n: int, seed: int, length: int = 14, cont: int = 40) -> list[dict]:
    rng = np.random.default_rng(seed)
    words = lambda k: " ".join(rng.choice(WORDS, size=k))  # noqa: E731
    return [{"id": f"p{i:02d}", "prompt": words(length), "continuation": " " + words(cont)} for i in range(n)]


def test_named_split_is_disjoint_in_files_deterministic_and_recorded(tiny_models):
    ids = [f"file{i % 10}.py:{i}:f" for i in range(60)]  # 10 source files, 6 prompts each
    a, b = named_split(ids, seed=0), named_split(list(reversed(ids)), seed=0)
    assert a == b and (len(a["fit"]), len(a["calibrate"]), len(a["evaluate"])) == (24, 18, 18)  # 4 / 3 / 3 files
    parts = [set(a[k]) for k in ("fit", "calibrate", "evaluate")]
    assert set.union(*parts) == set(ids) and sum(map(len, parts)) == 60
    files = [{i.split(":")[0] for i in part} for part in parts]  # each part's files, counted here
    assert not (files[0] & files[1] or files[0] & files[2] or files[1] & files[2])
    assert [a["files"][k] for k in ("fit", "calibrate", "evaluate")] == [sorted(f) for f in files]
    assert named_split(ids, seed=1)["fit"] != a["fit"]
    records = [{"id": f"r{i}", "prompt": "x", "file": f"f{i % 4}.py"} for i in range(12)]  # the record's file field wins
    by_field = named_split(prompt_ids(records), groups=source_files(records))
    assert {r["file"] for r in records if r["id"] in by_field["evaluate"]}.isdisjoint(
        {r["file"] for r in records if r["id"] in by_field["fit"]})
    with pytest.raises(ts.TrajscopeError, match="at least 3 files"):
        named_split([f"one.py:{i}" for i in range(9)])
    with pytest.raises(ts.TrajscopeError, match="unique"):
        named_split(["a", "a", "b", "c"])
    assert prompt_ids([{"prompt": "x"}, {"prompt": "y", "id": 7}]) == ["prompt-0", "7"]
    its = items(10, seed=1)
    ids = prompt_ids(its)
    split = named_split(ids, seed=3)
    prof = build_profile(tiny_models["llama"], [p["prompt"] for p in its], fpr=0.05, ids=ids, split=split,
                         progress=False)
    assert prof.info["split"]["fit"] == split["fit"] and prof.info["split"]["seed"] == 3
    assert prof.info["sink_excluded"] is True and prof.info["sink_pos"] == 0 and "sink_rule" in prof.info
    assert (prof.info["n_fit_prompts"], prof.info["n_heldout_prompts"]) == (len(split["fit"]), len(split["calibrate"]))
    # moments come from the fit prompts only: recompute them independently with NumPy
    xs = []
    for pid in split["fit"]:
        t = ts.capture(tiny_models["llama"], its[ids.index(pid)]["prompt"], max_new_tokens=1, residual_layers=[1])
        xs.append(t.residual(1)[1: t.prompt_len].double().numpy())
    x = np.concatenate(xs)
    np.testing.assert_allclose(prof.mean[1].numpy(), x.mean(0), atol=1e-9)
    np.testing.assert_allclose(prof.var[1].numpy(), x.var(0, ddof=1), rtol=1e-7)
    res = [{0: torch.randn(5, 4)} for _ in range(4)]
    with pytest.raises(ts.TrajscopeError, match="disjoint"):
        profile_from_residuals(res, fit=[0, 1], calibrate=[1, 2])


def test_a_split_whose_parts_share_a_file_is_refused():
    """The issue-31 defect: a split by prompt id gives fit and evaluate prompts of the same file."""
    by_id = {"fit": ["a.py:1", "b.py:1"], "calibrate": ["c.py:1"], "evaluate": ["a.py:2", "d.py:1"]}
    with pytest.raises(ts.TrajscopeError, match="fit and evaluate prompts share 1 source file.*'a.py'"):
        check_file_disjoint(by_id)
    check_file_disjoint({**by_id, "evaluate": ["d.py:1"]})  # disjoint: accepted
    with pytest.raises(ts.TrajscopeError, match="fit and calibrate"):  # a record's file field counts, not the id
        check_file_disjoint({"fit": ["x1"], "calibrate": ["x2"]}, {"x1": "same.py", "x2": "same.py"})
    with pytest.raises(ts.TrajscopeError, match="share"):
        build_profile(None, ["p", "q", "r"], ids=["a.py:1", "a.py:2", "b.py:1"],
                      split={"fit": ["a.py:1"], "calibrate": ["a.py:2"]}, progress=False)


def test_a_profile_split_by_prompt_id_evaluates_only_on_files_it_never_saw():
    from trajscope.studies.drift.study import held_out_split

    prof = ReferenceProfile(mean=torch.zeros(1, 4), var=torch.ones(1, 4), median_abs=torch.ones(1),
                            stat_mean=torch.ones(1, 5), stat_std=torch.ones(1, 5), threshold=torch.ones(1),
                            info={"split": {"fit": ["a.py:1", "b.py:1"], "calibrate": ["a.py:2", "c.py:1"]}})
    ids = ["a.py:1", "a.py:2", "a.py:3", "b.py:2", "c.py:1", "d.py:1", "d.py:2", "e.py:1"]
    out = held_out_split(prof, ids, "p")
    assert out["evaluate"] == ["d.py:1", "d.py:2", "e.py:1"]  # a.py:3 and b.py:2 are unseen prompts of seen files
    assert out["shared_fit_calibrate"] == ["a.py"] and out["files"]["evaluate"] == ["d.py", "e.py"]
    with pytest.raises(ts.TrajscopeError, match="source file that was"):
        held_out_split(prof, ["a.py:3", "b.py:2"], "p")


def test_continuation_states_equal_an_independent_hf_forward(tiny_models):
    model = tiny_models["llama"]
    prompt, cont = "def f(x):\n    return", " x + 1\n\nclass A:\n    pass\n"
    P, pos, resid, entropy = continuation_residuals(model, prompt, cont, 8)
    p_ids = model.tokenizer(prompt)["input_ids"]
    c_ids = model.tokenizer(cont, add_special_tokens=False)["input_ids"][:8]
    assert P == len(p_ids) and pos == list(range(P, P + 8))
    hf = hf_reference(model)
    grabbed, handles = {}, []
    for layer, block in enumerate(hf.model.layers):
        handles.append(block.register_forward_hook(
            lambda _m, _i, out, layer=layer: grabbed.__setitem__(layer, (out[0] if isinstance(out, tuple) else out)[0])))
    try:
        with torch.no_grad():
            out = hf(torch.tensor([p_ids + c_ids]), use_cache=False)
    finally:
        for h in handles:
            h.remove()
    for layer in range(model.n_layers):
        torch.testing.assert_close(resid[layer], grabbed[layer][P:].float(), atol=1e-4, rtol=1e-4)
    logp = torch.log_softmax(out.logits[0, P:].double(), -1)
    torch.testing.assert_close(entropy, -(logp.exp() * logp).sum(-1), atol=1e-4, rtol=1e-4)
    with pytest.raises(ts.TrajscopeError, match="continuation has"):
        continuation_residuals(model, prompt, " x", 8)


def test_regimes_share_positions_and_match_the_online_probe(tiny_models):
    model = tiny_models["llama"]
    its = items(8, seed=2)
    prof = build_profile(model, [p["prompt"] for p in its], fpr=0.05, progress=False)
    cfg = CaptureConfig(max_new_tokens=9, stop_at_eos=False)
    rows = prompt_regime_rows(model, prof, "p00", its[0], cfg)
    P = len(model.encode(its[0]["prompt"]))
    by = {r: g for (r,), g in rows.partition_by("regime", as_dict=True).items()}
    assert set(by) == set(dr.REGIMES)
    assert sorted(set(by["prefill"]["pos"])) == list(range(1, P))
    assert sorted(set(by["decode"]["pos"])) == sorted(set(by["continuation"]["pos"])) == list(range(P, P + 8))
    assert by["decode"].filter(pl.col("pos") == P)["step"].unique().to_list() == [1]
    # the online probe of capture (in-trace kernel) and the offline regime rows agree on the run statistic
    probe = DriftProbe(prof).calibrated([np.array([2.0])] * 19, 0.1)
    traj = ts.capture(model, its[0]["prompt"], max_new_tokens=9, stop_at_eos=False, probe=probe)
    offline = dr.run_statistics(rows, "decode")["run_statistic"].item()
    assert traj.meta["probe"]["run_statistic"] == pytest.approx(offline, rel=1e-4)
    assert traj.meta["probe"]["trajectory_flagged"] == (offline > probe.trajectory_threshold)
    only_cont = prompt_regime_rows(model, prof, "p00", its[0], cfg, decode=False)
    assert only_cont["regime"].unique().to_list() == ["continuation"] and only_cont["pos"].n_unique() == 8


def test_position_bins():
    edges = [0, 31, 32, 63, 64, 127, 128, 255, 256, 511, 512, 4000]
    want = ["0-31", "0-31", "32-63", "32-63", "64-127", "64-127", "128-255", "128-255", "256+", "256+",
            "256+", "256+"]
    assert [dr.pos_bin(p) for p in edges] == want
    got = pl.DataFrame({"pos": edges}).select(dr.pos_bin_expr(pl.col("pos")).alias("b"))["b"].to_list()
    assert got == want and tuple(dict.fromkeys(want)) == dr.POS_ORDER


def _synthetic_runs(rng: np.random.Generator, n: int, steps: int = 40, layers: int = 3) -> list[np.ndarray]:
    """Exchangeable prefill-like runs: a per-run level plus (step, layer) noise, heavy-ish tails."""
    return [rng.normal(0, 0.3) + rng.standard_t(5, size=(steps, layers)) for _ in range(n)]


def test_trajectory_calibration_false_alarm_rate_known_answer():
    """Calibrated on 99 runs at target 0.1 ((n+1)·target integer, continuous scores), the expected false-alarm
    rate on fresh exchangeable runs is exactly 0.1; averaged over 200 seeded calibrations it lies within 2 of its
    standard errors. The per-(step, layer) rule at the same nominal rate flags nearly every run."""
    rng = np.random.default_rng(0)
    target, rates = 0.1, []
    for _ in range(200):
        thr = calibrate_max(_synthetic_runs(rng, 99), target)
        rates.append(false_alarm_rate(_synthetic_runs(rng, 100), thr)[0])
    rates = np.array(rates)
    se = rates.std(ddof=1) / np.sqrt(rates.size)
    assert abs(rates.mean() - target) < 2 * se, (rates.mean(), se)
    cell_thr = np.quantile(np.concatenate([r.ravel() for r in _synthetic_runs(rng, 200)]), 1 - target)
    naive = np.mean([r.max() > cell_thr for r in _synthetic_runs(rng, 400)])
    assert naive > 0.9
    # through DriftProbe: probe tables in, the same threshold as calibrate_max out
    cal = _synthetic_runs(np.random.default_rng(1), 19)
    tables = [pl.DataFrame({"score": r.ravel() * 2.0, "threshold": np.full(r.size, 2.0)}) for r in cal]
    prof = ReferenceProfile(mean=torch.zeros(1, 2), var=torch.ones(1, 2), median_abs=torch.ones(1),
                            stat_mean=torch.ones(1, 5), stat_std=torch.ones(1, 5), threshold=torch.ones(1), info={})
    probe = DriftProbe(prof).calibrated(tables, 0.1)
    # n = 19 runs at 0.1: the ceil(20 · 0.9) = 18th smallest run maximum, so exactly the largest run is flagged
    assert probe.trajectory_threshold == calibrate_max(cal, 0.1) == sorted(r.max() for r in cal)[17]
    assert sum(probe.flags_run(t) for t in tables) == 1
    with pytest.raises(ts.TrajscopeError, match="no trajectory-level threshold"):
        DriftProbe(prof).flags_run(tables[0])


def test_summaries_have_prompt_clustered_intervals():
    rng = np.random.default_rng(4)
    rows = []
    for i in range(30):
        level = rng.normal(0, 0.5)
        for regime, shift in (("decode", 0.2), ("continuation", 0.0)):
            for p in range(40, 60):
                s = 1 + level + shift + rng.normal(0, 0.05)
                rows.append({"prompt_id": f"q{i}", "regime": regime, "pos": p, "layer": 0, "score": s,
                             "flagged": s > 1.5, "pos_bin": dr.pos_bin(p)})
    df = pl.DataFrame(rows)
    summ = dr.summarize(df, ("regime", "pos_bin", "layer"), n_boot=300)
    assert summ["regime"].to_list() == ["decode", "continuation"] and summ["n_prompts"].to_list() == [30, 30]
    d = summ.row(0, named=True)
    assert d["score_lo"] < d["score"] < d["score_hi"] and d["score_hi"] - d["score_lo"] > 0.2  # between-prompt spread
    gap = dr.paired_gap(df, ("pos_bin", "layer"), n_boot=300).row(0, named=True)
    assert gap["score_gap"] == pytest.approx(0.2, abs=0.02) and gap["score_gap_hi"] - gap["score_gap_lo"] < 0.03
    assert gap["n"] == 20 * 30 and gap["n_prompts"] == 30


def test_prompts_from_one_file_resample_together():
    """Two prompts cut from each of 12 files share their file's level: clustering by file widens the interval
    (by about √2 here); clustering by prompt would count each file twice as independent evidence."""
    rng = np.random.default_rng(7)
    rows = []
    for f in range(12):
        level = rng.normal(0, 0.5)
        for copy in range(2):
            for p in range(40, 50):
                s = 1 + level + rng.normal(0, 0.01)
                rows.append({"prompt_id": f"f{f}:{copy}", "cluster": f"f{f}.py", "regime": "decode", "pos": p,
                             "layer": 0, "score": s, "flagged": s > 1.5, "pos_bin": dr.pos_bin(p)})
    df = pl.DataFrame(rows)
    by_prompt = dr.summarize(df, ("regime", "layer"), n_boot=2000).row(0, named=True)
    by_file = dr.summarize(df, ("regime", "layer"), n_boot=2000, cluster="cluster").row(0, named=True)
    assert by_file["n_clusters"] == 12 and by_file["n_prompts"] == 24 and by_prompt["n_clusters"] == 24
    ratio = (by_file["score_hi"] - by_file["score_lo"]) / (by_prompt["score_hi"] - by_prompt["score_lo"])
    assert 1.2 < ratio < 1.7, ratio
    assert dr.heldout_fpr(df.with_columns(pl.lit("prefill").alias("regime")), n_boot=200,
                          cluster="cluster")["n_clusters"].to_list() == [12]


def test_shipped_prompts_keep_a_long_enough_continuation(sample_model):
    its = read_prompts(ROOT / "sample_data" / "prompts" / "heldout_code.jsonl")
    assert len(its) == 60
    for it in its:
        n = len(sample_model.tokenizer(it["continuation"], add_special_tokens=False)["input_ids"])
        assert n >= 127, (it["id"], n)
    spec = importlib.util.spec_from_file_location("make_prompts", ROOT / "scripts" / "make_prompts.py")
    mp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mp)
    src = "import os\n# a comment line that makes the prompt long enough to be kept by the script\n\n\ndef f(a, b):\n    \"\"\"Add two numbers and return the sum of them.\"\"\"\n    return a + b\n" \
          + "x = 1\n" * 400
    (p,) = mp.function_prompts("m.py", src, context_lines=4)
    assert src.startswith(p["prompt"] + p["continuation"][:50], src.index(p["prompt"]))
    assert len(p["continuation"]) >= mp.CONTINUATION_CHARS and p["continuation"].endswith("\n")


def test_drift_cli_end_to_end(tiny_dirs, tmp_path, capsys):
    from trajscope.cli import main

    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps(p) for p in items(14, seed=9)))
    model = str(tiny_dirs["llama"])
    prof_path = tmp_path / "prof.safetensors"
    assert main(["profile", "--model", model, "--prompts", str(prompts), "--fpr", "0.05", "--out", str(prof_path),
                 "--quiet"]) == 0
    split = ReferenceProfile.load(prof_path).info["split"]
    assert main(["drift", "--model", model, "--prompts", str(prompts), "--profile", str(prof_path),
                 "--max-new-tokens", "10", "--no-eos", "--trajectory-rate", "0.25", "--n-boot", "200", "--quiet",
                 "--out", str(tmp_path / "drift")]) == 0
    out = capsys.readouterr().out
    for fragment in ("held-out prefill false-positive rate", "decode minus continuation", "trajectory-level flag",
                     f"evaluate {len(split['evaluate'])}"):
        assert fragment in out
    pos = pl.read_parquet(tmp_path / "drift" / "drift_positions.parquet")
    ev = set(pos.filter(pl.col("split") == "evaluate")["prompt_id"])
    assert ev == set(split["evaluate"]) and not ev & (set(split["fit"]) | set(split["calibrate"]))
    assert set(pos.filter(pl.col("split") == "calibrate")["regime"]) == {"continuation"}
    marker = json.loads((tmp_path / "drift" / "drift.result.json").read_text())
    assert marker["summaries"]["split"]["sizes"] == {k: len(split[k]) for k in ("fit", "calibrate", "evaluate")}
    assert (tmp_path / "drift" / "profile.safetensors").is_file()
    bp = pl.read_parquet(tmp_path / "drift" / "drift_by_position.parquet")
    assert {"score_lo", "score_hi", "flagged_frac_lo", "n_prompts"} <= set(bp.columns)
    assert set(bp["regime"]) == set(dr.REGIMES)
    traj = pl.read_parquet(tmp_path / "drift" / "drift_trajectory.parquet")
    assert traj["n"].to_list() == [len(split["evaluate"])] * 4 and set(traj["rule"]) == {"trajectory", "any cell"} and traj["n_calibrate"][0] == len(split["calibrate"])
    # a profile without a recorded split, or one that saw every prompt, cannot give a held-out report
    ReferenceProfile(mean=torch.zeros(2, 32), var=torch.ones(2, 32), median_abs=torch.ones(2), stat_mean=torch.ones(2, 5),
                     stat_std=torch.ones(2, 5), threshold=torch.ones(2), info={"model_id": "x"}).save(tmp_path / "old.st")
    assert main(["drift", "--model", model, "--prompts", str(prompts), "--profile", str(tmp_path / "old.st"),
                 "--out", str(tmp_path / "x")]) == 2
    assert "records no fit/calibrate split" in capsys.readouterr().err
    seen = tmp_path / "seen.jsonl"
    seen.write_text("\n".join(json.dumps(p) for p in items(14, seed=9) if p["id"] in split["fit"]))
    assert main(["drift", "--model", model, "--prompts", str(seen), "--profile", str(prof_path),
                 "--out", str(tmp_path / "x")]) == 2
    assert "needs held-out prompts" in capsys.readouterr().err


def test_trajectory_calibration_reports_the_exact_conformal_rate():
    stats = lambda v: pl.DataFrame({"prompt_id": [f"r{i}" for i in range(len(v))], "run_statistic": v})  # noqa: E731
    out = dr.trajectory_calibration(stats(np.arange(18.0)), {"held": stats(np.array([16.5, 17.5, 3.0]))}, 0.1)
    assert out["threshold"] == 17.0 and out["expected_rate"] == pytest.approx(1 / 19)  # the max of 18
    assert out["rates"]["held"]["k"] == 1 and out["rates"]["held"]["n"] == 3
    assert out["rates"]["held, any flagged cell"]["k"] == 3  # every statistic above 1
    out = dr.trajectory_calibration(stats(np.arange(19.0)), {"held": stats(np.array([1.0]))}, 0.1)
    assert out["threshold"] == 17.0 and out["expected_rate"] == pytest.approx(0.1)  # (n+1)·target = 2


def test_a_profile_split_by_file_only_holds_out_the_other_files():
    """`trajscope prepare` records ``split_groups`` (files per part) and no prompt ids; evaluate = other files."""
    from types import SimpleNamespace

    from trajscope.studies.drift.study import held_out_split

    prof = SimpleNamespace(info={"split_groups": {"fit": ["a.jsonl"], "calibrate": ["b.jsonl"], "evaluate": ["c.jsonl"]}})
    out = held_out_split(prof, ["a.jsonl#0", "b.jsonl#1", "c.jsonl#2", "d.jsonl#3"], "p")
    assert out["evaluate"] == ["c.jsonl#2", "d.jsonl#3"] and out["calibrate"] == []
    assert out["files"]["fit"] == ["a.jsonl"] and out["files"]["calibrate"] == ["b.jsonl"]
