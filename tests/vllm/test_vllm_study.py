"""The serving-vllm study on the real engine (SmolLM2, 4 prompts, small settings, the SAE part on).

vLLM's own prefix-cache hit counts are checked against an independent model of its cache: the
longest prefix each prompt shares with the prompts before it, capped at its length − 1 and rounded
down to whole blocks of 32 tokens, computed from the token ids alone. The coverage map, the chunked and
batched parts and the section are checked for shape. The SAE part's prefix-cache harvest lacks exactly
the positions vLLM reports cached; the other harvests lack none and hold every computed position.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.vllm


def test_study_runs_on_the_engine_and_its_cache_hits_are_vllms(hf_model, tmp_path):
    import trajscope as ts
    from trajscope.studies.prompts import DEFAULT_HEADER, common_prefix_len
    from trajscope.studies.registry import Result
    from trajscope.studies.serving_vllm import ServingVllmConfig, run
    from trajscope.studies.serving_vllm.study import plan_calls

    texts = ["def add(a, b):\n    return a + b\n", "class Point:\n    x: int\n", "import os\nprint(os.getcwd())\n",
             "for i in range(3):\n    print(i * i)\n"]
    prompts = [(f"p{i}", hf_model.encode(DEFAULT_HEADER + t)) for i, t in enumerate(texts)]
    cfg = ServingVllmConfig(new_tokens=4, neighbours=("copies", "longer"), slots=("first",), chunks=(16,),
                            sae_seeds=(0, 1), sae_d_sae=64, sae_k=8, sae_n_tokens=8192)
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
    assert chunk.height == 4 and chunk["n_compared"].min() > 0
    batch = [r["run_id"] for c in plan_calls(prompts, cfg)["reference"] for r in c if r.get("run_id", "").startswith("batch-")]
    assert runs.filter(runs["part"] == "batch").height == len(batch) > 4  # copies for each, longer where one exists
    d = result.table("serving-vllm")
    assert d["floor_rel_l2"].max() > 0 and set(d["part"]) == {"batch", "chunked-prefill", "prefix-cache"}
    harv = {r["mode"]: r for r in result.table("serving-vllm_sae_harvests").iter_rows(named=True)}
    assert set(harv) == {"alone", "batch", "chunked-prefill-16", "prefix-cache"}
    assert harv["prefix-cache"]["n_missing"] == sum(want)  # the positions vLLM served from its cache
    computed = sum(len(ids) + cfg.new_tokens - 1 for ids in seqs)  # prompt positions, then 3 decode positions
    assert all(harv[m]["n_missing"] == 0 and harv[m]["n_rows"] == computed for m in ("alone", "batch", "chunked-prefill-16"))
    assert max(harv[m]["rel_l2_vs_alone"] for m in harv) <= d["floor_rel_l2"].max()
    saes = result.table("serving-vllm_saes")
    assert saes.filter(saes["region"] == "all").height == 4 * 2 and (saes["n_eval_prompts"] == 2).all()
    result.save(tmp_path)
    again = Result.load(tmp_path, "serving-vllm")
    _, html, _ = ts.studies.get("serving-vllm").section(again)
    assert "prefix-cache" in html and "SAEs trained on each harvest mode" in html
