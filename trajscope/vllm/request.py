"""What one request asks trajscope to do inside vLLM, read from ``SamplingParams.extra_args``.

vLLM passes a request's extra arguments (``SamplingParams(extra_args=...)`` offline,
``vllm_xargs`` in an OpenAI-compatible request) to the worker untouched; trajscope reads
the flat keys below (flat because ``vllm_xargs`` allows only strings, numbers and lists).
A request carrying none of them is served as plain vLLM.

=========================  ===================================================================
key                        meaning
=========================  ===================================================================
``trajscope``              1: record this request (implied by any other key below)
``trajscope_run_id``       the run directory's name (default: the vLLM request id)
``trajscope_layer``        the monitored layer: drift score, SAE, residual statistics
                           (default: the SAE's layer, else the middle layer)
``trajscope_profile``      a profile name from the server's catalogue: drift score per position
``trajscope_sae``          an SAE name from the catalogue (trained on the monitored layer)
``trajscope_sae_top_k``    features kept per position (default 8)
``trajscope_steer``        a vector name from the catalogue, or the direction as a list of floats
``trajscope_steer_layer``  the steered block (default: the vector file's layer)
``trajscope_strength``     multiplier of the direction (default: the file's, else 1)
``trajscope_start_step``   first steered decode step k ≥ 1 (default 1): steps s ≥ k are steered
``trajscope_residuals``    1: keep the monitored layer's residual rows (``tensors.safetensors``)
=========================  ===================================================================

:func:`plan_request` turns the keys into a :class:`RequestPlan` or one
:class:`~trajscope.errors.TrajscopeError` sentence; the API server runs it at admission
(:mod:`trajscope.vllm.admission`), so bad input is refused with HTTP 400 and the server keeps serving.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Mapping

import torch

from trajscope.errors import TrajscopeError
from trajscope.vllm.catalogue import Catalogue

PREFIX = "trajscope"
KEYS = ("trajscope", "trajscope_run_id", "trajscope_layer", "trajscope_profile", "trajscope_sae", "trajscope_sae_top_k",
        "trajscope_steer", "trajscope_steer_layer", "trajscope_strength", "trajscope_start_step", "trajscope_residuals")
DEFAULT_TOP_K = 8
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


@dataclasses.dataclass(frozen=True)
class RequestPlan:
    """A validated request: what the worker reads, scores and steers for it.

    Attributes:
        run_id: run directory name (None: the vLLM request id).
        layer: monitored layer.
        profile, sae: catalogue names (None: not asked).
        sae_top_k: features kept per position.
        steer_layer, steer_direction, strength, start_step: steering (direction None: not steered).
        keep_residuals: keep the monitored layer's residual rows.
    """

    run_id: str | None
    layer: int
    profile: str | None = None
    sae: str | None = None
    sae_top_k: int = DEFAULT_TOP_K
    steer_name: str | None = None
    steer_layer: int | None = None
    steer_direction: torch.Tensor | None = None
    strength: float = 1.0
    start_step: int = 1
    keep_residuals: bool = False

    @property
    def steered(self) -> bool:
        return self.steer_direction is not None

    def steering_dict(self) -> dict[str, Any]:
        """The steering entry of ``meta.json`` (the shape of :meth:`trajscope.steering.SteeringVector.to_dict`)."""
        return {"name": self.steer_name or "vector", "layer": self.steer_layer, "strength": self.strength,
                "start_step": self.start_step, "end_step": None, "mode": "add",
                "direction_norm": float(self.steer_direction.norm())}


def wants_trajscope(extra_args: Mapping[str, Any] | None) -> bool:
    """Whether a request carries any trajscope key."""
    return bool(extra_args) and any(str(k).startswith(PREFIX) for k in extra_args)


def _int(args: Mapping[str, Any], key: str) -> int | None:
    v = args.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float, str)) or not re.fullmatch(r"-?\d+(\.0*)?", str(v).strip()):
        raise TrajscopeError(f"{key} must be a whole number, not {v!r}.")
    return int(float(v))


def _float(args: Mapping[str, Any], key: str) -> float | None:
    v = args.get(key)
    if v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise TrajscopeError(f"{key} must be a number, not {v!r}.") from None
    if not math.isfinite(f):
        raise TrajscopeError(f"{key} must be a finite number, not {v!r}.")
    return f


def plan_request(extra_args: Mapping[str, Any] | None, catalogue: Catalogue, n_layers: int, d_model: int,
                 max_tokens: int | None = None) -> RequestPlan | None:
    """Validate a request's trajscope keys against the served model and the server's catalogue.

    Args:
        extra_args: ``SamplingParams.extra_args``.
        catalogue: the server's artefacts.
        n_layers, d_model: the served model's depth and width.
        max_tokens: the request's token budget (a start step at or past it is refused).
    Returns:
        A :class:`RequestPlan`, or None when the request carries no trajscope key.
    Raises:
        TrajscopeError: one sentence naming the bad key.
    """
    if not wants_trajscope(extra_args):
        return None
    args = dict(extra_args)
    unknown = sorted(k for k in args if str(k).startswith(PREFIX) and k not in KEYS)
    if unknown:
        raise TrajscopeError(f"Unknown trajscope key {unknown[0]!r}; the keys are {', '.join(KEYS)}.")
    run_id = args.get("trajscope_run_id")
    if run_id is not None and not (isinstance(run_id, str) and _RUN_ID.match(run_id) and ".." not in run_id):
        raise TrajscopeError("trajscope_run_id must be 1-128 letters, digits, '.', '_' or '-', starting with a "
                             "letter or digit.")
    sae_name, profile_name = args.get("trajscope_sae"), args.get("trajscope_profile")
    sae = catalogue.sae(str(sae_name)) if sae_name is not None else None
    layer = _int(args, "trajscope_layer")
    if layer is None:
        layer = sae.cfg.layer if sae is not None and sae.cfg.layer is not None else n_layers // 2
    if not 0 <= layer < n_layers:
        raise TrajscopeError(f"trajscope_layer {layer} is out of range; the model has layers 0..{n_layers - 1}.")
    if sae is not None:
        sae.check_input(torch.zeros(1, d_model), layer)
    if profile_name is not None:
        catalogue.profile(str(profile_name)).check_model(n_layers, d_model, "the served model")
    top_k = _int(args, "trajscope_sae_top_k")
    if top_k is not None and not 1 <= top_k <= 256:
        raise TrajscopeError(f"trajscope_sae_top_k must be between 1 and 256, not {top_k}.")
    plan = dict(run_id=run_id, layer=layer, profile=None if profile_name is None else str(profile_name),
                sae=None if sae_name is None else str(sae_name), sae_top_k=top_k or DEFAULT_TOP_K,
                keep_residuals=bool(_int(args, "trajscope_residuals") or 0))
    steer = args.get("trajscope_steer")
    if steer is None:
        for k in ("trajscope_steer_layer", "trajscope_strength", "trajscope_start_step"):
            if k in args:
                raise TrajscopeError(f"{k} was given without trajscope_steer (the vector to steer with).")
        return RequestPlan(**plan)
    s_layer, strength, start = (_int(args, "trajscope_steer_layer"), _float(args, "trajscope_strength"),
                                _int(args, "trajscope_start_step"))
    if isinstance(steer, str):
        vec = catalogue.vector(steer, layer=s_layer)
        direction, name = vec.direction, steer
        s_layer = vec.layer if s_layer is None else s_layer
        strength = vec.strength if strength is None else strength
    elif isinstance(steer, (list, tuple)):
        try:
            direction = torch.tensor([float(x) for x in steer], dtype=torch.float32)
        except (TypeError, ValueError):
            raise TrajscopeError("trajscope_steer must be a vector name or a list of numbers.") from None
        name = "vector"
        if s_layer is None:
            raise TrajscopeError("A steering direction given as numbers needs trajscope_steer_layer.")
    else:
        raise TrajscopeError("trajscope_steer must be a vector name or a list of numbers.")
    if direction.numel() != d_model:
        raise TrajscopeError(f"The steering vector has width {direction.numel()} but the model's residual stream "
                             f"has width {d_model}.")
    if not torch.isfinite(direction).all() or float(direction.norm()) == 0.0:
        raise TrajscopeError("The steering direction must be a non-zero, finite vector.")
    if not 0 <= s_layer < n_layers:
        raise TrajscopeError(f"Steering layer {s_layer} is out of range; the model has layers 0..{n_layers - 1}.")
    start = 1 if start is None else start
    if start < 1:
        raise TrajscopeError(f"trajscope_start_step must be ≥ 1 (decode steps count from 1), not {start}.")
    if max_tokens is not None and start >= max_tokens:
        raise TrajscopeError(f"trajscope_start_step {start} is beyond the request: max_tokens is {max_tokens}, so the "
                             f"last decode step is {max_tokens - 1}.")
    return RequestPlan(**plan, steer_name=name, steer_layer=s_layer, steer_direction=direction.float(),
                       strength=1.0 if strength is None else float(strength), start_step=start)
