"""Batched capture: many prompts through the model in padded batches, one Trajectory per prompt.

:func:`capture_batch` with ``batch_size = 1`` is :func:`trajscope.capture` run on each
prompt. With ``batch_size > 1`` each batch of prompts runs as one boundary operation,
:meth:`~trajscope.model.ModelHandle.greedy_batch` with ``reads``: the greedy
continuations of the whole batch, decoded together with the KV cache (padded on
``padding_side``, each row stopping at its own EOS), and, while it decodes, what every
step computed — every layer's block output, the logits, and the attention rows of the
queries capture reads: the last ``prefill_rows`` prompt queries (all with eager attention
or kept attention tensors) and every decode query — handed back per prompt, indexed by
its own positions.

Each prompt's step records are then cut from those reads — step 0 is the prompt
positions ``0..P−1``, step s ≥ 1 the single query at ``pos = P + s − 1``
(:mod:`trajscope.positions`) with its keys ``0..pos`` — and reduced by the same kernels
that capture uses (:func:`~trajscope.capture.kernels.step_record` for the prefill,
:func:`~trajscope.capture.kernels.decode_records` for chunks of decode steps), so the tables have
capture's schema and meaning. Per prompt they equal batch-1 capture within the model's
floating-point determinism floor (the batch's matmul shapes round differently), with
identical token ids and positions; ``tests/test_capture_batch.py`` holds them to it for
left and right padding on every tiny model family.

Cost: the reads of a batch are reduced after it finishes, so they are held at once: per
layer ``B × (P + N) × d_model`` block outputs and ``B × H × (prefill window + N) × (P + N)``
attention values, float32 on the CPU (capture reduces a few steps at a time); long runs want
smaller batches.

Batches decode greedily (temperature 0): sampling draws from the RNG in a different order
when rows share a step, so a sampled batch could not reproduce batch 1. Steering is
batch-1 only as well. Every run's ``meta["serving"]`` records the batch size, padding side,
dtype and device.
"""

from __future__ import annotations

import time
import uuid
from typing import Callable, Sequence

import torch

from trajscope.capture import CaptureConfig, finish, prepare, run_meta
from trajscope.chat import encode_prompt
from trajscope.capture import capture as capture_one
from trajscope.capture import kernels
from trajscope.capture.chunks import chunk_size
from trajscope.capture.record import StepRecord
from trajscope.errors import TrajscopeError
from trajscope.model import ModelHandle
from trajscope.trajectory import Trajectory


def _check(model: ModelHandle, cfg: CaptureConfig, batch_size: int, padding_side: str) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise TrajscopeError(f"The batch size must be a whole number of at least 1, not {batch_size!r}.")
    if padding_side not in ("left", "right"):
        raise TrajscopeError(f"padding_side must be 'left' or 'right', not '{padding_side}'.")
    if batch_size == 1:
        return
    if cfg.temperature > 0:
        raise TrajscopeError("Batched capture decodes greedily (temperature 0), because sampled rows of a batch draw "
                             "from the random generator in a different order than batch 1; use batch size 1 to sample.")
    if cfg.steering:
        raise TrajscopeError("Batched capture does not steer; use batch size 1 for steered runs.")
    if model.remote is True:
        raise TrajscopeError("Batched capture runs on a local model only; this model runs on NDIF.")
    if model.attn_impl == "sdpa":
        raise TrajscopeError("This model was loaded with attn='sdpa', which exposes no attention rows; "
                             "load it with attn='rows' (the default) or 'eager' to capture.")


def capture_batch(model: ModelHandle, prompts: Sequence[str | Sequence[int] | Sequence[dict]], config: CaptureConfig | None = None, *,
                  batch_size: int = 8, padding_side: str = "left", run_ids: Sequence[str | None] | None = None,
                  on_prompt: Callable[[int, int], None] | None = None) -> list[Trajectory]:
    """Capture many prompts, ``batch_size`` at a time, padded on ``padding_side``.

    Args:
        model: from :func:`trajscope.load_model`.
        prompts: texts, token-id lists or chat message lists (lengths may differ).
        config: a :class:`CaptureConfig` shared by every prompt (batches need ``temperature=0`` and no steering).
        batch_size: prompts per batch; 1 runs :func:`trajscope.capture` on each prompt.
        padding_side: ``"left"`` or ``"right"``.
        run_ids: one per prompt (None entries get a fresh id).
        on_prompt: called with ``(done, total)`` as prompts finish (progress bars).
    Returns:
        One :class:`Trajectory` per prompt, in order, with capture's tables and tensors
        (``residual.{l}`` ``[n_computed, d_model]``, ``attention.{l}`` ``[H, n, n]``) and
        ``meta["serving"] = {"batch_size", "padding_side", "dtype", "device"}``; ``meta["stop_reason"]``
        is ``"eos"`` or ``"max_new_tokens"``.
    """
    cfg = config or CaptureConfig()
    _check(model, cfg, batch_size, padding_side)
    prompts = list(prompts)
    if not prompts:
        raise TrajscopeError("The prompt list is empty.")
    run_ids = list(run_ids) if run_ids is not None else [None] * len(prompts)
    if len(run_ids) != len(prompts):
        raise TrajscopeError(f"run_ids has {len(run_ids)} entries but there are {len(prompts)} prompts.")
    serving = {"batch_size": batch_size, "padding_side": padding_side, "dtype": model.dtype, "device": model.device}
    out: list[Trajectory] = []
    for start in range(0, len(prompts), batch_size):
        group = prompts[start:start + batch_size]
        ids = run_ids[start:start + batch_size]
        if batch_size == 1:
            trajs = [capture_one(model, group[0], cfg, run_id=ids[0])]
        else:
            trajs = _capture_group(model, group, cfg, padding_side, ids)
        for t in trajs:
            t.meta["serving"] = dict(serving)
            out.append(t)
            if on_prompt is not None:
                on_prompt(len(out), len(prompts))
    return out


