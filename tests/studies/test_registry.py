"""The study registry: a study defined in one module gets ``trajscope study NAME``, a report section
and an app tab without editing any list; its number is the same on the card, in the report and in
the written summary, because all three read one Result.

The toy study below is the whole of such a module: a config, a run, a section and a card.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import field

import panel as pn
import param
import polars as pl
import pytest

from trajscope.errors import TrajscopeError
from trajscope.studies.registry import Result, Study, get, register, studies, unregister

PROMPTS = "sample_data/prompts/heldout_code.jsonl"


# ---- the toy study: one module's worth -------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ToyConfig:
    """Mean prompt length, cut to ``cap`` tokens."""

    cap: int = field(default=8, metadata={"help": "tokens counted per prompt at most"})
    tags: tuple[str, ...] = field(default=("a",), metadata={"help": "labels carried into the table"})
    loud: bool = field(default=False, metadata={"help": "a switch"})


def toy_summary(lengths: pl.DataFrame) -> dict:
    """The study's headline number: the mean counted length and its n (the one function computing it)."""
    return {"value": float(lengths["n"].mean()), "n": lengths.height}


def run_toy(model, prompts, config, progress=None, layers=None) -> Result:
    lengths = pl.DataFrame({"prompt_id": [p for p, _ in prompts], "n": [min(len(ids), config.cap) for _, ids in prompts],
                            "tag": [",".join(config.tags)] * len(prompts)})
    if progress:
        progress(len(prompts), len(prompts))
    return Result(study="toy", tables={"toy": lengths}, config=dataclasses.asdict(config),
                  summaries={"mean_length": toy_summary(lengths)})


def toy_section(result: Result):
    s = result.summaries["mean_length"]
    return "Toy", f"<p>mean length {s['value']:.4f} (n = {s['n']})</p><table></table>", []


class ToyCard(pn.viewable.Viewer):
    state = param.Parameter(doc="the app state")
    result = param.Parameter(default=None, doc="the toy Result shown")

    def __panel__(self):
        value = toy_summary(self.result.table("toy"))["value"] if self.result else float("nan")
        return pn.pane.Str(f"mean length {value:.4f}")


CARDS: list[ToyCard] = []  # the cards the app made (so the test can reach them)


def toy_card(state) -> ToyCard:
    CARDS.append(ToyCard(state=state))
    return CARDS[-1]


TOY = Study(name="toy", question="mean prompt length (a registry test)", config=ToyConfig, run=run_toy,
            section=toy_section, card=toy_card, example=f"trajscope study toy --prompts {PROMPTS}")
# -----------------------------------------------------------------------------------------------


@pytest.fixture
def toy():
    register(TOY)
    yield TOY
    unregister("toy")


def test_the_serving_studies_are_registered():
    assert {"determinism", "batch", "chunked-prefill", "prefix-cache", "sae-stability"} <= set(studies())


def test_a_config_must_be_a_frozen_dataclass():
    @dataclasses.dataclass
    class Loose:
        x: int = 1

    with pytest.raises(TypeError, match="frozen"):
        register(dataclasses.replace(TOY, name="loose", config=Loose))


def test_one_module_gives_a_command_a_report_section_and_an_app_tab(toy, tmp_path, capsys):
    from trajscope.cli import main
    from trajscope.reports.studies import detect, study_report

    with pytest.raises(SystemExit):  # the generated flags, with their help, are in the study's --help
        main(["study", "toy", "--help"])
    shown = capsys.readouterr().out
    assert "--cap" in shown and "tokens counted per prompt at most" in shown and "--loud" in shown

    out = tmp_path / "toy"
    assert main(["study", "toy", "--prompts", PROMPTS, "--max-prompts", "5", "--cap", "6", "--tags", "x,y",
                 "--out", str(out)]) == 0
    marker = json.loads((out / "toy.result.json").read_text())
    assert marker["config"] == {"cap": 6, "tags": ["x", "y"], "loud": False} and marker["tables"] == ["toy"]
    written = pl.read_parquet(out / "toy.parquet")
    assert written.height == 5 and written["n"].max() <= 6 and set(written["tag"]) == {"x,y"}

    # the report finds it through the registry; the card is an app tab
    assert detect(out) == ["toy"]
    html = study_report([out], tmp_path / "r.html").read_text()
    expected = toy_summary(written)["value"]
    assert f"mean length {expected:.4f} (n = 5)" in html

    from trajscope.ui.views.app import TrajScope

    app = TrajScope(autostart=False)
    main_area = app.main()
    titles = list(app.tabs._names)
    assert titles.index("Toy") == len(titles) - 2 and titles[-1] == "Export"  # before Export
    card = CARDS[-1]
    assert card.state is app.state
    card.result = Result.load(out, "toy")
    assert f"mean length {expected:.4f}" in card.__panel__().object
    assert main_area is not None


