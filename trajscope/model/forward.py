"""Forwards over known tokens: teacher forcing, reads, splices, key masks, chunks, prefixes (batches: batch.py).

Generation lives in :mod:`trajscope.model.generation`; the functions here run
the model over token ids that are already known. Locally they call the Hugging
Face module with forward hooks that are registered for the call and always
removed (``finally``); for NDIF models the teacher-forced forward with steering
and reads runs as one nnsight trace instead (the other operations need the
weights here and say so).

Positions and steps follow :mod:`trajscope.positions`: position ``p`` belongs to
query step ``max(0, p − P + 1)``, so a steering vector with ``start_step = k``
acts on exactly the queries the generation loop would steer.

Key masks (KV eviction, context compaction): ``key_mask`` is a boolean tensor
over key positions — ``[K]``, ``[L, K]`` or ``[L, H, K]`` (layer, head) — saying
which keys the queries at positions ``≥ mask_from`` may see (default
``mask_from = P``, the decode queries); earlier queries see every earlier key.
It is applied by replacing each attention module's ``attention_mask`` argument
with an additive ``[1, H, q, k]`` mask (causal ∧ key mask), which the eager
kernel adds to the scores before the softmax.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from typing import Any, Callable, Iterator, Sequence

import torch

from trajscope import positions
from trajscope.errors import TrajscopeError
from trajscope.model import steer as steer_kernel
from trajscope.model.families import get_path, hidden, with_hidden


@dataclasses.dataclass
class ForwardResult:
    """What a teacher-forced forward returns (float32, on the CPU).

    Attributes:
        logits: ``[T, vocab]`` (``[B, T, vocab]`` for batches).
        resid: ``{layer: [T, d_model]}`` block outputs of the layers asked for (after steering / splicing).
        cache: the KV cache when asked for (``return_cache=True``), else None.
        attn: ``{layer: [H, n, K]}`` attention rows of the last ``n`` queries when asked for
            (``attention_rows=n``), float32.
    """

    logits: torch.Tensor
    resid: dict[int, torch.Tensor]
    cache: Any = None
    attn: dict[int, torch.Tensor] = dataclasses.field(default_factory=dict)


@contextlib.contextmanager
def seeded(seed: int | None) -> Iterator[None]:
    """Seed torch's RNGs for the body, restoring their state afterwards (no-op seeding when None)."""
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        if seed is not None:
            torch.manual_seed(seed)
        yield


def steer_specs(model: Any, steering: Sequence[Any]) -> list[list[tuple]]:
    """Per layer, the spec tuples of the steering vectors on that layer."""
    return [[v.spec() for v in steering if v.layer == layer] for layer in range(model.n_layers)]


def _blocks(hf: torch.nn.Module, model: Any) -> Any:
    return get_path(hf, model.family.blocks)


def _device(hf: torch.nn.Module) -> torch.device:
    return next(hf.parameters()).device


def expand_key_mask(key_mask: torch.Tensor, n_layers: int, n_heads: int, n_keys: int) -> torch.Tensor:
    """A key mask as ``[L, H, n_keys]`` bool; keys past its end are visible (generated positions)."""
    m = torch.as_tensor(key_mask, dtype=torch.bool).cpu()
    if m.dim() == 1:
        m = m.expand(n_layers, n_heads, -1)
    elif m.dim() == 2:
        m = m[:, None, :].expand(-1, n_heads, -1)
    if m.dim() != 3 or m.shape[0] != n_layers or m.shape[1] != n_heads:
        raise TrajscopeError(f"A key mask must be [keys], [layers, keys] or [layers, heads, keys] with "
                             f"{n_layers} layers and {n_heads} heads; got shape {tuple(key_mask.shape)}.")
    if m.shape[2] < n_keys:
        m = torch.cat([m, torch.ones(n_layers, n_heads, n_keys - m.shape[2], dtype=torch.bool)], dim=2)
    return m[:, :, :n_keys]


