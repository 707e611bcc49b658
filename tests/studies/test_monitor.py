"""The monitor study: its measures against independent code, planted shifts (steering, a topic switch, a forced
random-token run) and their nulls on the sample model, the replay machinery against plain decode, the headline
numbers read from one function, and the whole study through ``trajscope study monitor`` and ``Result.save/load``."""

from __future__ import annotations

import json
import math

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
                                        ({"temperature": 0.0}, "--temperature"), ({"fpr": 0.7}, "--fpr"),
                                        ({"shifts": ("steer", "typo")}, "--shifts"), ({"shifts": ()}, "--shifts"),
                                        ({"forced_tokens": 24}, "--forced-tokens"),
                                        ({"switch_text": "  "}, "--switch-text")])
def test_config_refuses_bad_settings_in_one_sentence(bad, match):
    with pytest.raises(TrajscopeError, match=match):
        MonitorConfig(**bad)


# ---- the study on the sample model --------------------------------------------------------------
SWITCH = " # Les volcans"  # 7 tokens of the sample model


@pytest.fixture(scope="module")
def planted(sample_model):
    """A random direction at a very large strength (300 × a unit vector at layer 1) vs its null (0); a topic switch
    and 6 forced random tokens from step 4 vs their replay null."""
    from trajscope.studies import prompts as P

    prompts = P.encode_prompts(sample_model, P.read_prompt_file(PROMPTS, 40), 64)
    cfg = MonitorConfig(vector="random", strengths=(0.0, 300.0), new_tokens=14, start_step=4, fpr=0.1, n_boot=400,
                        forced_tokens=6, switch_text=SWITCH)
    return run(sample_model, prompts, cfg), cfg


def test_a_planted_shift_is_detected_and_the_null_is_chance(planted):
    result, cfg = planted
    s = result.tables["monitor_summary"]
    assert set(s["monitor"]) == {"drift", "attn-sink", "attn-entropy", "sae:layer3-prefill-only", "sae:layer3-hybrid"}
    assert s["label"].unique(maintain_order=True).to_list() == [
        "steer s=0 (null)", "steer s=300", "replay (null of topic, forced)", "topic switch", "forced 6 random tokens"]
    big = s.filter((pl.col("shift") == "steer") & (pl.col("strength") == 300.0))
    assert big["value"].min() > 0.95, big  # every monitor sees the planted shift
    drift = big.filter(pl.col("monitor") == "drift").row(0, named=True)
    assert drift["n_detected"] == drift["n_shifted"] > 0 and drift["ttd_median"] == 0.0
    null = s.filter((pl.col("shift") == "steer") & (pl.col("strength") == 0.0)
                    & pl.col("monitor").is_in(["drift", "sae:layer3-prefill-only"]))
    for r in null.iter_rows(named=True):  # strength 0: the arms differ only by seed
        assert r["lo"] <= 0.5 <= r["hi"], r
    assert (s["fpr_fit"] <= cfg.fpr).all()  # the threshold's rate holds on the runs it was fitted on


def test_a_forced_random_token_run_is_detected_and_the_replay_null_is_chance(planted):
    result, cfg = planted
    s = result.tables["monitor_summary"]
    forced = s.filter(pl.col("shift") == "forced")
    best = forced.sort("value").row(-1, named=True)
    assert best["value"] > 0.95 and best["lo"] > 0.5, forced  # the SAE sees random tokens in its layer's input
    assert forced.filter(pl.col("monitor") == "sae:layer3-hybrid")["value"][0] > 0.95
    assert all(v >= 1 for v in forced["ttd_median"] if math.isfinite(v))  # a forced token is first read at step k + 1
    for r in s.filter(pl.col("shift") == "replay").iter_rows(named=True):  # same machinery, nothing forced
        assert r["lo"] <= 0.5 <= r["hi"], r


