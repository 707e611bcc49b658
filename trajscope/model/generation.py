"""The generation trace: one nnsight ``generate`` with a ``tracer.iter`` loop over steps.

Step 0 is the prefill pass (all P prompt positions at once); step s ≥ 1 is the
s-th decode pass, whose single query is the token at ``pos = P + s − 1``
(:mod:`trajscope.positions`). At every step the loop reads, in execution order,
each block's attention probabilities and output (steering applied first, with
:func:`trajscope.model.steer.steer_hidden`) and the logits, and hands them to
the caller's ``step_fn`` — a per-step kernel that reduces them to a small
record *inside* the step (locally while it runs, or on the NDIF server, where
the kernel module is shipped by value) and appends it to a saved list. At the
prefill step an optional ``layer_fn`` reduces each layer's reads as soon as they
are read, so the trace never holds every layer's ``[P, d]`` block output and
attention rows at once (capture's prefill memory is one layer's, not L). A local
``step_fn`` may instead keep a few steps' reads and reduce them together
(:mod:`trajscope.capture.chunks`); the caller then reduces what is left after the trace.

Locally on the rows attention (``row_sink``), the rows come from the attention
function's sink instead, and at a decode step so do the outputs of the blocks the
trace does not steer (a forward hook leaves them there): such a step reads only
the streamer, the logits and the steered blocks through nnsight, since each read
is a greenlet round trip (``docs/capture_overhead.md``).

nnsight facts this relies on (NNSIGHT_NOTES.md): modules must be read in
execution order; ``tracer.result`` must be read in its own invoke so EOS before
N steps still returns the ids; only ``.save()`` d values leave the block.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from trajscope.model import steer as steer_kernel
from trajscope.model.families import get_path, hidden, with_hidden


def run_generation(model: Any, ids: Sequence[int], gen_kwargs: dict, step_fn: Callable, step_opts: tuple,
                   steer: Sequence[Sequence[tuple]], max_new_tokens: int,
                   kernels: Any = None, layer_fn: Callable | None = None,
                   row_sink: Any = None) -> tuple[list[int], list, Any]:
    """Run the generation trace.

    Args:
        model: the :class:`~trajscope.model.handle.ModelHandle` (its lock is held by the caller).
        ids: the P prompt ids.
        gen_kwargs: Hugging Face ``generate`` settings (sampling, EOS, stopping criteria).
        step_fn: ``step_fn(step, P, consumed [q], attn_rows (per layer [H, q, k]),
            resid (per layer [q, d_model]), logits [q, vocab], prev_lp, step_opts, records)``
            appends the step's record to ``records`` (or keeps the reads for later) and returns the
            ``[vocab]`` log-probabilities passed as ``prev_lp`` to the next step
            (:func:`trajscope.capture.kernels.record_step`).
        step_opts: passed through to ``step_fn``.
        steer: per layer, the steering spec tuples applied to that block's output.
        max_new_tokens: N, the number of steps.
        kernels: the module that defines ``step_fn``, registered with nnsight for remote runs.
        layer_fn: at the prefill step, ``layer_fn(layer, P, attn_rows [H, n, k], resid [P, d_model],
            step_opts)`` is called as each layer is read; its return value replaces that layer's attention
            rows in the list handed to ``step_fn`` and the layer's residual entry is None
            (:func:`trajscope.capture.kernels.prefill_layer`). None: the raw reads are handed on.
        row_sink: a local run on the rows attention: the :class:`~trajscope.model.attention.RowSink` that
            :func:`~trajscope.model.attention.collect_rows` fills; each layer's rows are taken from it (and it is
            emptied after each step) instead of being read from the attention module, and at a decode step the
            unsteered blocks' outputs too (:meth:`~trajscope.model.attention.RowSink.watch_output`, hooked for
            the run). A decode step's entry
            may be a :class:`~trajscope.model.attention.QueryRow`, whose row ``step_fn`` computes with its
            chunk's; the prefill's are always rows. None: read from the module (eager, NDIF).
    Returns:
        ``(final_ids, records, last_lp)``: all token ids (prompt + generated), the records, and
        ``step_fn``'s last return value (the ``[vocab]`` log-probabilities that produced the last token).
    """
    import nnsight

    if model.remote:
        gen_kwargs = {**gen_kwargs, **model.remote_options()}
        nnsight.register(steer_kernel)
        if kernels is not None:
            nnsight.register(kernels)
    hooks = [] if row_sink is None else [row_sink.watch_output(layer, module) for layer, module in
                                         enumerate(get_path(model.torch_module(), model.family.blocks))]
    try:
        return _trace(model, ids, gen_kwargs, step_fn, step_opts, steer, max_new_tokens, layer_fn, row_sink)
    finally:
        for hook in hooks:
            hook.remove()


def _trace(model: Any, ids: Sequence[int], gen_kwargs: dict, step_fn: Callable, step_opts: tuple,
           steer: Sequence[Sequence[tuple]], max_new_tokens: int, layer_fn: Callable | None,
           row_sink: Any) -> tuple[list[int], list, Any]:
    """The trace itself (:func:`run_generation`, whose caller holds the lock and whose hooks are installed)."""
    import nnsight

    records: list = []
    state = {"final": None}
    P = len(ids)
    n_layers = model.n_layers
    blocks = model.blocks()
    attns = [model.attn(layer) for layer in range(n_layers)]
    unembed = model.unembed()
    streamer = model.nn.generator.streamer
    prompt = torch.tensor([list(ids)])
    # Keep every statement inside the trace on one line, and no comment lines inside it: nnsight's
    # remote path maps the body's line numbers back to the file, and either shifts them.
    # Modules are read in execution order: a layer's attention before its block (or, with row_sink,
    # its rows taken from the sink after the block). With row_sink, a decode step reads only its
    # steered layers' blocks through nnsight; the others' outputs and rows are taken from the sink
    # once the logits are read (every block has run by then).
    with model.nn.generate(**gen_kwargs) as tracer:
        saved_records = nnsight.save(records)
        saved_state = nnsight.save(state)
        with tracer.invoke(prompt):
            prev_lp = None
            for step in tracer.iter[:max_new_tokens]:
                consumed = streamer.output.reshape(-1)
                attn_rows, resid = [None] * n_layers, [None] * n_layers
                steps = torch.full((consumed.shape[0],), step)
                reduce = step == 0 and layer_fn is not None
                hooked = row_sink is not None and step > 0
                for layer in range(n_layers):
                    if hooked and not steer[layer]:
                        continue
                    rows = attns[layer].output[1][0] if row_sink is None else None
                    out = blocks[layer].output
                    if row_sink is not None:
                        rows = row_sink.take(layer, step == 0)
                    new = steer_kernel.steer_hidden(hidden(out), steer[layer], steps) if steer[layer] else None
                    if new is not None:
                        blocks[layer].output = with_hidden(out, new)
                    r = (hidden(out) if new is None else new)[0]
                    attn_rows[layer] = layer_fn(layer, P, rows, r, step_opts) if reduce else rows
                    resid[layer] = None if reduce else r
                logits = unembed.output[0]
                for layer in range(n_layers if hooked else 0):
                    if not steer[layer]:
                        attn_rows[layer], resid[layer] = row_sink.take(layer), row_sink.output(layer)
                prev_lp = step_fn(step, P, consumed, attn_rows, resid, logits, prev_lp, step_opts, saved_records)
                saved_state["final"] = prev_lp
                if row_sink is not None:
                    row_sink.clear(keep_outputs=True)
        with tracer.invoke():
            out_ids = tracer.result.save()
    final_ids = [int(i) for i in out_ids[0].tolist()]
    return final_ids, list(saved_records), saved_state["final"]
