"""Batches of sequences through the model: one padded forward, and greedy decoding of a padded batch.

A batch of B sequences of different lengths becomes one ``[B, n]`` tensor (n = the
longest), padded on the ``left`` or the ``right`` with the tokenizer's pad id and an
attention mask that hides the padding. Position ids count real tokens only
(``cumsum(attention_mask) − 1``), so a sequence's positions are the same on either
side and at batch 1; every result is handed back per sequence with the padding
removed, indexed by the sequence's own positions ``0..T−1``.

- :func:`forward_batch`: one teacher-forced forward without a cache; per sequence the
  logits, the block outputs of chosen layers and, when asked, every layer's attention
  rows of the sequence's last queries (keys = its real positions only).
- :func:`greedy_batch`: greedy decoding with the KV cache, optionally reading what every
  step computes (block outputs, attention rows, logits: batched capture). Each new token is appended
  in a new column for every row (with right padding the pads stay between a prompt and
  its continuation, hidden by the mask), with position ``P_i + s``; a row that emits EOS
  is finished (its later columns are ignored) and the loop ends when every row is. A
  sliding attention window counts cache columns, so right padding would put pads inside
  it: for such models decoding is left-padded only (one clear error otherwise).

Per sequence the results equal batch 1 within the model's floating-point determinism
floor (different matmul shapes round differently); tests hold them to it.
"""

from __future__ import annotations

import contextlib
from typing import Any, Sequence

import torch

from trajscope.errors import TrajscopeError
from trajscope.model.forward import ForwardResult, _device, _hooks, _row_hooks


def _padded(model: Any, batch: Sequence[Sequence[int]], padding_side: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids [B, n], attention_mask [B, n])`` for ``batch`` padded on ``padding_side``."""
    if padding_side not in ("left", "right"):
        raise TrajscopeError(f"padding_side must be 'left' or 'right', not '{padding_side}'.")
    if not batch or any(len(s) == 0 for s in batch):
        raise TrajscopeError("A batch needs at least one sequence, and no sequence may be empty.")
    n = max(len(s) for s in batch)
    pad = model.tokenizer.pad_token_id or 0
    ids = torch.full((len(batch), n), pad, dtype=torch.long)
    att = torch.zeros((len(batch), n), dtype=torch.long)
    for i, s in enumerate(batch):
        sl = slice(n - len(s), n) if padding_side == "left" else slice(0, len(s))
        ids[i, sl] = torch.tensor(list(s))
        att[i, sl] = 1
    return ids, att


def _cover(want: list[int] | None, lens: list[int], n: int, padding_side: str) -> int:
    """How many last columns of the padded batch hold every sequence's last ``want[i]`` positions."""
    if want is None:
        return 0
    first = [(n - T if padding_side == "left" else 0) + T - a for a, T in zip(want, lens) if a > 0]
    return n - min(first) if first else 0