def additive_masks(key_mask: torch.Tensor, q_positions: torch.Tensor, n_keys: int, mask_from: int,
                   dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``[L, 1, H or 1, q, n_keys]`` additive masks: 0 where a query may see a key, the dtype's minimum elsewhere
    (one head axis entry when every head sees the same keys)."""
    L, H, _ = key_mask.shape
    k = torch.arange(n_keys)
    causal = k[None, :] <= q_positions[:, None]  # [q, K]
    masked_rows = (q_positions >= mask_from)[:, None]  # [q, 1]
    allowed = causal[None, None] & (~masked_rows[None, None] | key_mask[:, :, None, :])  # [L, H, q, K]
    if bool((allowed == allowed[:, :1]).all()):
        allowed = allowed[:, :1]  # the same for every head: [L, 1, q, K] keeps the fast kernel
    out = torch.zeros(allowed.shape, dtype=dtype)
    out.masked_fill_(~allowed, torch.finfo(dtype).min)
    return out.unsqueeze(1).to(device)


@contextlib.contextmanager
def _hooks(model: Any, hf: torch.nn.Module, *, steer: list, steps: torch.Tensor, layers: set[int],
           splice: tuple[int, Callable] | None, masks: torch.Tensor | None, grabbed: dict) -> Iterator[None]:
    """Forward hooks for one call: steering, splicing, reads and key masks; removed on exit."""
    handles = []
    try:
        for layer, block in enumerate(_blocks(hf, model)):
            spl = splice[1] if splice is not None and splice[0] == layer else None
            if steer[layer] or spl is not None or layer in layers:
                def hook(_m, _i, out, layer=layer, specs=steer[layer], spl=spl):
                    h = hidden(out)
                    new = steer_kernel.steer_hidden(h, specs, steps.to(h.device)) if specs else None
                    if spl is not None:
                        new = spl(h if new is None else new)
                    if layer in layers:
                        grabbed[layer] = (h if new is None else new).detach().float().cpu()
                    return None if new is None else with_hidden(out, new)

                handles.append(block.register_forward_hook(hook))
            if masks is not None:
                def pre(_m, args, kwargs, layer=layer):
                    kwargs["attention_mask"] = masks[layer].to(dtype=(args[0] if args else kwargs["hidden_states"]).dtype)
                    return args, kwargs

                attn = get_path(block, model.family.attn)
                handles.append(attn.register_forward_pre_hook(pre, with_kwargs=True))
        yield
    finally:
        for h in handles:
            h.remove()


def forward(model: Any, token_ids: Sequence[int], *, prompt_len: int | None = None, steering: Sequence[Any] = (),
            layers: Sequence[int] = (), splice: tuple[int, Callable] | None = None,
            key_mask: torch.Tensor | None = None, mask_from: int | None = None, past: Any = None,
            return_cache: bool = False, attention_rows: int = 0, rows_unmasked: bool = False,
            rows_sum: bool = False, _inplace: bool = False) -> ForwardResult:
    """Teacher-forced forward over ``token_ids`` (no cache unless ``past`` / ``return_cache``).

    Args:
        token_ids: the T tokens to run (after the ``past`` prefix, when given).
        prompt_len: P, which decides each position's query step (steering, key masks); default: all prompt.
        steering: objects with ``.layer`` and ``.spec()`` (:class:`~trajscope.steering.SteeringVector`).
        layers: blocks whose (steered, spliced) outputs to return.
        splice: ``(layer, fn)``: block ``layer``'s hidden state ``[1, T, d]`` is replaced by ``fn(hidden)``.
        key_mask: keys visible to queries at positions ``≥ mask_from`` (module docstring).
        past: a KV cache of the preceding positions (from :func:`prefix_cache` / ``return_cache``); it is
            copied, never changed.
        return_cache: also return the KV cache after these tokens.
        attention_rows: also return every layer's attention rows of the last ``attention_rows`` queries
            (needs a model whose attention can be read: ``attn="rows"`` or ``"eager"``).
        rows_unmasked: those rows see every causal key although the key mask hides some from the forward
            itself (``attn="rows"`` only): a query computed under eviction, scored against the full prompt.
        rows_sum: return each layer's rows summed over those queries, ``[H, 1, K]`` (H2O's accumulated
            attention), reduced layer by layer so ``attention_rows=T`` never holds every layer's ``[H, T, T]``.
    Returns:
        :class:`ForwardResult`: ``logits [T, vocab]``, ``resid {layer: [T, d_model]}``.
    """
    T = len(token_ids)
    if T == 0:
        raise TrajscopeError("A forward needs at least one token.")
    offset = 0 if past is None else int(past.get_seq_length())
    P = offset + T if prompt_len is None else int(prompt_len)
    steps = positions.step_of_positions(offset + T, P)[offset:]
    steer = steer_specs(model, steering)
    wanted = {int(layer) for layer in layers}
    if model.remote and splice is None and key_mask is None and past is None and not return_cache and not attention_rows:
        return _forward_nnsight(model, token_ids, steer, steps, wanted)
    if attention_rows and getattr(model, "attn_impl", "eager") == "sdpa":
        raise TrajscopeError("This model was loaded with attn='sdpa', whose attention cannot be read; load it with "
                             "attn='rows' (the default) or 'eager'.")
    if rows_unmasked and getattr(model, "attn_impl", "rows") != "rows":
        raise TrajscopeError("Unmasked attention rows beside a masked forward need the model loaded with attn='rows'.")
    hf = model._local("This forward (splice, key mask or KV cache)")
    dev = _device(hf)
    masks = None
    km = None if key_mask is None else expand_key_mask(key_mask, model.n_layers, model.n_heads, offset + T)
    if km is not None and not bool(km.all()):  # an all-visible mask is the plain forward, bit for bit
        masks = additive_masks(km, torch.arange(offset, offset + T), offset + T, P if mask_from is None else mask_from,
                               next(hf.parameters()).dtype, dev)
    grabbed: dict[int, torch.Tensor] = {}
    rows: dict[int, torch.Tensor] = {}
    cache = past if (past is None or _inplace) else copy.deepcopy(past)
    n_rows = min(int(attention_rows), T)
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.no_grad())
        stack.enter_context(_hooks(model, hf, steer=steer, steps=steps, layers=wanted, splice=splice, masks=masks,
                                   grabbed=grabbed))
        if n_rows:
            stack.enter_context(_row_hooks(model, hf, n_rows, rows, summed=rows_sum))
            if rows_unmasked:
                from trajscope.model.attention import unmasked_rows

                stack.enter_context(unmasked_rows(hf.config))
        out = hf(input_ids=torch.tensor([list(token_ids)], device=dev), past_key_values=cache,
                 use_cache=bool(return_cache or cache is not None))
    return ForwardResult(logits=out.logits[0].float().cpu(), resid={k: v[0] for k, v in grabbed.items()},
                         cache=out.past_key_values if return_cache else None, attn=rows)


@contextlib.contextmanager
def _row_hooks(model: Any, hf: torch.nn.Module, n: int, rows: dict, *, batched: bool = False,
               summed: bool = False) -> Iterator[None]:
    """Collect each layer's attention rows of the last ``n`` queries (``attn.output[1]``) for one call:
    ``[H, n, K]`` per layer, or ``[B, H, n, K]`` with ``batched`` (a padded batch); with ``summed``, their sum
    over the queries, ``[H, 1, K]``."""
    from trajscope.model.attention import prefill_rows

    handles = []
    try:
        for layer, block in enumerate(_blocks(hf, model)):
            def hook(_m, _i, out, layer=layer):
                w = out[1] if isinstance(out, tuple) and len(out) > 1 else None
                if w is not None:
                    got = (w if batched else w[0])[..., -n:, :].detach().float()
                    rows[layer] = (got.sum(-2, keepdim=True) if summed else got).cpu()

            handles.append(get_path(block, model.family.attn).register_forward_hook(hook))
        with prefill_rows(hf.config, n):
            yield
    finally:
        for h in handles:
            h.remove()


def _forward_nnsight(model: Any, token_ids: Sequence[int], steer: list, steps: torch.Tensor,
                     wanted: set[int]) -> ForwardResult:
    """The same teacher-forced forward as one nnsight trace (runs where the model runs, e.g. NDIF)."""
    import nnsight

    nnsight.register(steer_kernel)
    blocks = model.blocks()
    unembed = model.unembed()
    last = max([i for i, s in enumerate(steer) if s] + list(wanted) + [-1])
    saved: dict = {}
    with torch.no_grad():
        with model.nn.trace(torch.tensor([list(token_ids)]), **model.remote_options()):
            saved = nnsight.save(saved)
            for layer in range(last + 1):
                out = blocks[layer].output
                new = steer_kernel.steer_hidden(hidden(out), steer[layer], steps) if steer[layer] else None
                if new is not None:
                    blocks[layer].output = with_hidden(out, new)
                if layer in wanted:
                    saved[layer] = nnsight.save((hidden(out) if new is None else new)[0])
            logits = nnsight.save(unembed.output[0])
    return ForwardResult(logits=logits.float().cpu(), resid={k: v.float().cpu() for k, v in saved.items()})


def read_residuals(model: Any, prompts: Sequence[str | Sequence[int]], layer: int, position: int = -1) -> torch.Tensor:
    """Block ``layer``'s output at ``position`` of each prompt (one no-cache forward each): ``[n, d_model]``."""
    if not 0 <= layer < model.n_layers:
        raise TrajscopeError(f"Layer {layer} is out of range; the model has layers 0..{model.n_layers - 1}.")
    rows = [forward(model, model.encode(p), layers=[layer]).resid[layer][position] for p in prompts]
    return torch.stack(rows)


