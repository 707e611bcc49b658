"""capture: record prefill and every decode step of one generation.

One nnsight generation trace runs the whole continuation. Inside its
``tracer.iter`` loop, step 0 is the prefill pass (all P prompt positions at
once) and step s ≥ 1 is the s-th decode pass, whose single query is the token at
``pos = P + s - 1``. At every step the loop reads, in execution order, each
block's attention probabilities and output (the residual after that block) and
the logits, and reduces them to small per-step records with
:mod:`trajscope._stepstats`. Those records become the ``tokens``, ``attention``
and ``activations`` tables of a :class:`~trajscope.trajectory.Trajectory`; full
residual vectors and attention rows are kept only for the layers asked for.

Streaming: ``on_step`` is called while the step runs (locally), with a
:class:`StepEvent`. Cancelling: a ``cancel`` event ends generation after the
current step through a Hugging Face stopping criterion, so every kept step is
complete; Ctrl-C keeps the finished steps too. Generation also stops at EOS.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
import uuid
import warnings
from typing import Any, Callable, Sequence

import torch

from trajscope import _stepstats, attachments
from trajscope.errors import TrajscopeError
from trajscope.model import ModelHandle
from trajscope.steering import SteeringVector
from trajscope.trajectory import Trajectory, build_tables, library_versions

LayerSpec = str | int | Sequence[int] | None


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


def _layers(spec: LayerSpec, n_layers: int, what: str) -> list[int]:
    if spec is None:
        return []
    if spec == "all":
        return list(range(n_layers))
    if isinstance(spec, str):
        raise TrajscopeError(f"{what} must be 'all', a layer index or a list of indices, not '{spec}'.")
    items = [spec] if isinstance(spec, int) else list(spec)
    out = []
    for item in items:
        layer = int(item)
        if layer < 0:
            layer += n_layers
        if not 0 <= layer < n_layers:
            raise TrajscopeError(f"{what}: layer {item} is out of range; the model has layers 0..{n_layers - 1}.")
        out.append(layer)
    return sorted(set(out))


class _CancelCriterion:
    """A Hugging Face stopping criterion that fires when ``cancel`` is set."""

    def __init__(self, cancel: Any):
        self.cancel = cancel

    def is_set(self) -> bool:
        c = self.cancel
        return bool(c()) if callable(c) and not hasattr(c, "is_set") else bool(c.is_set())

    def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
        return torch.full((input_ids.shape[0],), self.is_set(), dtype=torch.bool, device=input_ids.device)


@contextlib.contextmanager
def _seeded(seed: int | None):
    """Seed torch's RNGs for the duration of a generation, restoring them afterwards."""
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        if seed is not None:
            torch.manual_seed(seed)
        yield


def encode_prompt(model: ModelHandle, prompt: str | Sequence[int]) -> list[int]:
    """Token ids of a prompt (a string, or ids passed through unchanged)."""
    if isinstance(prompt, str):
        if not prompt.strip():
            raise TrajscopeError("The prompt is empty; type some text to continue.")
        ids = model.tokenizer(prompt, add_special_tokens=True)["input_ids"]
    else:
        ids = [int(i) for i in prompt]
    if not ids:
        raise TrajscopeError("The prompt is empty; type some text to continue.")
    return ids


