"""The eviction-ppl study: held-out files from the end of the corpus order, budget 1.0 equals the full cache
exactly, the paired increase and its interval come from one function, and the command writes its tables."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest

from trajscope.studies.eviction import perplexity as pp
from trajscope.studies.eviction.config import PerplexityConfig
from trajscope.studies.registry import Result, get


def test_heldout_files_are_ones_the_build_never_read(tiny_models):
    from trajscope.prepare.corpus import stdlib_items

    model = tiny_models["llama"]
    texts = pp.heldout_texts(model, 3, 200)
    order = pp.stdlib_order()
    assert len({t["file"] for t in texts}) == 3 and all(len(t["ids"]) == 200 for t in texts)
    assert all(order[t["sha1_rank"]] == t["file"] for t in texts)
    assert all(t["sha1_rank"] >= len(order) - 20 for t in texts)  # from the end of the order
    corpus = {it["group"] for it in stdlib_items(40, 2, 400)}  # the build's prompt corpus
    assert not corpus & {t["file"] for t in texts}
    assert all(model.encode((pp.pathlib.Path(pp.sysconfig.get_paths()["stdlib"]) / t["file"]).read_text(
        encoding="utf-8", errors="replace"))[:200] == t["ids"] for t in texts)


def test_summary_is_the_paired_mean_over_files():
    rows = pl.DataFrame({"file": ["a", "b", "c"] * 3, "policy": ["full"] * 3 + ["snapkv"] * 6,
                         "budget": [1.0] * 3 + [0.2] * 3 + [0.5] * 3, "budget_tokens": [10.0] * 9,
                         "nll": [2.0, 3.0, 4.0, 2.5, 3.1, 4.6, 2.0, 3.0, 4.0]})
    s = pp.perplexity_summary(rows)
    assert s["policy"].to_list() == ["full", "snapkv", "snapkv"]
    at = s.filter(pl.col("budget") == 0.2).row(0, named=True)
    assert at["delta_nll"] == pytest.approx(np.mean([0.5, 0.1, 0.6])) and at["n_files"] == 3
    assert at["delta_nll_lo"] >= 0.1 - 1e-12 and at["delta_nll_hi"] <= 0.6 + 1e-12
    same = s.filter(pl.col("budget") == 0.5).row(0, named=True)
    assert (same["delta_nll"], same["delta_nll_lo"], same["delta_nll_hi"]) == (0.0, 0.0, 0.0)


def test_ppl_command_writes_tables_and_budget_one_is_exact(tmp_path, capsys, tiny_dirs):
    from trajscope.cli import main
    from trajscope.export import read_table

    assert main(["study", "eviction-ppl", "--model", str(tiny_dirs["llama"]), "--n-files", "2", "--prompt-len", "48",
                 "--continuation", "8", "--policies", "snapkv,lookahead,pseudo", "--budgets", "0.3,1.0",
                 "--window", "8", "--lookahead", "4", "--out", str(tmp_path / "p")]) == 0
    rows = read_table(tmp_path / "p" / "eviction_ppl.parquet")
    full = rows.filter(pl.col("policy") == "full").select("file", pl.col("nll").alias("full"))
    one = rows.filter(pl.col("budget") == 1.0).filter(pl.col("policy") != "full").join(full, on="file")
    assert one.height == 6 and (one["nll"] == one["full"]).all()  # every key kept: the full cache, exactly
    cut = rows.filter(pl.col("budget") == 0.3).join(full, on="file")
    assert (cut["nll"] != cut["full"]).all()
    summ = read_table(tmp_path / "p" / "eviction_ppl_summary.parquet")
    assert set(summ["policy"]) == {"full", "snapkv", "lookahead", "pseudo"} and set(summ["n_files"]) == {2}
    assert "eviction_ppl_summary:" in capsys.readouterr().out
    with pytest.raises(SystemExit):  # it reads its own files: no --prompts
        main(["study", "eviction-ppl", "--prompts", "x.jsonl", "--out", str(tmp_path)])
    assert main(["study", "eviction-ppl", "--policies", "h2o_rolling", "--out", str(tmp_path)]) == 2
    assert "Unknown eviction policy 'h2o_rolling'" in capsys.readouterr().err


def test_ppl_increase_is_one_value_in_report_and_marker(monkeypatch, tiny_models, tmp_path):
    sentinel, shown = 0.7123456, "0.712"

    real = pp.perplexity_summary
    calls = []

    def planted(rows):
        calls.append(1)
        return real(rows).with_columns(pl.when(pl.col("policy") == "full").then(pl.col("delta_nll"))
                                       .otherwise(pl.lit(sentinel)).alias("delta_nll"))

    monkeypatch.setattr(pp, "perplexity_summary", planted)
    config = PerplexityConfig(policies=("snapkv",), budgets=(0.4,), window=8, lookahead=4, prompt_len=40,
                              continuation=6, n_files=2)
    get("eviction-ppl").run(tiny_models["llama"], None, config).save(tmp_path)
    marker = json.loads((tmp_path / "eviction-ppl.result.json").read_text())
    assert marker["summaries"]["snapkv@0.4"]["value"] == sentinel and calls == [1]
    _, html, _ = get("eviction-ppl").section(Result.load(tmp_path, "eviction-ppl"))
    assert html.count(shown) == 1
