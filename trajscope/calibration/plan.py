"""Which registered studies the calibration report runs, in which section, with which settings.

The report has one section per question (:data:`SECTIONS`); each names the registered studies that answer
it, in order. A study runs when the artefacts it requires are there (:data:`REQUIRES`: the SAE-transfer
study needs an SAE, the steering and monitor studies a steering vector); otherwise its section says what
was missing. A study that takes an artefact (``Study.uses``: kind → config field) gets the given or shipped
one: a field typed as a tuple takes them all; a single-valued field runs the study once per artefact (one
:class:`Job` each, in its own folder) when the study requires that kind, and takes the first otherwise.

Artefacts are judged on prompts they were not fitted on: when the inputs record the source files an artefact
was fitted on (``Inputs.seen_files``), the studies in :data:`HELD_OUT` run on the other files' prompts only,
and a study takes them in the config fields it names in ``Study.uses`` under two kinds: ``"seen_files"``
takes every recorded file (the SAE bench reports rows of those files apart), ``"seen_prompt_files"`` the seen
files among the prompts' files, given only when some prompts' files are unseen (the steering-success study
leaves them out, the monitor study fits on them and evaluates on the rest).

Settings are the study's defaults, its ``quick`` overrides under ``--quick``, then the artefacts. Two
keys of ``quick`` are the runner's, not the config's: ``max_prompts`` (prompts taken round-robin over
source files, so a split by file still has files on each side) and ``max_tokens`` (each prompt's cut).
"""

from __future__ import annotations

import dataclasses
import pathlib
import typing
from typing import Any

from trajscope.calibration.inputs import Inputs
from trajscope.studies.registry import Study, studies


@dataclasses.dataclass(frozen=True)
class Section:
    """One part of the report: its anchor, title, question and the studies that answer it."""

    key: str
    title: str
    question: str
    studies: tuple[str, ...]


SECTIONS: tuple[Section, ...] = (
    Section("drift", "Drift", "Does the residual stream during decode still look like prefill, against a "
            "prefill profile fitted on other prompts (held-out false-positive rate)?", ("drift",)),
    Section("sae", "SAE transfer", "Does an SAE fitted on prefill reconstruct decode as well (FVU, CE recovered, "
            "feature overlap against its matched-n null, SAEBench's core metrics and sparse probing by phase and segment), "
            "and does a prefill/decode mix do better?", ("sae-drift", "sae-bench")),
    Section("steering", "Steering reliability", "Does a steering vector's effect depend on the decode step where "
            "it starts (onset and accumulation over equal windows), and does it do what it is for (success rate, fluency "
            "cost, anti-steerable prompts, by layer and start depth)?", ("steering", "steering-success")),
    Section("monitor", "Monitor transfer", "Do monitors calibrated on clean decode detect a shift planted into "
            "decode (AUROC, time-to-detect at a fixed false-positive rate)?", ("monitor",)),
    Section("eviction", "KV-eviction consistency", "Do the prompt keys a KV-eviction policy keeps after prefill "
            "stay the ones decode attends to, and does the model still retrieve a passkey?", ("eviction", "needle")),
)

REQUIRES: dict[str, tuple[str, ...]] = {"sae-drift": ("sae",), "sae-bench": ("sae",), "steering": ("vector",),
                                         "steering-success": ("vector",), "monitor": ("vector",)}
HELD_OUT = ("sae-drift",)  # studies that judge an artefact on prompts: only files it was not fitted on
RUNNER_KEYS = ("max_prompts", "max_tokens")
DEFAULT_MAX_TOKENS = 96