def _capture_group(model: ModelHandle, prompts: list, cfg: CaptureConfig, padding_side: str,
                   run_ids: list) -> list[Trajectory]:
    """One batch: greedy continuations decoded together, each step's reads cut into capture's records."""
    res_layers, row_layers, probe_spec, sae_spec = prepare(model, cfg)
    pairs = [encode_prompt(model, p) for p in prompts]
    encoded, prompts = [ids for ids, _ in pairs], [p for _, p in pairs]
    for ids in encoded:
        model.check_fits(len(ids), cfg.max_new_tokens)
    limit = cfg.prefill_row_limit
    n_attn = [len(p) if (limit is None or model.attn_impl == "eager") else min(len(p), limit) for p in encoded]
    m0 = [len(p) if limit is None else min(len(p), limit) for p in encoded]  # prefill rows with logits
    with torch.no_grad():
        full, fws = model.greedy_batch(encoded, max_new_tokens=cfg.max_new_tokens, padding_side=padding_side,
                                       stop_at_eos=cfg.stop_at_eos, reads=list(zip(n_attn, m0)))
    opts = (res_layers, row_layers, cfg.top_k_keys, cfg.top_k_tokens, probe_spec, sae_spec)
    trajs = []
    for prompt, ids, seq, fw, a0, rid in zip(prompts, encoded, full, fws, n_attn, run_ids):
        P = len(ids)
        rid = rid or time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
        meta = run_meta(model, cfg, prompt, P, rid, res_layers, row_layers, sae_spec)
        records, last_lp = step_records(fw, seq, P, a0, limit, opts)
        eos = model.eos_token_id
        stop = "eos" if (cfg.stop_at_eos and eos is not None and seq[-1] == eos) else "max_new_tokens"
        trajs.append(finish(model, cfg, meta, records, seq, last_lp, stop, probe_spec, sae_spec))
    return trajs


def step_records(fw, seq: Sequence[int], P: int, n_attn: int, limit: int | None,
                 opts: tuple) -> tuple[list[StepRecord], torch.Tensor]:
    """Capture's step records of one sequence, cut from its reads.

    Args:
        fw: the sequence's reads, a :class:`~trajscope.model.ForwardResult` over its ``T`` computed positions
            (``resid`` of every layer, ``attn`` rows of its last ``T − P + n_attn`` queries, ``logits`` of at
            least its last ``T − P + m`` positions, m = the prefill rows with a next-token distribution).
        seq: prompt + continuation ids (``T + 1`` of them).
        P: prompt length; n_attn: prefill attention rows (the last ``n_attn`` prompt queries).
        limit: prefill rows whose next-token distribution is computed (None: all).
        opts: the kernel options (``kernels.step_record``).
    Returns:
        ``(records, last_lp)``: steps ``0..T−P`` and the ``[vocab]`` log-probabilities that produced the last token.
    """
    T = len(seq) - 1
    L = len(fw.resid)
    ids = torch.tensor(list(seq), dtype=torch.long)
    base = T - fw.attn[0].shape[1]  # position of the first attention row returned
    lg = T - fw.logits.shape[0]  # position of the first logits row returned
    m0 = P if limit is None else min(P, limit)
    rec = kernels.step_record(0, P, ids[:P], [fw.attn[layer][:, P - n_attn - base:P - base, :P] for layer in range(L)],
                              [fw.resid[layer][:P] for layer in range(L)], fw.logits[P - m0 - lg:P - lg], None, opts)
    last_lp = rec.pop("last_lp")
    records = [StepRecord.from_kernel(rec)]
    s = 1
    while P + s - 1 < T:  # decode steps, a chunk at a time (chunks.py)
        p0 = P + s - 1
        C = min(chunk_size(L, fw.attn[0].shape[0], p0), T - p0)
        rows = torch.stack([fw.attn[layer][:, p0 - base:p0 - base + C, :p0 + C] for layer in range(L)])
        resid = torch.stack([fw.resid[layer][p0:p0 + C] for layer in range(L)])
        recs, last_lp = kernels.decode_records(s, P, ids[p0:p0 + C], rows, resid, fw.logits[p0 - lg:p0 - lg + C],
                                               last_lp, opts)
        records += [StepRecord.from_kernel(r) for r in recs]
        s += C
    return records, last_lp