def capture(
    model: ModelHandle,
    prompt: str | Sequence[int],
    *,
    max_new_tokens: int = 32,
    temperature: float = 0.0,
    top_p: float | None = None,
    top_k: int | None = None,
    seed: int | None = 0,
    stop_at_eos: bool = True,
    residual_layers: LayerSpec = None,
    attention_layers: LayerSpec = None,
    steering: Sequence[SteeringVector] = (),
    probe: Any = None,
    sae: Any = None,
    sae_top_k: int = 16,
    on_step: Callable[[StepEvent], None] | None = None,
    cancel: Any = None,
    run_id: str | None = None,
    top_k_keys: int = 8,
    top_k_tokens: int = 5,
) -> Trajectory:
    """Generate a continuation and record every step.

    Args:
        model: from :func:`trajscope.load_model`.
        prompt: text, or token ids.
        max_new_tokens: N ≥ 1; steps 0..N-1 are captured unless EOS or cancel ends sooner.
        temperature: 0 for greedy; > 0 samples (with ``top_p`` / ``top_k`` when given).
        seed: seeds torch's RNG for sampling (RNG state is restored afterwards).
        stop_at_eos: end when the model emits its EOS token.
        residual_layers: ``"all"``, an index or indices whose block outputs are kept as
            tensors (``traj.residual(l)``: ``[n_positions_computed, d_model]``).
        attention_layers: layers whose full attention rows are kept
            (``traj.attention_rows(l)``: ``[n_heads, n_pos, n_pos]``).
        steering: :class:`~trajscope.steering.SteeringVector` s applied at the steps
            ``start_step ≤ s < end_step`` (recorded in ``meta["steering"]``; the
            directions are kept as tensors ``steering.{i}``).
        probe: a :class:`~trajscope.profile.DriftProbe`; scored decode steps go to the
            ``probe`` table and ``meta["probe"]`` (the profile must match the model).
        sae: a :class:`~trajscope.sae.model.SAE` for the layer in its config (``hook_name``); every
            position's top ``sae_top_k`` features go to the ``features`` table, and ``sae_l0`` /
            ``sae_rel_err`` (‖x − x̂‖² ÷ ‖x‖²) / ``sae_cos`` columns are added to ``tokens``.
        on_step: called with a :class:`StepEvent` as each step finishes (locally
            while generating; for NDIF, after the results come back).
        cancel: a ``threading.Event`` (or a callable returning bool); when set,
            generation ends after the current step and the run keeps what it has.
        run_id: defaults to a fresh unique id.
        top_k_keys: top attended keys kept per query row (attention table).
        top_k_tokens: top next-token alternatives kept per position (tokens table).

    Returns:
        A :class:`Trajectory`; ``meta["stop_reason"]`` is one of ``"max_new_tokens"``,
        ``"eos"``, ``"cancelled"`` or ``"interrupted"``.
    """
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens <= 0:
        raise TrajscopeError(f"max_new_tokens must be a positive whole number, not {max_new_tokens!r}.")
    if temperature < 0:
        raise TrajscopeError(f"temperature must be ≥ 0 (0 means greedy), not {temperature}.")
    ids = encode_prompt(model, prompt)
    P = len(ids)
    if model.context_len and P + max_new_tokens > model.context_len:
        if P >= model.context_len:
            raise TrajscopeError(f"The prompt has {P} tokens but the model's context window is {model.context_len}.")
        raise TrajscopeError(
            f"The prompt ({P} tokens) plus max_new_tokens ({max_new_tokens}) exceeds the model's context window "
            f"of {model.context_len}; ask for at most {model.context_len - P} new tokens.")
    steering = list(steering or ())
    for vec in steering:
        if not isinstance(vec, SteeringVector):
            raise TrajscopeError(f"steering takes SteeringVector objects, not {type(vec).__name__}.")
        vec.validate(model.n_layers, model.d_model, max_new_tokens)
    steer = [[v.spec() for v in steering if v.layer == layer] for layer in range(model.n_layers)]
    res_layers = _layers(residual_layers, model.n_layers, "residual_layers")
    probe_spec = None
    if probe is not None:
        probe.profile.check_model(model.n_layers, model.d_model, model.model_id)
        probe_spec = probe.spec()
        _layers(probe_spec[0], model.n_layers, "probe layers")
    row_layers = _layers(attention_layers, model.n_layers, "attention_layers")
    sae_spec = attachments.sae_spec(model, sae, sae_top_k)
    run_id = run_id or time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
    sampling = {"do_sample": temperature > 0, "temperature": temperature, "top_p": top_p, "top_k": top_k,
                "seed": seed, "max_new_tokens": max_new_tokens, "stop_at_eos": stop_at_eos}
    meta = {
        "run_id": run_id, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "prompt": prompt if isinstance(prompt, str) else None, "prompt_len": P,
        "sampling": sampling, "model": model.describe(), "versions": library_versions(),
        "residual_layers": res_layers, "attention_layers": row_layers,
        "top_k_keys": top_k_keys, "top_k_tokens": top_k_tokens,
        "steering": [v.to_dict() for v in steering],
        "probe": probe.to_dict() if probe is not None else None,
        "sae": None if sae is None else {"layer": sae_spec[0], "top_k": sae_top_k, "d_sae": sae.cfg.d_sae,
                                         "architecture": sae.cfg.architecture, "hook_name": sae.cfg.hook_name},
    }
    gen_kwargs: dict[str, Any] = {"max_new_tokens": max_new_tokens, "logits_to_keep": 0,
                                  "pad_token_id": model.tokenizer.pad_token_id}
    if temperature > 0:
        gen_kwargs.update(do_sample=True, temperature=float(temperature), top_p=top_p or 1.0, top_k=top_k or 0)
    else:
        gen_kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
    eos = model.eos_token_id
    gen_kwargs["eos_token_id"] = eos if (stop_at_eos and eos is not None) else []
    criterion = None
    if cancel is not None and model.remote is not True:
        from transformers import StoppingCriteriaList

        criterion = _CancelCriterion(cancel)
        gen_kwargs["stopping_criteria"] = StoppingCriteriaList([criterion])
    if model.remote:
        gen_kwargs.update(model.remote_options())
        import nnsight

        nnsight.register(_stepstats)

    records: list[dict] = []
    state = {"final": None}

    def partial(n_steps: int) -> Trajectory:
        return _assemble(model, meta, records[:n_steps], None, state, res_layers, row_layers, "running")

    emit = None
    if on_step is not None and not model.remote:
        def emit(rec: dict, n_steps: int) -> None:
            on_step(_event(model, rec, max_new_tokens, functools.partial(partial, n_steps)))
    stop_reason = None
    with model.lock, _seeded(seed if temperature > 0 else None), torch.no_grad(), warnings.catch_warnings():
        # EOS and cancel end the iter loop early by design; nnsight warns about the unreached steps.
        warnings.filterwarnings("ignore", message=".*was never reached.*")
        try:
            result = _run_trace(model, ids, gen_kwargs, records, state, (res_layers, row_layers, top_k_keys,
                                top_k_tokens, probe_spec, sae_spec), steer, emit, max_new_tokens)
        except KeyboardInterrupt:
            result, stop_reason = None, "interrupted"
    if result is not None and result[1] is not records:  # remote: the server's copies came back
        records[:] = result[1]
        state["final"] = result[2]
    final_ids = None if result is None else result[0]
    if stop_reason is None:
        n = len(records)
        if criterion is not None and criterion.is_set() and n < max_new_tokens:
            stop_reason = "cancelled"
        elif final_ids is not None and stop_at_eos and eos is not None and final_ids[-1] == eos:
            stop_reason = "eos"
        else:
            stop_reason = "max_new_tokens"
    traj = _assemble(model, meta, records, final_ids, state, res_layers, row_layers, stop_reason)
    traj.tensors.update({f"steering.{i}": v.direction for i, v in enumerate(steering)})
    if sae_spec is not None:
        traj.features, traj.tokens = attachments.feature_tables(traj, records, sae_spec[0],
                                                     f"{sae.cfg.architecture}{sae.cfg.d_sae}-L{sae_spec[0]}")
    if probe_spec is not None:
        traj.probe = attachments.probe_table(traj, records, probe_spec)
        traj.meta["probe"].update(n_probed=traj.probe["step"].n_unique(),
                                  n_flagged_steps=traj.probe.filter("flagged")["step"].n_unique(),
                                  flagged=bool(traj.probe["flagged"].any()))
    if on_step is not None and model.remote:
        for rec in records:
            on_step(_event(model, rec, max_new_tokens, lambda: traj))
    return traj


