"""Forwards over fixed sequences: teacher forcing and last-token reads, through nnsight.

Generation lives in :mod:`trajscope.capture`; this module runs a single
no-cache forward over tokens that are already known. The steering sweep uses
:func:`forced_forward` to measure a vector's effect on the *base* run's tokens,
and CAA uses :func:`last_token_residuals` to read contrast prompts.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from trajscope import _stepstats
from trajscope.capture import encode_prompt
from trajscope.model import ModelHandle
from trajscope.steering import SteeringVector


def last_token_residuals(model: ModelHandle, prompts: Sequence[str], layer: int) -> torch.Tensor:
    """Block ``layer``'s output at the last token of each prompt (one no-cache forward each).

    Returns:
        ``[n_prompts, d_model]`` float32.
    """
    blocks = model.blocks()
    rows = []
    with torch.no_grad():
        for prompt in prompts:
            ids = torch.tensor([encode_prompt(model, prompt)])
            with model.nn.trace(ids, **model.remote_options()):
                out = blocks[layer].output
                h = nnsight_save((out[0] if isinstance(out, tuple) else out)[0, -1])
            rows.append(h.float().cpu())
    return torch.stack(rows)


def forced_forward(model: ModelHandle, token_ids: Sequence[int], prompt_len: int,
                   steering: Sequence[SteeringVector] = (), layers: Sequence[int] = ()) -> dict:
    """Teacher-forced no-cache forward over a fixed sequence, with steering by step.

    Position ``p`` belongs to step ``max(0, p − P + 1)``, so a vector with
    ``start_step = k`` steers positions ``p ≥ P + k − 1`` — exactly the queries the
    generation loop would steer, but on the given tokens instead of sampled ones.

    Args:
        token_ids: the sequence (e.g. an unsteered run's tokens, minus the last).
        prompt_len: P.
        steering: vectors to apply.
        layers: blocks whose (steered) outputs to return.
    Returns:
        ``{"logits": [T, vocab] float32, "resid": {layer: [T, d_model] float32}}``.
    """
    steer = [[v.spec() for v in steering if v.layer == layer] for layer in range(model.n_layers)]
    T = len(token_ids)
    steps = (torch.arange(T) - prompt_len + 1).clamp_min(0)
    blocks = model.blocks()
    unembed = model.unembed()
    wanted = set(layers)
    last = max([v.layer for v in steering] + list(wanted) + [-1])
    saved: dict = {}
    with torch.no_grad(), model.lock:
        with model.nn.trace(torch.tensor([list(token_ids)]), **model.remote_options()):
            saved = nnsight_save(saved)
            for layer in range(last + 1):
                out = blocks[layer].output
                new = _stepstats.steer_output(out, steer[layer], steps) if steer[layer] else None
                if new is not None:
                    blocks[layer].output = new
                    out = new
                if layer in wanted:
                    saved[layer] = nnsight_save((out[0] if isinstance(out, tuple) else out)[0])
            logits = nnsight_save(unembed.output[0])
    return {"logits": logits.float().cpu(), "resid": {k: v.float().cpu() for k, v in saved.items()}}


def nnsight_save(value: Any) -> Any:
    """``nnsight.save`` (imported lazily so importing trajscope stays light)."""
    import nnsight

    return nnsight.save(value)
