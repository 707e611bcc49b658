"""The serving-vllm study without vLLM (default suite): registration, the one-sentence refusal where vLLM is
not installed, the calls it plans, and a planted number found in its report section.

The study itself runs vLLM (``tests/vllm/test_vllm_study.py`` under the ``vllm`` marker; the shipped SmolLM2
tables in ``sample_data/smollm2/report/serving-vllm``).
"""

from __future__ import annotations

import importlib.util
import types

import polars as pl
import pytest

from trajscope.errors import TrajscopeError
from trajscope.studies.registry import Result, get
from trajscope.studies.serving_vllm import ServingVllmConfig
from trajscope.studies.serving_vllm.report import headline, section
from trajscope.studies.serving_vllm.study import NO_VLLM, plan_calls


def test_registered_with_flags_and_a_one_sentence_refusal_without_vllm(monkeypatch):
    study = get("serving-vllm")
    assert study.config is ServingVllmConfig and "--model smollm2" in study.example
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    with pytest.raises(TrajscopeError) as exc:
        study.run(types.SimpleNamespace(), [("a", [1, 2])], ServingVllmConfig())
    assert str(exc.value) == NO_VLLM and NO_VLLM.count(". ") == 0


@pytest.mark.parametrize("kw, sentence", [({"neighbours": ("odd",)}, "Unknown neighbour kind 'odd'"),
                                          ({"batch_size": 1}, "--batch-size must be at least 2"),
                                          ({"chunks": (0,)}, "Chunk budgets must be positive")])
def test_bad_settings_get_one_sentence(kw, sentence):
    with pytest.raises(TrajscopeError, match="^" + sentence):
        ServingVllmConfig(**kw)


def test_plan_co_schedules_each_prompt_with_its_neighbours_on_salts_of_their_own():
    prompts = [("p0", [1] * 5), ("p1", [2] * 9), ("p2", [3] * 14)]
    plan = plan_calls(prompts, ServingVllmConfig(chunks=(8, 32)))
    ref = plan["reference"]
    assert set(plan) == {"reference", "chunk8", "chunk32"}
    alone = [c for c in ref if c[0].get("run_id", "").startswith("alone-")]
    assert [c[0]["ids"] for c in alone] == [ids for _, ids in prompts] and all(len(c) == 1 for c in alone)
    batch = [c for c in ref if any(r.get("run_id", "").startswith("batch-") for r in c)]
    # p0 has no shorter prompt and p2 no longer one; mixed needs both; copies run in one slot
    expect = {0: 2 + 1, 1: 2 + 2 + 2 + 1, 2: 2 + 1}
    for i, n in expect.items():
        assert sum(1 for c in batch if any(r.get("run_id", "").startswith(f"batch-{i}-") for r in c)) == n
    for c in batch:
        assert len(c) == 4 and len({r["salt"] for r in c}) == 4  # no request reads another's cache
        target = [r for r in c if r.get("run_id")]
        assert len(target) == 1 and (c[0] is target[0]) == target[0]["run_id"].endswith("-first")
    longer = next(c for c in batch if c[0].get("run_id") == "batch-0-longer-first")
    assert [len(r["ids"]) for r in longer[1:]] == [14, 9, 14]
    prefix = [c[0] for c in ref if c[0].get("run_id", "").startswith("prefix-")]
    assert [r["salt"] for r in prefix] == ["shared"] * 3  # one cache, in order
    assert [c[0]["run_id"] for c in plan["chunk8"]] == ["chunk8-0", "chunk8-1", "chunk8-2"]


