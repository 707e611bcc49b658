"""Local captures reduce decode steps in chunks, not one at a time.

At short context a decode step of a small model takes a few milliseconds, and
running the step kernels (:mod:`trajscope.capture.kernels`) on each step's tiny
tensors costs about as much again in per-operation overhead (measured in
``docs/capture_overhead.md``). So a local capture keeps each decode step's reads
(attention rows, block outputs, logits) as they are and reduces C steps at once
with :func:`~trajscope.capture.kernels.decode_records`; the prefill step is
reduced on its own, as before. C is as large as fits a memory budget for the
stacked attention rows (16 MiB on a CPU, at most :data:`MAX_CHUNK` steps): on SmolLM2
(30 layers, 9 heads) 14 steps at P = 1,024, 3 at P = 4,096 and one at 8,192
positions, where the budget keeps capture's peak memory near ``generate``'s. On a
GPU, where a capture is bound by its host's kernel launches and memory is
plentiful, the budget is 256 MiB (32 steps up to about 7,700 positions on
SmolLM2), and the prefill's layers are reduced in groups (:class:`PrefillGroups`). Each
reduction has a fixed cost of some dozens of small operations, so at long
context one reduction per step was about 2% of a capture on SmolLM2 at P = 1,024.

Records are handed on (``emit``) as each chunk is reduced, so streaming sees
steps in short bursts: with a streaming consumer (``max_delay_s``) a chunk is
also reduced once its first step is that old, so events trail the generation
by at most about that much. :meth:`StepChunks.flush` reduces what is left when
the generation ends, however it ends (EOS, Stop, Ctrl-C). NDIF captures keep the
per-step kernel (:func:`~trajscope.capture.kernels.record_step`), which runs on
the server inside the step.
"""

from __future__ import annotations

import time
from typing import Callable

import torch

from trajscope.capture import kernels
from trajscope.model.attention import QueryRow, chunk_rows

MAX_CHUNK = 32
BUDGET_BYTES = 16 * 2**20  # the stacked [L, H, C, K] float32 attention rows of one chunk
GPU_BUDGET_BYTES = 256 * 2**20  # the same on a GPU, whose capture is bound by kernel launches, not memory
STREAM_DELAY_S = 0.1  # how far streamed events may trail the generation


def budget(device: torch.device | str) -> int:
    """The bytes a chunk of decode rows (or a group of prefill layers) may take on ``device``."""
    return BUDGET_BYTES if torch.device(device).type == "cpu" else GPU_BUDGET_BYTES


