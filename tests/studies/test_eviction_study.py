"""The eviction study on tiny models: nothing evicted changes nothing, and the masked re-run is the real model."""

from __future__ import annotations

import polars as pl
import pytest
import torch

import trajscope as ts
from tiny import FAMILIES, hf_reference
from trajscope.metrics import eviction as ev
from trajscope.studies.eviction.engine import eviction, first_divergence

PROMPTS = ["def fibonacci(n):\n    if n < 2:\n        return n\n", "import os\nimport sys\n\n\nclass Path:\n"]


def test_full_budget_reproduces_the_full_run(tiny_models):
    res = eviction(tiny_models["llama"], PROMPTS[:1], budgets=[1.0], max_new_tokens=6, window=4, lookahead=3)
    assert res.tables["eviction_rerun"]["token_agrees"].all() and res.tables["eviction_rerun"]["forced_agrees"].all()
    assert res.tables["eviction_rerun"]["kl_to_full"].abs().max() < 1e-6
    assert res.tables["eviction_steps"]["recall_at_k"].min() == 1.0 and res.tables["eviction_steps"]["evicted_mass"].abs().max() < 1e-6
    assert set(res.tables["eviction_kept"]["policy"]) == set(ev.POLICIES)
    assert first_divergence(res.tables["eviction_rerun"])["first_divergence"].null_count() == len(ev.POLICIES)


def test_tables_and_small_budgets_cost_something(tiny_models, tmp_path):
    res = eviction(tiny_models["qwen2"], PROMPTS, policies=["snapkv", "streamingllm", "oracle"], budgets=[0.5, 6],
                   max_new_tokens=8, window=4, lookahead=4)
    assert set(res.tables["eviction_steps"].columns) == {"run_id", "policy", "budget", "step", "layer", "head", "recall_at_k",
                                      "evicted_mass"}
    assert res.tables["eviction_steps"]["step"].min() == 1 and res.tables["eviction_rerun"]["step"].min() == 0
    n_steps = res.tables["eviction_rerun"].group_by("run_id", "policy", "budget").len()["len"]
    assert n_steps.n_unique() == 1 and n_steps[0] == 8
    assert res.tables["eviction_steps"]["evicted_mass"].max() > 0 and res.tables["eviction_rerun"]["kl_to_full"].max() > 0
    summ = res.tables["eviction_summary"]
    assert {"recall_at_k", "evicted_mass", "kl_to_full", "token_agreement", "forced_agreement"} <= set(summ.columns)
    assert summ["depth_band"][0] == "all" and set(res.summaries) == {"snapkv@0.5", "snapkv@6", "streamingllm@0.5",
                                                                        "streamingllm@6", "oracle@0.5", "oracle@6"}
    _forced_agreement_is_per_step(tiny_models["qwen2"], res)
    out = tmp_path / "ev"
    res.save(out)
    from trajscope.export import read_table

    for name in ("eviction_kept", "eviction_steps", "eviction_rerun"):
        assert read_table(out / f"{name}.parquet").height > 0


def _forced_agreement_is_per_step(model, res):
    """Teacher-forced agreement = the masked forward's greedy token on the full run's context equals the full
    run's own (captured) token; after a free-running divergence it still scores each step on its own."""
    traj = ts.capture(model, PROMPTS[0], max_new_tokens=8, stop_at_eos=False, attention_layers="all")
    P, ids = traj.prompt_len, traj.token_ids
    prefill = torch.stack([ev.split_rows(traj.attention_rows(layer), P)[0] for layer in range(model.n_layers)])
    sel = ev.select("snapkv", prefill, 0.5, window=4)  # as the study chose it for prompt 0
    masked = model.forward(ids[:-1], prompt_len=P, key_mask=ev.key_mask(sel, len(ids))).logits
    rr = res.tables["eviction_rerun"].filter((pl.col("run_id") == "0") & (pl.col("policy") == "snapkv") & (pl.col("budget") == 0.5))
    assert rr["forced_agrees"].to_list() == (masked[P - 1:].argmax(-1) == torch.tensor(ids[P:])).tolist()
    after = res.tables["eviction_rerun"].join(first_divergence(res.tables["eviction_rerun"]), on=["run_id", "policy", "budget"]).filter(
        pl.col("step") > pl.col("first_divergence"))
    assert after["forced_agrees"].mean() > after["token_agrees"].mean()