def forward_batch(model: Any, batch: Sequence[Sequence[int]], *, padding_side: str = "right",
                  layers: Sequence[int] = (), attention_rows: Sequence[int] | None = None,
                  logits_rows: Sequence[int] | None = None) -> list[ForwardResult]:
    """One forward over a padded batch; results per sequence, padding rows removed.

    Args:
        batch: B sequences of token ids (lengths ``T_i``).
        padding_side: ``left`` or ``right``.
        layers: blocks whose outputs to return.
        attention_rows: per sequence, how many of its last queries need their attention rows
            (``a_i ≤ T_i``; needs ``attn="rows"`` or ``"eager"``). The forward computes the rows of the
            fewest last columns that cover every sequence's request.
        logits_rows: per sequence, how many of its last positions need logits (None: all); the
            unembedding runs on the fewest last columns that cover them (``logits_to_keep``).
    Returns:
        Per sequence a :class:`~trajscope.model.forward.ForwardResult`: ``logits [T_i, vocab]`` (the last
        ``logits_rows[i]`` positions only, ``[l_i, vocab]``, when asked),
        ``resid {layer: [T_i, d_model]}`` and, when asked, ``attn {layer: [H, a_i, T_i]}`` (the rows of
        positions ``T_i − a_i … T_i − 1`` over keys ``0 … T_i − 1``; a row's keys after its query are 0).
    """
    ids, att = _padded(model, batch, padding_side)
    if attention_rows is not None and getattr(model, "attn_impl", "eager") == "sdpa":
        raise TrajscopeError("This model was loaded with attn='sdpa', whose attention cannot be read; load it with "
                             "attn='rows' (the default) or 'eager'.")
    hf = model._local("A batched forward")
    dev = _device(hf)
    B, n = ids.shape
    lens = [len(s) for s in batch]
    want = None if attention_rows is None else [min(int(a), T) for a, T in zip(attention_rows, lens)]
    n_cols = _cover(want, lens, n, padding_side)
    want_lg = None if logits_rows is None else [max(1, min(int(a), T)) for a, T in zip(logits_rows, lens)]
    n_lg = n if want_lg is None else _cover(want_lg, lens, n, padding_side)
    pos_ids = (att.cumsum(-1) - 1).clamp_min(0)
    grabbed: dict[int, torch.Tensor] = {}
    rows: dict[int, torch.Tensor] = {}
    wanted = {int(layer) for layer in layers}
    steps = torch.zeros(n, dtype=torch.long)
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.no_grad())
        stack.enter_context(_hooks(model, hf, steer=[[] for _ in range(model.n_layers)], steps=steps, layers=wanted,
                                   splice=None, masks=None, grabbed=grabbed))
        if n_cols:
            stack.enter_context(_row_hooks(model, hf, n_cols, rows, batched=True))
        out = hf(input_ids=ids.to(dev), attention_mask=att.to(dev), position_ids=pos_ids.to(dev), use_cache=False,
                 logits_to_keep=n_lg)
    results = []
    for i, T in enumerate(lens):
        keep = att[i].bool()
        k0 = n - T if padding_side == "left" else 0  # column of position 0
        attn = {}
        if want is not None and want[i] > 0:
            c0 = k0 + T - want[i] - (n - n_cols)  # first wanted row within the computed columns
            attn = {layer: r[i, :, c0:c0 + want[i], k0:k0 + T] for layer, r in rows.items()}
        if want_lg is None:
            logits = out.logits[i][keep.to(dev)]
        else:
            c0 = k0 + T - want_lg[i] - (n - n_lg)
            logits = out.logits[i, c0:c0 + want_lg[i]]
        results.append(ForwardResult(logits.float().cpu(), {k: v[i][keep] for k, v in grabbed.items()}, attn=attn))
    return results


def sliding_window(hf_config: Any) -> int | None:
    """The model's sliding attention window in tokens, or None when no layer uses one."""
    w = getattr(hf_config, "sliding_window", None)
    types = getattr(hf_config, "layer_types", None)
    if w is None or getattr(hf_config, "use_sliding_window", True) is False:
        return None
    return int(w) if types is None or "sliding_attention" in types else None


