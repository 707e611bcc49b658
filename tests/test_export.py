"""Exports and comparison reports: versioned Parquet, Hive datasets (Polars, DuckDB), reports, bad runs."""

from __future__ import annotations

import shutil

import polars as pl
import pytest

import trajscope as ts
from trajscope.cli import main
from trajscope.export import ALL_TABLES, export, read_table, scan
from trajscope.reports.comparison import compare
from trajscope.trajectory import SCHEMA_VERSION


@pytest.fixture(scope="module")
def runs(tiny_models, tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    out = []
    for i, fam in enumerate(["llama", "gpt2", "llama"]):
        t = ts.capture(tiny_models[fam], f"def f{i}(x):", max_new_tokens=5, stop_at_eos=False, run_id=f"run{i}")
        out.append((t, t.save(root / f"run{i}")))
    return out


def test_parquet_files_carry_the_schema_version(runs, tmp_path):
    traj, path = runs[0]
    meta = pl.read_parquet_metadata(path / "attention.parquet")
    assert meta["trajscope_schema"] == str(SCHEMA_VERSION) and meta["trajscope_table"] == "attention"
    traj.to_parquet(tmp_path / "t")
    assert read_table(tmp_path / "t" / "tokens.parquet").equals(traj.tokens)
    old = tmp_path / "old.parquet"
    traj.tokens.write_parquet(old, metadata={"trajscope_schema": "0", "trajscope_table": "tokens"})
    with pytest.raises(ts.TrajscopeError, match="schema version 0; this trajscope reads version"):
        read_table(old)
    traj.tokens.write_parquet(tmp_path / "plain.parquet")
    with pytest.raises(ts.TrajscopeError, match="not written by trajscope"):
        read_table(tmp_path / "plain.parquet")


def test_export_reads_back_with_polars_and_duckdb(runs, tmp_path):
    out = export([p for _, p in runs], tmp_path / "ds", progress=False)
    for table in ("tokens", "attention", "activations"):
        df = scan(out, table).collect()
        want = sum(getattr(t, table).height for t, _ in runs)
        assert df.height == want
        assert set(df["run_id"]) == {"run0", "run1", "run2"}
        assert set(getattr(runs[0][0], table).columns) <= set(df.columns)
    models = scan(out, "tokens").select("model").unique().collect()["model"].to_list()
    assert len(models) == 2
    duckdb = pytest.importorskip("duckdb")
    n = duckdb.sql(f"select count(*) from read_parquet('{out}/attention/**/*.parquet', hive_partitioning=true)").fetchall()[0][0]
    assert n == sum(t.attention.height for t, _ in runs)
    cols = {r[0] for r in duckdb.sql(f"describe select * from read_parquet('{out}/tokens/**/*.parquet', "
                                     "hive_partitioning=true)").fetchall()}
    assert {"run_id", "model", "pos", "step", "phase", "logprob"} <= cols
    exported = {d.name for d in out.iterdir() if d.is_dir()}
    assert exported == {t for t in ALL_TABLES if getattr(runs[0][0], t, None) is not None}  # every table a run has


def test_export_errors(runs, tmp_path):
    with pytest.raises(ts.TrajscopeError, match="not a trajscope run directory"):
        export([tmp_path], tmp_path / "o", progress=False)
    with pytest.raises(ts.TrajscopeError, match="Cannot partition by"):
        export([runs[0][1]], tmp_path / "o", partition_by=("color",), progress=False)
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ts.TrajscopeError, match="Cannot export to"):
        export([runs[0][1]], blocker / "o", progress=False)