def test_a_replayed_run_scores_its_shared_steps_as_plain_decode_does(planted):
    """Steps 1..k of a replay, topic or forced run read the same k sampled tokens as the s = 0 steering run
    (seed + 1, no vector), once as a second capture's prefill and once as decode: the monitors' values agree;
    from step k + 1 on the forced arm reads other tokens."""
    result, cfg = planted
    steps, k = result.tables["monitor_steps"], cfg.start_step
    ref = steps.filter((pl.col("shift") == "steer") & (pl.col("strength") == 0.0) & (pl.col("part") == "evaluate"))
    for shift in ("replay", "topic", "forced"):
        mine = steps.filter(pl.col("shift") == shift).join(ref, on=["prompt_id", "monitor", "step"], suffix="_ref")
        early = mine.filter(pl.col("step") <= k)
        assert early.height == ref.filter(pl.col("step") <= k).height > 0
        np.testing.assert_allclose(early["value"].to_numpy(), early["value_ref"].to_numpy(), rtol=2e-3, atol=2e-4)
    forced = steps.filter(pl.col("shift") == "forced").join(ref, on=["prompt_id", "monitor", "step"], suffix="_ref")
    late = forced.filter((pl.col("step") == k + 1) & pl.col("monitor").str.starts_with("sae:"))
    assert (late["value"] - late["value_ref"]).abs().max() > 1e-3


def test_each_arm_against_its_null_equals_scikit_learn_on_the_run_scores(planted):
    from sklearn.metrics import roc_auc_score

    result, cfg = planted
    runs, vs_null = result.tables["monitor"], result.tables["monitor_vs_null"]
    assert vs_null.height == 5 * 3  # steer s=300 vs s=0, topic and forced vs replay; 5 monitors
    for r in vs_null.iter_rows(named=True):
        null = ("steer", 0.0) if r["shift"] == "steer" else ("replay", None)
        mine = runs.filter((pl.col("monitor") == r["monitor"]) & (pl.col("shift") == r["shift"])
                           & pl.col("strength").eq_missing(r["strength"]) & (pl.col("part") == "evaluate"))
        base = runs.filter((pl.col("monitor") == r["monitor"]) & (pl.col("shift") == null[0])
                           & pl.col("strength").eq_missing(null[1]) & (pl.col("part") == "evaluate"))
        y = [1] * mine.height + [0] * base.height
        assert r["value"] == pytest.approx(roc_auc_score(y, mine["run_score"].to_list() + base["run_score"].to_list()))
        assert r["lo"] <= r["value"] <= r["hi"] and r["n_prompts"] == mine.height


def test_the_forced_tokens_are_the_ones_written(planted, sample_model):
    from trajscope.studies.monitor.study import forced_ids

    result, cfg = planted
    runs = result.tables["monitor_runs"].filter(pl.col("part") == "evaluate")
    topic = runs.filter(pl.col("shift") == "topic")
    assert (topic["forced_text"] == SWITCH).all() and topic["text_from_k"].str.starts_with(SWITCH).all()
    forced = runs.filter(pl.col("shift") == "forced")
    assert forced["forced_text"].n_unique() == forced.height  # one seeded draw per prompt
    assert all(a.startswith(f) and a.endswith(b) for a, f, b in
               zip(forced["text_from_k"], forced["forced_text"], forced["text_after_shift"]))
    assert (runs["n_steps"] == cfg.new_tokens).all() and (runs.filter(pl.col("shift") == "replay")["forced_text"] == "").all()
    draw = forced_ids(sample_model, cfg, "forced", 3)
    assert draw == forced_ids(sample_model, cfg, "forced", 3) and len(draw) == cfg.forced_tokens
    assert not set(draw) & set(sample_model.tokenizer.all_special_ids)


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
    text = {(r["shift"], r["strength"]): r["text_from_k"] for r in runs.filter(pl.col("prompt_id") == pid).iter_rows(named=True)}
    assert text[("steer", 0.0)] == shifted_text(plain, cfg.start_step)  # s = 0: only the seed differs
    assert text[("steer", 300.0)] != text[("steer", 0.0)]  # the planted shift changes the text


