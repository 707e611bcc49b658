"""The SAE drift study, registered: ``trajscope study sae-drift`` on the sample model and its shipped SAEs,
its headline numbers from one function, and the shipped report read as a Result."""

from __future__ import annotations

import json
import pathlib

import polars as pl
import pytest

from trajscope.errors import TrajscopeError
from trajscope.studies import sae_drift
from trajscope.studies.registry import Result, get, studies
from trajscope.studies.sae_drift import summary as S

PROMPTS = "sample_data/prompts/heldout_code.jsonl"
SHIPPED = pathlib.Path(__file__).resolve().parents[2] / "sample_data" / "saes" / "report"
FAST = ["--max-prompts", "3", "--max-tokens", "24", "--max-new-tokens", "6", "--n-boot", "20", "--n-null", "5"]
SENTINEL = 7777.0


def test_registered_with_flags_from_its_config(capsys):
    from trajscope.cli import main

    assert get("sae-drift").config is sae_drift.SaeDriftConfig and "sae-drift" in studies()
    with pytest.raises(SystemExit):
        main(["study", "sae-drift", "--help"])
    shown = capsys.readouterr().out
    assert "--saes" in shown and "--no-splice" in shown and "seed replicate" in shown


def test_config_refuses_bad_values_in_one_sentence():
    with pytest.raises(TrajscopeError, match="at least one SAE"):
        sae_drift.SaeDriftConfig(saes=())
    with pytest.raises(TrajscopeError, match="--n-boot must be at least 1"):
        sae_drift.SaeDriftConfig(n_boot=0)
    with pytest.raises(TrajscopeError, match="NAME=DIR"):
        sae_drift.SaeDriftConfig(saes=("a=",))
    assert sae_drift.parse_saes(("a=x", "b=y", "a=z", "dir/w")) == {"a": ["x", "z"], "b": ["y"], "w": ["dir/w"]}


def test_a_directory_whose_path_holds_an_equals_sign_is_a_bare_dir(tmp_path):
    d = tmp_path / "k=32"
    d.mkdir()
    assert sae_drift.parse_saes((str(d),)) == {"k=32": [str(d)]}


def test_the_headline_number_comes_from_one_function(tmp_path, monkeypatch, capsys):
    """``summarize`` patched to a sentinel: the marker, the summary table, the printed summary and the report
    section all show the sentinel, so none of them computes the number itself."""
    from trajscope.cli import main
    from trajscope.reports.studies import study_report

    real = S.summarize

    def patched(*args, **kw):
        out = real(*args, **kw)
        out["fvu decode prefill-only"] = {**out["fvu decode prefill-only"], "value": SENTINEL}
        return out

    monkeypatch.setattr(S, "summarize", patched)
    out = tmp_path / "sd"
    assert main(["study", "sae-drift", "--prompts", PROMPTS, *FAST, "--out", str(out)]) == 0
    assert "7777" in capsys.readouterr().out  # trajscope study prints the summary table
    marker = json.loads((out / "sae-drift.result.json").read_text())
    assert marker["summaries"]["fvu decode prefill-only"]["value"] == SENTINEL
    table = pl.read_parquet(out / "sae-drift_summary.parquet")
    assert table.filter(pl.col("summary") == "fvu decode prefill-only")["value"].to_list() == [SENTINEL]
    html = study_report([out], tmp_path / "r.html").read_text()
    assert "7777.000 [" in html
    # the number is not the table's own: unpatched, the summary equals the seed table's decode row
    seeds = pl.read_parquet(out / "sae-drift_seeds.parquet").filter(
        (pl.col("kind") == "phase") & (pl.col("phase") == "decode") & (pl.col("metric") == "fvu")
        & (pl.col("sae") == "prefill-only"))
    honest = real(seeds, pl.read_parquet(out / "sae-drift_diff.parquet"), pl.read_parquet(out / "sae-drift_overlap.parquet"))
    assert honest["fvu decode prefill-only"]["value"] == pytest.approx(seeds["value"][0]) != SENTINEL
    assert marker["summaries"]["setup"]["harvest"]["max_new_tokens"] == 6


def test_layers_must_hold_the_sae_layer(sample_model):
    from trajscope.studies import prompts as P

    prompts = P.encode_prompts(sample_model, P.read_prompt_file(PROMPTS, 2), 16)
    with pytest.raises(TrajscopeError, match="layer 3"):
        sae_drift.run(sample_model, prompts, sae_drift.SaeDriftConfig(), layers=[0, 1])


def test_the_shipped_report_is_a_result_its_section_reads():
    res = Result.load(SHIPPED, "sae-drift")
    assert get("sae-drift").holds(SHIPPED)
    title, body, figs = get("sae-drift").section(res)
    s = res.summaries["fvu decode prefill-only"]
    assert f"{s['value']:.3f} [{s['lo']:.3f}, {s['hi']:.3f}]" == "0.106 [0.103, 0.111]"  # as sae-drift.txt prints it
    assert "0.106 [0.103, 0.111]" in (SHIPPED / "sae-drift.txt").read_text()
    assert "0.106 [0.103, 0.111]" in body and "beyond noise" in body and len(figs) == 1
    # the stored summaries are what summarize gives on the shipped tables
    again = S.summarize(res.table("sae-drift_seeds"), res.table("sae-drift_diff"), res.table("sae-drift_overlap"))
    assert {k: v for k, v in res.summaries.items() if k != "setup"} == again


def test_a_result_without_summaries_is_summarised_by_the_same_function(tmp_path):
    res = Result.load(SHIPPED, "sae-drift")
    bare = Result(study="sae-drift", tables={n: res.table(n) for n in ("sae-drift_seeds", "sae-drift_diff",
                                                                     "sae-drift_overlap")})
    from trajscope.studies.sae_drift.section import summaries_of

    assert summaries_of(bare)["fvu decode hybrid − prefill-only"]["verdict"] == "beyond noise"
