"""Drift by chat segment: the calibration report hands the drift study its chat prompts' turns, every scored
row carries its position's segment, ``drift_by_segment`` summarises them and the section shows that table."""

from __future__ import annotations

import pathlib

import polars as pl
import pytest

import trajscope as ts
from trajscope.studies.drift import DriftConfig, run
from trajscope.studies.registry import Result, get

SYSTEM = "You are a helpful AI assistant named SmolLM"
QUESTIONS = ["How do I boil an egg?", "What is a prime number?", "Why is the sky blue?", "Name a red fruit.",
             "How far is the moon?", "What does a cat eat?"]


@pytest.fixture(scope="module")
def chat_model(tiny_dirs):
    from test_chat import SMOLLM2_TEMPLATE

    model = ts.load_model(str(tiny_dirs["llama"]))  # its own tokenizer object: the template stays local
    model.tokenizer.chat_template = SMOLLM2_TEMPLATE
    return model


def _records() -> tuple[dict, ...]:
    return tuple({"id": f"f{j}.jsonl#{i}", "messages": [{"role": "user", "content": f"{q} ({j})"}]}
                 for j in range(5) for i, q in enumerate(QUESTIONS[:3] if j % 2 else QUESTIONS[3:]))


@pytest.fixture(scope="module")
def drifted(chat_model):
    from trajscope.calibration.inputs import Inputs
    from trajscope.calibration.plan import Job
    from trajscope.calibration.runner import job_prompts

    inputs = Inputs(model="llama", prompt_files=(pathlib.Path("x.jsonl"),), records=_records())
    config = DriftConfig(max_new_tokens=5, no_eos=True, fpr=0.1, n_boot=50)
    prompts = job_prompts(chat_model, inputs, Job(section="drift", study="drift", folder="studies/drift", max_tokens=None), config)
    return prompts, run(chat_model, prompts, config)


def test_the_report_hands_drift_each_prompt_positions_turn(chat_model, drifted):
    """The segments match the tokens' text: the template's default system turn, the user's question, the
    generation prompt (assistant), and they equal a capture of the same messages."""
    prompts, _ = drifted
    tok = chat_model.tokenizer
    for rec, src in zip(prompts, _records()):
        ids, segs = rec["prompt"], rec["segments"]
        text = {s: tok.decode([t for t, x in zip(ids, segs) if x == s]) for s in set(segs)}
        assert SYSTEM in text["system"] and src["messages"][0]["content"] in text["user"]
        assert text["assistant"].strip() == "<|im_start|>assistant"
        traj = ts.capture(chat_model, src["messages"], max_new_tokens=1, stop_at_eos=False)
        assert traj.token_ids[:traj.prompt_len] == ids and traj.tokens["segment"].to_list()[:len(ids)] == segs


def test_rows_carry_segments_and_the_by_segment_table_is_their_mean(drifted):
    prompts, res = drifted
    pos = res.table("drift_positions").filter(pl.col("split") == "evaluate")
    want = {(r["id"], p): s for r in prompts for p, s in enumerate(r["segments"])}
    pre = pos.filter(pl.col("regime") == "prefill")
    assert [want[(i, p)] for i, p in zip(pre["prompt_id"], pre["pos"])] == pre["segment"].to_list()
    assert set(pos.filter(pl.col("regime") == "decode")["segment"]) == {"assistant"}
    seg = res.table("drift_by_segment")
    assert {(r["regime"], r["segment"]) for r in seg.iter_rows(named=True)} == {
        ("prefill", "system"), ("prefill", "user"), ("prefill", "assistant"), ("decode", "assistant")}
    for r in seg.filter(pl.col("layer") == 1).iter_rows(named=True):
        g = pos.filter((pl.col("regime") == r["regime"]) & (pl.col("segment") == r["segment"]) & (pl.col("layer") == 1))
        assert r["score"] == pytest.approx(g["score"].mean()) and r["n"] == g.height
        assert r["flagged_frac"] == pytest.approx(g["flagged"].cast(pl.Float64).mean())
        assert r["score_lo"] - 1e-12 <= r["score"] <= r["score_hi"] + 1e-12


def test_the_section_shows_the_by_segment_table_and_a_result_without_it_is_drawn_as_before(drifted):
    from trajscope.studies.serving.sections import ci

    _, res = drifted
    seg = res.table("drift_by_segment")
    seg = seg.with_columns(pl.when(pl.int_range(pl.len()) == 0).then(0.4321).otherwise(pl.col("score")).alias("score"),
                           pl.when(pl.int_range(pl.len()) == 0).then(0.1234).otherwise(pl.col("score_lo")).alias("score_lo"),
                           pl.when(pl.int_range(pl.len()) == 0).then(0.8765).otherwise(pl.col("score_hi")).alias("score_hi"))
    planted = Result("drift", tables={**res.tables, "drift_by_segment": seg}, summaries=res.summaries)
    _, body, _ = get("drift").section(planted)
    assert "Drift by chat segment" in body and ci(0.4321, 0.1234, 0.8765, seg["n_prompts"][0]) in body
    without = Result("drift", tables={k: v for k, v in res.tables.items() if k != "drift_by_segment"},
                     summaries=res.summaries)
    _, old, _ = get("drift").section(without)
    assert "Drift by chat segment" not in old and body.startswith(old)
