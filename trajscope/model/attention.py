"""Attention rows without eager attention: the forward keeps SDPA, rows come from q and K.

trajscope registers an attention implementation, ``"trajscope_rows"``, with
Hugging Face's ``AttentionInterface``. Every attention module of a model loaded
with it (:func:`trajscope.load_model`'s default ``attn="rows"``) computes its
output with the model's fast kernel (``sdpa_attention_forward``, unchanged) and,
beside it, the attention probabilities of only the query rows trajscope reads:

- at a decode step (one query), that query's row;
- at prefill, the last ``n`` query rows (``n`` = :func:`prefill_rows`' setting:
  the window that eviction policies and telemetry use), or every row when the
  setting is None — computed in chunks of query rows, so memory stays
  ``O(H · chunk · k)`` instead of ``O(H · P²)``.

A row is ``softmax(q · Kᵀ · scaling + mask)`` over the keys the query sees, in
float32, from the post-RoPE query and the cached post-RoPE keys the module hands
the kernel (so RoPE, GQA/MQA head sharing and the model's own mask — causal,
sliding window, padding — are all accounted for). Query heads that share a key
head are multiplied against it as one group of rows, so the keys (and values)
are never repeated per query head. The rows are returned where eager attention
returns its weights, as ``[batch, heads, rows, keys]``: the generation trace
reads them unchanged. At a decode step, and with an explicit per-head mask (the
key-mask forward), the output itself is computed from the same probabilities
(``probs · V``, as eager attention does) instead of by a second pass of SDPA
over the keys; it agrees with SDPA to float rounding (about 1e-7 relative in
float32; tests hold it to the eager reference).

Within :func:`collect_rows` (a local generation trace), every call also leaves
its rows in a :class:`RowSink`, in call order (layer 0 … L − 1 at each step), so
the trace takes a layer's rows from there once it has read the layer's block
output, instead of reading the attention module's output too: one nnsight read
per layer instead of two (``docs/capture_overhead.md``). At decode steps the
sink also holds each block's output, left by a forward hook
(:meth:`RowSink.watch_output`), so the trace reads no unsteered block through
nnsight there at all: 2 reads per step instead of L + 2. There, a decode call
whose query sees every cached key (no mask, no sliding window) goes further: it
computes its output with SDPA alone and leaves only its query; the rows of a
chunk of decode steps are computed later, per layer, in one product with the
layer's newest keys (:func:`chunk_rows`), which hold every earlier step's keys
as a prefix. NDIF and ``remote="local"`` runs serialise the trace, so they keep
the module reads and the rows in the forward.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any, Iterator

import torch

from trajscope.model.families import hidden

ROWS_IMPL = "trajscope_rows"
DEFAULT_PREFILL_ROWS = 32
CHUNK = 256


def register() -> None:
    """Register ``"trajscope_rows"`` with transformers (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    if ROWS_IMPL not in AttentionInterface._global_mapping:
        AttentionInterface.register(ROWS_IMPL, rows_attention_forward)
    if ROWS_IMPL not in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping:
        ALL_MASK_ATTENTION_FUNCTIONS.register(ROWS_IMPL, sdpa_mask)


@contextlib.contextmanager
def prefill_rows(hf_config: Any, n: int | None) -> Iterator[None]:
    """Within the body, prefill computes the last ``n`` query rows (None: all); restored on exit."""
    old = getattr(hf_config, "_trajscope_prefill_rows", DEFAULT_PREFILL_ROWS)
    hf_config._trajscope_prefill_rows = n
    try:
        yield
    finally:
        hf_config._trajscope_prefill_rows = old


@contextlib.contextmanager
def unmasked_rows(hf_config: Any) -> Iterator[None]:
    """Within the body, the rows returned beside a masked call see every causal key (the output still uses the
    mask): the LAQ draft's queries, computed on a compressed cache, scored against the full prompt."""
    old = getattr(hf_config, "_trajscope_rows_unmasked", False)
    hf_config._trajscope_rows_unmasked = True
    try:
        yield
    finally:
        hf_config._trajscope_rows_unmasked = old


@contextlib.contextmanager
def collect_rows(hf_config: Any, sink: "RowSink | None" = None) -> Iterator["RowSink"]:
    """Within the body, every ``"trajscope_rows"`` call leaves its rows (or, at a decode step that can
    wait, its query) in the yielded :class:`RowSink` (``sink``, or a new one), in call order; restored on
    exit. Whoever holds the sink empties it after each step (:meth:`RowSink.clear`)."""
    old = getattr(hf_config, "_trajscope_row_sink", None)
    sink = RowSink() if sink is None else sink
    hf_config._trajscope_row_sink = sink
    try:
        yield sink
    finally:
        hf_config._trajscope_row_sink = old


class RowSink:
    """What a local generation trace takes from the rows attention: one entry per call, in call order
    (layer 0 … L − 1 at each step), emptied by the trace after each step (:meth:`clear`).

    An entry is the call's rows, ``[H, n, k]`` float32, or — at a decode step of a layer whose query sees
    every cached key (no mask, no sliding window) — a :class:`QueryRow`: the forward then kept SDPA for its
    output and left only the query, and the rows of a whole chunk of steps are computed at once from those
    queries and the layer's latest keys (:func:`chunk_rows`). The cache only appends keys, so the latest
    keys hold every earlier step's keys as a prefix. The sink keeps a reference to each layer's latest keys
    (the cache's own tensor, replaced at the next step), not a copy.
    """

    def __init__(self) -> None:
        self.calls: list = []
        self.keys: list[torch.Tensor] = []
        self.outputs: dict[int, torch.Tensor] = {}
        self.keep_outputs = False  # the prefill's block outputs are read through nnsight (and reduced as read)

    def watch_output(self, layer: int, block: torch.nn.Module) -> Any:
        """Keep block ``layer``'s hidden output, ``[q, d_model]`` of batch 0, at each call while
        :attr:`keep_outputs` is set (every decode step: :meth:`clear`), for the trace to take with :meth:`output`
        instead of reading the block through nnsight. Returns the hook's handle (``.remove()`` when the trace
        ends). A PyTorch forward hook sees the module's output after nnsight has handed it on, so a layer the
        trace steers holds its steered output (the trace reads steered layers through nnsight anyway)."""
        def keep(module: torch.nn.Module, args: Any, output: Any) -> None:
            if self.keep_outputs:
                self.outputs[layer] = hidden(output)[0]

        return block.register_forward_hook(keep)

    def output(self, layer: int) -> torch.Tensor:
        """This step's block output of ``layer`` (:meth:`watch_output`); the sink lets go of it."""
        return self.outputs.pop(layer)

    def add(self, rows: torch.Tensor) -> None:
        """Keep a call's rows, ``[b, H, n, k]`` (batch 0 is kept)."""
        self.calls.append(rows[0])

    def defer(self, query: torch.Tensor, key: torch.Tensor, scaling: float) -> None:
        """Keep a decode call's query ``[b, H, 1, d]`` and its layer's keys ``[b, H_kv, k, d]`` (batch 0)."""
        layer = len(self.calls)
        if layer < len(self.keys):
            self.keys[layer] = key
        else:
            self.keys.append(key)
        self.calls.append(QueryRow(self, layer, query, key.shape[2], scaling))

    def take(self, layer: int, now: bool = False) -> Any:
        """This step's entry for ``layer``: ``[H, n, k]`` rows or a :class:`QueryRow` (its rows when ``now``).

        The sink lets go of the entry (its place stays, so later calls keep their layer index): at prefill
        the trace reduces each layer's rows as it takes them, and holding every layer's ``[H, n, P]`` rows
        until the step ends cost 280 MiB at P = 8,176 on SmolLM2 (30 layers, 9 heads, 32 rows; measured).
        """
        entry = self.calls[layer]
        self.calls[layer] = None
        return entry.rows() if now and isinstance(entry, QueryRow) else entry

    def clear(self, keep_outputs: bool = False) -> None:
        """Empty the sink after a step; ``keep_outputs``: keep the block outputs of the steps after it."""
        self.calls.clear()
        self.outputs.clear()
        self.keep_outputs = keep_outputs


class QueryRow:
    """A decode step's query at one layer, whose attention row is computed later (:func:`chunk_rows`).

    ``query`` is the ``[b, H, 1, d]`` query as the forward handed it (batch 0's row is the one computed);
    ``shape`` is the row's, ``(H, 1, n_keys)``: the step's query sees keys ``0 … n_keys − 1``.
    """

    __slots__ = ("sink", "layer", "query", "n_keys", "scaling")

    def __init__(self, sink: RowSink, layer: int, query: torch.Tensor, n_keys: int, scaling: float) -> None:
        self.sink, self.layer, self.query, self.n_keys, self.scaling = sink, layer, query, n_keys, scaling

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.query.shape[1], 1, self.n_keys)

    def rows(self) -> torch.Tensor:
        """``[H, 1, n_keys]`` float32."""
        return chunk_rows([self], self.n_keys)