def test_the_tables_agree_with_each_other(planted):
    result, cfg = planted
    runs, steps = result.tables["monitor"], result.tables["monitor_steps"]
    split = result.summaries["split"]
    assert set(split["fit_files"]).isdisjoint(split["evaluate_files"])
    assert runs.filter(pl.col("part") == "fit")["arm"].unique().to_list() == ["clean"]
    # a run score is the max of its step scores from step k on
    for shift in ("steer", "forced"):
        one = runs.filter((pl.col("shift") == shift) & (pl.col("monitor") == "drift")).row(-1, named=True)
        mine = steps.filter((pl.col("prompt_id") == one["prompt_id"]) & (pl.col("shift") == shift)
                            & (pl.col("strength").eq_missing(one["strength"]))
                            & (pl.col("monitor") == "drift") & (pl.col("step") >= cfg.start_step))
        assert one["run_score"] == mine["score"].max()
    assert summary_table(runs, cfg).equals(result.tables["monitor_summary"])
    pairs, summary = result.tables["monitor_pairs"], result.tables["monitor_summary"]
    for r in pairs.iter_rows(named=True):  # the paired difference's estimate is the difference of the summary's AUROCs
        auc = {m: summary.filter((pl.col("label") == r["label"]) & (pl.col("monitor") == m))["value"][0]
               for m in (r["monitor"], "drift")}
        assert r["value"] == pytest.approx(auc[r["monitor"]] - auc["drift"], abs=1e-12) and r["lo"] <= r["hi"]
    assert pairs.height == 4 * (len(cfg.strengths) + 3)
    texts = result.tables["monitor_runs"]  # one row per run, its text from step k on
    assert texts.height == runs.select("prompt_id", "arm", "shift", "strength").unique().height
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
                 "--shifts", "steer,forced", "--forced-tokens", "2",
                 "--fpr", "0.2", "--n-boot", "100", "--saes", "none", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "monitor_summary" in printed and "AUROC" in printed
    marker = json.loads((out / "monitor.result.json").read_text())
    assert marker["config"]["strengths"] == [0.0, 50.0] and marker["config"]["saes"] == ["none"]
    assert marker["config"]["shifts"] == ["steer", "forced"] and "forced 2 random tokens | drift" in marker["summaries"]["auroc"]
    loaded = Result.load(out, "monitor")
    cfg = MonitorConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in loaded.config.items()})
    assert summary_table(loaded.table("monitor"), cfg).equals(loaded.table("monitor_summary"))
    assert not loaded.table("monitor")["monitor"].str.starts_with("sae:").any()
    assert detect(out) == ["monitor"]
    title, html, _ = get("monitor").section(loaded)
    n = loaded.summaries["split"]["n_evaluate_prompts"]
    assert title == "Monitor transfer" and f"Evaluate ({n} prompts" in html and "AUROC" in html
    page = study_report([out], tmp_path / "r.html").read_text()
    assert "Monitor transfer" in page and "Detection AUROC by shift" in page and "forced 2 random tokens" in page


def test_the_headline_aurocs_are_one_value_in_the_marker_and_the_report(monkeypatch, sample_model, tmp_path):
    """summary_table is the one function that computes the AUROC rows: plant a sentinel in its output and find it in
    the written marker, the summary table and the report section, with the function called once."""
    from trajscope.studies import prompts as P
    from trajscope.studies.monitor import study as st
    from trajscope.studies.serving.sections import ci

    sentinel, lo, hi = 7.654321, 7.0, 8.0
    calls = []

    def planted_table(per_run, config):
        calls.append(1)
        return real(per_run, config).with_columns(value=pl.lit(sentinel), lo=pl.lit(lo), hi=pl.lit(hi))

    real = st.summary_table
    monkeypatch.setattr(st, "summary_table", planted_table)
    prompts = P.encode_prompts(sample_model, P.read_prompt_file(PROMPTS, 16), 48)
    cfg = MonitorConfig(vector="random", strengths=(0.0,), shifts=("steer", "forced"), new_tokens=6, start_step=2,
                        forced_tokens=2, fpr=0.2, n_boot=20, saes=("none",))
    run(sample_model, prompts, cfg).save(tmp_path)
    marker = json.loads((tmp_path / "monitor.result.json").read_text())
    assert marker["summaries"]["auroc"]["forced 2 random tokens | drift"]["value"] == sentinel
    assert set(pl.read_parquet(tmp_path / "monitor_summary.parquet")["value"]) == {sentinel}
    _, html, _ = get("monitor").section(Result.load(tmp_path, "monitor"))
    table = pl.read_parquet(tmp_path / "monitor_summary.parquet")
    shown = ci(sentinel, lo, hi, int(table["n_prompts"][0]))  # "7.65 [7, 8]": the report's number format
    assert html.count(f"<td>{shown}</td>") == table.height and len(calls) == 1


@pytest.mark.parametrize("name", ["monitor", "drift"])
def test_the_quick_preset_names_settings_the_study_has(name):
    import dataclasses

    study = get(name)
    fields = {f.name for f in dataclasses.fields(study.config)}
    assert study.quick and set(study.quick) <= fields | set(study.shared_defaults) | {"max_prompts"}
    assert set(study.uses.values()) <= fields
    study.config(**{k: v for k, v in study.quick.items() if k in fields})  # a valid config
