"""The monitor study's settings, and the shipped artefacts it reads (steering vector, drift profile, SAEs).

Three kinds of planted shift (``shifts``), each from decode step k:

- ``steer``: the steering vector added at strength s from step k (s = 0: the null);
- ``topic``: the tokens produced at steps k, k + 1, … are replaced by the tokens of ``switch_text`` (a
  switch of topic and language, teacher-forced), after which the model generates freely;
- ``forced``: the same with ``forced_tokens`` tokens drawn uniformly from the vocabulary (special
  tokens excluded; a seeded draw per prompt) — an off-distribution token run.

``topic`` and ``forced`` share one null arm, ``replay``: the same machinery (the run's first k tokens
re-read as a prompt, then free generation) with nothing forced.

:class:`MonitorConfig` is a frozen dataclass whose fields carry their help text: ``trajscope study
monitor`` generates its flags from it (:mod:`trajscope.studies.flags`). ``default`` for the vector,
the profile and the SAEs means the model's shipped artefacts: under ``sample_data/`` for the sample
model, under ``sample_data/<model>/`` for a model built by ``trajscope prepare --ship``
(``sample_data/smollm2/vectors/french_caa_layer6.safetensors``, ``profile.safetensors``,
``saes/layer15-*``). A prompt's source file (its split group) is its id up to the first ``#`` or
``:`` (``chat_cooking.jsonl#0``, ``base64.py:51:b64encode``): :func:`file_of`.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
from dataclasses import field
from typing import Any

import torch

from trajscope.errors import TrajscopeError


SHIFT_KINDS = ("steer", "topic", "forced")
SWITCH_TEXT = " Now, in French, about volcanoes: Les volcans"


def _help(text: str, **more: Any) -> dict[str, Any]:
    return {"help": text, **more}


@dataclasses.dataclass(frozen=True)
class MonitorConfig:
    """Do monitors tuned to prefill catch a shift planted into decode: detection AUROC and time-to-detect at a fixed false-positive rate."""

    vector: str = field(default="default", metadata=_help(
        "steering vector that plants the shift: a .safetensors/.npy path, 'default' (the model's shipped vector) "
        "or 'random' (a seeded Gaussian direction of unit norm)"))
    vector_layer: int | None = field(default=None, metadata=_help(
        "layer to steer (default: the vector file's layer; for 'random', n_layers // 4)"))
    strengths: tuple[float, ...] = field(default=(0.0, 0.5, 1.0, 2.0), metadata=_help(
        "steering strengths (multiples of the vector); 0 is the null: the two arms then differ only by seed"))
    start_step: int = field(default=8, metadata=_help("decode step k from which the shift is active"))
    new_tokens: int = field(default=32, metadata=_help("tokens generated per run"))
    temperature: float = field(default=0.7, metadata=_help("sampling temperature (> 0: the arms differ by seed)"))
    seed: int = field(default=0, metadata=_help(
        "sampling seed of the clean arm (the shifted arm uses seed + 1) and of the split and bootstrap"))
    fpr: float = field(default=0.05, metadata=_help(
        "false-positive rate of the detection threshold on clean runs (needs ≥ (1 − fpr) / fpr fitting prompts)"))
    fit_files: tuple[str, ...] | None = field(default=None, metadata=_help(
        "source files whose clean runs fit the thresholds and the attention baseline (default: half of the "
        "files, by trajscope.stats.split_ids); the other files' prompts evaluate"))
    attention_layer: int | None = field(default=None, metadata=_help(
        "layer of the attention monitors (default: n_layers // 2)"))
    profile: str = field(default="default", metadata=_help(
        "drift profile for the drift monitor: a path, 'default' (the model's shipped one) or 'none'"))
    saes: tuple[str, ...] | None = field(default=None, metadata=_help(
        "SAE directories whose reconstruction error is a monitor (default: the model's shipped SAEs; 'none': no SAE)"))
    n_boot: int = field(default=1000, metadata=_help("bootstrap resamples of each AUROC interval"))
    shifts: tuple[str, ...] = field(default=("steer", "topic", "forced"), metadata=_help(
        "kinds of planted shift: steer (the vector at each strength), topic (switch_text teacher-forced from step k) "
        "and forced (forced_tokens uniform random tokens from step k); topic and forced share the null arm 'replay'"))
    switch_text: str = field(default=SWITCH_TEXT, metadata=_help(
        "the text teacher-forced from step k by the topic shift (a switch of topic and language)"))
    forced_tokens: int = field(default=8, metadata=_help(
        "how many tokens, drawn uniformly from the vocabulary, the forced shift teacher-forces from step k"))
    stop_at_eos: bool = field(default=False, metadata=_help(
        "end a run at EOS (runs that end before the start step are left out and counted); default: every run "
        "generates new_tokens"))

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "strengths", tuple(float(s) for s in self.strengths))
        except (TypeError, ValueError) as exc:
            raise TrajscopeError(f"--strengths must be numbers like 0,0.5,1,2; got {self.strengths!r}.") from exc
        if not self.strengths and "steer" in self.shifts:
            raise TrajscopeError("--strengths needs at least one strength.")
        if self.new_tokens < 2:
            raise TrajscopeError(f"--new-tokens must be at least 2, not {self.new_tokens}.")
        if not 1 <= self.start_step < self.new_tokens:
            raise TrajscopeError(f"--start-step must lie in 1..{self.new_tokens - 1} (a decode step of the run), "
                                 f"not {self.start_step}.")
        if not self.temperature > 0:
            raise TrajscopeError(f"--temperature must be above 0 (the null arm differs by sampling seed), "
                                 f"not {self.temperature}.")
        if not 0 < self.fpr < 0.5:
            raise TrajscopeError(f"--fpr must lie between 0 and 0.5, not {self.fpr}.")
        if self.n_boot < 1:
            raise TrajscopeError(f"--n-boot must be at least 1, not {self.n_boot}.")
        object.__setattr__(self, "shifts", tuple(str(k) for k in self.shifts))
        bad = [k for k in self.shifts if k not in SHIFT_KINDS]
        if bad or not self.shifts or len(set(self.shifts)) != len(self.shifts):
            raise TrajscopeError(f"--shifts takes distinct kinds among {', '.join(SHIFT_KINDS)}, not "
                                 f"{','.join(self.shifts) or 'nothing'}.")
        if "forced" in self.shifts and not 1 <= self.forced_tokens < self.new_tokens - self.start_step:
            raise TrajscopeError(f"--forced-tokens must lie in 1..{self.new_tokens - self.start_step - 1} (the run "
                                 f"keeps a free step after the forced ones), not {self.forced_tokens}.")
        if "topic" in self.shifts and not str(self.switch_text).strip():
            raise TrajscopeError("--switch-text is empty; give the text the topic shift forces.")


def file_of(prompt_id: str) -> str:
    """A prompt's source file: its id up to the first ``#`` or ``:`` (the whole id when it has neither)."""
    return re.split(r"[#:]", str(prompt_id), maxsplit=1)[0] or str(prompt_id)


