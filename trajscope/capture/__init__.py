"""capture: record prefill and every decode step of one generation.

The model boundary runs one generation trace
(:meth:`~trajscope.model.ModelHandle.generation`). Step 0 is the prefill pass
(all P prompt positions at once) and step s ≥ 1 is the s-th decode pass, whose
single query is the token at ``pos = P + s − 1`` (:mod:`trajscope.positions`).
The kernels of :mod:`trajscope.capture.kernels` reduce each step's big tensors
(attention probabilities, residuals, logits) to a small record: on NDIF inside
the step, on the server; locally a few decode steps at a time
(:mod:`trajscope.capture.chunks`), which removes most of the kernels' per-step
cost at short context (``docs/capture_overhead.md``). Capture wraps each record in a typed
:class:`~trajscope.capture.record.StepRecord` and
:mod:`trajscope.capture.tables` builds the ``tokens``, ``attention`` and
``activations`` tables of a :class:`~trajscope.trajectory.Trajectory` from them.
What is recorded is decided by one frozen :class:`CaptureConfig`.

Streaming: ``on_step`` is called with a :class:`StepEvent` for every step, in
order, while the generation runs (locally): decode steps are reduced a few at a
time (:mod:`trajscope.capture.chunks`), so events come in short bursts, at most
about 0.1 s behind the generation. Stopping: a ``cancel`` event ends generation
after the step being computed through a Hugging Face stopping criterion, so
every kept step is complete; Ctrl-C keeps the finished steps too. Generation
also stops at EOS.
"""

from __future__ import annotations

import dataclasses
import functools
import time
import uuid
import warnings
from typing import Any, Callable, Sequence

import torch

from trajscope.capture import attachments, kernels
from trajscope.capture.chunks import STREAM_DELAY_S, PrefillGroups, StepChunks
from trajscope.capture.config import CaptureConfig, LayerSpec, resolve_layers
from trajscope.capture.record import StepRecord
from trajscope.capture.tables import build_tables
from trajscope.chat import encode_prompt, prompt_fields
from trajscope.errors import TrajscopeError
from trajscope.model import ModelHandle
from trajscope.model.forward import steer_specs
from trajscope.trajectory import Trajectory, library_versions

__all__ = ["capture", "CaptureConfig", "StepEvent", "StepRecord", "LayerSpec", "resolve_layers"]


@dataclasses.dataclass
class StepEvent:
    """What ``on_step`` receives after each captured step.

    Attributes:
        step: 0 for prefill, s ≥ 1 for decode.
        max_steps: the planned number of steps (``max_new_tokens``).
        pos: absolute position of the step's (last) query token.
        token_id: the token at ``pos``; text: its decoded text.
        mean_entropy: attention entropy of this step averaged over layers and heads (nats).
        next_entropy: entropy of the next-token distribution at ``pos`` (nats).
        partial: builds a :class:`Trajectory` of the steps captured so far.
    """

    step: int
    max_steps: int
    pos: int
    token_id: int
    text: str
    mean_entropy: float
    next_entropy: float
    partial: Callable[[], Trajectory]


class _CancelCriterion:
    """A Hugging Face stopping criterion that fires when ``cancel`` is set (asked once after each step)."""

    def __init__(self, cancel: Any):
        self.cancel = cancel
        self.fired = False

    def is_set(self) -> bool:
        c = self.cancel
        return bool(c()) if callable(c) and not hasattr(c, "is_set") else bool(c.is_set())

    def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
        self.fired = self.fired or self.is_set()
        return torch.full((input_ids.shape[0],), self.fired, dtype=torch.bool, device=input_ids.device)


def _gen_kwargs(model: ModelHandle, cfg: CaptureConfig) -> dict[str, Any]:
    keep = 0 if cfg.prefill_row_limit is None else cfg.prefill_row_limit  # 0: every position's logits
    kw: dict[str, Any] = {"max_new_tokens": cfg.max_new_tokens, "logits_to_keep": keep,
                          "pad_token_id": model.tokenizer.pad_token_id}
    if cfg.temperature > 0:
        kw.update(do_sample=True, temperature=float(cfg.temperature), top_p=cfg.top_p or 1.0, top_k=cfg.top_k or 0)
    else:
        kw.update(do_sample=False, temperature=None, top_p=None, top_k=None)
    eos = model.eos_token_id
    kw["eos_token_id"] = eos if (cfg.stop_at_eos and eos is not None) else []
    return kw


