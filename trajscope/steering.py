"""SteeringVector: a direction added to (or clamped in) one block's output from a chosen decode step.

Steering "at depth k" means the vector is active for every step ``s`` with
``start_step ≤ s < end_step`` and for no step before, so a greedy run is
token-identical to the unsteered run up to the token that step k produces.
``start_step = 0`` also steers the prefill pass (every prompt position).

Modes (applied to the residual ``h`` after block ``layer``):

- ``"add"``: ``h ← h + strength · direction``;
- ``"clamp"`` (projection clamp): ``h ← h − (h·û)û + strength · û`` with ``û`` the
  unit direction, i.e. the component along the direction is set to ``strength``.

Sources: :meth:`SteeringVector.from_contrast` (CAA: mean difference of the
residual at the last prompt token over contrast pairs, Rimsky et al. 2024),
:meth:`SteeringVector.from_sae` (an SAE decoder row), or
:meth:`SteeringVector.load` (safetensors or ``.npy``; never pickle).
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
from typing import Any, Sequence

import numpy as np
import torch

from trajscope.errors import TrajscopeError, first_sentence

MODES = ("add", "clamp")


@dataclasses.dataclass(frozen=True)
class SteeringVector:
    """A steering intervention.

    Attributes:
        layer: block whose output is steered.
        direction: ``[d_model]`` float tensor.
        strength: multiplier (``"add"``) or target projection (``"clamp"``).
        start_step: first steered step (1 = the first decode step; 0 includes prefill).
        end_step: first step no longer steered (None = until the end).
        mode: ``"add"`` or ``"clamp"``.
        name: a label for tables and plots.
    """

    layer: int
    direction: torch.Tensor
    strength: float = 1.0
    start_step: int = 1
    end_step: int | None = None
    mode: str = "add"
    name: str = "steer"

    def __post_init__(self):
        if self.mode not in MODES:
            raise TrajscopeError(f"Unknown steering mode '{self.mode}': use one of {', '.join(MODES)}.")
        d = torch.as_tensor(self.direction, dtype=torch.float32).detach().reshape(-1).cpu()
        if d.numel() == 0 or not torch.isfinite(d).all() or float(d.norm()) == 0.0:
            raise TrajscopeError("The steering direction must be a non-zero, finite vector.")
        object.__setattr__(self, "direction", d)
        if not math.isfinite(float(self.strength)):  # a NaN strength makes every steered residual NaN
            raise TrajscopeError(f"The steering strength must be a finite number, not {self.strength}.")
        if self.start_step < 0:
            raise TrajscopeError(f"start_step must be ≥ 0, not {self.start_step}.")
        if self.end_step is not None and self.end_step <= self.start_step:
            raise TrajscopeError(f"end_step ({self.end_step}) must be after start_step ({self.start_step}).")

    # -- derived copies -----------------------------------------------------------------
    def at(self, start_step: int | None = None, strength: float | None = None) -> "SteeringVector":
        """The same vector with another start step and/or strength."""
        return dataclasses.replace(self, start_step=self.start_step if start_step is None else start_step,
                                   strength=self.strength if strength is None else strength)

    @property
    def unit(self) -> torch.Tensor:
        """``[d_model]`` unit direction."""
        return self.direction / self.direction.norm()

    def validate(self, n_layers: int, d_model: int, max_new_tokens: int) -> None:
        """Raise :class:`TrajscopeError` when this vector cannot apply to a model / run."""
        if not 0 <= self.layer < n_layers:
            raise TrajscopeError(f"Steering layer {self.layer} is out of range; the model has layers 0..{n_layers - 1}.")
        if self.direction.numel() != d_model:
            raise TrajscopeError(f"The steering vector has width {self.direction.numel()} but layer {self.layer} "
                                 f"has width {d_model}.")
        if self.start_step >= max_new_tokens:
            raise TrajscopeError(f"start_step {self.start_step} is beyond the run: max_new_tokens is {max_new_tokens}, "
                                 f"so the last step is {max_new_tokens - 1}.")

    def spec(self) -> tuple:
        """The plain tuple that the model boundary applies (see :func:`trajscope.model.steer.steer_hidden`)."""
        return (self.direction, float(self.strength), int(self.start_step),
                -1 if self.end_step is None else int(self.end_step), self.mode)

    # -- (de)serialisation ----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """JSON-ready settings (the direction itself is summarised by its norm)."""
        return {"name": self.name, "layer": self.layer, "strength": self.strength, "start_step": self.start_step,
                "end_step": self.end_step, "mode": self.mode, "direction_norm": float(self.direction.norm())}

    @classmethod
    def from_dict(cls, d: dict[str, Any], direction: torch.Tensor) -> "SteeringVector":
        keys = ("layer", "strength", "start_step", "end_step", "mode", "name")
        return cls(direction=direction, **{k: d[k] for k in keys if k in d})

    def save(self, path: str | pathlib.Path) -> pathlib.Path:
        """Write the direction and settings to a ``.safetensors`` file."""
        from safetensors.torch import save_file

        path = pathlib.Path(path)
        meta = {k: str(v) for k, v in self.to_dict().items()}
        try:
            save_file({"direction": self.direction.contiguous()}, str(path), metadata=meta)
        except OSError as exc:
            raise TrajscopeError(f"Cannot write the steering vector to '{path}': {exc.strerror or exc}.") from exc
        return path

    @classmethod
    def load(cls, path: str | pathlib.Path, layer: int | None = None, **kwargs: Any) -> "SteeringVector":
        """Read a direction from ``.safetensors`` (key ``direction``, or the only tensor) or ``.npy``.

        Settings stored in a safetensors file written by :meth:`save` are used unless
        overridden by ``layer`` / ``kwargs`` (strength, start_step, end_step, mode, name).
        """
        path = pathlib.Path(path)
        if not path.is_file():
            raise TrajscopeError(f"No steering vector file at '{path}'.")
        stored: dict[str, Any] = {}
        if path.suffix == ".npy":
            try:
                direction = torch.from_numpy(np.load(path, allow_pickle=False).astype(np.float32))
            except (ValueError, OSError, EOFError) as exc:
                raise TrajscopeError(f"'{path}' is not a plain numeric .npy array ({first_sentence(exc)}).") from exc
        elif path.suffix == ".safetensors":
            from safetensors import safe_open

            from safetensors import SafetensorError

            try:
                with safe_open(str(path), framework="pt") as fh:
                    keys = list(fh.keys())
                    key = "direction" if "direction" in keys else (keys[0] if len(keys) == 1 else None)
                    if key is None:
                        raise TrajscopeError(f"'{path}' holds tensors {keys}; expected one named 'direction'.")
                    direction = fh.get_tensor(key)
                    meta = fh.metadata() or {}
            except (SafetensorError, OSError) as exc:
                raise TrajscopeError(f"'{path}' is not a readable safetensors file ({first_sentence(exc)}).") from exc
            for k, conv in (("layer", int), ("strength", float), ("start_step", int), ("end_step", int),
                            ("mode", str), ("name", str)):
                if meta.get(k) in (None, "None"):
                    continue
                try:
                    stored[k] = conv(meta[k])
                except ValueError as exc:
                    raise TrajscopeError(f"'{path}' stores {k}={meta[k]!r} in its metadata, which is not "
                                         f"{'a whole number' if conv is int else 'a number'}.") from exc
        else:
            raise TrajscopeError(f"Cannot read '{path}': steering vectors load from .safetensors or .npy files, "
                                 f"not '{path.suffix}'.")
        if direction.dim() != 1:
            raise TrajscopeError(f"'{path}' holds a tensor of shape {tuple(direction.shape)}; a steering direction is 1-D.")
        if layer is not None:
            stored["layer"] = layer
        stored.update(kwargs)
        if "layer" not in stored:
            raise TrajscopeError(f"'{path}' does not say which layer to steer; pass layer=.")
        if not direction.is_floating_point():
            raise TrajscopeError(f"'{path}' holds a tensor of dtype {str(direction.dtype).removeprefix('torch.')}; a "
                                 "steering direction is a float vector.")
        try:
            return cls(direction=direction, **stored)
        except TrajscopeError as exc:
            raise TrajscopeError(f"'{path}' does not hold a usable direction ({str(exc).rstrip('.')}).") from exc

    # -- sources ------------------------------------------------------------------------
    @classmethod
    def from_contrast(cls, model: Any, pairs: Sequence[tuple[str, str]], layer: int, *, strength: float = 1.0,
                      name: str = "caa", **kwargs: Any) -> "SteeringVector":
        """CAA: mean over pairs of ``resid(positive) − resid(negative)`` at the last prompt token.

        Args:
            model: a :class:`~trajscope.model.ModelHandle`.
            pairs: ``(positive_text, negative_text)`` prompts.
            layer: block whose output is read (and later steered).
        """
        if not pairs:
            raise TrajscopeError("CAA needs at least one contrast pair.")
        if not 0 <= layer < model.n_layers:
            raise TrajscopeError(f"Steering layer {layer} is out of range; the model has layers 0..{model.n_layers - 1}.")
        pos = model.read_residuals([p for p, _ in pairs], layer)
        neg = model.read_residuals([n for _, n in pairs], layer)
        return cls(layer=layer, direction=(pos - neg).mean(0), strength=strength, name=name, **kwargs)

    @classmethod
    def from_sae(cls, sae: Any, feature: int, layer: int, *, strength: float = 1.0, **kwargs: Any) -> "SteeringVector":
        """The decoder direction of SAE ``feature`` (``sae.W_dec[feature]``, ``[d_model]``)."""
        W_dec = sae.W_dec
        if not 0 <= feature < W_dec.shape[0]:
            raise TrajscopeError(f"SAE feature {feature} is out of range; the SAE has {W_dec.shape[0]} features.")
        return cls(layer=layer, direction=W_dec[feature].detach().float(), strength=strength,
                   name=kwargs.pop("name", f"sae-{feature}"), **kwargs)
