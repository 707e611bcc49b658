"""What the calibration report is given: a model, a prompt set and the artefacts to calibrate.

:func:`resolve` turns the command's arguments into :class:`Inputs`, checking each artefact against the
model before any study runs, so a wrong one costs one sentence and no compute:

- **prompts**: one or more JSON-lines files (``{"prompt": …}`` or chat ``{"messages": […]}`` records).
  Without ``--prompts`` the model's shipped evaluation prompts are used (``sample_data/<model>/prompts``,
  contrast-pair files left out; the sample model's ``sample_data/prompts/heldout_code.jsonl``). Every
  record's id is prefixed with its source file (``chat_math.jsonl#3``) unless it already names one, so the
  studies can split by source file. The records go to ``prompts.jsonl`` in the output folder: the report
  names the exact set it measured.
- **SAEs** (directories), **vectors** (steering direction files) and a drift **profile**: given, or the
  model's shipped ones (:mod:`trajscope.artefacts`); the report says which were shipped.
- **seen files**: the source files the artefacts record as fitted on (a profile's split groups, an SAE's
  ``train_files``). Studies that judge an artefact evaluate on the other files only (the plan says which).

An SAE for another width or layer count, a vector of the wrong width or for a layer the model lacks, a
profile from another model and an empty prompt file each raise one :class:`TrajscopeError`.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any, Sequence

from trajscope import artefacts
from trajscope.errors import TrajscopeError
from trajscope.model import sample_data_dir


@dataclasses.dataclass(frozen=True)
class Inputs:
    """The resolved inputs of one calibration report (paths as given or as found)."""

    model: str
    prompt_files: tuple[pathlib.Path, ...]
    records: tuple[dict, ...]
    saes: tuple[pathlib.Path, ...] = ()
    vectors: tuple[pathlib.Path, ...] = ()
    profile: pathlib.Path | None = None
    shipped: tuple[str, ...] = ()  # the kinds ("prompts", "sae", "vector", "profile") taken from shipped assets
    seen_files: tuple[str, ...] = ()  # source files the artefacts were fitted on, as they record it

    def has(self, kind: str) -> bool:
        """Whether an artefact of ``kind`` ("sae", "vector", "profile") is given or shipped."""
        return bool({"sae": self.saes, "vector": self.vectors, "profile": self.profile}.get(kind))

    def describe(self) -> dict[str, Any]:
        """A JSON-ready record of the inputs (for ``summary.json`` and the report's first section)."""
        return {"model": self.model, "prompt_files": [str(p) for p in self.prompt_files],
                "n_prompts": len(self.records), "saes": [str(p) for p in self.saes],
                "vectors": [str(p) for p in self.vectors], "profile": str(self.profile) if self.profile else None,
                "shipped": list(self.shipped), "seen_files": list(self.seen_files)}

    def unseen(self, records: Sequence[dict]) -> list[dict]:
        """The records whose source file no artefact was fitted on."""
        from trajscope.studies.monitor.config import file_of

        seen = set(self.seen_files)
        return [r for r in records if file_of(r["id"]) not in seen]


def _model_folder(facts: dict) -> pathlib.Path | None:
    name = artefacts._name(facts.get("model_id"))
    if name == "sample":
        return sample_data_dir()
    found = [d for d in sample_data_dir().iterdir() if d.is_dir() and artefacts.same_model(d.name, name)
             and (d / "prompts").is_dir()] if name else []
    return found[0] if found else None


def shipped_prompts(facts: dict) -> list[pathlib.Path]:
    """The model's shipped evaluation prompt files (contrast pairs left out); [] when it ships none."""
    folder = _model_folder(facts)
    if folder is None:
        return []
    if folder == sample_data_dir():
        return [folder / "prompts" / "heldout_code.jsonl"]
    return sorted(p for p in (folder / "prompts").glob("*.jsonl") if not p.name.endswith("_pairs.jsonl"))


def shipped_saes(facts: dict) -> list[pathlib.Path]:
    """Every shipped SAE that fits the model (prefill-only first)."""
    base = sample_data_dir()
    roots = [base / "saes", *sorted(base.glob("*/saes"))]
    dirs = sorted((p.parent for r in roots if r.is_dir() for p in r.glob("*/cfg.json")),
                  key=lambda d: ("prefill-only" not in d.name, str(d)))
    return [d for d in dirs if artefacts.sae_misfit(d, facts) is None]


def shipped_vectors(facts: dict) -> list[pathlib.Path]:
    """The model's shipped steering vectors that fit it."""
    folder = _model_folder(facts)
    files = sorted((folder / "vectors").glob("*.safetensors")) if folder is not None else []
    return [f for f in files if vector_misfit(f, facts) is None]


def vector_misfit(path: str | pathlib.Path, facts: dict) -> str | None:
    """Why the steering vector at ``path`` does not fit a model with ``facts``, or None if it fits."""
    from trajscope.steering import SteeringVector

    try:
        vec = SteeringVector.load(path)
    except TrajscopeError as exc:
        return str(exc)
    except Exception as exc:  # a damaged file: one sentence
        return f"The steering vector '{path}' is unreadable ({type(exc).__name__})."
    width = int(vec.direction.numel())
    if facts.get("d_model") is not None and width != int(facts["d_model"]):
        return (f"The steering vector '{path}' is {width} wide; the model '{facts.get('model_id')}' is "
                f"{facts['d_model']} wide.")
    layer = getattr(vec, "layer", None)
    if layer is None:
        return f"The steering vector '{path}' names no layer; save it with its layer (SteeringVector.save)."
    if facts.get("n_layers") is not None and not 0 <= int(layer) < int(facts["n_layers"]):
        return (f"The steering vector '{path}' steers layer {layer}; the model '{facts.get('model_id')}' has "
                f"layers 0..{int(facts['n_layers']) - 1}.")
    return None


def read_records(files: Sequence[pathlib.Path]) -> list[dict]:
    """Every prompt record of ``files``, each id prefixed with its source file (module docstring)."""
    from trajscope.studies.prompts import read_prompt_file

    out: list[dict] = []
    for f in files:
        for item in read_prompt_file(f):
            pid = str(item["id"])
            if "#" not in pid and ":" not in pid:
                pid = f"{item.get('source') or f.name}#{pid}"
            out.append({**item, "id": pid})
    ids = [r["id"] for r in out]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise TrajscopeError(f"Two prompts share the id '{dup}'; give each prompt of a file its own id.")
    return out


def resolve(model: Any, prompts: Sequence[str] = (), saes: Sequence[str] = (), vectors: Sequence[str] = (),
            profile: str | None = None, model_name: str | None = None) -> Inputs:
    """Check and complete the inputs for ``model`` (a loaded :class:`~trajscope.model.ModelHandle`).

    Raises:
        TrajscopeError: an empty or missing prompt file, or an artefact that does not fit the model.
    """
    facts = {"model_id": model.model_id, "n_layers": model.n_layers, "d_model": model.d_model}
    shipped: list[str] = []
    files = [pathlib.Path(p) for p in prompts]
    if not files:
        files = shipped_prompts(facts)
        if not files:
            raise TrajscopeError(f"The model '{model.model_id}' ships no evaluation prompts; give --prompts FILE.")
        shipped.append("prompts")
    records = read_records(files)
    sae_dirs = [pathlib.Path(s) for s in saes]
    for d in sae_dirs:
        why = artefacts.sae_misfit(d, facts)
        if why:
            raise TrajscopeError(why)
    if not saes and (found := shipped_saes(facts)):
        sae_dirs, _ = found, shipped.append("sae")
    vec_files = [pathlib.Path(v) for v in vectors]
    for v in vec_files:
        if not v.is_file():
            raise TrajscopeError(f"No steering vector file at '{v}'.")
        why = vector_misfit(v, facts)
        if why:
            raise TrajscopeError(why)
    if not vectors and (found_v := shipped_vectors(facts)):
        vec_files, _ = found_v, shipped.append("vector")
    prof = pathlib.Path(profile) if profile else None
    if prof is not None:
        info = artefacts._profile_info(prof) if prof.is_file() else None
        if info is None:
            raise TrajscopeError(f"'{prof}' is not a drift profile (build one with 'trajscope profile').")
        why = artefacts.profile_misfit(info, facts)
        if why:
            raise TrajscopeError(why)
    elif (found_p := artefacts.find_profile(facts)) is not None:
        prof, _ = found_p, shipped.append("profile")
    return Inputs(model=model_name or model.model_id, prompt_files=tuple(files), records=tuple(records),
                  saes=tuple(sae_dirs), vectors=tuple(vec_files), profile=prof, shipped=tuple(shipped),
                  seen_files=tuple(seen_files(prof, sae_dirs)))


def seen_files(profile: pathlib.Path | None, saes: Sequence[pathlib.Path]) -> list[str]:
    """Source files the artefacts record as fitted on: a profile's ``split_groups`` fit and calibrate groups
    (``trajscope prepare`` fits its SAEs on the same parts) and an SAE's ``metadata.train_files``."""
    out: set[str] = set()
    info = artefacts._profile_info(profile) if profile is not None else None
    groups = (info or {}).get("split_groups")
    if isinstance(groups, dict):
        out |= {str(f) for part in ("fit", "calibrate") for f in groups.get(part, [])}
    for d in saes:
        meta = (artefacts._sae_cfg(pathlib.Path(d)) or {}).get("metadata", {})
        out |= {str(f) for f in meta.get("train_files", [])}
    return sorted(out)


def write_records(inputs: Inputs, out: pathlib.Path) -> pathlib.Path:
    """The prompt set as measured, ``out/prompts.jsonl``; returns its path."""
    from trajscope.io import atomic_write_text

    path = out / "prompts.jsonl"
    atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in inputs.records))
    return path
