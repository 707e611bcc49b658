"""The drift study's model runs: the three regimes of a prompt — prefill, decode, and the teacher-forced
human continuation.

For each prompt, :func:`prompt_regime_rows` captures greedy decode (all
residuals kept) and, when the prompt record has a ``continuation`` (the human
text that followed it in its source), runs the model boundary's teacher-forced
forward (:meth:`~trajscope.model.ModelHandle.forward`) over the prompt's tokens
followed by the continuation's, cut to the number of decode positions, so the
continuation's positions are exactly the decode positions P..P+n−1. The prompt
is tokenized as capture tokenizes it and the continuation on its own (no
special tokens), so positions below P are the same tokens in every regime.
Scoring and summaries live in :mod:`trajscope.studies.drift.regimes`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import polars as pl
import torch

from trajscope import positions
from trajscope.capture import CaptureConfig, capture
from trajscope.errors import TrajscopeError
from trajscope.studies.drift.regimes import regime_rows
from trajscope.profile import ReferenceProfile


def continuation_residuals(model: Any, prompt: str | Sequence[int], continuation: str, n_positions: int,
                           layers: Sequence[int] | None = None) -> tuple[int, list[int], dict[int, torch.Tensor], torch.Tensor]:
    """Teacher-force ``prompt + continuation`` and keep the continuation's first ``n_positions`` positions.

    Args:
        model: a :class:`~trajscope.model.ModelHandle`.
        prompt: the prompt's text, or its token ids (as capture would take them).
        n_positions: continuation tokens to run (the decode positions to match).
        layers: blocks to read (default all).
    Returns:
        ``(P, pos, resid, entropy)``: prompt length, the positions ``[P, P + n)``, ``{layer: [n, d_model]}``
        block outputs there, and ``[n]`` next-token entropies (nats) at those positions.
    """
    prompt_ids = model.encode(prompt) if isinstance(prompt, str) else list(prompt)
    cont_ids = model.tokenizer(continuation, add_special_tokens=False)["input_ids"][:n_positions]
    if len(cont_ids) < n_positions:
        raise TrajscopeError(f"The continuation has {len(cont_ids)} tokens but {n_positions} decode positions need "
                             f"matching; keep more of the text that followed the prompt.")
    P = len(prompt_ids)
    model.check_fits(P, n_positions)
    layers = list(range(model.n_layers)) if layers is None else list(layers)
    out = model.forward(prompt_ids + cont_ids, prompt_len=P, layers=layers)
    logp = torch.log_softmax(out.logits[P:].double(), dim=-1)
    entropy = -(logp.exp() * logp).sum(-1)
    return P, list(range(P, P + n_positions)), {k: v[P:] for k, v in out.resid.items()}, entropy


def prompt_regime_rows(model: Any, profile: ReferenceProfile, prompt_id: str, item: dict, cfg: CaptureConfig, *,
                       decode: bool = True, skip_first: bool = positions.SKIP_SINK) -> pl.DataFrame:
    """Scored rows of one prompt in the regimes it supports, each with its position's chat segment.

    Segments are the capture's (``tokens.segment``: a chat prompt's turns, ``user`` for every position of a
    plain prompt, ``assistant`` / ``thinking`` for generated text), or the record's ``segments`` for its prompt
    positions when it gives them (token ids rendered from a chat prompt carry no turns of their own); the
    continuation's positions take the segments of generated text (:func:`trajscope.positions.generated_segments`).

    Args:
        item: a prompt record (``prompt``: text or token ids; optional ``continuation`` and ``segments``).
        cfg: the decode capture settings (``residual_layers`` is forced to all layers).
        decode: run greedy decode (regimes ``prefill`` and ``decode``); with False only the continuation runs, over
            ``cfg.max_new_tokens − 1`` positions (the decode positions a full run would fill).
        skip_first: leave position 0 (the attention sink) out of the prefill rows, as the profile does.
    Returns:
        Rows of :func:`trajscope.studies.drift.regimes.regime_rows`, all regimes concatenated.
    """
    parts = []
    n_match = cfg.max_new_tokens - 1
    if decode:
        traj = capture(model, item["prompt"], dataclasses.replace(cfg, residual_layers="all"))
        P = traj.prompt_len
        n_res = traj.residual(0).shape[0]
        ent = dict(zip(traj.tokens["pos"].to_list(), traj.tokens["entropy"].to_list()))
        seg = dict(zip(traj.tokens["pos"].to_list(), traj.tokens["segment"].to_list()))
        if item.get("segments") is not None:
            given = list(item["segments"])
            if len(given) != P:
                raise TrajscopeError(f"Prompt '{prompt_id}' gives {len(given)} segments for its {P} tokens.")
            seg.update(enumerate(given))
        layers = range(model.n_layers)
        start = positions.first_reference_pos(skip_first)
        pre = list(range(start, P))
        dec = list(range(P, n_res))
        if pre:
            parts.append(regime_rows(profile, prompt_id, "prefill", {k: traj.residual(k)[start:P] for k in layers},
                                     pre, P, [ent.get(p) for p in pre], [seg[p] for p in pre]))
        if dec:
            parts.append(regime_rows(profile, prompt_id, "decode", {k: traj.residual(k)[P:n_res] for k in layers},
                                     dec, P, [ent.get(p) for p in dec], [seg[p] for p in dec]))
        n_match = len(dec)
    if item.get("continuation") and n_match > 0:
        P, pos, resid, entropy = continuation_residuals(model, item["prompt"], item["continuation"], n_match)
        ids = model.tokenizer(item["continuation"], add_special_tokens=False)["input_ids"][:len(pos)]
        segs = positions.generated_segments([model.tokenizer.decode([t]) for t in ids])
        parts.append(regime_rows(profile, prompt_id, "continuation", resid, pos, P, entropy.tolist(), segs))
    return pl.concat(parts) if parts else pl.DataFrame()
