"""The serving-vllm study's SAE part without vLLM (default suite), on synthetic harvests with known answers.

- which run makes each mode's harvest (the plan alone);
- a harvest identical to the alone one trains identical SAEs: cosine 1, Jaccard 1, ΔFVU 0 exactly;
- a harvest scaled by 1.5 is 0.5 relative L2 from alone; a prefix-cached one lacks exactly the cached rows,
  and rows after a changed token are not compared;
- the alone SAE's FVU equals one computed here from the trainer's SAE and numpy, on the split's eval rows;
- bad input gets one sentence.
"""

from __future__ import annotations

import polars as pl
import pytest
import torch

from trajscope.errors import TrajscopeError
from trajscope.model.forward import numerics
from trajscope.stats import split_ids
from trajscope.studies.sae_stability import StabilityConfig
from trajscope.studies.serving_vllm import ServingVllmConfig
from trajscope.studies.serving_vllm.saes import PromptRows, mode_runs, sae_tables
from trajscope.studies.serving_vllm.study import plan_calls

D, SHARED, N_POS = 16, 8, 30
CFG = StabilityConfig(layer=15, seeds=(0, 1), d_sae=32, k=4, n_tokens=4096, batch_size=128, n_boot=200)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    with numerics(threads=1):
        yield


def _alone(n_prompts=6) -> dict[str, PromptRows]:
    """Rows from a sparse dictionary; the first SHARED positions are the same in every prompt (a shared header)."""
    g = torch.Generator().manual_seed(0)
    dictionary = torch.randn(48, D, generator=g)

    def rows(n):
        codes = torch.rand(n, 48, generator=g) * (torch.rand(n, 48, generator=g) < 0.08)
        return codes @ dictionary + 0.05 * torch.randn(n, D, generator=g)

    header = rows(SHARED)
    return {f"p{i}": PromptRows(0, torch.cat([header, rows(N_POS - SHARED)]), [7] * SHARED + list(range(i, i + N_POS - SHARED)))
            for i in range(n_prompts)}


def test_mode_runs_pick_one_run_per_prompt_and_drop_a_mode_some_prompt_lacks():
    prompts = [("p0", [1] * 5), ("p1", [2] * 9), ("p2", [3] * 14), ("p3", [4] * 20)]
    runs = mode_runs(plan_calls(prompts, ServingVllmConfig(chunks=(8,))), 4)
    assert list(runs) == ["alone", "batch", "prefix-cache", "chunked-prefill-8"]
    assert runs["alone"][2] == ("reference", "alone-2") and runs["prefix-cache"][0] == ("reference", "prefix-0")
    assert runs["chunked-prefill-8"][3] == ("chunk8", "chunk8-3")
    # the first neighbour kind each prompt has, first slot: p0 has no shorter prompt, so its first is longer
    assert runs["batch"][0] == ("reference", "batch-0-longer-first")
    assert runs["batch"][1] == ("reference", "batch-1-shorter-first")
    only_shorter = mode_runs(plan_calls(prompts, ServingVllmConfig(neighbours=("shorter",), chunks=())), 4)
    assert "batch" not in only_shorter and set(only_shorter) == {"alone", "prefix-cache"}


def test_identical_scaled_cached_and_diverged_harvests():
    alone = _alone()
    same = {p: PromptRows(h.first, h.rows.clone(), list(h.token_ids)) for p, h in alone.items()}
    scaled = {p: PromptRows(h.first, h.rows * 1.5, list(h.token_ids)) for p, h in alone.items()}
    # prefix cache: every prompt but the first read its first 8 positions from the cache
    cached = {p: PromptRows(0 if p == "p0" else SHARED, h.rows if p == "p0" else h.rows[SHARED:], list(h.token_ids))
              for p, h in alone.items()}
    # a token changed at position 20: rows from there on hold another sequence and are not compared
    diverged = {}
    for p, h in alone.items():
        rows, ids = h.rows.clone(), list(h.token_ids)
        rows[20:] += 100.0
        ids[20] = -1
        diverged[p] = PromptRows(0, rows, ids)
    out = sae_tables({"alone": alone, "batch": same, "scaled": scaled, "prefix-cache": cached, "diverged": diverged},
                     SHARED, CFG, eval_fraction=0.5)
    harv = {r["mode"]: r for r in out["serving-vllm_sae_harvests"].iter_rows(named=True)}
    assert harv["alone"]["rel_l2_vs_alone"] == 0 and harv["alone"]["n_missing"] == 0
    assert harv["batch"]["rel_l2_vs_alone"] == 0
    assert harv["scaled"]["rel_l2_vs_alone"] == pytest.approx(0.5, rel=1e-6)
    assert harv["diverged"]["rel_l2_vs_alone"] == 0
    assert harv["prefix-cache"]["n_missing"] == SHARED * 5 and harv["prefix-cache"]["n_rows"] == 6 * N_POS - SHARED * 5
    split = out["serving-vllm_sae_split"]
    train = split.filter(pl.col("split") == "train")["prompt_id"].to_list()
    assert sorted(train) == split_ids([f"p{i}" for i in range(6)], (0.5, 0.5), ("train", "eval"))["train"]
    # train rows start at position 1 (position 0, the sink, is left out): the cached prompts lack 1..SHARED-1 too
    assert harv["alone"]["n_train_rows"] == 3 * (N_POS - 1)
    assert harv["prefix-cache"]["n_train_rows"] == 3 * (N_POS - 1) - (SHARED - 1) * sum(p != "p0" for p in train)
    pairs = out["serving-vllm_sae_pairs"]
    same_seed = pairs.filter((pl.col("mode") == "batch") & (pl.col("kind") == "same_seed"))
    assert same_seed.height == 2  # identical rows, same seed: the same SAE
    assert same_seed["dec_maxcos"].to_list() == pytest.approx([1.0, 1.0], abs=1e-12) and (same_seed["row_jaccard"] == 1).all()
    assert (same_seed["fvu_delta"] == 0).all()
    assert pairs.filter(pl.col("kind") == "seed").height == 1 and set(pairs["mode"]) == {
        "alone", "batch", "scaled", "prefix-cache", "diverged"}
    summ = out["serving-vllm_sae_summary"]
    batch = summ.filter((pl.col("mode") == "batch") & (pl.col("kind") == "same_seed") & (pl.col("metric") == "row_jaccard"))
    assert batch["value"][0] == 1 and batch["verdict"][0] in ("closer than reseeding", "within seed spread")
    saes = out["serving-vllm_saes"]
    assert set(saes["region"]) == {"all", "shared", "own"} and (saes["n_eval_prompts"] == 3).all()
    assert saes.filter(pl.col("region") == "shared")["n_rows"].unique().to_list() == [3 * (SHARED - 1)]


