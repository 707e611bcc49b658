"""The serving-vllm study on the real engine (SmolLM2, 3 prompts, small settings).

vLLM's own prefix-cache hit counts are checked against an independent model of its cache: the
longest prefix each prompt shares with the prompts before it, capped at its length − 1 and rounded
down to whole blocks of 32 tokens, computed from the token ids alone. The coverage map, the chunked and
batched parts and the section are checked for shape.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.vllm


def test_study_runs_on_the_engine_and_its_cache_hits_are_vllms(hf_model, tmp_path):
    import trajscope as ts
    from trajscope.studies.prompts import DEFAULT_HEADER, common_prefix_len
    from trajscope.studies.registry import Result
    from trajscope.studies.serving_vllm import ServingVllmConfig, run

    texts = ["def add(a, b):\n    return a + b\n", "class Point:\n    x: int\n", "import os\nprint(os.getcwd())\n"]
    prompts = [(f"p{i}", hf_model.encode(DEFAULT_HEADER + t)) for i, t in enumerate(texts)]
    cfg = ServingVllmConfig(new_tokens=4, neighbours=("copies", "longer"), slots=("first",), chunks=(16,))
    result = run(hf_model, prompts, cfg, layers=[15])
    runs = result.table("serving-vllm_runs")
    prefix = runs.filter(runs["part"] == "prefix-cache").sort("prompt_id")
    seqs = [ids for _, ids in prompts]
    want = [0] + [(min(max(common_prefix_len(seqs[j], s) for j in range(i)), len(s) - 1) // cfg.block) * cfg.block
                  for i, s in enumerate(seqs) if i]
    assert prefix["num_cached_tokens"].to_list() == want and want[1] >= 32
    assert prefix["first_computed_pos"].to_list() == want  # the plugin's first computed row is vLLM's hit count
    cov = result.table("serving-vllm_coverage")
    assert cov.filter(cov["status"] == "reused").height == sum(want)
    chunk = runs.filter(runs["part"] == "chunked-prefill")
    assert chunk.height == 3 and chunk["n_compared"].min() > 0
    assert runs.filter(runs["part"] == "batch").height == 3 + 2  # copies for each; longer ones exist for p1 and p2 (61, 56, 58 tokens)
    d = result.table("serving-vllm")
    assert d["floor_rel_l2"].max() > 0 and set(d["part"]) == {"batch", "chunked-prefill", "prefix-cache"}
    result.save(tmp_path)
    again = Result.load(tmp_path, "serving-vllm")
    _, html, _ = ts.studies.get("serving-vllm").section(again)
    assert "prefix-cache" in html
