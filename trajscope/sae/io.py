"""SAELens' on-disk SAE format: a directory with ``cfg.json`` and ``sae_weights.safetensors``.

What SAELens writes (``SAE.save_model`` in ``sae_lens/saes/sae.py``, v6):

- ``sae_weights.safetensors``: the module's ``state_dict`` — ``W_enc [d_in, d_sae]``,
  ``W_dec [d_sae, d_in]``, ``b_enc [d_sae]``, ``b_dec [d_in]``.
- ``cfg.json``: the config dataclass as JSON — ``architecture`` (``"standard"``,
  ``"topk"``, …), ``d_in``, ``d_sae``, ``dtype``, ``device``,
  ``apply_b_dec_to_input``, ``normalize_activations``, ``reshape_activations``,
  for TopK ``k`` and ``rescale_acts_by_decoder_norm``, and a ``metadata`` object
  (``sae_lens_version``, ``hook_name``, ``model_name``, …).

SAELens' loader (``load_from_disk`` → ``handle_config_defaulting``) treats a
config without ``sae_lens_version`` as pre-6.0 and reads ``hook_name`` (or
``hook_point``) and ``activation_fn``/``activation_fn_kwargs.k`` from the top
level. This reader accepts both layouts; the writer produces the v6 layout with
``metadata.sae_lens_version = "6.0.0"`` so SAELens reads it as v6.
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

import torch

from trajscope.errors import TrajscopeError
from trajscope.io import atomic_file, atomic_write_text
from trajscope.sae.config import DTYPES, SAEConfig

CFG_FILENAME = "cfg.json"
WEIGHTS_FILENAME = "sae_weights.safetensors"
FORMAT_VERSION = "6.0.0"  # the SAELens config layout this writer follows
_TOP_LEVEL = ("architecture", "d_in", "d_sae", "dtype", "device", "apply_b_dec_to_input",
              "normalize_activations")


def _config_from_saelens(raw: dict[str, Any], where: pathlib.Path) -> SAEConfig:
    """Map a SAELens cfg.json (v6 or pre-6 layout) onto :class:`SAEConfig`."""
    meta = dict(raw.get("metadata") or {})
    arch = raw.get("architecture")
    k = raw.get("k")
    if arch is None:  # pre-6.0: the activation function names the architecture
        fn = raw.get("activation_fn", raw.get("activation_fn_str", "relu"))
        arch = "topk" if fn == "topk" else "standard" if fn == "relu" else str(fn)
    if k is None and isinstance(raw.get("activation_fn_kwargs"), dict):
        k = raw["activation_fn_kwargs"].get("k")
    if raw.get("reshape_activations", "none") not in ("none", None):
        raise TrajscopeError(f"{where}: reshape_activations='{raw['reshape_activations']}' (attention hook_z SAEs) "
                             "is not supported; trajscope reads residual-stream SAEs.")
    norm = raw.get("normalize_activations", "none")
    if isinstance(norm, bool) or norm is None:  # pre-6.0 boolean
        norm = "expected_average_only_in" if norm else "none"
    dtype = str(raw.get("dtype", "float32")).removeprefix("torch.")
    for key in ("d_in", "d_sae"):
        if not isinstance(raw.get(key), int):
            raise TrajscopeError(f"{where / CFG_FILENAME} has no integer '{key}'; it is not an SAELens config.")
    hook = meta.pop("hook_name", None) or raw.get("hook_name") or raw.get("hook_point")
    for key, value in raw.items():  # keep every other field so a round trip loses nothing
        if key not in _TOP_LEVEL and key not in ("metadata", "k", "hook_name", "hook_point",
                                                   "rescale_acts_by_decoder_norm", "reshape_activations"):
            meta.setdefault(key, value)
    return SAEConfig(architecture=str(arch), d_in=raw["d_in"], d_sae=raw["d_sae"],
                     k=int(k) if k is not None and arch == "topk" else None,
                     apply_b_dec_to_input=bool(raw.get("apply_b_dec_to_input", True)),
                     normalize_activations=str(norm),
                     rescale_acts_by_decoder_norm=bool(raw.get("rescale_acts_by_decoder_norm", False)),
                     hook_name=hook, dtype=dtype, device=str(raw.get("device", "cpu")), metadata=meta)


def config_to_saelens(cfg: SAEConfig) -> dict[str, Any]:
    """The ``cfg.json`` dict SAELens v6 writes for this config."""
    out: dict[str, Any] = {
        "d_in": cfg.d_in, "d_sae": cfg.d_sae, "dtype": cfg.dtype, "device": cfg.device,
        "apply_b_dec_to_input": cfg.apply_b_dec_to_input, "normalize_activations": cfg.normalize_activations,
        "reshape_activations": "none",
    }
    if cfg.architecture == "topk":
        out["k"] = int(cfg.k)
        out["rescale_acts_by_decoder_norm"] = cfg.rescale_acts_by_decoder_norm
    meta = {"sae_lens_version": FORMAT_VERSION, "sae_lens_training_version": FORMAT_VERSION,
            **cfg.metadata, "hook_name": cfg.hook_name}
    out["metadata"] = meta
    out["architecture"] = cfg.architecture
    return out


def load_sae(path: str | os.PathLike, sae_cls: Any, device: str | None = None) -> Any:
    """Read a SAELens-format SAE directory.

    Args:
        path: directory holding ``cfg.json`` and ``sae_weights.safetensors``.
        sae_cls: the class to build (:class:`trajscope.sae.model.SAE`; ``SAE.load`` passes it).
        device: where to put the weights (default: the config's device if available, else CPU).

    Returns:
        An :class:`SAE` in eval mode with ``W_enc [d_in, d_sae]``, ``W_dec [d_sae, d_in]``.

    Raises:
        TrajscopeError: missing directory or files, unreadable JSON, an unknown
        architecture, or weights whose shapes disagree with the config.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    p = pathlib.Path(path)
    if not p.is_dir():
        raise TrajscopeError(f"No SAE directory at '{p}'.")
    cfg_path, w_path = p / CFG_FILENAME, p / WEIGHTS_FILENAME
    if not cfg_path.is_file():
        raise TrajscopeError(f"'{p}' has no {CFG_FILENAME}; an SAELens-format SAE directory holds "
                             f"{CFG_FILENAME} and {WEIGHTS_FILENAME}.")
    if not w_path.is_file():
        raise TrajscopeError(f"'{p}' has no {WEIGHTS_FILENAME}; an SAELens-format SAE directory holds "
                             f"{CFG_FILENAME} and {WEIGHTS_FILENAME}.")
    try:
        raw = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TrajscopeError(f"{cfg_path} is not valid JSON ({exc}).") from exc
    if not isinstance(raw, dict):
        raise TrajscopeError(f"{cfg_path} does not hold a JSON object.")
    cfg = _config_from_saelens(raw, p)
    try:
        state = load_file(str(w_path), device="cpu")
    except (SafetensorError, OSError) as exc:
        raise TrajscopeError(f"{w_path} is not a readable safetensors file ({exc}).") from exc
    want = {"W_enc": (cfg.d_in, cfg.d_sae), "W_dec": (cfg.d_sae, cfg.d_in), "b_enc": (cfg.d_sae,), "b_dec": (cfg.d_in,)}
    for name, shape in want.items():
        if name not in state:
            raise TrajscopeError(f"{w_path} has no '{name}' tensor (found {sorted(state)}).")
        if tuple(state[name].shape) != shape:
            raise TrajscopeError(f"{w_path}: '{name}' is {tuple(state[name].shape)} but cfg.json "
                                 f"(d_in={cfg.d_in}, d_sae={cfg.d_sae}) implies {shape}.")
    sae = sae_cls(cfg, seed=None)
    dtype = DTYPES[cfg.dtype]
    with torch.no_grad():
        for name in want:
            getattr(sae, name).copy_(state[name].to(dtype))
    if device is None:
        device = cfg.device if (cfg.device == "cpu" or torch.cuda.is_available()) else "cpu"
    for param in sae.parameters():
        param.requires_grad_(False)
    return sae.to(device).eval()


def save_sae(sae: Any, path: str | os.PathLike) -> pathlib.Path:
    """Write ``sae`` as a SAELens v6 directory (atomic per file: temporary name, then rename).

    Returns:
        The directory path.
    """
    from safetensors.torch import save_file

    p = pathlib.Path(path)
    p.mkdir(parents=True, exist_ok=True)
    state = {name: getattr(sae, name).detach().to("cpu").contiguous() for name in ("W_enc", "W_dec", "b_enc", "b_dec")}
    with atomic_file(p / WEIGHTS_FILENAME) as tmp:
        save_file(state, str(tmp))
    atomic_write_text(p / CFG_FILENAME, json.dumps(config_to_saelens(sae.cfg), indent=1))
    return p
