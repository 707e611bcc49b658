"""The steering-depth study as a registered study: ``trajscope study steering``, its report section and the app's
Steering tab show one number, computed by one function (:func:`trajscope.studies.steering.summary.decay_summary`)."""

from __future__ import annotations

import json
import time

import panel as pn
import polars as pl
import pytest

import trajscope as ts
from trajscope.studies.registry import Result, get
from trajscope.studies.steering import summary

SENTINEL = 0.4321
SHOWN = "0.4321 [0.1234, 0.8765]"


def _pairs(tmp_path):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("\n".join(json.dumps({"positive": f"x{i} = \"", "negative": f"x{i} = '"}) for i in range(4)))
    return pairs


def _study(tiny_dirs, tmp_path, out) -> int:
    from trajscope.cli import main

    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": f"def f{i}(x):"}) for i in range(3)))
    return main(["study", "steering", "--model", str(tiny_dirs["llama"]), "--prompts", str(prompts),
                 "--pairs", str(_pairs(tmp_path)), "--layer", "1", "--depths", "1,3", "--strengths", "2,6",
                 "--window", "3", "--out", str(out)])


def _sentinel(monkeypatch):
    real = summary.decay_summary

    def fake(steps, *a, **kw):
        return real(steps, *a, **kw).with_columns(pl.lit(SENTINEL).alias("effect"), pl.lit(0.1234).alias("effect_lo"),
                                                  pl.lit(0.8765).alias("effect_hi"))

    monkeypatch.setattr(summary, "decay_summary", fake)


def test_steering_is_a_registered_study_with_the_steering_tab(capsys):
    from trajscope.cli import main

    study = get("steering")
    assert study.tab_title == "Steering" and study.order == 20
    with pytest.raises(SystemExit):
        main(["study", "steering", "--help"])
    shown = capsys.readouterr().out
    assert "--depths" in shown and "start steps k" in shown and "--window" in shown


def test_the_effect_is_one_value_on_the_card_in_the_report_and_in_the_marker(tiny_dirs, tiny_models, tmp_path,
                                                                            monkeypatch, data_dirs):
    """decay_summary() is replaced by one that writes a sentinel effect: the marker, the report section and the
    card all show it, so none of them computes the effect on its own."""
    from trajscope.reports.studies import study_report
    from trajscope.ui.views.app import TrajScope

    _sentinel(monkeypatch)
    out = tmp_path / "steering"
    assert _study(tiny_dirs, tmp_path, out) == 0
    marker = json.loads((out / "steering.result.json").read_text())
    assert {e["value"] for e in marker["summaries"]["effect"]} == {SENTINEL}            # the written summary
    assert len(marker["summaries"]["effect"]) == 4                                      # 2 depths × 2 strengths
    assert SHOWN in study_report([out], tmp_path / "r.html").read_text()               # the report section

    llama = tiny_models["llama"]
    app = TrajScope(trajectory=ts.capture(llama, "def f(x):", max_new_tokens=16, stop_at_eos=False))
    view = app.study_cards["steering"]
    view.model_loader = lambda source: llama
    view.settings.param.update(pairs_path=str(_pairs(tmp_path)), layer=1, strength=4.0, depths="1,3")
    view.sweep()                                                                        # the card's own run
    deadline = time.time() + 60
    while view.settings.busy and time.time() < deadline:
        time.sleep(0.05)
    res = view.settings.sweep
    assert res is not None, view.settings.status
    assert {e["value"] for e in res.summaries["effect"]} == {SENTINEL}
    panes = view._sweep_plots(res).select(pn.pane.HTML)
    assert any(SHOWN in str(p.object) for p in panes)                                   # the card


def test_the_effect_matches_the_written_steps(tiny_dirs, tmp_path):
    """Unpatched: each headline effect is the mean KL over its equal window in the written per-step table."""
    out = tmp_path / "steering"
    assert _study(tiny_dirs, tmp_path, out) == 0
    res = Result.load(out, "steering")
    steps = res.table("steering")
    for e in res.summaries["effect"]:
        k = e["start_step"]
        win = steps.filter((pl.col("start_step") == k) & (pl.col("strength") == e["strength"])
                           & (pl.col("step") >= k) & (pl.col("step") < k + 3))
        per_prompt = win.group_by("prompt_idx").agg(pl.col("kl_to_base").mean())["kl_to_base"]
        assert e["value"] == pytest.approx(float(per_prompt.mean())) and e["n_prompts"] == 3
        assert e["lo"] <= e["value"] <= e["hi"]
    title, body, figs = get("steering").section(res)
    assert title.startswith("Steering") and "same window of 3 steered steps" in body and figs


def test_a_bad_setting_is_one_sentence(tiny_dirs, tmp_path, capsys):
    from trajscope.cli import main

    argv = ["study", "steering", "--prompts", str(tmp_path / "p.jsonl"), "--out", str(tmp_path / "x")]
    assert main(argv) == 2 and "exactly one of --vector" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # the generated flag parses numbers
        main([*argv, "--pairs", "p.jsonl", "--layer", "1", "--strengths", "a"])
    assert "comma-separated finite numbers" in capsys.readouterr().err
    with pytest.raises(ts.TrajscopeError, match="--strengths must be comma-separated numbers"):
        get("steering").config(pairs="p.jsonl", layer=1, strengths=("a",))  # the alias passes text through
    (tmp_path / "p.jsonl").write_text(json.dumps({"prompt": "def f(x):"}))
    assert main([*argv, "--model", str(tiny_dirs["llama"]), "--pairs", str(_pairs(tmp_path)), "--layer", "1",
                 "--layers", "0,1"]) == 2
    assert "give it with --layer, not --layers" in capsys.readouterr().err


def test_the_shipped_report_shows_the_shipped_effects():
    """sample_data/reports holds the steering study of the sample model: its section shows the marker's effects,
    and each is the shipped summary table's, which the shipped per-step table reproduces."""
    import pathlib

    from trajscope.interval_text import format_interval
    from trajscope.studies.steering.summary import decay_summary

    shipped = pathlib.Path(__file__).resolve().parents[2] / "sample_data" / "reports"
    res = Result.load(shipped, "steering")
    _, body, _ = get("steering").section(res)
    table = res.table("steering_summary")
    again = decay_summary(res.table("steering"), window=res.config["window"])
    assert len(res.summaries["effect"]) == table.height == 8
    for e in res.summaries["effect"]:
        assert format_interval(e["value"], e["lo"], e["hi"], 4, n_clusters=e["n_prompts"]) in body
        row = again.filter((pl.col("start_step") == e["start_step"]) & (pl.col("strength") == e["strength"]))
        assert row["effect"][0] == pytest.approx(e["value"])