@dataclasses.dataclass(frozen=True)
class Job:
    """One study run of the report: the study, its folder (relative to the output), its config overrides and
    the runner's prompt settings; ``missing`` names what it required and did not get (then it is not run)."""

    section: str
    study: str
    folder: str
    overrides: tuple[tuple[str, Any], ...] = ()
    max_prompts: int | None = None
    max_tokens: int | None = DEFAULT_MAX_TOKENS
    label: str = ""
    missing: str = ""
    held_out: bool = False  # run on the prompts of files no artefact was fitted on (Inputs.unseen)

    @property
    def key(self) -> str:
        """The job's name in the report and in ``summary.json`` (the folder's last part)."""
        return pathlib.PurePath(self.folder).name

    def config(self) -> Any:
        """The study's frozen config with the overrides (it validates itself)."""
        return study_of(self).config(**dict(self.overrides))


def study_of(job: Job) -> Study:
    """The registered study a job runs."""
    return studies()[job.study]


def _is_tuple(study: Study, field: str) -> bool:
    hint = typing.get_type_hints(study.config)[field]
    args = typing.get_args(hint)
    return typing.get_origin(hint) is tuple or any(typing.get_origin(a) is tuple for a in args)


def _artefacts(inputs: Inputs, kind: str) -> list[pathlib.Path]:
    return {"sae": list(inputs.saes), "vector": list(inputs.vectors),
            "profile": [inputs.profile] if inputs.profile else [],
            "prompt_files": list(inputs.prompt_files)}.get(kind, [])


def _held_out_settings(study: Study, inputs: Inputs) -> dict[str, Any]:
    """The config settings of the study's seen-file kinds (``Study.uses``; module docstring): ``"seen_files"``
    takes every file the artefacts record, ``"seen_prompt_files"`` the seen ones among the prompts' files when
    the prompts also hold unseen files (a split with two sides)."""
    from trajscope.studies.monitor.config import file_of

    if not inputs.seen_files:
        return {}
    files = sorted({file_of(r["id"]) for r in inputs.records})
    seen = [f for f in files if f in set(inputs.seen_files)]
    out: dict[str, Any] = {}
    if "seen_files" in study.uses:
        out[study.uses["seen_files"]] = tuple(inputs.seen_files)
    if "seen_prompt_files" in study.uses and seen and len(seen) < len(files):
        out[study.uses["seen_prompt_files"]] = tuple(seen)
    return out


def jobs(inputs: Inputs, quick: bool = False) -> list[Job]:
    """Every study run the report needs, in section order (module docstring)."""
    found = studies()
    out: list[Job] = []
    for sec in SECTIONS:
        for name in sec.studies:
            study = found.get(name)
            if study is None:
                continue
            need = [k for k in REQUIRES.get(name, ()) if not inputs.has(k)]
            shared = dict(study.shared_defaults)
            runner = {"max_prompts": shared.get("max_prompts"), "max_tokens": shared.get("max_tokens", DEFAULT_MAX_TOKENS)}
            over: dict[str, Any] = {}
            if quick:
                for k, v in study.quick.items():
                    (runner if k in RUNNER_KEYS else over)[k] = v
            over.update(_held_out_settings(study, inputs))
            base = dict(section=sec.key, study=name, max_prompts=runner["max_prompts"], max_tokens=runner["max_tokens"],
                        held_out=name in HELD_OUT and bool(inputs.seen_files))
            if need:
                out.append(Job(folder=f"studies/{name}", missing=" and ".join(need), **base))
                continue
            fanout: list[tuple[str, dict[str, Any]]] = [("", {})]
            for kind, field in study.uses.items():
                items = _artefacts(inputs, kind)
                if not items:
                    continue
                if _is_tuple(study, field):
                    fanout = [(lab, {**o, field: tuple(str(p) for p in items)}) for lab, o in fanout]
                elif kind not in REQUIRES.get(name, ()):  # an optional artefact: the first one
                    fanout = [(lab, {**o, field: str(items[0])}) for lab, o in fanout]
                else:
                    fanout = [(lab + ("-" if lab else "") + (p.stem if len(items) > 1 else ""), {**o, field: str(p)})
                              for lab, o in fanout for p in items]
            for label, extra in fanout:
                folder = f"studies/{name}" + (f"-{label}" if label else "")
                out.append(Job(folder=folder, overrides=tuple(sorted({**over, **extra}.items())), label=label, **base))
    return out
