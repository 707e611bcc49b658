"""The report's eviction section: present with the numbers of a run's eviction tables, absent without them.

A run "has" an eviction study when ``trajscope eviction --runs RUN_DIR`` saved the study's Result into
``RUN_DIR/eviction/``; the expected means are recomputed here from those Parquet files (independently of the
study's summary function, which the section reads).
"""

from __future__ import annotations

import polars as pl
import pytest

import trajscope as ts
from trajscope.cli import main
from trajscope.reports.comparison import compare


@pytest.fixture(scope="module")
def two_runs(tiny_models, tiny_dirs, tmp_path_factory):
    root = tmp_path_factory.mktemp("evruns")
    llama = tiny_models["llama"]
    a = ts.capture(llama, "def f(x):\n    return x", max_new_tokens=6, stop_at_eos=False, run_id="a").save(root / "a")
    b = ts.capture(llama, "import os\nimport sys", max_new_tokens=6, stop_at_eos=False, run_id="b").save(root / "b")
    assert main(["eviction", "--runs", str(a), "--model", str(tiny_dirs["llama"]), "--device", "cpu",
                 "--policies", "snapkv,streamingllm", "--budgets", "0.7", "--window", "2"]) == 0
    return a, b


def test_cli_writes_the_study_into_the_run_directory(two_runs):
    a, b = two_runs
    assert {f.name for f in (a / "eviction").iterdir()} >= {"eviction_kept.parquet", "eviction_steps.parquet",
                                                             "eviction_rerun.parquet", "eviction_summary.parquet",
                                                             "eviction.result.json"}
    assert not (b / "eviction").exists()
    rr = pl.read_parquet(a / "eviction" / "eviction_rerun.parquet")
    assert rr["run_id"].unique().to_list() == ["a"] and rr["step"].max() == 5  # the run's 6 generated tokens
    ts.Trajectory.load(a)  # the run directory still loads


def test_report_has_the_eviction_section_with_the_tables_numbers(two_runs, tmp_path):
    a, b = two_runs
    out = compare([a, b]).save(tmp_path / "r.html")
    page = out.read_text()
    assert "<h2>KV-cache eviction</h2>" in page and "recall@k of decode attention" in page
    section = page[page.index("<h2>KV-cache eviction</h2>"):]
    steps = pl.read_parquet(a / "eviction" / "eviction_steps.parquet")
    rerun = pl.read_parquet(a / "eviction" / "eviction_rerun.parquet")
    for policy in ("snapkv", "streamingllm"):
        s = steps.filter((pl.col("policy") == policy) & pl.col("step").is_between(1, 4))
        r = rerun.filter((pl.col("policy") == policy) & pl.col("step").is_between(1, 4))
        row = (f"<td>a</td><td>{policy}</td><td>0.7000</td><td>1-4</td><td>{s['recall_at_k'].mean():.4f}</td>"
               f"<td>{s['evicted_mass'].mean():.4f}</td><td>{r['kl_to_full'].mean():.4f}</td>"
               f"<td>{r['token_agrees'].cast(pl.Float64).mean():.4f}</td></tr>")
        assert row in section, row
    assert "<td>b</td>" not in section  # run b has no study
    table = pl.read_parquet(tmp_path / "r_files" / "eviction_by_depth.parquet")
    assert set(table["run_id"]) == {"a"} and set(table["policy"]) == {"snapkv", "streamingllm"}


def test_runs_without_a_study_have_no_section(two_runs, tmp_path, tiny_models):
    _, b = two_runs
    in_memory = ts.capture(tiny_models["llama"], "x = 1", max_new_tokens=3)  # no directory: no study
    out = compare([b, in_memory]).save(tmp_path / "r.html")
    assert "KV-cache eviction" not in out.read_text()
    assert not (tmp_path / "r_files" / "eviction_by_depth.parquet").exists()


def test_runs_option_refuses_prompts_and_another_model(two_runs, tmp_path, capsys):
    a, _ = two_runs
    assert main(["eviction", "--runs", str(a), "--out", str(tmp_path)]) != 0
    assert "leave out --prompts and --out" in capsys.readouterr().err
    assert main(["eviction", "--runs", str(a), "--model", "sample"]) != 0
    assert "was captured with" in capsys.readouterr().err