def test_report_tables_and_skip_bad(runs, tmp_path, capsys):
    comp = compare([runs[0][0], runs[2][0]])
    tables = comp.tables()
    aligned = tables["tokens_aligned"]
    assert aligned.height == 5 and aligned.columns[0] == "produced_at_step"
    assert tables["overview"]["run_id"].to_list() == ["run0", "run2"]
    bad = tmp_path / "bad"
    shutil.copytree(runs[1][1], bad)
    (bad / "attention.parquet").unlink()
    with pytest.raises(ts.TrajscopeError, match=f"Cannot report on '{bad}'"):
        compare([runs[0][1], bad])
    rc = main(["report", str(runs[0][1]), str(bad), str(runs[2][1]), "-o", str(tmp_path / "r.html"), "--skip-bad"])
    assert rc == 0
    text = (tmp_path / "r.html").read_text()
    assert "Runs left out" in text and "attention.parquet is missing" in text
    assert (tmp_path / "r_files" / "tokens_aligned.parquet").exists()
    assert main(["report", str(bad), "-o", str(tmp_path / "r2.html")]) == 2
    assert "bad" in capsys.readouterr().err


def test_report_of_many_runs_summarises(tiny_models, tmp_path):
    from trajscope.reports.comparison import MAX_ALIGNED_RUNS, MAX_CURVES

    model = tiny_models["gpt2"]
    many = [ts.capture(model, f"x = {i}", max_new_tokens=3, stop_at_eos=False, run_id=f"m{i:02d}")
            for i in range(MAX_CURVES + 1)]
    comp = compare(many)
    assert len(comp.tables()["tokens_aligned"].columns) == 1 + MAX_ALIGNED_RUNS
    text = comp.save(tmp_path / "many.html").read_text()
    assert f"mean of {MAX_CURVES + 1} runs" in text and f"the first {MAX_ALIGNED_RUNS} of {MAX_CURVES + 1} runs" in text


def test_report_drift_section(tiny_models, tmp_path):
    from trajscope.studies.drift.build import build_profile

    model = tiny_models["llama"]
    prof = build_profile(model, [f"def g{i}(y):\n    return y * {i}" for i in range(5)], fpr=0.05, progress=False)
    runs = [ts.capture(model, f"import os{i}", max_new_tokens=6, stop_at_eos=False, residual_layers="all")
            for i in range(2)]
    comp = compare(runs, profile=prof.save(tmp_path / "p.safetensors"))
    table = comp.tables()["drift_by_depth"]
    assert set(table["layer"]) == {0, 1} and "prefill" in set(table["depth_band"])
    text = comp.save(tmp_path / "d.html").read_text()
    assert "Drift versus the prefill profile" in text and (tmp_path / "d_files" / "drift_by_depth.parquet").exists()


def test_report_reads_run_directories_lazily(runs, tiny_models, tmp_path):
    from trajscope.studies.drift.build import build_profile

    lazy = ts.Trajectory.load(runs[0][1], lazy=True)
    assert isinstance(lazy.attention, pl.LazyFrame) and lazy.tensors == {}
    eager = compare([t for t, _ in runs[:1]]).tables()
    from_disk = compare([p for _, p in runs[:1]]).tables()
    from polars.testing import assert_frame_equal

    for name in ("attention_by_step", "residual_by_step", "tokens_aligned"):  # streaming means may sum in another order
        assert_frame_equal(from_disk[name], eager[name], check_exact=False, rel_tol=1e-6, abs_tol=1e-9)
    model = tiny_models["llama"]
    t = ts.capture(model, "import sys", max_new_tokens=6, stop_at_eos=False, residual_layers="all")
    prof = build_profile(model, [f"x{i} = {i} * y" for i in range(4)], fpr=0.05, progress=False)
    assert "drift_by_depth" in compare([t.save(tmp_path / "r")], profile=prof).tables()


def test_every_parquet_write_in_the_package_stamps_schema_metadata():
    """The module docstring's promise, checked on the source: each ``write_parquet`` / ``sink_parquet``
    call passes ``metadata=`` (``Trajectory``'s ``write_table`` helper does)."""
    import ast
    import pathlib

    root = pathlib.Path(ts.__file__).parent
    bare = []
    for f in root.rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("write_parquet", "sink_parquet")
                    and not any(k.arg == "metadata" for k in node.keywords)):
                bare.append(f"{f.relative_to(root)}:{node.lineno}")
    assert not bare, bare