def generate_ids(model: Any, ids: Sequence[int], *, max_new_tokens: int, temperature: float = 0.0,
                 top_p: float | None = None, seed: int | None = None, stop_at_eos: bool = True) -> list[int]:
    """Hugging Face ``generate`` with the KV cache: prompt + continuation ids (a reference engine)."""
    hf = model._local("Plain generate")
    kwargs: dict[str, Any] = {"max_new_tokens": max_new_tokens, "pad_token_id": model.tokenizer.pad_token_id}
    if temperature > 0:
        kwargs.update(do_sample=True, temperature=float(temperature), top_p=top_p or 1.0, top_k=0)
    else:
        kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
    eos = model.eos_token_id
    kwargs["eos_token_id"] = eos if (stop_at_eos and eos is not None) else []
    with torch.no_grad(), seeded(seed if temperature > 0 else None):
        return hf.generate(torch.tensor([list(ids)], device=_device(hf)), **kwargs)[0].tolist()


def prefill_chunks(model: Any, token_ids: Sequence[int], chunk: int, layers: Sequence[int] = ()) -> ForwardResult:
    """Prefill ``token_ids`` through the KV cache ``chunk`` tokens at a time (chunked prefill).

    Returns:
        The concatenated ``logits [T, vocab]`` and ``resid {layer: [T, d_model]}``, and the final cache.
    """
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk <= 0:
        raise TrajscopeError(f"The chunk size must be a positive whole number of tokens, not {chunk!r}.")
    ids = list(token_ids)
    cache, logits, resid = None, [], {int(layer): [] for layer in layers}
    for start in range(0, len(ids), chunk):
        out = forward(model, ids[start:start + chunk], past=cache, layers=layers, return_cache=True, _inplace=True)
        cache = out.cache
        logits.append(out.logits)
        for layer, r in out.resid.items():
            resid[layer].append(r)
    return ForwardResult(torch.cat(logits), {k: torch.cat(v) for k, v in resid.items()}, cache)