def _result(planted: float) -> Result:
    deltas = pl.DataFrame({"part": ["batch"] * 4 + ["prefix-cache"] * 2, "condition": ["copies neighbours, first"] * 4 + ["x"] * 2,
                           "prompt_id": ["a", "a", "b", "b", "a", "b"], "layer": [15] * 6, "pos": [0, 1, 0, 1, 5, 5],
                           "phase": ["prefill"] * 6, "l2": [0.0] * 6, "rel_l2": [1e-7, 3e-7, 2e-7, planted, 0.0, 0.0],
                           "cos": [1.0] * 6, "floor_rel_l2": [1e-6] * 6})
    deltas = deltas.with_columns(above_floor=pl.col("rel_l2") > pl.col("floor_rel_l2"))
    from trajscope.studies.common import summarize

    runs = pl.DataFrame({"part": ["batch", "batch", "prefix-cache", "prefix-cache"], "condition": ["c"] * 4,
                         "prompt_id": ["a", "b", "a", "b"], "prompt_len": [4, 4, 8, 8], "num_cached_tokens": [0, 0, 0, 4],
                         "tokens_identical": [True, False, True, True], "first_divergence": [None, 1, None, None],
                         "first_computed_pos": [0, 0, 0, 4], "n_compared": [2, 2, 1, 1]})
    cov = pl.DataFrame({"prompt_id": ["a"] * 4 + ["b"] * 4, "status": ["computed"] * 4 + ["reused"] * 2 + ["computed"] * 2})
    return Result(study="serving-vllm", tables={"serving-vllm": deltas, "serving-vllm_summary": summarize(deltas, ["part", "condition"]),
                                                "serving-vllm_runs": runs, "serving-vllm_coverage": cov,
                                                "serving-vllm_floor": pl.DataFrame({"prompt_id": ["a", "b"], "floor_rel_l2": [1e-6, 1e-6]})},
                  config={"layer": 15, "new_tokens": 8})


def test_headline_numbers_and_a_planted_number_in_the_section():
    r = _result(0.004321)
    h = headline(r)
    assert h["batch: largest delta / float32 floor"]["value"] == pytest.approx(4321.0)
    assert h["batch: share of positions above the floor"]["value"] == 0.25
    assert h["batch: runs whose greedy tokens changed"]["k"] == 1 and h["batch: runs whose greedy tokens changed"]["n"] == 2
    assert h["prefix-cache: share of a prompt's positions never computed"]["value"] == 0.25  # mean of 0 and 0.5
    r.summaries = h
    title, html, _ = section(r)
    assert "vLLM" in title and "4.32e+03" in html


def test_section_escapes_the_condition_text():
    r = _result(0.001)
    r.tables["serving-vllm_summary"] = r.tables["serving-vllm_summary"].with_columns(condition=pl.lit("<b>x</b>"))
    _, html, _ = section(r)
    assert "<b>x</b>" not in html and "&lt;b&gt;x&lt;/b&gt;" in html


def test_compare_aligns_computed_rows_and_stops_at_the_first_changed_token(monkeypatch):
    import torch

    from trajscope.studies.serving_vllm import tables

    g = torch.Generator().manual_seed(0)
    x = torch.randn(9, 4, generator=g, dtype=torch.float64)  # positions 0..8 of the reference (P = 5, 5 new tokens)
    y = x.clone()
    y[6] *= 1.5  # a delta at position 6 (decode step 2)
    ref_ids = [1, 2, 3, 4, 5, 10, 11, 12, 13, 14]
    run_ids = [1, 2, 3, 4, 5, 10, 11, 12, 99, 14]  # generated index 3 differs: position 8 holds another token
    fake = {"ref": (0, x, ref_ids, 5), "run": (2, y[2:], run_ids, 5)}  # the run's first 2 positions came from a cache
    monkeypatch.setattr(tables, "_rows", lambda d, layer: fake[d])
    df, facts = tables.compare("ref", "run", 15)
    assert df["pos"].to_list() == [2, 3, 4, 5, 6, 7]  # computed by both, before position 5 + 3
    assert df["rel_l2"].to_list()[:4] == [0.0] * 4 and df.filter(df["pos"] == 6)["rel_l2"][0] == pytest.approx(0.5)
    assert facts == {"tokens_identical": False, "first_divergence": 3, "first_computed_pos": 2}
