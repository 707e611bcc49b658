"""The study report: each serving section renders from the shipped tables, the page loads nothing
from the network, and ``trajscope study-report`` runs end to end (with its one-sentence errors).

Numbers in the sections are checked against the tables they come from (recomputed here with Polars).
"""

from __future__ import annotations

import pathlib
import re
import shutil

import polars as pl
import pytest

from trajscope.studies.serving import sections as rs
from trajscope.errors import TrajscopeError
from trajscope.reports.studies import detect, sections, study_report
from trajscope.studies.registry import studies

ROOT = pathlib.Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "sample_data" / "reports" / "serving"
COMPACTION = ROOT / "sample_data" / "reports" / "compaction"
EVICTION = ROOT / "sample_data" / "reports" / "eviction"
SECTIONS = sections()
SERVING = [name for name, s in studies().items() if s.family == "serving"]


def _fetched(html: str) -> list[str]:
    """What the page itself loads from the network (copied from tests/test_newcomer.py)."""
    out = re.findall(r"""<script[^>]*\ssrc\s*=\s*["'](https?://[^"']+)""", html)
    out += re.findall(r"""<link[^>]*\shref\s*=\s*["'](https?://[^"']+)""", html)
    out += re.findall(r"""@import\s+(?:url\()?["']?(https?://[^"')\s]+)""", html)
    return out


def test_shipped_directory_holds_every_serving_study():
    assert detect(SHIPPED) == SERVING and detect(COMPACTION) == ["compaction"] and detect(EVICTION) == ["eviction"]


def test_one_page_holds_the_serving_compaction_and_eviction_studies(tmp_path):
    out = study_report([SHIPPED, COMPACTION, COMPACTION / "planted", EVICTION], tmp_path / "all.html")
    html = out.read_text(encoding="utf-8")
    assert not _fetched(html) and html.count("<h2>") >= len(SERVING) + 3
    assert "<h2>KV-cache eviction" in html and "Planted-signal check" in html
    assert "Sections left out" not in html


@pytest.mark.parametrize("study", SERVING)
def test_each_section_renders_from_the_shipped_tables(study):
    title, body, figs = SECTIONS[study](SHIPPED)
    assert title and "<table>" in body and figs
    assert "95" in body and "n = " in body or "train" in body  # setup, n and split are stated
    if study == "prefix-cache":
        cov = pl.read_parquet(SHIPPED / "prefix-cache_coverage.parquet")
        n, r = cov.height, int((cov["status"] == "reused").sum())
        assert f"{r:,} of {n:,} positions" in body
    if study == "determinism":
        fl = pl.read_parquet(SHIPPED / "determinism_floor.parquet")
        top = fl.filter(pl.col("dtype") == "float32")["floor_rel_l2"].max()
        assert rs.num(top) in body
    if study == "sae-stability":
        summ = pl.read_parquet(SHIPPED / "sae-stability_summary.parquet")
        row = summ.filter((pl.col("mode") == "bfloat16") & (pl.col("metric") == "row_jaccard")).row(0, named=True)
        assert rs.ci(row["value"], row["lo"], row["hi"]) in body and "eval prompts" in body
        h = pl.read_parquet(SHIPPED / "sae-stability_harvests.parquet").filter(pl.col("mode") == "bfloat16").row(0, named=True)
        assert rs.ci(h["rel_l2_vs_reference"], h["rel_l2_lo"], h["rel_l2_hi"]) in body
    assert "[–, –]" not in body  # every interval cell found its bounds


def test_num_and_ci_format():
    assert rs.num(None) == "–" and rs.num(0.0) == "0" and rs.num(3) == "3" and rs.num(0.000123456) == "0.000123"
    assert rs.ci(0.5, 0.25, 0.75) == "0.5 [0.25, 0.75]"


def test_study_report_command_end_to_end(tmp_path, capsys):
    from trajscope.cli import main

    one = tmp_path / "serving"
    shutil.copytree(SHIPPED, one)
    other = tmp_path / "only-chunked"
    other.mkdir()
    for f in SHIPPED.glob("chunked-prefill*.parquet"):
        shutil.copy(f, other / f.name)
    out = tmp_path / "r" / "studies.html"
    assert main(["study-report", str(one), str(other), "--out", str(out)]) == 0
    html = out.read_text(encoding="utf-8")
    assert not _fetched(html) and "fonts.googleapis" not in html and "cdn.bokeh.org" not in html
    assert html.count("<h2>Chunked vs monolithic prefill") == 2 and "Bokeh" in html
    assert all(f"<h2>{t}" in html for t in ("Determinism floor", "Batch composition", "Prefix cache",
                                            "SAE stability under serving modes"))
    assert "studies: determinism" in capsys.readouterr().err
    # a damaged table leaves its section out with its reason; the rest still renders
    (other / "chunked-prefill_floor.parquet").write_bytes(b"not parquet")
    study_report([other, one], out)
    assert "Sections left out" in out.read_text(encoding="utf-8")


def test_study_report_errors(tmp_path):
    with pytest.raises(TrajscopeError, match=r"^No study tables found in"):
        study_report([tmp_path], tmp_path / "x.html")
    with pytest.raises(TrajscopeError, match=r"is not a directory\.$"):
        study_report([tmp_path / "missing"], tmp_path / "x.html")
    with pytest.raises(TrajscopeError, match=r"^Give at least one study directory"):
        study_report([], tmp_path / "x.html")


def test_trajscope_report_renders_study_folders_through_the_registry(tmp_path, capsys):
    """``trajscope report DIR…`` on folders of studies' output writes their sections (as study-report does);
    mixing study folders and runs is one sentence."""
    from trajscope.cli import main

    out = tmp_path / "r.html"
    assert main(["report", str(SHIPPED), str(EVICTION), "-o", str(out)]) == 0
    html = out.read_text(encoding="utf-8")
    assert html.count("<h2>") >= len(SERVING) + 1 and "<h2>KV-cache eviction" in html and not _fetched(html)
    assert "2 study folders" in capsys.readouterr().err
    runs = ROOT / "sample_data" / "runs"
    assert main(["report", str(SHIPPED), str(runs), "-o", str(tmp_path / "x.html")]) == 2
    assert "holds a study's output and the other paths hold runs" in capsys.readouterr().err
    assert not (tmp_path / "x.html").exists()