def _facts(model: Any) -> dict[str, Any]:
    return {"model_id": model.model_id, "n_layers": model.n_layers, "d_model": model.d_model}


def _shipped_dirs(model: Any, kind: str) -> list[pathlib.Path]:
    """``sample_data/<kind>`` (the sample model's) and ``sample_data/<model>/<kind>`` of a model with that name."""
    from trajscope.model import sample_data_dir
    from trajscope.ui.artefacts import same_model

    base = sample_data_dir()
    out = [base / kind] if same_model("sample", model.model_id) else []
    return out + [d / kind for d in sorted(base.iterdir()) if d.is_dir() and d.name not in ("models", kind)
                  and same_model(d.name, model.model_id)]


def steering_vector(model: Any, config: MonitorConfig) -> Any:
    """The :class:`~trajscope.steering.SteeringVector` that plants the shift (strength 1, from ``start_step``)."""
    from trajscope.steering import SteeringVector

    kw = {"start_step": config.start_step, "strength": 1.0, "end_step": None, "mode": "add"}
    if config.vector == "random":
        g = torch.Generator().manual_seed(config.seed)
        d = torch.randn(model.d_model, generator=g)
        layer = model.n_layers // 4 if config.vector_layer is None else config.vector_layer
        vec = SteeringVector(layer=layer, direction=d / d.norm(), name="random", **kw)
    else:
        path = config.vector
        if path == "default":
            files = [f for d in _shipped_dirs(model, "vectors") for f in sorted(d.glob("*.safetensors"))]
            if not files:
                raise TrajscopeError(f"No steering vector is shipped for model '{model.model_id}'; pass --vector PATH "
                                     "or --vector random.")
            path = str(files[0])
        vec = SteeringVector.load(path, layer=config.vector_layer, **kw)
    vec.validate(model.n_layers, model.d_model, config.new_tokens)
    return vec


def drift_profile(model: Any, config: MonitorConfig) -> Any:
    """The :class:`~trajscope.profile.ReferenceProfile` of the drift monitor, or None (``'none'``, or no shipped one)."""
    from trajscope.profile import ReferenceProfile
    from trajscope.ui.artefacts import find_profile

    if config.profile == "none":
        return None
    path = find_profile(_facts(model)) if config.profile == "default" else config.profile
    if path is None:
        return None
    profile = ReferenceProfile.load(path)
    profile.check_model(model.n_layers, model.d_model, model.model_id)
    return profile


def monitor_saes(model: Any, config: MonitorConfig) -> dict[str, Any]:
    """``{name: SAE}`` of the SAE monitors: the given directories, or every shipped SAE that fits the model."""
    from trajscope.sae.model import SAE
    from trajscope.ui.artefacts import sae_misfit

    if config.saes is not None and tuple(config.saes) in ((), ("none",)):
        return {}
    if config.saes is None:
        dirs = [p.parent for d in _shipped_dirs(model, "saes") for p in sorted(d.glob("*/cfg.json"))]
        dirs = [d for d in dirs if sae_misfit(d, _facts(model)) is None]
    else:
        dirs = [pathlib.Path(p) for p in config.saes]
        for d in dirs:
            why = sae_misfit(d, _facts(model))
            if why:
                raise TrajscopeError(why)
    out = {}
    for d in dirs:
        sae = SAE.load(str(d))
        if sae.cfg.layer is None:
            raise TrajscopeError(f"The SAE at {d} does not say which layer it reads (hook_name or metadata.layer).")
        out[d.name] = sae.eval()
    return out


def default_drift_layers(n_layers: int) -> list[int]:
    """The drift monitor's layers when ``--layers`` is not given: a quarter, half, three quarters and the last."""
    return sorted({min(n_layers - 1, round(n_layers * f)) for f in (0.25, 0.5, 0.75)} | {n_layers - 1})
