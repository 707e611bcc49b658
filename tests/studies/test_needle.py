"""The passkey task on a tiny model: prompts are built as documented, budget 1.0 answers exactly as the full cache,
accuracy carries a Wilson interval, and the command writes its tables."""

from __future__ import annotations

import polars as pl
import pytest

from trajscope.stats import binomial_interval
from trajscope.studies.eviction import needle as nd


def test_prompts_hide_the_key_at_the_depth(tiny_models):
    model = tiny_models["llama"]
    ps = nd.needle_prompts(model, 3, 160, [0.1, 0.9], seed=3)
    assert [p["depth"] for p in ps] == [0.1, 0.9, 0.1] and len({p["key"] for p in ps}) == 3
    for p in ps:
        text = model.tokenizer.decode(p["ids"])
        assert abs(len(p["ids"]) - 160) <= 12 and text.count(p["key"]) == 2
        haystack = text.split("\n\n" + nd.QUESTION)[0]
        needle_at = haystack.index(" The pass key is")
        filler_len = len(haystack) - len(f" The pass key is {p['key']}. Remember it. {p['key']} is the pass key. ")
        assert abs(needle_at / filler_len - p["depth"]) < 0.05
        assert text.rstrip().endswith("The pass key is")


def test_answer_matching():
    assert nd.answer_matches("The pass key is 1234567.", "1234567")
    assert not nd.answer_matches("1234567 8", "123456") and not nd.answer_matches("no digits", "1")
    assert not nd.answer_matches("12345678", "1234567")


def test_full_budget_answers_equal_the_full_cache(tiny_models):
    model = tiny_models["llama"]
    ps = nd.needle_prompts(model, 2, 128, [0.5], seed=0)
    ans = nd.needle_study(model, ps, budgets=[0.25, 1.0], window=8, lookahead=4, answer_tokens=4)
    assert ans.height == 2 * (1 + len(nd.POLICIES) * 2)
    full = ans.filter(pl.col("policy") == "full").select("run_id", pl.col("answer").alias("full"))
    at_one = ans.filter((pl.col("budget") == 1.0) & (pl.col("policy") != "full")).join(full, on="run_id")
    assert (at_one["answer"] == at_one["full"]).all()
    for p, got in zip(ps, full["full"]):  # the full answer is Hugging Face's greedy generation (independent)
        ref = model.generate_ids(p["ids"], max_new_tokens=4, stop_at_eos=False)[len(p["ids"]):]
        assert got == model.tokenizer.decode(ref, skip_special_tokens=True).strip()
    small = ans.filter(pl.col("budget") == 0.25).join(full, on="run_id")
    assert (small["answer"] != small["full"]).any()  # evicting three quarters changes some answer
    table = nd.accuracy_table(ans.with_columns(correct=pl.col("run_id") == "needle0"))
    row = table.row(0, named=True)
    iv = binomial_interval(1, 2)
    assert (row["accuracy"], row["lo"], row["hi"], row["n"]) == (0.5, iv.lo, iv.hi, 2)


def test_needle_command(tmp_path, capsys, tiny_dirs):
    from trajscope.cli import main
    from trajscope.export import read_table

    assert main(["study", "needle", "--model", str(tiny_dirs["llama"]), "--context", "96",
                 "--n-prompts", "2", "--policies", "snapkv,lookahead", "--budgets", "0.5,1.0", "--window", "8",
                 "--lookahead", "4", "--answer-tokens", "3", "--out", str(tmp_path / "n")]) == 0
    acc = read_table(tmp_path / "n" / "needle_summary.parquet")
    assert set(acc["policy"]) == {"full", "snapkv", "lookahead"} and acc["n"].to_list() == [2] * 5
    printed = capsys.readouterr().out
    assert "needle_summary:" in printed and "accuracy" in printed
    with pytest.raises(SystemExit):  # the needle study builds its prompts: it takes no --prompts
        main(["study", "needle", "--prompts", "x.jsonl", "--out", str(tmp_path)])
    assert main(["study", "needle", "--policies", "h2o", "--out", str(tmp_path)]) == 2  # one sentence, no model work
    assert "Unknown eviction policy 'h2o'" in capsys.readouterr().err


def test_heldout_perplexity_equals_the_full_model_at_budget_one(tiny_models):
    import math

    import torch

    model = tiny_models["llama"]
    ids = model.encode(nd.filler_text()[:2000])[:80]
    out = nd.heldout_perplexity(model, [ids], 48, policies=["snapkv", "lookahead"], budgets=[0.3, 1.0], window=8,
                                lookahead=4)
    full = out.filter(pl.col("policy") == "full")["nll"][0]
    logits = model.forward(ids[:-1]).logits[47:]  # independent: cross-entropy of the plain forward
    assert full == pytest.approx(float(torch.nn.functional.cross_entropy(logits, torch.tensor(ids[48:]))), rel=1e-6)
    assert (out.filter(pl.col("budget") == 1.0)["nll"] == full).all()
    assert (out.filter(pl.col("budget") == 0.3)["nll"] != full).all() and math.isfinite(out["nll"].max())


def test_key_positions_cover_both_occurrences_and_key_kept_reads_the_kept_mask(tiny_models):
    import torch

    from trajscope.metrics import eviction as ev

    model = tiny_models["llama"]
    p = nd.needle_prompts(model, 1, 160, [0.5], seed=1)[0]
    kpos = p["key_pos"]
    text = "".join(model.tokenizer.decode([p["ids"][i]]) for i in kpos)
    assert text.count(p["key"]) == 2  # the key tokens hold both occurrences …
    assert sum(c.isdigit() for c in text) <= 2 * len(p["key"]) + 2  # … and little else
    ans = nd.needle_study(model, [p], policies=["snapkv", "streamingllm", "h2o_rolling"], budgets=[0.25, 1.0],
                          window=8, lookahead=4, answer_tokens=3)
    assert (ans.filter(pl.col("budget") == 1.0)["key_kept"] == 1.0).all()
    # independent recount for SnapKV: its kept mask at the passkey tokens
    pre = model.forward(p["ids"], return_cache=True, attention_rows=8)
    sel = ev.select("snapkv", torch.stack([pre.attn[i] for i in sorted(pre.attn)]), 0.25, window=8)
    want = sel.mask[:, :, kpos].float().mean().item()
    got = ans.filter((pl.col("policy") == "snapkv") & (pl.col("budget") == 0.25))["key_kept"][0]
    assert got == pytest.approx(want) and 0 <= got < 1
    # StreamingLLM keeps 4 sinks and the newest tokens: a passkey in the middle is gone
    assert ans.filter((pl.col("policy") == "streamingllm") & (pl.col("budget") == 0.25))["key_kept"][0] == 0.0
    assert "mean_key_kept" in nd.accuracy_table(ans).columns


def test_quick_presets_are_valid_configs():
    from trajscope.studies.registry import studies

    from trajscope.calibration.plan import RUNNER_KEYS

    for name in ("eviction", "needle", "eviction-ppl"):
        study = studies()[name]
        own = {k: v for k, v in study.quick.items() if k not in RUNNER_KEYS}  # prompt count and cut: the runner's
        cfg = study.config(**own)  # the config checks itself: one sentence on a bad override
        assert all(getattr(cfg, k) == v for k, v in own.items())