def test_alone_fvu_matches_the_trainers_sae_evaluated_here():
    from trajscope.features.train import TrainConfig, train_sae

    alone = _alone()
    out = sae_tables({"alone": alone}, SHARED, CFG, eval_fraction=0.5)
    part = split_ids(list(alone), (0.5, 0.5), ("train", "eval"))
    x_train = torch.cat([alone[p].rows[1:] for p in part["train"]])  # from position 1: the sink is left out
    x_eval = torch.cat([alone[p].rows[1:] for p in part["eval"]]).double().numpy()
    steps = CFG.n_tokens // CFG.batch_size
    sae, _ = train_sae(x_train, None, TrainConfig(d_sae=CFG.d_sae, k=CFG.k, n_tokens=CFG.n_tokens, batch_size=CFG.batch_size,
                                                  lr=CFG.lr, warmup_steps=min(100, max(1, steps // 10)),
                                                  dead_after=CFG.n_tokens // 4, seed=0), layer=15, progress=False)
    with torch.no_grad():
        x_hat = sae.reconstruct(torch.from_numpy(x_eval).float())[0].double().numpy()
    fvu = ((x_eval - x_hat) ** 2).sum() / ((x_eval - x_eval.mean(0)) ** 2).sum()
    got = out["serving-vllm_saes"].filter((pl.col("seed") == 0) & (pl.col("region") == "all"))["fvu"][0]
    assert got == pytest.approx(fvu, rel=1e-6) and 0 < fvu < 1


def test_bad_input_gets_one_sentence():
    alone = _alone()
    with pytest.raises(TrajscopeError, match="^Every harvest mode must hold the same prompts"):
        sae_tables({"alone": alone, "batch": {p: h for p, h in alone.items() if p != "p5"}}, SHARED, CFG, eval_fraction=0.5)
    with pytest.raises(TrajscopeError, match="^The SAE part needs at least 4 prompts"):
        sae_tables({"alone": _alone(3)}, SHARED, CFG, eval_fraction=0.5)
    with pytest.raises(TrajscopeError, match="^The SAE part needs the alone harvest"):
        sae_tables({"batch": alone}, SHARED, CFG, eval_fraction=0.5)
    with pytest.raises(TrajscopeError, match="^Give --sae-seeds at least two distinct seeds"):
        ServingVllmConfig(sae_seeds=(1, 1))
    with pytest.raises(TrajscopeError, match="^--sae-k must lie between 1 and --sae-d-sae"):
        ServingVllmConfig(sae_seeds=(0, 1), sae_k=600)


def test_headline_and_section_show_the_sae_part():
    from test_serving_vllm_study import _result

    from trajscope.studies.serving_vllm.report import headline, section

    alone = _alone()
    scaled = {p: PromptRows(h.first, h.rows * 1.5, list(h.token_ids)) for p, h in alone.items()}
    r = _result(0.001)
    r.tables.update(sae_tables({"alone": alone, "scaled": scaled}, SHARED, CFG, eval_fraction=0.5))
    h = headline(r)
    summ = r.tables["serving-vllm_sae_summary"]
    want = summ.filter((pl.col("mode") == "scaled") & (pl.col("kind") == "same_seed") & (pl.col("metric") == "fvu_delta")).row(0, named=True)
    got = h["SAE scaled vs alone, same seed: FVU(B) − FVU(A)"]
    assert (got["value"], got["lo"], got["hi"], got["n"], got["verdict"]) == (want["value"], want["lo"], want["hi"], 3, want["verdict"])
    assert "SAE seed pairs (alone vs alone): row Jaccard" in h
    r.summaries = h
    _, html, _ = section(r)
    assert "SAEs trained on each harvest mode" in html and html.count("<table") == 2 + 3  # 2 tables before, 3 SAE tables