def masked_decode(model: Any, prompt_ids: Sequence[int], max_new_tokens: int, key_mask: torch.Tensor,
                  mask_from: int | None = None) -> list[int]:
    """Greedy decode with the KV cache; queries at positions ``≥ mask_from`` see only the kept keys.

    By default (``mask_from = P``) the prompt is prefilled with full attention (its states are what
    a serving stack would have computed before evicting) and masked keys are hidden from the first
    decode query on. An earlier ``mask_from`` also masks the prompt's later queries (compaction: the
    turns after a summary no longer see the compacted ones).

    Returns:
        Prompt + generated ids (``max_new_tokens`` of them; EOS does not stop it).
    """
    ids = list(prompt_ids)
    P = len(ids)
    mask_from = P if mask_from is None else int(mask_from)
    out = forward(model, ids, prompt_len=mask_from, key_mask=key_mask if mask_from < P else None,
                  mask_from=mask_from, return_cache=True)
    cache = out.cache
    for _ in range(max_new_tokens):
        nxt = int(out.logits[-1].argmax())
        ids.append(nxt)
        if len(ids) - P >= max_new_tokens:
            break
        out = forward(model, [nxt], prompt_len=P, key_mask=key_mask, mask_from=mask_from, past=cache,
                      return_cache=True, _inplace=True)
        cache = out.cache
    return ids


