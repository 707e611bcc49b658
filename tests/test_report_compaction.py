"""The study report's compaction section renders from the shipped study's Result, numbers with intervals."""

from __future__ import annotations

import re
import shutil

import numpy as np
import polars as pl
import pytest
from bokeh.model import Model

from trajscope.errors import TrajscopeError
from trajscope.model import sample_data_dir
from trajscope.studies.compaction.section import decode_divergence, divergence_by_layer, probe_rows, section
from trajscope.studies.registry import Result

SHIPPED = sample_data_dir() / "reports" / "compaction"


def _section(d=SHIPPED):
    return section(Result.load(d, "compaction"))


def test_section_renders_the_shipped_study():
    title, frag, figs = _section()
    assert title == "Context compaction: masking vs restart"
    assert figs and all(isinstance(f, Model) for f in figs)
    assert [f.title.text.split(":")[0] for f in figs] == ["Compaction"] * 2 + ["Compaction probe (real labels)"]
    summary = pl.read_parquet(SHIPPED / "compaction_summary.parquet")
    kl = summary.filter((pl.col("metric") == "next_token_kl") & (pl.col("pair") == "A_vs_B")).row(0, named=True)
    assert f"{kl['estimate']:.3f} [{kl['lo']:.3f}, {kl['hi']:.3f}]" in frag
    att = summary.filter((pl.col("metric") == "attention_summary_mass") & (pl.col("pair") == "B")
                         & (pl.col("layer") == 5)).row(0, named=True)
    assert f"{att['estimate']:.3f} [{att['lo']:.3f}, {att['hi']:.3f}]" in frag
    # setup, n and split are stated
    assert "200 sessions; probe fitted on 140 and scored on 60 held-out sessions" in frag
    assert "Planted-signal check" not in frag
    ptitle, pfrag, pfigs = _section(SHIPPED / "planted")  # the planted run is its own Result
    assert ptitle.endswith("(planted signal)") and "Planted-signal check (80 × a class direction at block 0" in pfrag
    assert pfigs[-1].title.text.startswith("Compaction probe (planted fact)")
    assert "http" not in frag
    for h in ("T3 hidden states vs the full context", "Next-token distribution", "Greedy continuation",
              "Attention mass of T3's queries on the summary", "Probe: the masked fact"):
        assert h in frag
    # every row of the divergence table: A, B and D against C, one per layer
    div = divergence_by_layer(summary)
    assert sorted(div["pair"].unique()) == ["A_vs_C", "B_vs_C", "D_vs_C"] and div.height == 18
    assert ((div["rel_l2_lo"] <= div["rel_l2"]) & (div["rel_l2"] <= div["rel_l2_hi"])).all()


def test_first_divergence_and_probe_rows_against_direct_counts():
    decode = pl.read_parquet(SHIPPED / "compaction_decode.parquet")
    summary = pl.read_parquet(SHIPPED / "compaction_summary.parquet")
    rows = decode_divergence(summary)
    assert [r["setup"] for r in rows] == ["A", "B", "D"]
    for r in rows:
        g = decode.filter(pl.col("setup") == r["setup"])
        fd = np.array([16 if v is None else v for v in g["first_divergence"].to_list()], dtype=float)
        assert r["depth"]["estimate"] == pytest.approx(fd.mean()) and r["depth"]["n_sessions"] == 200
        assert r["diverged"]["estimate"] == pytest.approx(np.mean([v is not None for v in g["first_divergence"]]))
        assert r["depth"]["lo"] <= r["depth"]["estimate"] <= r["depth"]["hi"]
    probe = pl.read_parquet(SHIPPED / "compaction_probe.parquet")
    rows = probe_rows(probe)
    assert [r[0] for r in rows] == [str(i) for i in range(6)]
    c5 = probe.filter((pl.col("layer") == 5) & (pl.col("train_setup") == "C") & (pl.col("test_setup") == "C")
                      & (pl.col("control") == "real")).row(0, named=True)
    assert rows[5][3] == f"{c5['accuracy']:.3f} [{c5['lo']:.3f}, {c5['hi']:.3f}]"
    c5s = probe.filter((pl.col("layer") == 5) & (pl.col("train_setup") == "C") & (pl.col("test_setup") == "C")
                       & (pl.col("control") == "shuffled")).row(0, named=True)
    assert rows[5][5] == f"{c5s['accuracy']:.3f} [{c5s['lo']:.3f}, {c5s['hi']:.3f}]"


def test_figures_embed_in_a_standalone_page():
    from bokeh.embed import components

    _, frag, figs = _section()
    script, divs = components(figs)
    assert len(divs) == len(figs) and "Bokeh" in script


def test_an_older_study_without_attention_and_a_folder_without_a_study(tmp_path):
    old = tmp_path / "old"
    shutil.copytree(SHIPPED, old, ignore=shutil.ignore_patterns("planted", "compaction_attention.parquet"))
    s = pl.read_parquet(old / "compaction_summary.parquet")
    s.filter(~pl.col("metric").str.starts_with("attention")).write_parquet(old / "compaction_summary.parquet")
    _, frag, figs = _section(old)
    assert "not in these tables" in frag and len(figs) == 2
    with pytest.raises(TrajscopeError, match=re.escape("The compaction study has no table 'compaction_summary'")):
        _section(tmp_path)