def greedy_batch(model: Any, batch: Sequence[Sequence[int]], *, max_new_tokens: int, padding_side: str = "left",
                 eos_token_id: int | None = None, reads: Sequence[tuple[int, int]] | None = None):
    """Greedy continuations of a padded batch, decoded together with the KV cache.

    Args:
        batch: B prompts (token ids).
        max_new_tokens: N ≥ 1 tokens per prompt at most.
        padding_side: ``left`` or ``right`` (module docstring: both are exact, not HF's left-only rule).
        eos_token_id: a row ends after emitting it (None: every row runs N steps).
        reads: per prompt ``(a, m)``: also read, while decoding, every layer's block output at every
            computed position, the attention rows of the last ``a`` prompt queries and of every decode
            query, and the logits of the last ``m`` prompt positions and of every decode query.
    Returns:
        Per prompt, prompt + continuation ids (the continuation ends with EOS when it stopped there); with
        ``reads``, ``(ids, results)``: per prompt a :class:`~trajscope.model.forward.ForwardResult` over its
        ``T = len(ids) − 1`` computed positions: ``resid {layer: [T, d_model]}``,
        ``attn {layer: [H, a + g − 1, T]}``
        (the last ``a + g − 1`` positions, g = new tokens; keys after a row's query are 0) and
        ``logits [m + g − 1, vocab]`` (the last positions).
    """
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise TrajscopeError(f"max_new_tokens must be a positive whole number, not {max_new_tokens!r}.")
    ids, att = _padded(model, batch, padding_side)
    hf = model._local("Batched generation")
    dev = _device(hf)
    B, n = ids.shape
    window = sliding_window(hf.config)
    if padding_side == "right" and window is not None and window < n + max_new_tokens:
        raise TrajscopeError(f"Right padding puts pad columns inside this model's sliding attention window ({window} "
                             "tokens) during decode, which changes its results; use left padding.")
    lens = att.sum(-1)
    plens = [len(p) for p in batch]
    last_col = (lens - 1) if padding_side == "right" else torch.full((B,), n - 1)
    gen: list[list[int]] = [[] for _ in range(B)]
    done = torch.zeros(B, dtype=torch.bool)
    keep = n - int(last_col.min())  # unembed only the columns from the earliest last prompt token on
    n_attn = 0
    if reads is not None:
        keep = max(keep, _cover([m for _, m in reads], plens, n, padding_side))
        n_attn = max(1, _cover([a for a, _ in reads], plens, n, padding_side))
    calls: list[tuple[dict, dict, torch.Tensor]] = []  # per model call: block outputs, attention rows, logits
    grabbed: dict[int, torch.Tensor] = {}
    rows: dict[int, torch.Tensor] = {}
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.no_grad())
        if reads is not None:
            stack.enter_context(_hooks(model, hf, steer=[[] for _ in range(model.n_layers)], steps=torch.zeros(1),
                                       layers=set(range(model.n_layers)), splice=None, masks=None, grabbed=grabbed))
            stack.enter_context(_row_hooks(model, hf, n_attn, rows, batched=True))
        out = hf(input_ids=ids.to(dev), attention_mask=att.to(dev),
                 position_ids=(att.cumsum(-1) - 1).clamp_min(0).to(dev), use_cache=True, logits_to_keep=keep)
        if reads is not None:
            calls.append((dict(grabbed), dict(rows), out.logits.float().cpu()))
        nxt = out.logits[torch.arange(B, device=dev), (last_col - (n - keep)).to(dev)].argmax(-1).cpu()
        cache = out.past_key_values
        for s in range(max_new_tokens):
            for i in range(B):
                if not done[i]:
                    gen[i].append(int(nxt[i]))
            if eos_token_id is not None:
                done |= nxt == eos_token_id
            if s == max_new_tokens - 1 or bool(done.all()):
                break
            att = torch.cat([att, torch.ones(B, 1, dtype=att.dtype)], dim=1)
            out = hf(input_ids=nxt[:, None].to(dev), attention_mask=att.to(dev),
                     position_ids=(lens + s)[:, None].to(dev), past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            if reads is not None:
                calls.append((dict(grabbed), dict(rows), out.logits[:, -1:].float().cpu()))
            nxt = out.logits[:, -1].argmax(-1).cpu()
    seqs = [list(map(int, p)) + g for p, g in zip(batch, gen)]
    if reads is None:
        return seqs
    return seqs, [_row_reads(calls, i, P, len(g), a, m, n, keep, n_attn, padding_side)
                  for i, (P, g, (a, m)) in enumerate(zip(plens, gen, reads))]


def _row_reads(calls: list, i: int, P: int, g: int, a: int, m: int, n: int, keep: int, n_attn: int,
               padding_side: str) -> ForwardResult:
    """Row ``i``'s reads from the decode calls, indexed by its own positions (``greedy_batch``'s ``reads``)."""
    pad = torch.nn.functional.pad
    T = P + g - 1
    k0 = n - P if padding_side == "left" else 0  # column of position 0
    (pre_resid, pre_rows, pre_logits), dec = calls[0], calls[1:g]  # decode call j has the query at P + j
    resid = {layer: torch.cat([r[i, k0:k0 + P]] + [c[0][layer][i] for c in dec]) for layer, r in pre_resid.items()}
    c0 = k0 + P - m - (n - keep)
    logits = torch.cat([pre_logits[i, c0:c0 + m]] + [c[2][i] for c in dec])
    attn = {}
    for layer, r in pre_rows.items():
        r0 = k0 + P - a - (n - n_attn)
        parts = [pad(r[i, :, r0:r0 + a, k0:k0 + P], (0, T - P))]
        for j, c in enumerate(dec):
            w = c[1][layer][i]  # [H, 1, K]: K = n + j + 1 columns (fewer in a sliding-window cache: the newest)
            w = pad(w, (n + j + 1 - w.shape[-1], 0))
            keys = w[..., k0:] if padding_side == "left" else torch.cat([w[..., :P], w[..., n:]], dim=-1)
            parts.append(pad(keys, (0, T - keys.shape[-1])))
        attn[layer] = torch.cat(parts, dim=1)
    return ForwardResult(logits, resid, attn=attn)


class _Stop(Exception):
    """Raised by the deepest harvested block's hook: nothing after it needs computing."""


def batch_to_layer(model: Any, batch: Sequence[Sequence[int]], layers: Sequence[int], *,
                   padding_side: str = "right") -> list[dict[int, torch.Tensor]]:
    """Block outputs of ``layers`` for a padded batch, from a forward that stops after the deepest of them.

    The batch is padded and positioned as :meth:`~trajscope.model.ModelHandle.forward_batch` pads it
    (``cumsum(attention_mask) − 1`` position ids, no cache), so every block up to the deepest harvested one
    computes what ``forward_batch`` computes; that block's forward hook then raises, so the later blocks,
    the final norm and the unembedding never run.

    Args:
        model: a local :class:`~trajscope.model.ModelHandle`.
        batch: B sequences of token ids (lengths ``T_i``).
        layers: blocks to read (at least one).
        padding_side: ``left`` or ``right``.
    Returns:
        Per sequence ``{layer: [T_i, d_model]}`` float32 on the CPU, padding rows removed.
    """
    from trajscope.model.families import hidden
    from trajscope.model.forward import _blocks, _device

    wanted = sorted({int(x) for x in layers})
    if not wanted:
        raise TrajscopeError("A batched harvest needs at least one layer to read.")
    ids, att = _padded(model, batch, padding_side)
    hf = model._local("A batched harvest")
    dev = _device(hf)
    blocks = _blocks(hf, model)
    grabbed: dict[int, torch.Tensor] = {}
    handles = []

    def hook(_m, _i, out, layer):
        grabbed[layer] = hidden(out).detach().float().cpu()
        if layer == wanted[-1]:
            raise _Stop

    with model.lock, torch.no_grad(), contextlib.ExitStack() as stack:
        for layer in wanted:
            handles.append(blocks[layer].register_forward_hook(lambda m, i, o, layer=layer: hook(m, i, o, layer)))
        stack.callback(lambda: [h.remove() for h in handles])
        try:
            hf(input_ids=ids.to(dev), attention_mask=att.to(dev),
               position_ids=(att.cumsum(-1) - 1).clamp_min(0).to(dev), use_cache=False)
        except _Stop:
            pass
    if len(grabbed) != len(wanted):
        raise TrajscopeError(f"The batched forward stopped before reading layers {sorted(set(wanted) - set(grabbed))}.")
    return [{layer: grabbed[layer][i][att[i].bool()] for layer in wanted} for i in range(len(batch))]