@pytest.mark.parametrize("family", FAMILIES)
def test_masked_rerun_equals_hf_with_an_explicit_mask(tiny_models, family):
    """The study's teacher-forced re-run is the model boundary's key mask; here the same kept set is handed
    to HF as a 4-D additive mask that hides the evicted prompt keys from every decode query."""
    model = tiny_models[family]
    traj = ts.capture(model, PROMPTS[0], max_new_tokens=5, stop_at_eos=False, attention_layers="all")
    P, ids = traj.prompt_len, traj.token_ids[:-1]
    prefill = torch.stack([ev.split_rows(traj.attention_rows(layer), P)[0] for layer in range(model.n_layers)])
    sel = ev.select("streamingllm", prefill, 0.4, window=4)  # the same set for every layer and head: one HF mask can say it
    got = model.forward(ids, prompt_len=P, key_mask=ev.key_mask(sel, len(ids))).logits
    T = len(ids)
    allowed = torch.ones(T, T).tril().bool()
    allowed[P:, :P] &= sel.mask[0, 0]
    mask = torch.zeros(T, T).masked_fill(~allowed, torch.finfo(torch.float32).min)[None, None]
    with torch.no_grad():
        ref = hf_reference(model)(torch.tensor([ids]), attention_mask=mask, use_cache=False).logits[0]
    torch.testing.assert_close(got, ref.float(), atol=1e-5, rtol=1e-4)


def test_clear_errors(tiny_models, tiny_dirs):
    m = tiny_models["gpt2"]
    with pytest.raises(ts.TrajscopeError, match="Unknown eviction policy 'lru'"):
        eviction(m, PROMPTS, policies=["lru"])
    with pytest.raises(ts.TrajscopeError, match="not a fraction"):
        eviction(m, PROMPTS, budgets=[1.5])
    with pytest.raises(ts.TrajscopeError, match="longer than prompt"):
        eviction(m, PROMPTS, window=500, max_new_tokens=2)
    with pytest.raises(ts.TrajscopeError, match="attn='rows'"):
        eviction(ts.load_model(str(tiny_dirs["gpt2"]), attn="sdpa"), PROMPTS)


def test_eviction_command(tmp_path, capsys):
    import json

    from trajscope.cli import main
    from trajscope.export import read_table

    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": p, "id": f"p{i}"}) for i, p in enumerate(PROMPTS)))
    assert main(["eviction", "--prompts", str(prompts), "--policies", "snapkv,h2o", "--budgets", "0.5,6",
                 "--max-new-tokens", "4", "--window", "4", "--out", str(tmp_path / "ev")]) == 0
    steps = read_table(tmp_path / "ev" / "eviction_steps.parquet")
    assert set(steps["policy"]) == {"snapkv", "h2o"} and set(steps["budget"]) == {0.5, 6.0}
    assert "recall_at_k" in capsys.readouterr().out
    assert main(["study", "eviction", "--prompts", str(prompts), "--policies", "snapkv", "--budgets", "0.5",
                 "--max-new-tokens", "3", "--window", "4", "--out", str(tmp_path / "ev2")]) == 0  # the same study
    assert (tmp_path / "ev2" / "eviction.result.json").is_file()
    assert main(["eviction", "--prompts", str(prompts), "--budgets", "0", "--out", str(tmp_path / "x")]) == 2


def test_pyramid_schedule_reaches_the_selection_in_every_eviction_study(tmp_path, capsys, monkeypatch, tiny_dirs):
    """``--pyramid-schedule paper`` (default ``code``, KVCache-Factory's schedule) is what PyramidKV's selection is
    given in the eviction, needle and eviction-ppl studies, and is recorded in the marker; a bad value is one
    sentence before any model work."""
    import json

    from trajscope.cli import main
    from trajscope.metrics import eviction as ev_mod

    seen: list[str] = []
    real = ev_mod.select

    def spy(policy, *args, **kwargs):
        if policy == "pyramidkv":
            seen.append(kwargs.get("schedule", "code"))
        return real(policy, *args, **kwargs)

    monkeypatch.setattr(ev_mod, "select", spy)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": p, "id": f"p{i}"}) for i, p in enumerate(PROMPTS)))
    llama = str(tiny_dirs["llama"])
    runs = {
        "eviction": ["--model", llama, "--prompts", str(prompts), "--policies", "pyramidkv", "--budgets", "0.5",
                     "--max-new-tokens", "3", "--window", "4"],
        "needle": ["--model", llama, "--context", "96", "--n-prompts", "1", "--policies", "pyramidkv",
                   "--budgets", "0.5", "--window", "8", "--answer-tokens", "2"],
        "eviction-ppl": ["--model", llama, "--n-files", "2", "--prompt-len", "48", "--continuation", "4",
                         "--policies", "pyramidkv", "--budgets", "0.5", "--window", "8"],
    }
    for name, args in runs.items():
        for schedule in ("code", "paper"):
            seen.clear()
            out = tmp_path / f"{name}-{schedule}"
            flag = [] if schedule == "code" else ["--pyramid-schedule", "paper"]
            assert main(["study", name, *args, *flag, "--out", str(out)]) == 0, name
            assert seen and set(seen) == {schedule}, (name, schedule, seen)
            marker = json.loads(next(out.glob("*.result.json")).read_text())
            assert marker["config"]["pyramid_schedule"] == schedule
    capsys.readouterr()
    assert main(["study", "needle", "--pyramid-schedule", "linear", "--out", str(tmp_path / "bad")]) == 2
    assert "Unknown PyramidKV schedule 'linear'" in capsys.readouterr().err
