"""Which shipped artefact fits a model, and why one does not.

An SAE reads residuals of one width at one layer; a drift profile scores every layer of one model; a
steering vector adds to one layer's residual. Any of them, fitted on another model, gives numbers that
mean nothing (the sample SAE's features on SmolLM2) or fails on the width. :func:`sae_misfit` /
:func:`profile_misfit` give the sentence that says why one does not fit a model's facts
(:func:`model_facts`: model id, layers, width), and :func:`find_sae` / :func:`find_profile` /
:func:`find_steering` look for one that does where assets are shipped: the sample model's under
``sample_data/saes``, ``sample_data/profiles`` and ``sample_data/vectors``, another model's in its own
folder as ``trajscope prepare --ship`` writes it (``sample_data/smollm2/saes/*``,
``sample_data/smollm2/profile.safetensors``, ``sample_data/smollm2/vectors``). The app's cards and the
calibration report both ask here.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

from trajscope.model import sample_data_dir

ALIASES = {"trajscope-tiny": "sample"}  # the sample model's directory name


def model_facts(meta: dict) -> dict[str, Any]:
    """``{"model_id", "n_layers", "d_model"}`` of a run's ``meta`` (missing values as None)."""
    m = meta.get("model", {}) if meta else {}
    return {"model_id": m.get("model_id"), "n_layers": m.get("n_layers"), "d_model": m.get("d_model")}


def _name(model_id: str | None) -> str:
    name = pathlib.PurePath(str(model_id or "")).name.lower()
    return ALIASES.get(name, name)


def same_model(a: str | None, b: str | None) -> bool:
    """Whether two model ids name one model: equal names (last path part, any case), or one is the other's
    short name (``smollm2`` and ``smollm2-135m-instruct``). Unknown ids (None, "") never conflict."""
    x, y = _name(a), _name(b)
    if not x or not y:
        return True
    return x == y or x.startswith(y + "-") or y.startswith(x + "-")


def _sae_cfg(path: pathlib.Path) -> dict | None:
    try:
        return json.loads((path / "cfg.json").read_text())
    except (OSError, ValueError):
        return None


def sae_misfit(path: str | pathlib.Path, facts: dict) -> str | None:
    """Why the SAE at ``path`` does not fit a model with ``facts`` (:func:`model_facts`), or None if it fits."""
    cfg = _sae_cfg(pathlib.Path(path))
    if cfg is None:
        return f"No SAE directory at {path}."
    meta = cfg.get("metadata", {})
    layer = meta.get("layer", cfg.get("layer"))
    trained_on = meta.get("model_name")
    what = f"The SAE at {path} was trained on '{trained_on}' (width {cfg.get('d_in')}, layer {layer})"
    if facts.get("d_model") is not None and cfg.get("d_in") != facts["d_model"]:
        return f"{what}; this run's model '{facts.get('model_id')}' is {facts['d_model']} wide."
    if facts.get("n_layers") is not None and layer is not None and not 0 <= int(layer) < facts["n_layers"]:
        return f"{what}; this run's model '{facts.get('model_id')}' has {facts['n_layers']} layers."
    if not same_model(trained_on, facts.get("model_id")):
        return f"{what}, not on this run's model '{facts.get('model_id')}'."
    return None


def profile_misfit(info: dict, facts: dict) -> str | None:
    """Why a profile with ``info`` (its model fingerprint) does not fit a model with ``facts``, or None."""
    shape_ok = (facts.get("n_layers") in (None, info.get("n_layers"))
                and facts.get("d_model") in (None, info.get("d_model")))
    if shape_ok and same_model(info.get("model_id"), facts.get("model_id")):
        return None
    return (f"This profile was built on '{info.get('model_id')}' ({info.get('n_layers')} layers, width "
            f"{info.get('d_model')}), not on this run's model '{facts.get('model_id')}' ({facts.get('n_layers')} "
            f"layers, width {facts.get('d_model')}).")


def find_sae(facts: dict, root: pathlib.Path | None = None) -> pathlib.Path | None:
    """A shipped SAE that fits the model: under ``root``, default ``sample_data/saes`` and every
    ``sample_data/<model>/saes``; prefill-only SAEs first, then by name."""
    roots = [root] if root else [sample_data_dir() / "saes", *sorted(sample_data_dir().glob("*/saes"))]
    dirs = [p.parent for r in roots if r.is_dir() for p in r.glob("*/cfg.json")]
    dirs.sort(key=lambda d: ("prefill-only" not in d.name, str(d)))
    return next((d for d in dirs if sae_misfit(d, facts) is None), None)


def _profile_info(path: pathlib.Path) -> dict | None:
    from safetensors import safe_open

    try:
        with safe_open(str(path), "pt") as f:
            return json.loads((f.metadata() or {}).get("info", "null"))
    except Exception:  # not a profile file: skipped
        return None


def find_profile(facts: dict, root: pathlib.Path | None = None) -> pathlib.Path | None:
    """A shipped drift profile that fits the model: the first by name under ``root``, default
    ``sample_data/profiles`` and every ``sample_data/<model>/profile.safetensors``."""
    if root:
        files = sorted(root.glob("*.safetensors")) if root.is_dir() else []
    else:
        base = sample_data_dir()
        files = [*sorted((base / "profiles").glob("*.safetensors")), *sorted(base.glob("*/profile.safetensors"))]
    return next((p for p in files if (i := _profile_info(p)) is not None and profile_misfit(i, facts) is None), None)


def find_steering(facts: dict, root: pathlib.Path | None = None) -> dict[str, Any] | None:
    """The shipped CAA setting for the model: ``{"pairs": path, "layer": int}``, or None.

    The sample model's is ``sample_data/prompts/quotes_pairs.jsonl`` at the layer of
    ``sample_data/vectors/*.safetensors``; another model's, as ``trajscope prepare --ship`` writes it,
    is ``sample_data/<model>/prompts/steer_*_pairs.jsonl`` at the layer of the vector in
    ``sample_data/<model>/vectors/``.
    """
    from safetensors import safe_open

    base = root or sample_data_dir()
    name = _name(facts.get("model_id"))
    if name == "sample":
        pairs, vectors = sorted((base / "prompts").glob("*_pairs.jsonl")), sorted((base / "vectors").glob("*.safetensors"))
    elif name and (base / name).is_dir():
        pairs = sorted((base / name / "prompts").glob("steer_*_pairs.jsonl"))
        vectors = sorted((base / name / "vectors").glob("*.safetensors"))
    else:
        pairs, vectors = [], []
    if not pairs or not vectors:
        return None
    try:
        with safe_open(str(vectors[0]), "pt") as f:
            layer = int((f.metadata() or {})["layer"])
    except Exception:  # an unreadable or foreign vector file: no shipped setting
        return None
    n_layers = facts.get("n_layers")
    if n_layers is not None and not 0 <= layer < int(n_layers):
        return None
    return {"pairs": pairs[0], "layer": layer}