def capture(model: ModelHandle, prompt: str | Sequence[int] | Sequence[dict], config: CaptureConfig | None = None, *,
            on_step: Callable[[StepEvent], None] | None = None, cancel: Any = None, run_id: str | None = None,
            **settings: Any) -> Trajectory:
    """Generate a continuation and record every step.

    Args:
        model: from :func:`trajscope.load_model`.
        prompt: text, token ids, or chat messages ``[{"role": ..., "content": ...}]`` (rendered through the
            tokenizer's chat template with the generation prompt: :mod:`trajscope.chat`; ``meta.json``
            records the messages and the rendered text, and ``tokens.segment`` each position's turn).
        config: a :class:`CaptureConfig` (default settings when None).
        on_step: called with a :class:`StepEvent` for each step, in order (locally while
            generating, in bursts at most about 0.1 s behind it; for NDIF, after the results come back).
        cancel: a ``threading.Event`` (or a callable returning bool); when set,
            generation ends after the step being computed and the run keeps every step it has.
        run_id: defaults to a fresh unique id.
        **settings: :class:`CaptureConfig` fields overriding ``config`` (e.g. ``max_new_tokens=16``).

    Returns:
        A :class:`Trajectory` (tables described in :mod:`trajscope.trajectory`; kept tensors
        ``residual.{l}`` ``[n_positions_computed, d_model]`` and ``attention.{l}``
        ``[n_heads, n_pos, n_pos]``); ``meta["stop_reason"]`` is one of ``"max_new_tokens"``,
        ``"eos"``, ``"cancelled"`` or ``"interrupted"``.
    """
    cfg = (config or CaptureConfig()).replace(**settings) if settings else (config or CaptureConfig())
    ids, prompt = encode_prompt(model, prompt)
    P = len(ids)
    N = cfg.max_new_tokens
    model.check_fits(P, N)
    res_layers, row_layers, probe_spec, sae_spec = prepare(model, cfg)
    run_id = run_id or time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
    meta = run_meta(model, cfg, prompt, P, run_id, res_layers, row_layers, sae_spec)
    gen_kwargs = _gen_kwargs(model, cfg)
    criterion = None
    if cancel is not None and model.remote is not True:
        from transformers import StoppingCriteriaList

        criterion = _CancelCriterion(cancel)
        gen_kwargs["stopping_criteria"] = StoppingCriteriaList([criterion])

    chunks: StepChunks | None = None  # local captures: the records, as the chunks are reduced

    def partial(n_steps: int) -> Trajectory:
        recs = [StepRecord.from_kernel(r) for r in chunks.out[:n_steps]]
        return _assemble(model, meta, recs, None, None, res_layers, row_layers, "running")

    emit = None
    if on_step is not None and not model.remote:
        def emit(rec: dict, n_steps: int) -> None:
            on_step(_event(model, StepRecord.from_kernel(rec), N, functools.partial(partial, n_steps)))
    # locally, decode steps are reduced in chunks (chunks.py); NDIF reduces each step on the server
    if not model.remote:
        chunks = StepChunks(emit, STREAM_DELAY_S if on_step is not None else None)
    opts = (res_layers, row_layers, cfg.top_k_keys, cfg.top_k_tokens, probe_spec, sae_spec)
    from trajscope.model.forward import seeded

    result, stop_reason = None, None
    with seeded(cfg.seed if cfg.temperature > 0 else None), torch.no_grad(), warnings.catch_warnings():
        # EOS and cancel end the iter loop early by design; nnsight warns about the unreached steps.
        warnings.filterwarnings("ignore", message=".*was never reached.*")
        try:
            result = model.generation(ids, gen_kwargs, kernels.record_step if chunks is None else chunks, opts,
                                      steer_specs(model, cfg.steering), N, kernels=kernels,
                                      prefill_rows=cfg.prefill_row_limit,
                                      layer_fn=kernels.prefill_layer if chunks is None else
                                      PrefillGroups(model.n_layers))
        except KeyboardInterrupt:
            stop_reason = "interrupted"
        if chunks is not None and chunks.out is not None:
            try:
                chunks.flush()  # the steps kept since the last chunk, however the generation ended
            except KeyboardInterrupt:
                stop_reason = "interrupted"
    final_ids, recs, final_lp = result if result is not None else (None, [], None)
    if chunks is not None:  # the records and the last log-probabilities as the chunks were reduced
        recs, final_lp = chunks.out or [], chunks.last_lp
    records = [StepRecord.from_kernel(r) for r in recs]
    if stop_reason is None:
        eos = model.eos_token_id
        if criterion is not None and criterion.fired and len(records) < N:
            stop_reason = "cancelled"
        elif final_ids is not None and cfg.stop_at_eos and eos is not None and final_ids[-1] == eos:
            stop_reason = "eos"
        else:
            stop_reason = "max_new_tokens"
    traj = finish(model, cfg, meta, records, final_ids, final_lp, stop_reason, probe_spec, sae_spec)
    if on_step is not None and model.remote:
        for rec in records:
            on_step(_event(model, rec, N, lambda: traj))
    return traj