def check_dtype(device: str, dtype: str | torch.dtype) -> torch.dtype:
    """The torch dtype named ``dtype`` if ``device`` can run a transformer in it, else one clear error.

    Probes a tiny matmul, softmax and SiLU in ``dtype`` on ``device`` (what every block runs), so a
    dtype the device lacks kernels for fails here in one sentence instead of deep inside a forward.

    Raises:
        TrajscopeError: for an unknown name, a non-floating dtype, or a dtype the device cannot run.
    """
    dt = getattr(torch, dtype, None) if isinstance(dtype, str) else dtype
    if not isinstance(dt, torch.dtype) or not dt.is_floating_point:
        raise TrajscopeError(f"Unknown dtype '{dtype}': use float32, bfloat16, float16 or float64.")
    name = str(dt).replace("torch.", "")
    try:
        x = torch.ones(4, 4, dtype=dt, device=device)
        torch.nn.functional.silu((x @ x).softmax(-1)).sum().item()
    except (RuntimeError, TypeError, NotImplementedError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TrajscopeError(f"The {device} device cannot run {name} ({reason[:80]}); "
                             "choose float32 or bfloat16.") from None
    return dt


@contextlib.contextmanager
def numerics(*, tf32: bool | None = None, deterministic: bool | None = None,
             threads: int | None = None) -> Iterator[dict]:
    """Set torch's process-wide numerics for the body and restore them afterwards (``finally``).

    Args:
        tf32: allow TF32 in CUDA matmuls and cuDNN convolutions (``None`` leaves the setting alone).
        deterministic: ``torch.use_deterministic_algorithms`` (on CUDA, ``CUBLAS_WORKSPACE_CONFIG``
            is set to ``:4096:8`` for the body when unset, as cuBLAS requires).
        threads: CPU intra-op threads (``torch.set_num_threads``); ``None`` leaves it alone.
    Yields:
        The settings in force in the body: ``{"tf32", "deterministic", "threads"}``.
    """
    import os

    old = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
           torch.are_deterministic_algorithms_enabled(), torch.get_num_threads(), os.environ.get("CUBLAS_WORKSPACE_CONFIG"))
    try:
        if tf32 is not None:
            torch.backends.cuda.matmul.allow_tf32 = bool(tf32)
            torch.backends.cudnn.allow_tf32 = bool(tf32)
        if deterministic is not None:
            if deterministic and torch.cuda.is_available():
                os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
            torch.use_deterministic_algorithms(bool(deterministic))
        if threads is not None:
            torch.set_num_threads(int(threads))
        yield {"tf32": bool(torch.backends.cuda.matmul.allow_tf32),
               "deterministic": torch.are_deterministic_algorithms_enabled(), "threads": torch.get_num_threads()}
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old[0], old[1]
        torch.use_deterministic_algorithms(old[2])
        if threads is not None:  # set_num_threads also fixes the count every new thread starts with
            torch.set_num_threads(old[3])
        if old[4] is None:
            os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
        else:
            os.environ["CUBLAS_WORKSPACE_CONFIG"] = old[4]