def _run_trace(model, ids, gen_kwargs, records, state, opts, steer, emit, max_new_tokens):
    """Run the nnsight generation trace; fills ``records`` step by step. Returns (ids, records, final)."""
    import nnsight

    P = len(ids)
    n_layers = model.n_layers
    blocks = model.blocks()
    attns = [model.attn(layer) for layer in range(n_layers)]
    unembed = model.unembed()
    streamer = model.nn.generator.streamer
    prompt = torch.tensor([ids])
    # Keep every statement inside the trace on one line: nnsight's remote path maps
    # the body's line numbers back to the file, and a continued line shifts them.
    with model.nn.generate(**gen_kwargs) as tracer:
        saved_records = nnsight.save(records)
        saved_state = nnsight.save(state)
        with tracer.invoke(prompt):
            prev_lp = None
            for step in tracer.iter[:max_new_tokens]:
                consumed = streamer.output.reshape(-1)
                first_pos = 0 if step == 0 else P + step - 1
                attn_rows, resid = [], []
                steps = torch.full((consumed.shape[0],), step)
                for layer in range(n_layers):
                    attn_rows.append(attns[layer].output[1][0])
                    out = blocks[layer].output
                    new = _stepstats.steer_output(out, steer[layer], steps) if steer[layer] else None
                    if new is not None:
                        blocks[layer].output = new
                        out = new
                    resid.append((out[0] if isinstance(out, tuple) else out)[0])
                logits = unembed.output[0]
                rec = _stepstats.step_record(step, first_pos, P, consumed, attn_rows, resid, logits, prev_lp, opts)
                prev_lp = rec.pop("last_lp")
                saved_state["final"] = prev_lp
                saved_records.append(rec)
                if emit is not None:
                    emit(rec, len(saved_records))
        with tracer.invoke():
            out_ids = tracer.result.save()
    final_ids = [int(i) for i in out_ids[0].tolist()]
    return final_ids, saved_records, saved_state["final"]


def _event(model: ModelHandle, rec: dict, max_steps: int, partial: Callable[[], Trajectory]) -> StepEvent:
    tok = int(rec["ids"][-1])
    return StepEvent(step=rec["step"], max_steps=max_steps, pos=rec["first_pos"] + len(rec["ids"]) - 1,
                     token_id=tok, text=model.tokenizer.decode([tok]),
                     mean_entropy=float(rec["attn"][..., -1, 0].mean()),
                     next_entropy=float(rec["entropy"][-1]), partial=partial)


def _assemble(model, meta, records, final_ids, state, res_layers, row_layers, stop_reason) -> Trajectory:
    recs = list(records)
    meta = dict(meta, stop_reason=stop_reason, n_steps=len(recs))
    consumed = [int(i) for r in recs for i in r["ids"].tolist()]
    token_ids = list(consumed)
    final_lp = None
    if final_ids is not None and len(final_ids) > len(consumed):
        token_ids = final_ids[: len(consumed) + 1]
        final_lp = state["final"]
    meta["n_generated"] = max(0, len(token_ids) - meta["prompt_len"])
    tables, tensors = build_tables(meta, recs, token_ids, final_lp, model.tokenizer, res_layers, row_layers)
    return Trajectory(meta=meta, tensors=tensors, **tables)