def chunk_rows(entries: list[QueryRow], n_keys: int) -> torch.Tensor:
    """One layer's attention rows for a chunk of consecutive decode steps, in one product over the keys.

    The steps' queries are the consecutive query rows that :func:`attention_rows` masks causally: step c's
    query sits at key index ``n_keys_0 − 1 + c``.

    Args:
        entries: the layer's :class:`QueryRow` of C consecutive steps, oldest first.
        n_keys: K, the columns of the result (at least the newest entry's ``n_keys``).
    Returns:
        ``[H, C, K]`` float32: row c is ``softmax(q_c · Kᵀ · scaling)`` over keys ``0 … n_keys_c − 1``,
        and exactly 0 beyond them.
    """
    first = entries[0]
    keys = first.sink.keys[first.layer]
    seen = [e.n_keys for e in entries]
    k = seen[-1]
    if seen != list(range(first.n_keys, k + 1)) or keys.shape[2] < k or n_keys < k:
        raise RuntimeError(f"layer {first.layer}: queries saw {seen} keys; {keys.shape[2]} are held, {n_keys} asked")
    queries = torch.cat([e.query for e in entries], dim=2)  # [b, H, C, d]; batch 0's rows are returned
    rows = attention_rows(queries, keys[:, :, :k], None, first.scaling, first.n_keys - 1)[0]
    return rows if n_keys == k else torch.nn.functional.pad(rows, (0, n_keys - k))


