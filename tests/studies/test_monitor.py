"""The monitor study: its measures against independent code, a planted shift and a null on the sample
model, and the whole study through ``trajscope study monitor`` and ``Result.save/load``."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest

from trajscope.errors import TrajscopeError
from trajscope.studies.monitor import MonitorConfig, measures as M
from trajscope.studies.monitor.config import file_of
from trajscope.studies.monitor.study import run, split_prompts, summary_table
from trajscope.studies.registry import Result, get

PROMPTS = "sample_data/prompts/heldout_code.jsonl"


# ---- measures ---------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(6))
def test_auroc_equals_scikit_learn_on_scores_with_ties(seed):
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 80))
    labels = rng.random(n) < 0.4
    labels[:2] = [True, False]  # both classes
    scores = rng.integers(0, 6, n).astype(float) + labels * rng.integers(0, 3)  # few values: many ties
    assert M.auroc(scores, labels) == pytest.approx(roc_auc_score(labels, scores), abs=1e-12)


def test_auroc_extremes_and_refusals():
    assert M.auroc([3, 4, 5, 0, 1, 2], [1, 1, 1, 0, 0, 0]) == 1.0
    assert M.auroc([0, 1, 2, 3, 4, 5], [1, 1, 1, 0, 0, 0]) == 0.0
    assert M.auroc([1, 1, 1, 1], [1, 0, 1, 0]) == 0.5  # all tied: chance
    with pytest.raises(TrajscopeError, match="both classes"):
        M.auroc([1.0, 2.0], [1, 1])


def test_auroc_interval_resamples_prompts_and_covers_the_estimate():
    rng = np.random.default_rng(0)
    n = 30
    clean, shifted = rng.normal(0, 1, n), rng.normal(1, 1, n)
    scores = np.r_[clean, shifted]
    labels = np.r_[np.zeros(n, bool), np.ones(n, bool)]
    prompts = np.r_[np.arange(n), np.arange(n)]
    iv = M.auroc_interval(scores, labels, prompts, n_boot=300)
    assert iv.n_clusters == n and iv.lo < iv.estimate < iv.hi
    assert iv.estimate == M.auroc(scores, labels) and 0.6 < iv.estimate < 0.95


def test_a_paired_difference_is_narrower_than_its_parts_when_the_monitors_share_noise():
    rng = np.random.default_rng(2)
    n = 40
    common = rng.normal(0, 1, 2 * n)  # what both monitors see of each run
    labels = np.r_[np.zeros(n, bool), np.ones(n, bool)]
    a, b = common + 0.8 * labels + rng.normal(0, 0.2, 2 * n), common + 0.5 * labels + rng.normal(0, 0.2, 2 * n)
    prompts = np.r_[np.arange(n), np.arange(n)]
    d = M.auroc_difference(a, b, labels, prompts, n_boot=400)
    assert d.estimate == pytest.approx(M.auroc(a, labels) - M.auroc(b, labels))
    one = M.auroc_interval(a, labels, prompts, n_boot=400)
    assert d.hi - d.lo < one.hi - one.lo and d.lo > 0


def test_threshold_holds_its_false_positive_rate_on_the_fitting_runs_and_on_fresh_ones():
    rng = np.random.default_rng(1)
    fit = rng.gamma(2.0, 1.0, 39)
    thr = M.fit_threshold(fit, 0.05)
    assert M.false_positive_rate(fit, thr).estimate <= 0.05
    fresh = M.false_positive_rate(rng.gamma(2.0, 1.0, 20_000), thr)
    assert fresh.estimate < 0.12  # conformal: ≤ 0.05 in expectation over fitting sets; this set's is one draw
    with pytest.raises(TrajscopeError, match="at least 19"):
        M.fit_threshold(fit[:10], 0.05)


def test_time_to_detect_counts_from_k_and_censors_undetected_runs():
    assert M.detect_step([1, 2, 3, 4, 5], [9, 0, 0, 2, 3], 1.5, start_step=3) == 4  # step 1 is before k
    assert M.detect_step([1, 2, 3], [0, 0, 0], 1.5, start_step=2) is None
    # 4 runs detected at k+0, k+0, k+2 and one never (last step k+5): KM median 0 (S drops to 0.5 at t = 0)
    iv = M.time_to_detect([8, 8, 10, None], [13, 13, 13, 13], 8)
    assert iv.estimate == 0.0 and iv.n_clusters == 4
    never = M.time_to_detect([None, None, 9], [13, 13, 13], 8)  # most never detected: median not reached
    assert never.estimate == float("inf")


def test_prompt_file_and_split_are_by_source_file():
    assert file_of("chat_cooking.jsonl#3") == "chat_cooking.jsonl" and file_of("base64.py:51:b64encode") == "base64.py"
    ids = [f"f{i % 4}.py#{i}" for i in range(16)]
    parts = split_prompts(ids, MonitorConfig())
    assert {file_of(i) for i in parts["fit"]}.isdisjoint({file_of(i) for i in parts["evaluate"]})
    assert sorted(parts["fit"] + parts["evaluate"]) == sorted(ids)
    named = split_prompts(ids, MonitorConfig(fit_files=("f0.py",)))
    assert named["fit"] == sorted(i for i in ids if i.startswith("f0.py"))
    with pytest.raises(TrajscopeError, match="at least two files"):
        split_prompts(["a.py#1", "a.py#2"], MonitorConfig())
    with pytest.raises(TrajscopeError, match="no prompt comes from"):
        split_prompts(ids, MonitorConfig(fit_files=("g.py",)))


@pytest.mark.parametrize("bad, match", [({"strengths": ("x",)}, "--strengths"), ({"start_step": 32}, "--start-step"),
                                        ({"temperature": 0.0}, "--temperature"), ({"fpr": 0.7}, "--fpr")])
def test_config_refuses_bad_settings_in_one_sentence(bad, match):
    with pytest.raises(TrajscopeError, match=match):
        MonitorConfig(**bad)


# ---- the study on the sample model --------------------------------------------------------------
@pytest.fixture(scope="module")
def planted(sample_model):
    """A random direction at a very large strength (300 × a unit vector at layer 1) vs its null (0)."""
    from trajscope.studies import prompts as P

    prompts = P.encode_prompts(sample_model, P.read_prompt_file(PROMPTS, 40), 64)
    cfg = MonitorConfig(vector="random", strengths=(0.0, 300.0), new_tokens=12, start_step=4, fpr=0.1, n_boot=400)
    return run(sample_model, prompts, cfg), cfg


def test_a_planted_shift_is_detected_and_the_null_is_chance(planted):
    result, cfg = planted
    s = result.tables["monitor_summary"]
    assert set(s["monitor"]) == {"drift", "attn-sink", "attn-entropy", "sae:layer3-prefill-only", "sae:layer3-hybrid"}
    big = s.filter(pl.col("strength") == 300.0)
    assert big["value"].min() > 0.95, big  # every monitor sees the planted shift
    drift = big.filter(pl.col("monitor") == "drift").row(0, named=True)
    assert drift["n_detected"] == drift["n_shifted"] > 0 and drift["ttd_median"] == 0.0
    null = s.filter((pl.col("strength") == 0.0) & pl.col("monitor").is_in(["drift", "sae:layer3-prefill-only"]))
    for r in null.iter_rows(named=True):  # strength 0: the arms differ only by seed
        assert r["lo"] <= 0.5 <= r["hi"], r
    assert (s["fpr_fit"] <= cfg.fpr).all()  # the threshold's rate holds on the runs it was fitted on


def test_the_null_arm_is_an_unsteered_run_with_the_other_seed(planted, sample_model):
    from trajscope.capture import CaptureConfig, capture
    from trajscope.studies import prompts as P
    from trajscope.studies.monitor.study import shifted_text

    result, cfg = planted
    runs = result.tables["monitor_runs"].filter(pl.col("part") == "evaluate")
    pid = runs["prompt_id"][0]
    ids = dict(P.encode_prompts(sample_model, P.read_prompt_file(PROMPTS, 40), 64))[pid]
    plain = capture(sample_model, ids, CaptureConfig(max_new_tokens=cfg.new_tokens, temperature=cfg.temperature,
                                                     seed=cfg.seed + 1, stop_at_eos=False, prefill_rows=1))
    text = {(r["arm"], r["strength"]): r["text_from_k"] for r in runs.filter(pl.col("prompt_id") == pid).iter_rows(named=True)}
    assert text[("shifted", 0.0)] == shifted_text(plain, cfg.start_step)  # s = 0: only the seed differs
    assert text[("shifted", 300.0)] != text[("shifted", 0.0)]  # the planted shift changes the text


def test_the_tables_agree_with_each_other(planted):
    result, cfg = planted
    runs, steps = result.tables["monitor"], result.tables["monitor_steps"]
    split = result.summaries["split"]
    assert set(split["fit_files"]).isdisjoint(split["evaluate_files"])
    assert runs.filter(pl.col("part") == "fit")["arm"].unique().to_list() == ["clean"]
    # a run score is the max of its step scores from step k on
    one = runs.filter((pl.col("arm") == "shifted") & (pl.col("monitor") == "drift")).row(0, named=True)
    mine = steps.filter((pl.col("prompt_id") == one["prompt_id"]) & (pl.col("strength") == one["strength"])
                        & (pl.col("monitor") == "drift") & (pl.col("step") >= cfg.start_step))
    assert one["run_score"] == mine["score"].max()
    assert summary_table(runs, cfg).equals(result.tables["monitor_summary"])
    pairs, summary = result.tables["monitor_pairs"], result.tables["monitor_summary"]
    for r in pairs.iter_rows(named=True):  # the paired difference's estimate is the difference of the summary's AUROCs
        auc = {m: summary.filter((pl.col("strength") == r["strength"]) & (pl.col("monitor") == m))["value"][0]
               for m in (r["monitor"], "drift")}
        assert r["value"] == pytest.approx(auc[r["monitor"]] - auc["drift"], abs=1e-12) and r["lo"] <= r["hi"]
    assert pairs.height == 4 * len(cfg.strengths)
    texts = result.tables["monitor_runs"]  # one row per run, its text from step k on
    assert texts.height == runs.select("prompt_id", "arm", "strength").unique().height
    assert (texts["n_steps"] == cfg.new_tokens).all() and (texts["text_from_k"].str.len_chars() > 0).all()


def test_the_study_runs_from_the_command_line_and_reloads(tmp_path, capsys):
    from trajscope.cli import main
    from trajscope.reports.studies import detect, study_report

    with pytest.raises(SystemExit):
        main(["study", "monitor", "--help"])
    shown = capsys.readouterr().out
    assert "--strengths" in shown and "--fit-files" in shown and "false-positive rate" in shown
    out = tmp_path / "monitor"
    assert main(["study", "monitor", "--prompts", PROMPTS, "--max-prompts", "16", "--max-tokens", "48",
                 "--new-tokens", "8", "--start-step", "3", "--strengths", "0,50", "--vector", "random",
                 "--fpr", "0.2", "--n-boot", "100", "--saes", "none", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "monitor_summary" in printed and "AUROC" in printed
    marker = json.loads((out / "monitor.result.json").read_text())
    assert marker["config"]["strengths"] == [0.0, 50.0] and marker["config"]["saes"] == ["none"]
    loaded = Result.load(out, "monitor")
    cfg = MonitorConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in loaded.config.items()})
    assert summary_table(loaded.table("monitor"), cfg).equals(loaded.table("monitor_summary"))
    assert not loaded.table("monitor")["monitor"].str.starts_with("sae:").any()
    assert detect(out) == ["monitor"]
    title, html, _ = get("monitor").section(loaded)
    n = loaded.summaries["split"]["n_evaluate_prompts"]
    assert title == "Monitor transfer" and f"Evaluate ({n} prompts" in html and "AUROC" in html
    page = study_report([out], tmp_path / "r.html").read_text()
    assert "Monitor transfer" in page and "Detection AUROC by strength" in page
