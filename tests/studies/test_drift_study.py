"""The drift study as a registered study: ``trajscope study drift``, its report section and the app's Drift
tab show one number, computed by one function (:func:`trajscope.studies.drift.summary.headline`)."""

from __future__ import annotations

import json

import numpy as np
import panel as pn
import polars as pl
import pytest

import trajscope as ts
from trajscope.studies.drift import summary
from trajscope.studies.registry import Result, cards, get

PROMPTS = [f"def f{i}(x):\n    y = x * {i}\n    return y + {i}" for i in range(10)]
SENTINEL = {"decode_flagged": {"value": 0.4321, "lo": 0.1234, "hi": 0.8765, "n_prompts": 7, "n_clusters": 7}}
SHOWN = "0.4321 [0.1234, 0.8765]"


@pytest.fixture()
def prompt_file(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text("\n".join(json.dumps({"id": f"q{i}", "prompt": p}) for i, p in enumerate(PROMPTS)))
    return f


def _study(tiny_dirs, prompt_file, out) -> int:
    from trajscope.cli import main

    return main(["study", "drift", "--model", str(tiny_dirs["llama"]), "--prompts", str(prompt_file), "--max-prompts",
                 "10", "--max-new-tokens", "6", "--no-eos", "--fpr", "0.1", "--n-boot", "50", "--out", str(out)])


def _html_of(viewable) -> str:
    """Every HTML/Markdown/Str pane's text under a Panel layout."""
    found = viewable.select(lambda o: isinstance(o, (pn.pane.HTML, pn.pane.Markdown, pn.pane.Str)))
    return "\n".join(str(p.object) for p in found)


def test_drift_is_a_registered_study_with_the_drift_tab():
    study = get("drift")
    assert study.tab_title == "Drift" and study.order == 10 and study in cards()
    assert cards().index(get("steering")) == cards().index(study) + 1


def test_the_headline_is_one_value_on_the_card_in_the_report_and_in_the_marker(tiny_dirs, tiny_models, prompt_file,
                                                                              tmp_path, monkeypatch, data_dirs):
    """headline() is replaced by a sentinel: the marker, the report section and the card all show it, so none
    of them computes the number on its own."""
    from trajscope.reports.studies import study_report
    from trajscope.studies.drift.build import build_profile
    from trajscope.ui.views.app import TrajScope

    monkeypatch.setattr(summary, "headline", lambda rows, **kw: json.loads(json.dumps(SENTINEL)))
    out = tmp_path / "drift"
    assert _study(tiny_dirs, prompt_file, out) == 0
    marker = json.loads((out / "drift.result.json").read_text())
    assert marker["summaries"]["decode_flagged"] == SENTINEL["decode_flagged"]          # the written summary
    html = study_report([out], tmp_path / "r.html").read_text()
    assert SHOWN in html                                                                # the report section

    llama = tiny_models["llama"]
    profile = build_profile(llama, PROMPTS[:6], fpr=0.1, progress=False).save(tmp_path / "p.safetensors")
    traj = ts.capture(llama, "import os\n", max_new_tokens=6, stop_at_eos=False, residual_layers="all")
    app = TrajScope(trajectory=traj)
    view = app.study_cards["drift"]
    view.settings.profile_path = str(profile)
    view.settings.compute(traj)                                                         # the card's own run
    assert view.settings.result is not None, view.settings.message
    assert view.settings.result.summaries["decode_flagged"] == SENTINEL["decode_flagged"]
    assert SHOWN in _html_of(view.__panel__()) and view.figures.visible                  # the card


def test_the_headline_matches_an_independent_count(tiny_dirs, prompt_file, tmp_path):
    """Unpatched: the marker's decode share is the share of flagged decode cells in the written positions table,
    counted here with numpy, and its interval holds it."""
    out = tmp_path / "drift"
    assert _study(tiny_dirs, prompt_file, out) == 0
    res = Result.load(out, "drift")
    pos = res.table("drift_positions").filter(pl.col("split") == "evaluate")
    for name, regime in (("decode_flagged", "decode"), ("prefill_flagged", "prefill")):
        cells = pos.filter((pl.col("regime") == regime) & (pl.col("pos") > 0))["flagged"].to_numpy()
        s = res.summaries[name]
        assert s["value"] == pytest.approx(float(np.mean(cells)))
        assert s["n_prompts"] == len(res.summaries["split"]["evaluate"])
        assert s["lo"] is None or s["lo"] <= s["value"] <= s["hi"]
    title, body, _ = get("drift").section(res)
    assert title.startswith("Drift") and "Held-out prefill false-positive rate" in body


def test_a_bad_setting_is_one_sentence_before_the_model_loads(tiny_dirs, prompt_file, tmp_path, capsys):
    from trajscope.cli import main

    assert main(["study", "drift", "--prompts", str(prompt_file), "--fpr", "2", "--out", str(tmp_path / "x")]) == 2
    assert "--fpr must be between 0 and 1" in capsys.readouterr().err
    for flag, value, fragment in (("--fpr", "nan", "expected a finite number"),
                                  ("--trajectory-rate", "inf", "expected a finite number")):
        with pytest.raises(SystemExit) as exit_:  # argparse's own error: before any model or file is read
            main(["study", "drift", "--prompts", str(prompt_file), flag, value, "--out", str(tmp_path / "x")])
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert f"argument {flag}: {fragment}" in err and "Traceback" not in err, err


def test_the_shipped_report_shows_the_shipped_headline():
    """sample_data/reports holds the drift study of the sample model (scripts/make_sample_reports.sh): its section
    shows the marker's numbers, and the marker's prefill share is the held-out FPR table pooled over layers."""
    import pathlib

    from trajscope.interval_text import format_interval

    shipped = pathlib.Path(__file__).resolve().parents[2] / "sample_data" / "reports"
    assert get("drift").holds(shipped)
    res = Result.load(shipped, "drift")
    _, body, _ = get("drift").section(res)
    for name in ("decode_flagged", "prefill_flagged", "decode_minus_continuation"):
        s = res.summaries[name]
        assert format_interval(s["value"], s["lo"], s["hi"], 4, n_clusters=s["n_clusters"]) in body
    fpr = res.table("drift_heldout_fpr")
    pooled = float((fpr["fpr"] * fpr["n_positions"]).sum() / fpr["n_positions"].sum())
    assert res.summaries["prefill_flagged"]["value"] == pytest.approx(pooled)


def test_the_study_command_reads_records_with_their_continuations(tiny_dirs, tmp_path):
    """``trajscope study drift`` reads the prompt records itself: the continuation regime, its matched gap and the
    decode-minus-continuation headline are there, as in ``trajscope drift``."""
    from trajscope.cli import main

    f = tmp_path / "c.jsonl"
    f.write_text("\n".join(json.dumps({"id": f"c{i}", "prompt": p, "continuation": f"\n# line {i}\nz = {i} + 1\n" * 4})
                           for i, p in enumerate(PROMPTS)))
    out = tmp_path / "drift"
    assert main(["study", "drift", "--model", str(tiny_dirs["llama"]), "--prompts", str(f), "--max-new-tokens", "6",
                 "--no-eos", "--fpr", "0.1", "--n-boot", "50", "--trajectory-rate", "0.5", "--out", str(out)]) == 0
    res = Result.load(out, "drift")
    assert set(res.table("drift_positions")["regime"]) == {"prefill", "decode", "continuation"}
    assert res.table("drift_gap").height and "decode_minus_continuation" in res.summaries