def attention_rows(query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None, scaling: float,
                   q_offset: int, chunk: int = CHUNK) -> torch.Tensor:
    """Attention probabilities of chosen query rows, in float32.

    Query heads that share a key head (GQA/MQA) are multiplied against it together, as one group of rows,
    so the keys are never repeated per query head; the scale is applied inside the product.

    Args:
        query: ``[b, H, n, d]`` the chosen (post-RoPE) query rows.
        key: ``[b, H_kv, k, d]`` all keys; query head h uses key head ``h // (H / H_kv)``.
        mask: None (plain causal), or the model's mask for these rows, ``[b, 1 or H, n, k]``: boolean
            (True = visible) or additive float.
        scaling: the score scale (usually ``d ** −0.5``).
        q_offset: the key index of the first chosen row (row r sees keys ``≤ q_offset + r`` when causal).
        chunk: rows per matmul.
    Returns:
        ``[b, H, n, k]`` float32, contiguous; each row sums to 1 over its visible keys.
    """
    b, H, n, d = query.shape
    Hkv, k = key.shape[1], key.shape[2]
    keys_t = _f32(key).reshape(b * Hkv, k, d).transpose(1, 2)
    zero = query.new_zeros((), dtype=torch.float32)
    out = []
    for s in range(0, n, chunk):
        q = query[:, :, s:s + chunk]
        m = q.shape[2]
        grouped = _f32(q).reshape(b * Hkv, (H // Hkv) * m, d)
        scores = torch.baddbmm(zero, grouped, keys_t, beta=0, alpha=scaling).view(b, H, m, k)
        if mask is None and q_offset + s + m == k and m == 1:
            pass  # the newest query sees every cached key: nothing to hide
        elif mask is None:
            rows = torch.arange(q_offset + s, q_offset + s + m, device=q.device)
            hide = torch.arange(k, device=q.device)[None, :] > rows[:, None]
            scores = scores.masked_fill(hide, float("-inf"))
        else:
            vis = mask[:, :, s:s + chunk, :k]
            scores = scores.masked_fill(~vis, float("-inf")) if vis.dtype == torch.bool else scores + vis.float()
        out.append(torch.softmax(scores, dim=-1))
    return out[0] if len(out) == 1 else torch.cat(out, dim=2)


def _f32(x: torch.Tensor) -> torch.Tensor:
    return x if x.dtype == torch.float32 else x.float()


def rows_output(rows: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """Attention output from the rows: ``[b, H, n, k]`` rows, ``[b, H_kv, k, d]`` values → ``[b, n, H, d]``
    (the layout attention modules expect back), in the values' dtype; grouped like :func:`attention_rows`."""
    b, H, n, k = rows.shape
    Hkv, d = value.shape[1], value.shape[-1]
    out = torch.bmm(rows.to(value.dtype).view(b * Hkv, (H // Hkv) * n, k), value.reshape(b * Hkv, k, d))
    return out.view(b, H, n, d).transpose(1, 2).contiguous()


def rows_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                           attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                           **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The ``"trajscope_rows"`` attention: SDPA output plus the rows trajscope reads (module docstring)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    q_len, k_len = query.shape[2], key.shape[2]
    per_head = attention_mask is not None and attention_mask.dim() == 4 and attention_mask.shape[1] > 1
    # read off the config's __dict__: its class's __getattribute__ (attribute aliases) is Python, and this
    # runs once per layer per step (collect_rows sets the attribute, so it is in __dict__ when set)
    sink = module.config.__dict__.get("_trajscope_row_sink")
    if sink is not None and q_len == 1 and attention_mask is None and not _sliding(module, kwargs):
        out, _ = sdpa_attention_forward(module, query, key, value, None, dropout=dropout, scaling=scaling, **kwargs)
        sink.defer(query, key, scaling)  # its row is computed with its chunk's (RowSink)
        return out, None
    if q_len == 1 or per_head:  # the output from the row itself: one pass over the keys, not two
        rows = attention_rows(query, key, attention_mask, scaling, k_len - q_len)
        out = rows_output(rows, value)
    else:
        out, _ = sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                        **kwargs)
        want = getattr(module.config, "_trajscope_prefill_rows", DEFAULT_PREFILL_ROWS)
        n = q_len if want is None else max(1, min(q_len, int(want)))
        mask = None if attention_mask is None else attention_mask[:, :, q_len - n:, :]
        rows = attention_rows(query[:, :, q_len - n:], key, mask, scaling, k_len - n)
    if attention_mask is not None and getattr(module.config, "_trajscope_rows_unmasked", False):
        n = rows.shape[2]  # the output above used the mask; the returned rows see every causal key
        rows = attention_rows(query[:, :, q_len - n:], key, None, scaling, k_len - n)
    if sink is not None:
        sink.add(rows)
    return out, rows


_MODULE_SLIDING: "weakref.WeakKeyDictionary[torch.nn.Module, bool]" = weakref.WeakKeyDictionary()


def _sliding(module: torch.nn.Module, kwargs: dict) -> bool:
    """Whether this attention call sees a sliding window of keys (its cache drops old ones).

    The module's own ``sliding_window`` is looked up once per module (``getattr`` on a module without
    one goes through ``nn.Module.__getattr__`` and raises, once per layer per decode step)."""
    if kwargs.get("sliding_window") is not None:
        return True
    window = _MODULE_SLIDING.get(module)
    if window is None:
        window = _MODULE_SLIDING[module] = getattr(module, "sliding_window", None) is not None
    return window
