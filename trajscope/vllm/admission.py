"""Admission check: a request's trajscope keys are validated in vLLM's front end, before the engine sees them.

vLLM runs the ``validate_params`` class method of each custom logits processor on every
request at admission, and turns a ``ValueError`` into HTTP 400 with its message
(``vllm/v1/sample/logits_processor``). :class:`TrajscopeAdmission` is such a processor:
its ``validate_params`` runs :func:`trajscope.vllm.request.plan_request` against the served
model and the server's catalogue, so a vector of the wrong width, a start step < 1, an
unknown SAE or a profile from another model gets one sentence and the server keeps
serving. As a logits processor it does nothing (``apply`` returns the logits unchanged).

Install it with ``--logits-processors trajscope.vllm.admission:TrajscopeAdmission``
(``vllm serve``) or ``logits_processors=[TrajscopeAdmission]`` (``vllm.LLM``).
The served model's depth and width are read once from its ``config.json``
(``$TRAJSCOPE_VLLM_MODEL``, which the documented command sets to the served directory).
"""

from __future__ import annotations

import functools
import json
import os
import pathlib

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor

from trajscope.errors import TrajscopeError
from trajscope.vllm.catalogue import Catalogue
from trajscope.vllm.request import plan_request, wants_trajscope

ENV_MODEL = "TRAJSCOPE_VLLM_MODEL"


@functools.lru_cache(maxsize=4)
def _model_shape(model_dir: str) -> tuple[int, int]:
    cfg = json.loads((pathlib.Path(model_dir).expanduser() / "config.json").read_text())
    return int(cfg["num_hidden_layers"]), int(cfg["hidden_size"])


@functools.lru_cache(maxsize=1)
def _catalogue(roots: str | None) -> Catalogue:
    return Catalogue.scan(roots)


class TrajscopeAdmission(LogitsProcessor):
    """A no-op logits processor whose ``validate_params`` refuses bad trajscope keys with one sentence."""

    @classmethod
    def validate_params(cls, sampling_params) -> None:
        args = getattr(sampling_params, "extra_args", None)
        if not wants_trajscope(args):
            return
        model = os.environ.get(ENV_MODEL)
        if not model:
            raise ValueError(f"This server does not serve trajscope requests: start it with {ENV_MODEL} set to the "
                             "served model's directory.")
        try:
            n_layers, d_model = _model_shape(model)
            plan_request(args, _catalogue(os.environ.get("TRAJSCOPE_VLLM_ARTEFACTS")), n_layers, d_model,
                         sampling_params.max_tokens)
        except TrajscopeError as exc:
            raise ValueError(str(exc)) from None
        except (OSError, KeyError, ValueError) as exc:
            raise ValueError(f"trajscope could not check this request: {exc}") from None

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool):
        pass

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        return logits

    def is_argmax_invariant(self) -> bool:
        return True

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        return None
