"""The steering-success study's settings and the artefacts it reads (the vector, the contrast pairs, the SAE).

:class:`SuccessConfig` is a frozen dataclass whose fields carry their help text (the flags of
``trajscope study steering-success``). ``default`` for the vector, the pairs and the SAE means the
model's shipped artefacts: ``sample_data/smollm2/vectors/*.safetensors``,
``sample_data/smollm2/prompts/steer_*_pairs.jsonl`` and ``sample_data/smollm2/saes/layer15-hybrid``
for SmolLM2; for the sample model ``sample_data/vectors/``, ``sample_data/prompts/quotes_pairs.jsonl``
and its shipped SAE.

Contrast pairs are JSON lines ``{"positive", "negative"}`` (plain texts), optionally with a
``"question"``: then each side is the chat-templated question followed by that answer start
(the shape of SmolLM2's French pairs).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from dataclasses import field
from typing import Any

import torch

from trajscope.errors import TrajscopeError


def _help(text: str, **more: Any) -> dict[str, Any]:
    return {"help": text, **more}


@dataclasses.dataclass(frozen=True)
class SuccessConfig:
    """Steering as the field measures it: behavioural success, fluency cost, anti-steerable fraction, by layer,
    start depth and source (CAA vs an SAE decoder row)."""

    vector: str = field(default="default", metadata=_help(
        "steering vector of the headline arm: a .safetensors/.npy path or 'default' (the model's shipped vector)"))
    strength: float | None = field(default=None, metadata=_help(
        "strength of the headline arm (default: the vector file's); its negation is the anti-steering arm"))
    pairs: str = field(default="default", metadata=_help(
        "contrast pairs (JSON lines: positive, negative, optional question) for the CAA layer sweep; "
        "'default': the model's shipped pairs"))
    sweep_layers: tuple[int, ...] = field(default=(3, 6, 9, 12, 15, 20), metadata=_help(
        "layers of the CAA sweep (vectors from --pairs at each layer)"))
    strengths: tuple[float, ...] = field(default=(1.0, 2.0), metadata=_help(
        "multipliers of the raw CAA vector in the layer sweep and of the matched-norm SAE arm"))
    heldout_prompts: int = field(default=0, metadata=_help(
        "held-out prompts of the headline arm (0: all; else the first, spread over the files)"))
    sweep_prompts: int = field(default=12, metadata=_help(
        "held-out prompts of the layer sweep and the SAE arm (the first, spread over the files)"))
    new_tokens: int = field(default=24, metadata=_help("generated tokens scored per run (greedy)"))
    depths: tuple[int, ...] = field(default=(1, 8, 32), metadata=_help(
        "decode steps k where steering starts, for the by-depth arm"))
    window: int = field(default=16, metadata=_help(
        "steered steps scored at every depth (tokens k … k + window − 1: an equal window)"))
    depth_prompts: int = field(default=16, metadata=_help("held-out prompts of the by-depth arm"))
    sae: str = field(default="default", metadata=_help(
        "SAE directory of the feature-space arm, 'default' (the model's shipped hybrid SAE) or 'none'"))
    exclude_files: tuple[str, ...] = field(default=(), metadata=_help(
        "source files whose prompts chose the vector's layer or strength (left out: held-out = the other files)"))
    target: str = field(default="", metadata=_help(
        "a single-token string: the behaviour is then the share of generated tokens equal to it, success a share "
        "of at least 0.5 (default: the French function-word criterion)"))
    batch_size: int = field(default=16, metadata=_help("prompts decoded together"))
    n_boot: int = field(default=1000, metadata=_help("bootstrap resamples of each interval"))

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "strengths", tuple(float(s) for s in self.strengths))
            object.__setattr__(self, "sweep_layers", tuple(int(x) for x in self.sweep_layers))
            object.__setattr__(self, "depths", tuple(sorted({int(d) for d in self.depths})))
        except (TypeError, ValueError) as exc:
            raise TrajscopeError(f"--strengths, --sweep-layers and --depths must be comma-separated numbers ({exc}).") from exc
        if not self.strengths or min(self.strengths) <= 0:
            raise TrajscopeError("--strengths needs at least one strength, each above 0.")
        if self.new_tokens < 2:
            raise TrajscopeError(f"--new-tokens must be at least 2, not {self.new_tokens}.")
        if self.depths and self.depths[0] < 1:
            raise TrajscopeError("--depths are decode steps, each ≥ 1.")
        if self.window < 1:
            raise TrajscopeError(f"--window must be at least 1, not {self.window}.")
        for name in ("heldout_prompts", "sweep_prompts", "depth_prompts", "batch_size", "n_boot"):
            if getattr(self, name) < (0 if name.endswith("prompts") else 1):
                raise TrajscopeError(f"--{name.replace('_', '-')} must not be below "
                                     f"{0 if name.endswith('prompts') else 1}, not {getattr(self, name)}.")


def _shipped(model: Any, kind: str) -> list[pathlib.Path]:
    from trajscope.studies.monitor.config import _shipped_dirs

    return _shipped_dirs(model, kind)


def load_vector(model: Any, config: SuccessConfig) -> Any:
    """The headline :class:`~trajscope.steering.SteeringVector` (its file's layer; strength from the config)."""
    from trajscope.steering import SteeringVector

    path = config.vector
    if path == "default":
        files = [f for d in _shipped(model, "vectors") for f in sorted(d.glob("*.safetensors"))]
        if not files:
            raise TrajscopeError(f"No steering vector is shipped for model '{model.model_id}'; pass --vector PATH.")
        path = str(files[0])
    vec = SteeringVector.load(path, start_step=1, end_step=None, mode="add")
    if config.strength is not None:
        vec = vec.at(strength=config.strength)
    vec.validate(model.n_layers, model.d_model, 2)
    return vec


def pairs_path(model: Any, config: SuccessConfig) -> pathlib.Path:
    """The contrast-pair file of the layer sweep."""
    if config.pairs != "default":
        return pathlib.Path(config.pairs)
    for d in _shipped(model, "prompts"):
        found = sorted(d.glob("steer_*_pairs.jsonl")) or sorted(d.glob("*_pairs.jsonl"))
        if found:
            return found[0]
    raise TrajscopeError(f"No contrast pairs are shipped for model '{model.model_id}'; pass --pairs FILE.jsonl.")


def read_pair_ids(model: Any, path: pathlib.Path) -> list[tuple[list[int], list[int]]]:
    """Contrast pairs as token ids: plain texts, or the chat-templated ``question`` followed by each answer."""
    if not path.is_file():
        raise TrajscopeError(f"No contrast-pair file at '{path}'.")
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError as exc:
            raise TrajscopeError(f"{path}, line {n}: not JSON ({exc}).") from exc
        if not isinstance(rec, dict) or not all(isinstance(rec.get(k), str) for k in ("positive", "negative")):
            raise TrajscopeError(f"{path}, line {n}: expected {{\"positive\": ..., \"negative\": ...}}.")
        head: list[int] = []
        if isinstance(rec.get("question"), str):
            head = list(model.tokenizer.apply_chat_template([{"role": "user", "content": rec["question"]}],
                                                            add_generation_prompt=True, tokenize=True,
                                                            return_dict=True)["input_ids"])
        enc = lambda t: head + list(model.tokenizer(t, add_special_tokens=not head)["input_ids"])  # noqa: E731
        out.append((enc(rec["positive"]), enc(rec["negative"])))
    if not out:
        raise TrajscopeError(f"'{path}' holds no contrast pairs.")
    return out


def caa_vectors(model: Any, pairs: list[tuple[list[int], list[int]]], layers: list[int]) -> dict[int, torch.Tensor]:
    """Per layer, CAA: the mean over pairs of ``resid(positive) − resid(negative)`` at each text's last token."""
    from trajscope.model.batch import forward_batch

    bad = [x for x in layers if not 0 <= x < model.n_layers]
    if bad:
        raise TrajscopeError(f"Layer {bad[0]} is out of range; the model has layers 0..{model.n_layers - 1}.")
    pos = forward_batch(model, [p for p, _ in pairs], layers=layers)
    neg = forward_batch(model, [q for _, q in pairs], layers=layers)
    return {L: torch.stack([a.resid[L][-1] - b.resid[L][-1] for a, b in zip(pos, neg)]).mean(0) for L in layers}


def load_sae(model: Any, config: SuccessConfig) -> tuple[str, Any] | None:
    """``(name, SAE)`` of the feature-space arm, or None (``'none'``, or nothing shipped for the model)."""
    from trajscope.sae.model import SAE
    from trajscope.ui.artefacts import sae_misfit

    if config.sae == "none":
        return None
    if config.sae == "default":
        dirs = [p.parent for d in _shipped(model, "saes") for p in sorted(d.glob("*/cfg.json"))]
        dirs = [d for d in dirs if sae_misfit(d, {"model_id": model.model_id, "n_layers": model.n_layers,
                                                   "d_model": model.d_model}) is None]
        dirs = sorted(dirs, key=lambda d: ("hybrid" not in d.name, d.name))
        if not dirs:
            return None
        path = dirs[0]
    else:
        path = pathlib.Path(config.sae)
        if not (path / "cfg.json").is_file():
            raise TrajscopeError(f"No SAE at '{path}' (expected a cfg.json there).")
    sae = SAE.load(str(path)).eval()
    if sae.cfg.layer is None:
        raise TrajscopeError(f"The SAE at {path} does not say which layer it reads (hook_name or metadata.layer).")
    return path.name, sae
