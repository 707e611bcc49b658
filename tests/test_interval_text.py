"""One interval formatter: ``est [lo, hi]``, and "one prompt: no interval" instead of ``[NaN, NaN]``."""

from __future__ import annotations

import json
import math

import polars as pl

from trajscope.interval_text import format_interval, interval_columns
from trajscope.stats import Interval, cluster_bootstrap

NAN = math.nan


def test_format_interval_cases():
    assert format_interval(0.12345, 0.1, 0.15) == "0.123 [0.100, 0.150]"
    assert format_interval(0.5, NAN, NAN, n_clusters=1) == "0.500 (one prompt: no interval)"
    assert format_interval(0.5, None, None, n_clusters=1, unit="session") == "0.500 (one session: no interval)"
    assert format_interval(0.5, NAN, NAN, n_clusters=4) == "0.500 (no interval)"
    assert format_interval(0.5, NAN, NAN) == "0.500"
    assert format_interval(None, 0.1, 0.2) == format_interval(NAN, 0.1, 0.2) == "—"
    assert format_interval(2.0, 1.0, 3.0, 1, number=lambda v: f"{v:g}") == "2 [1, 3]"


def test_one_prompt_bootstrap_says_so():
    one = cluster_bootstrap([0.1, 0.2, 0.3], ["p"] * 3)
    assert math.isnan(one.lo) and one.fmt() == "0.200 (one prompt: no interval)" and "nan" not in str(one)
    two = cluster_bootstrap([0.1, 0.2, 0.3, 0.4], ["p", "p", "q", "q"])
    assert str(two).startswith("0.250 [") and "nan" not in str(two)
    assert Interval(1.0, NAN, NAN, 0.95, 1, 0).fmt(2, unit="session") == "1.00 (one session: no interval)"


def test_interval_columns_merge_estimate_and_bounds():
    df = pl.DataFrame({"band": ["1-4", "5-16"], "n_prompts": [1, 3], "kl": [0.5, 0.25], "kl_lo": [NAN, 0.2],
                       "kl_hi": [NAN, 0.3], "other": [1, 2]})
    out = interval_columns(df, ["kl", "missing"], "n_prompts")
    assert out.columns == ["band", "n_prompts", "kl", "other"]
    assert out["kl"].to_list() == ["0.500 (one prompt: no interval)", "0.250 [0.200, 0.300]"]


def test_one_prompt_eviction_study_prints_no_nan(tmp_path, capsys):
    from trajscope.cli import main

    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "def fibonacci(n):\n    if n < 2:\n        return n\n", "id": "p0"}))
    assert main(["eviction", "--prompts", str(prompts), "--policies", "snapkv", "--budgets", "0.25",
                 "--max-new-tokens", "4", "--window", "4", "--out", str(tmp_path / "ev")]) == 0
    out = capsys.readouterr().out
    assert "one prompt: no interval" in out and "nan" not in out.lower(), out
