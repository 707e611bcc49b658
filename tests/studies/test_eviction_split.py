"""Per-step vs accumulated eviction damage on a model built so that only the generated history needs the evicted key.

The planted model (2 layers, 1 head, head_dim 4, MLPs off, RoPE nearly still: θ = 1e9 and the content in the
slow rotary pair) reads tokens F (filler), A (the key we evict), H and C:

- layer 0: H's query attends almost only to A (score +20) and copies A's value into residual dim 4; C's query
  scores A at −20, so C never reads A, masked or not;
- layer 1: C attends to H and copies H's dim 4 into dim 5; the unembedding reads dim 5 (token X).

Prompt F A F F, continuation H C X. With A evicted, the accumulated arm (history computed under the mask) loses
H's copy of A and C's prediction collapses; the per-step arm (C alone masked, H's states from the full run)
keeps it. At step 1 (query H, no history) the two arms are equal by construction.
"""

from __future__ import annotations

import pytest
import torch

import trajscope as ts
from tiny import SAMPLE_DIR, VOCAB
from trajscope.studies.eviction.engine import eviction
from trajscope.studies.eviction.split import split_steps, split_summary

F_, A_, H_, C_, X_ = 10, 11, 12, 13, 14
IDS = [F_, A_, F_, F_, H_, C_, X_]
P = 4


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=8, intermediate_size=4, num_hidden_layers=2,
                      num_attention_heads=1, num_key_value_heads=1, head_dim=4, rope_theta=1e9,
                      max_position_embeddings=64, tie_word_embeddings=False, bos_token_id=0, eos_token_id=0,
                      pad_token_id=0, rms_norm_eps=1e-6)
    model = LlamaForCausalLM(cfg)
    a = 5 ** 0.5
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.model.embed_tokens.weight[:, 0] = 1.0  # every other token is filler
        for tok, dim in ((A_, 1), (H_, 2), (C_, 3)):
            model.model.embed_tokens.weight[tok] = 0.0
            model.model.embed_tokens.weight[tok, dim] = 1.0
        for layer in model.model.layers:
            layer.input_layernorm.weight.fill_(1.0)
            layer.post_attention_layernorm.weight.fill_(1.0)
        l0, l1 = model.model.layers[0].self_attn, model.model.layers[1].self_attn
        l0.q_proj.weight[1, 2], l0.q_proj.weight[1, 3] = a, -a  # H seeks A, C avoids it
        l0.k_proj.weight[1, 1] = a  # A's key
        l0.v_proj.weight[0, 1] = 1.0  # A's value
        l0.o_proj.weight[4, 0] = 1.0  # → residual dim 4
        l1.q_proj.weight[1, 3] = 10 ** 0.5  # C seeks H
        l1.k_proj.weight[1, 2] = 10 ** 0.5
        l1.v_proj.weight[0, 4] = 1.0  # H's dim 4
        l1.o_proj.weight[5, 0] = 1.0  # → residual dim 5
        model.model.norm.weight.fill_(1.0)
        model.lm_head.weight[X_, 5] = 5.0
    path = tmp_path_factory.mktemp("planted") / "llama"
    model.save_pretrained(path)
    PreTrainedTokenizerFast.from_pretrained(SAMPLE_DIR).save_pretrained(path)
    return ts.load_model(str(path), device="cpu")


def hide_a(model, n):
    mask = torch.ones(model.n_layers, model.n_heads, n, dtype=torch.bool)
    mask[:, :, 1] = False
    return mask


def test_planted_dependency_differs_only_in_the_accumulated_arm(planted):
    out = split_steps(planted, IDS, P, hide_a(planted, len(IDS)))
    assert out["step"].to_list() == [1, 2]
    step1, step2 = out.row(0, named=True), out.row(1, named=True)
    assert step1["kl_per_step"] == pytest.approx(step1["kl_accumulated"], abs=1e-6)  # no history yet
    assert step2["kl_accumulated"] > 1.0  # C lost what H read from A
    assert step2["kl_per_step"] < 1e-5  # C alone never needed A
    assert step2["kl_carried"] == pytest.approx(step2["kl_accumulated"] - step2["kl_per_step"])


def test_nothing_evicted_both_arms_equal_the_full_run(planted, tiny_models):
    out = split_steps(planted, IDS, P, torch.ones(2, 1, len(IDS), dtype=torch.bool))
    assert out["kl_per_step"].abs().max() < 1e-9 and out["kl_accumulated"].abs().max() < 1e-9
    res = eviction(tiny_models["llama"], ["def fibonacci(n):\n    if n < 2:\n        return n\n"], budgets=[1.0],
                   policies=["snapkv", "streamingllm"], max_new_tokens=5, window=4, rerun=False, split=True)
    assert res.tables["eviction_split"].height == 2 * 4
    assert res.tables["eviction_split"]["kl_per_step"].abs().max() < 1e-6 and res.tables["eviction_split"]["kl_accumulated"].abs().max() < 1e-6


def test_split_in_the_study_with_paired_intervals(tiny_models):
    prompts = ["def fibonacci(n):\n    if n < 2:\n        return n\n", "import os\nimport sys\n\n\nclass Path:\n",
               "for i in range(10):\n    print(i * i)\n"]
    res = eviction(tiny_models["qwen2"], prompts, policies=["snapkv"], budgets=[0.5], max_new_tokens=8, window=4,
                   rerun=True, split=True)
    joined = res.tables["eviction_split"].join(res.tables["eviction_rerun"], on=["run_id", "policy", "budget", "step"])
    # the accumulated arm is the study's teacher-forced masked re-run
    assert (joined["kl_accumulated"] - joined["kl_to_full"]).abs().max() < 1e-6
    first = res.tables["eviction_split"].filter(pl_step_is(1))
    assert (first["kl_per_step"] - first["kl_accumulated"]).abs().max() < 1e-6
    summ = split_summary(res.tables["eviction_split"], n_boot=200)
    assert {"kl_carried", "kl_carried_lo", "kl_carried_hi", "n_prompts"} <= set(summ.columns)
    assert summ["n_prompts"].max() == 3


def pl_step_is(step):
    import polars as pl

    return pl.col("step") == step


def test_per_step_arm_reads_the_full_runs_history(planted):
    """The per-step arm's last query equals one masked forward over the full run's cache, built independently."""
    mask = hide_a(planted, len(IDS))
    per = planted.per_step_logits(IDS, P, mask)
    cache = planted.forward(IDS[:P + 1], return_cache=True).cache
    last = planted.forward([IDS[P + 1]], prompt_len=P, key_mask=mask, past=cache).logits[-1]
    torch.testing.assert_close(per[-1], last)


def test_first_divergence_is_censored_not_dropped():
    import polars as pl

    from trajscope.studies.eviction.engine import divergence_survival

    # four runs of 6 steps (0..5): diverge at 1 and 3; two never diverge (censored at 5)
    rows = []
    for run, first in enumerate([1, 3, None, None]):
        rows += [{"run_id": str(run), "policy": "snapkv", "budget": 0.5, "step": s,
                  "token_agrees": first is None or s < first} for s in range(6)]
    out = divergence_survival(pl.DataFrame(rows))
    row = out.row(0, named=True)
    assert (row["n_runs"], row["n_censored"]) == (4, 2)
    assert row["km_median"] == 3.0  # S = 3/4, 1/2 at t = 1, 3 (dropping the censored runs would say 1)
