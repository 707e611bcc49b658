"""Bands sort by depth, not as text (``1-4, 5-16, 17-64``, never ``1-4, 17-64, 5-16``)."""

from __future__ import annotations

import polars as pl

from trajscope.metrics.bands import DEPTH_ORDER, band_rank, sort_bands
from trajscope.studies.eviction.summary import summarize

TEXT_ORDER = sorted(DEPTH_ORDER[1:5])  # ['1-4', '17-64', '5-16', '65-256']: what a text sort gives


def test_band_rank_and_sort_bands():
    assert TEXT_ORDER != list(DEPTH_ORDER[1:5])
    df = pl.DataFrame({"k": ["b", "a", "a", "a"], "depth_band": ["1-4", "17-64", "5-16", "prefill"],
                       "entropy_band": ["3+", "0-0.5", "1.5-3", None]})
    assert df.select(band_rank("depth_band"))["depth_band"].to_list() == [1, 3, 2, 0]
    assert sort_bands(df, "k", "depth_band")["depth_band"].to_list() == ["prefill", "5-16", "17-64", "1-4"]
    assert sort_bands(df, "entropy_band")["entropy_band"].to_list() == ["0-0.5", "1.5-3", "3+", None]
    assert sort_bands(df.lazy(), "depth_band").collect()["depth_band"].to_list()[:2] == ["prefill", "1-4"]


def _costs() -> pl.DataFrame:
    steps = list(range(1, 71))
    rows = [{"run_id": r, "policy": "snapkv", "budget": 0.2, "step": s, "layer": 0, "head": 0,
             "recall_at_k": 1.0 / s, "evicted_mass": s / 100} for r in ("p0", "p1") for s in steps]
    return pl.DataFrame(rows)


def test_eviction_tables_sort_bands_by_depth():
    want = ["1-4", "5-16", "17-64", "65-256"]
    rerun = pl.DataFrame(schema={"run_id": pl.String, "policy": pl.String, "budget": pl.Float64, "step": pl.Int32,
                                 "kl_to_full": pl.Float64, "token_agrees": pl.Boolean, "forced_agrees": pl.Boolean})
    assert summarize(_costs(), rerun, n_boot=20)["depth_band"].to_list() == ["all", *want]
