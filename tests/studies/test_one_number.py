"""One number, one function: for each converted study, the headline number on the app's card, in the report
section's HTML and in the written summary (``Result.save``: the marker and the summary table) is the same value,
computed once.

Each test replaces the study's one summary function by a counting wrapper that plants a sentinel value, runs the
study once (through the card where the study has one), then reads the number from all three surfaces. A surface
that computed the number itself would show the real value instead of the sentinel, or call the function again.
"""

from __future__ import annotations

import json

import polars as pl
import pytest
from bokeh.document import Document

from trajscope.studies.registry import Result, get
from trajscope.ui.state import AppState

SENTINEL, LO, HI = 7.654321, 7.0, 8.0
SHOWN = "7.654 [7.000, 8.000]"


@pytest.fixture
def short_run(sample_model):
    """8 greedy decode steps of the sample model."""
    import trajscope as ts

    return ts.capture(sample_model, "def fibonacci(n):\n    if n < 2:\n        return n\n", max_new_tokens=8)


class Counting:
    """Wraps a summary function: counts its calls and plants the sentinel in what it returns."""

    def __init__(self, real, plant):
        self.real, self.plant, self.calls = real, plant, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.plant(self.real(*args, **kwargs))


def test_eviction_headline_is_one_value_on_card_report_and_summary(monkeypatch, short_run, sample_model, tmp_path):
    from trajscope.studies.eviction import summary as sm
    from trajscope.studies.eviction.card import EvictionView

    def plant(df: pl.DataFrame) -> pl.DataFrame:
        return df.with_columns(pl.lit(SENTINEL).alias("kl_to_full"), pl.lit(LO).alias("kl_to_full_lo"),
                               pl.lit(HI).alias("kl_to_full_hi"))

    counting = Counting(sm.summarize, plant)
    monkeypatch.setattr(sm, "summarize", counting)
    state = AppState()
    state.set_trajectory(short_run, step=0)
    card = EvictionView(state=state, model_loader=lambda source: sample_model)
    card.__panel__().get_root(Document())
    card.settings.param.update(policy="snapkv", budget=0.5, window=3)
    card.run()
    result = card.settings.result
    assert result is not None, card.settings.status
    assert f"KL {SHOWN} nats" in card.settings.summary  # the card

    result.save(tmp_path)  # the written summary: marker and table
    marker = json.loads((tmp_path / "eviction.result.json").read_text())
    assert marker["summaries"]["snapkv@0.5"]["kl_to_full"] == {"value": SENTINEL, "lo": LO, "hi": HI}
    assert set(pl.read_parquet(tmp_path / "eviction_summary.parquet")["kl_to_full"]) == {SENTINEL}

    _, html, _ = get("eviction").section(Result.load(tmp_path, "eviction"))  # the report
    assert html.count(SHOWN) >= 2  # over every decode step, and by band
    assert counting.calls == 1


def test_compaction_headline_is_one_value_on_card_report_and_summary(monkeypatch, sample_model, tmp_path):
    from trajscope.studies.compaction import summary as sm
    from trajscope.studies.compaction.card import CompactionView

    def plant(df: pl.DataFrame) -> pl.DataFrame:
        hit = (pl.col("metric") == "rel_l2") & (pl.col("pair") == "A_vs_C")
        return df.with_columns(*[pl.when(hit).then(pl.lit(v)).otherwise(pl.col(c)).alias(c)
                                 for c, v in (("estimate", SENTINEL), ("lo", LO), ("hi", HI))])

    counting = Counting(sm.summarize, plant)
    monkeypatch.setattr(sm, "summarize", counting)
    card = CompactionView(state=AppState(), model_loader=lambda source: sample_model)
    card.settings.max_new_tokens = 3
    card.__panel__().get_root(Document())
    card.run()
    res = card.settings.result
    assert res is not None, card.settings.status
    assert "rel. L2 to C 7.654 (A)" in card.settings.summary  # the card

    res.result.save(tmp_path)
    marker = json.loads((tmp_path / "compaction.result.json").read_text())
    assert (marker["summaries"]["divergence"]["estimate"], marker["summaries"]["divergence"]["lo"]) == (SENTINEL, LO)
    table = pl.read_parquet(tmp_path / "compaction_summary.parquet")
    assert set(table.filter((pl.col("metric") == "rel_l2") & (pl.col("pair") == "A_vs_C"))["estimate"]) == {SENTINEL}

    _, html, _ = get("compaction").section(Result.load(tmp_path, "compaction"))
    assert f"rel. L2 {SHOWN}" in html
    assert counting.calls == 1


@pytest.mark.parametrize("study", ["needle"])
def test_needle_accuracy_is_one_value_in_report_and_summary(monkeypatch, tiny_models, tmp_path, study):
    """The needle study has no card: its accuracy in the report and in the written summary is one value."""
    from trajscope.studies.eviction import needle as nd
    from trajscope.studies.eviction.config import NeedleConfig

    def plant(df: pl.DataFrame) -> pl.DataFrame:
        return df.with_columns(pl.lit(SENTINEL).alias("accuracy"), pl.lit(LO).alias("lo"), pl.lit(HI).alias("hi"))

    counting = Counting(nd.accuracy_table, plant)
    monkeypatch.setattr(nd, "accuracy_table", counting)
    config = NeedleConfig(policies=("snapkv",), budgets=(0.5,), window=8, lookahead=4, context=96, n_prompts=2,
                          answer_tokens=2)
    get(study).run(tiny_models["llama"], None, config).save(tmp_path)
    marker = json.loads((tmp_path / "needle.result.json").read_text())
    assert marker["summaries"]["snapkv@0.5"]["value"] == SENTINEL
    assert set(pl.read_parquet(tmp_path / "needle_summary.parquet")["accuracy"]) == {SENTINEL}
    _, html, _ = get(study).section(Result.load(tmp_path, study))
    assert html.count(SHOWN) == 2  # snapkv and the full cache
    assert counting.calls == 1