def test_the_number_is_one_value_on_card_report_and_summary(toy, tmp_path, sample_model):
    from trajscope.studies import prompts as P

    prompts = P.encode_prompts(sample_model, P.read_prompt_file(PROMPTS, 4), None)
    result = get("toy").run(sample_model, prompts, ToyConfig(cap=5))
    result.save(tmp_path)
    loaded = Result.load(tmp_path, "toy")
    value = toy_summary(result.tables["toy"])["value"]
    assert loaded.summaries["mean_length"]["value"] == value == toy_summary(loaded.table("toy"))["value"]
    assert f"{value:.4f}" in toy_section(loaded)[1]


def test_a_missing_table_is_one_sentence(tmp_path):
    from trajscope.errors import TrajscopeError

    with pytest.raises(TrajscopeError, match="no table 'toy_extra'"):
        Result.load(tmp_path, "toy").table("toy_extra")


def test_serving_section_reads_the_result_it_is_given():
    """A converted study: the report section renders from a Result holding the shipped tables."""
    import pathlib

    shipped = pathlib.Path(__file__).resolve().parents[2] / "sample_data" / "reports" / "serving"
    res = Result.load(shipped, "chunked-prefill")
    title, body, figs = get("chunked-prefill").section(res)
    summ = res.table("chunked-prefill_summary")
    deepest = summ.filter(pl.col("layer") == summ["layer"].max()).sort("chunk").row(0, named=True)
    from trajscope.studies.serving.sections import ci

    assert ci(deepest["rel_l2_mean"], deepest["rel_l2_mean_lo"], deepest["rel_l2_mean_hi"]) in body and figs


def test_number_flags_take_finite_numbers_only(capsys):
    import argparse

    from trajscope.cli import main
    from trajscope.studies.flags import floats, number

    assert number("0.5") == 0.5 and number("-2") == -2.0 and number("1e-3") == 1e-3
    assert floats("0.1, 0.5,6") == (0.1, 0.5, 6.0)
    for bad in ("nan", "NaN", "inf", "-inf", "x", ""):
        with pytest.raises(argparse.ArgumentTypeError, match=f"^expected a finite number like 0.5; got '{bad}'$"):
            number(bad)
    with pytest.raises(argparse.ArgumentTypeError, match="^expected comma-separated finite numbers like 0.1,0.5; got '1,nan'$"):
        floats("1,nan")
    # a study's float-tuple flag (the steering study's --strengths) refuses it before anything is read
    with pytest.raises(SystemExit) as exit_:
        main(["study", "steering", "--prompts", PROMPTS, "--strengths", "4,nan", "--out", "unused"])
    assert exit_.value.code == 2
    assert "argument --strengths: expected comma-separated finite numbers" in capsys.readouterr().err


def test_a_prompt_cut_below_zero_is_one_sentence(toy, tmp_path, capsys):
    from trajscope.cli import main
    from trajscope.studies.prompts import study_items

    # '--max-tokens -3' cut each prompt to ids[:-3] (its last 3 tokens dropped), unsaid
    assert main(["study", "toy", "--prompts", PROMPTS, "--max-tokens", "-3", "--out", str(tmp_path / "x")]) == 2
    assert "--max-tokens (each prompt's cut) must be 0 for no cut or a number of tokens, not -3." in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
    with pytest.raises(TrajscopeError, match="must be 0 for no cut"):  # the calibration runner's path
        study_items(None, [{"prompt": "x"}], ToyConfig(), -3)