def prepare(model: ModelHandle, cfg: CaptureConfig) -> tuple[list[int], list[int], tuple | None, tuple | None]:
    """Check a config against the model: ``(residual layers, attention layers, probe spec, SAE spec)``."""
    for vec in cfg.steering:
        vec.validate(model.n_layers, model.d_model, cfg.max_new_tokens)
    res_layers = resolve_layers(cfg.residual_layers, model.n_layers, "residual_layers")
    row_layers = resolve_layers(cfg.attention_layers, model.n_layers, "attention_layers")
    probe_spec = None
    if cfg.probe is not None:
        cfg.probe.profile.check_model(model.n_layers, model.d_model, model.model_id)
        probe_spec = cfg.probe.spec()
        resolve_layers(probe_spec[0], model.n_layers, "probe layers")
    return res_layers, row_layers, probe_spec, attachments.sae_spec(model, cfg.sae, cfg.sae_top_k)


def run_meta(model: ModelHandle, cfg: CaptureConfig, prompt: Any, P: int, run_id: str,
             res_layers: list[int], row_layers: list[int], sae_spec: tuple | None) -> dict:
    """What a capture's ``meta.json`` records before the run (settings, model, versions).

    ``prompt`` is the text, the token ids, or the :class:`~trajscope.chat.ChatPrompt` of
    :func:`~trajscope.chat.encode_prompt` (which adds ``messages`` and the prompt's segment runs).
    """
    return {
        "run_id": run_id, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        **prompt_fields(prompt, P), "prompt_len": P,
        "sampling": cfg.sampling, "model": model.describe(), "versions": library_versions(),
        "capture": cfg.to_dict(), "residual_layers": res_layers, "attention_layers": row_layers,
        "top_k_keys": cfg.top_k_keys, "top_k_tokens": cfg.top_k_tokens,
        "attention_prefill_rows": P if (cfg.prefill_row_limit is None or model.attn_impl == "eager")
        else min(P, cfg.prefill_row_limit),
        "steering": [v.to_dict() for v in cfg.steering],
        "probe": cfg.probe.to_dict() if cfg.probe is not None else None,
        "sae": None if cfg.sae is None else {"layer": sae_spec[0], "top_k": cfg.sae_top_k, "d_sae": cfg.sae.cfg.d_sae,
                                             "architecture": cfg.sae.cfg.architecture,
                                             "hook_name": cfg.sae.cfg.hook_name},
    }


def finish(model: ModelHandle, cfg: CaptureConfig, meta: dict, records: list[StepRecord], final_ids: list[int] | None,
           final_lp: torch.Tensor | None, stop_reason: str, probe_spec: tuple | None,
           sae_spec: tuple | None) -> Trajectory:
    """The Trajectory of a finished run: tables from the step records, then the steering, SAE and probe parts."""
    traj = _assemble(model, meta, records, final_ids, final_lp, meta["residual_layers"], meta["attention_layers"],
                     stop_reason)
    traj.tensors.update({f"steering.{i}": v.direction for i, v in enumerate(cfg.steering)})
    if sae_spec is not None:
        traj.features, traj.tokens = attachments.feature_tables(traj, records, sae_spec[0],
                                                                f"{cfg.sae.cfg.architecture}{cfg.sae.cfg.d_sae}-L{sae_spec[0]}")
    if probe_spec is not None:
        traj.probe = attachments.probe_table(traj, records, probe_spec)
        traj.meta["probe"].update(n_probed=traj.probe["step"].n_unique(),
                                  n_flagged_steps=traj.probe.filter("flagged")["step"].n_unique(),
                                  flagged=bool(traj.probe["flagged"].any()))
        if cfg.probe.trajectory_threshold is not None and traj.probe.height:
            traj.meta["probe"].update(run_statistic=cfg.probe.run_statistic(traj.probe),
                                      trajectory_flagged=cfg.probe.flags_run(traj.probe))
    return traj


def _event(model: ModelHandle, rec: StepRecord, max_steps: int, partial: Callable[[], Trajectory]) -> StepEvent:
    tok = int(rec.ids[-1])
    return StepEvent(step=rec.step, max_steps=max_steps, pos=rec.last_pos, token_id=tok,
                     text=model.tokenizer.decode([tok]), mean_entropy=float(rec.attn[..., -1, 0].mean()),
                     next_entropy=float(rec.entropy[-1]), partial=partial)


def _assemble(model, meta, records, final_ids, final_lp, res_layers, row_layers, stop_reason) -> Trajectory:
    recs = list(records)
    meta = dict(meta, stop_reason=stop_reason, n_steps=len(recs))
    consumed = [int(i) for r in recs for i in r.ids.tolist()]
    token_ids = list(consumed)
    lp = None
    if final_ids is not None and len(final_ids) > len(consumed):
        token_ids = final_ids[: len(consumed) + 1]
        lp = final_lp
    meta["n_generated"] = max(0, len(token_ids) - meta["prompt_len"])
    tables, tensors = build_tables(meta, recs, token_ids, lp, model.tokenizer, res_layers, row_layers)
    return Trajectory(meta=meta, tensors=tensors, **tables)
