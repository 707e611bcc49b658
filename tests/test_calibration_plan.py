"""The calibration plan hands the artefacts' seen source files to the config fields each study names in
``Study.uses`` (kinds ``seen_files`` and ``seen_prompt_files``), by that declaration alone."""

from __future__ import annotations

import dataclasses
import pathlib
from dataclasses import field

import pytest

from trajscope.calibration.inputs import Inputs
from trajscope.calibration.plan import SECTIONS, jobs
from trajscope.studies.registry import Result, Study, register, unregister

FILES = ("a.jsonl", "b.jsonl", "c.jsonl")


def _inputs(seen: tuple[str, ...]) -> Inputs:
    records = tuple({"id": f"{f}#{i}", "ids": [1, 2, 3]} for f in FILES for i in range(2))
    return Inputs(model="sample", prompt_files=tuple(pathlib.Path(f) for f in FILES), records=records,
                  saes=(pathlib.Path("sae"),), vectors=(pathlib.Path("v.safetensors"),), seen_files=seen)


def _overrides(inputs: Inputs) -> dict[str, dict]:
    return {j.study: dict(j.overrides) for j in jobs(inputs)}


@pytest.mark.parametrize("seen", [("a.jsonl", "zz.py"), FILES, ("zz.py",), ()])
def test_the_shipped_studies_take_seen_files_where_they_declare_them(seen):
    """sae-bench gets every recorded seen file; steering-success and monitor the seen ones among the prompts'
    files, only when other files remain to judge on; no study without the declaration gets any."""
    configs = {j.study: j.config() for j in jobs(_inputs(seen))}
    split = ("a.jsonl",) if seen == ("a.jsonl", "zz.py") else None
    assert configs["sae-bench"].sae_train_files == tuple(seen)
    assert configs["steering-success"].exclude_files == (split or ())
    assert configs["monitor"].fit_files == split
    over = _overrides(_inputs(seen))
    for study, o in over.items():
        assert not {"sae_train_files", "exclude_files", "fit_files"} & set(o) or study in (
            "sae-bench", "steering-success", "monitor"), study


@dataclasses.dataclass(frozen=True)
class _ToyConfig:
    held: tuple[str, ...] = field(default=(), metadata={"help": "files the artefact saw"})
    everything: tuple[str, ...] = field(default=(), metadata={"help": "every file the artefact saw"})
    exclude_files: tuple[str, ...] = field(default=(), metadata={"help": "a conventional name, not declared"})


def test_a_study_gets_seen_files_by_its_declaration_not_by_a_field_name(monkeypatch):
    """A toy study in a report section takes the seen files in fields of any name it declares, and a field
    named like a shipped study's (``exclude_files``) but not declared gets nothing."""
    from trajscope.calibration import plan

    toy = Study(name="toy-seen", question="q", config=_ToyConfig, run=lambda *a, **k: Result("toy-seen"),
                section=lambda r: ("t", "", []), example="",
                uses={"seen_files": "everything", "seen_prompt_files": "held"})
    register(toy)
    try:
        monkeypatch.setattr(plan, "SECTIONS", (*SECTIONS, plan.Section("toy", "Toy", "q", ("toy-seen",))))
        over = _overrides(_inputs(("b.jsonl", "zz.py")))["toy-seen"]
        assert over == {"everything": ("b.jsonl", "zz.py"), "held": ("b.jsonl",)}
        assert _overrides(_inputs(FILES))["toy-seen"] == {"everything": FILES}  # no unseen file: no split
    finally:
        unregister("toy-seen")