def chunk_size(n_layers: int, n_heads: int, n_keys: int, budget_bytes: int = BUDGET_BYTES) -> int:
    """How many decode steps to reduce at once when rows have about ``n_keys`` keys (1 … MAX_CHUNK)."""
    return max(1, min(MAX_CHUNK, budget_bytes // (4 * n_layers * n_heads * (n_keys + MAX_CHUNK))))


class PrefillGroups:
    """The prefill's ``layer_fn`` for local captures: each layer's reads reduced as read on a CPU
    (:func:`~trajscope.capture.kernels.prefill_layer`), a group of layers at once on a GPU
    (:func:`~trajscope.capture.kernels.prefill_layers`, up to :func:`budget` bytes of rows and block outputs,
    always reduced by the last layer): there a capture is bound by its host's kernel launches, and the
    prefill's telemetry is some 70 launches a layer. Returns each layer's dict, filled when its group is reduced.
    """

    def __init__(self, n_layers: int, budget_bytes: int | None = None):
        self.n_layers = n_layers
        self.budget_bytes = budget_bytes  # None: 0 on a CPU (each layer alone), budget() on a GPU
        self.pending: list[tuple] = []
        self.bytes = 0

    def __call__(self, layer, P, rows, resid, opts) -> dict:
        limit = self.budget_bytes
        if limit is None:
            limit = 0 if resid.device.type == "cpu" else budget(resid.device)
        if limit <= 0:
            return kernels.prefill_layer(layer, P, rows, resid, opts)
        slot: dict = {}
        self.pending.append((layer, rows, resid, slot))
        self.bytes += 4 * (rows.shape[0] * rows.shape[1] * P + resid.numel())
        if self.bytes >= limit or layer == self.n_layers - 1:
            done = kernels.prefill_layers([p[0] for p in self.pending], P, [p[1] for p in self.pending],
                                          [p[2] for p in self.pending], opts)
            for (*_, into), d in zip(self.pending, done):
                into.update(d)
            self.pending, self.bytes = [], 0
        return slot


class StepChunks:
    """The generation loop's reducer for local captures (same call as ``kernels.record_step``).

    Args:
        emit: ``emit(record, n)`` for each record once its chunk is in the loop's list (``n``: the
            record's 1-based index there), or None.
        max_delay_s: also reduce a chunk once its first step is this old (None: only when it is full).
    """

    def __init__(self, emit: Callable[[dict, int], None] | None = None, max_delay_s: float | None = None):
        self.emit = emit
        self.max_delay_s = max_delay_s
        self.started = 0.0
        self.pending: list[tuple] = []
        self.out: list | None = None
        self.last_lp: torch.Tensor | None = None
        self.P = 0
        self.opts: tuple = ()

    def __call__(self, step, P, consumed, attn_rows, resid, logits, prev_lp, opts, out) -> torch.Tensor | None:
        """Take one step's reads; returns the last reduced step's ``[vocab]`` log-probabilities."""
        self.out, self.P, self.opts = out, P, opts
        if step == 0:
            prefill: list = []
            self.last_lp = kernels.record_step(step, P, consumed, attn_rows, resid, logits, None, opts, prefill)
            self._append(prefill)
            return self.last_lp
        if not self.pending:
            self.started = time.monotonic()
        self.pending.append((step, consumed, attn_rows, resid, logits))
        L, (H, _, k) = len(attn_rows), attn_rows[0].shape
        full = len(self.pending) >= chunk_size(L, H, k, budget(logits.device))
        if full or (self.max_delay_s is not None and time.monotonic() - self.started >= self.max_delay_s):
            self.flush()
        return self.last_lp

    def _append(self, records: list[dict]) -> None:
        n = len(self.out)
        self.out.extend(records)  # all kept before any is handed on: an error in emit loses none
        if self.emit is not None:
            for i, rec in enumerate(records):
                self.emit(rec, n + i + 1)

    def flush(self) -> None:
        """Reduce the steps taken since the last chunk (a no-op when there are none)."""
        if not self.pending:
            return
        chunk = self.pending
        s0 = chunk[0][0]
        L, H = len(chunk[0][2]), chunk[0][2][0].shape[0]
        K = self.P + chunk[-1][0]  # keys of the last step: 0 … P + s − 1
        rows = torch.zeros((L, H, len(chunk), K), dtype=torch.float32, device=chunk[-1][4].device)
        for layer in range(L):
            entries = [c[2][layer] for c in chunk]
            if all(isinstance(e, QueryRow) for e in entries):
                rows[layer] = chunk_rows(entries, K)  # one product for the chunk (attention.RowSink)
                continue
            for c, ((step, *_), e) in enumerate(zip(chunk, entries)):
                a = e.rows() if isinstance(e, QueryRow) else e
                n_keys = self.P + step  # a sliding-window cache holds only the newest of them
                rows[layer, :, c, n_keys - a.shape[-1]:n_keys] = a[:, 0]
        resid = torch.cat([r for _, _, _, res, _ in chunk for r in res]).view(len(chunk), L, -1).transpose(0, 1)
        ids = torch.cat([c[1] for c in chunk])
        logits = torch.cat([c[4] for c in chunk])
        records, last_lp = kernels.decode_records(s0, self.P, ids, rows, resid, logits, self.last_lp, self.opts)
        self.pending, self.last_lp = [], last_lp
        self._append(records)
