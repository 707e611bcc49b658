"""Capture's kernels: the reductions of each step's tensors to the numbers the tables keep.

On the NDIF server they run inside each step (:func:`record_step`; this module
and :mod:`trajscope.metrics.residual_stats` are shipped by value with
``nnsight.register``), so they import nothing but torch and return small
tensors. Locally the prefill step is reduced while the trace runs and decode
steps a chunk at a time (:func:`decode_records`, :mod:`trajscope.capture.chunks`;
:func:`step_record` hands a decode step to it as a chunk of one). The
definitions follow DESIGN.md:

- attention entropy ``H = -Σ_j a_j log a_j`` over the keys a query sees, also
  divided by ``log(#keys)``; ``prefix_mass = Σ_{j<P} a_j``; ``generated_mass =
  Σ_{j≥P} a_j``; ``sink_mass = a_0``; ``sink4_mass = Σ_{j<4} a_j`` (StreamingLLM);
  ``self_mass = a_i`` for the query's own position ``i``;
- residual statistics per vector: :func:`trajscope.metrics.residual_stats.residual_stats`
  (the one definition; the massive-rule reference is the layer's median |x| over the prompt at
  prefill, and the vector's own median |x| at a decode step);
- next-token distribution: entropy of ``softmax(logits)`` in nats and the top-k.
"""

from __future__ import annotations

import torch

from trajscope.metrics.residual_stats import ACT_FIELDS, MASSIVE_ABS, residual_stats

ATTN_FIELDS = ("entropy", "entropy_norm", "prefix_mass", "generated_mass", "sink_mass", "sink4_mass", "self_mass")
__all__ = ["ACT_FIELDS", "ATTN_FIELDS", "attention_stats", "token_stats", "step_record", "prefill_layer",
           "prefill_layers", "decode_records", "record_step", "probe_scores"]


def attention_stats(a: torch.Tensor, prompt_len: int, first_query_pos: int, top_k: int = 8) -> dict:
    """Telemetry of attention probabilities.

    Args:
        a: ``[..., q, k]`` probabilities; query row r sits at absolute position
            ``first_query_pos + r`` and sees keys ``0..first_query_pos + r``.
        prompt_len: P, the number of prompt positions.
        first_query_pos: absolute position of the first query row.
        top_k: how many top keys to keep per row.

    Returns:
        ``{"stats": [..., q, 7] float32 in ATTN_FIELDS order, "top_pos": [..., q, top_k] int32
        (weight descending, ties by position; −1 pads rows with fewer keys of nonzero weight),
        "top_w": [..., q, top_k] float32}``.
    """
    a = a.float()
    q, k = a.shape[-2], a.shape[-1]
    qpos = torch.arange(first_query_pos, first_query_pos + q, device=a.device)
    ent = _entropy(a)
    n_keys = (qpos + 1).to(torch.float32)
    log_keys = torch.log(n_keys).clamp_min(1e-12)
    ent_norm = torch.where(n_keys > 1, ent / log_keys, torch.zeros_like(ent))
    prefix = a[..., :prompt_len].sum(-1)
    generated = a[..., prompt_len:].sum(-1)
    sink = a[..., 0]
    sink4 = a[..., :4].sum(-1)
    idx = qpos.view(*([1] * (a.dim() - 2)), q, 1).expand(*a.shape[:-1], 1)
    self_mass = a.gather(-1, idx).squeeze(-1)
    kk = min(top_k, k)
    top_w, top_pos = a.topk(kk, dim=-1)
    top_pos = top_pos.to(torch.int32)
    # a key the query cannot see, or gives no weight (outside a sliding window), is not a top key
    invisible = (top_pos > qpos.view(q, 1).to(torch.int32)) | (top_w <= 0)
    top_pos = top_pos.masked_fill(invisible, -1)
    top_w = top_w.masked_fill(invisible, 0.0)
    # weight descending, ties by position, padding (−1) last: the same order however wide the row is
    by_pos = torch.where(invisible, torch.iinfo(torch.int32).max, top_pos).argsort(dim=-1, stable=True)
    top_pos, top_w = top_pos.gather(-1, by_pos), top_w.gather(-1, by_pos)
    order = top_w.argsort(dim=-1, descending=True, stable=True)
    top_pos, top_w = top_pos.gather(-1, order), top_w.gather(-1, order)
    if kk < top_k:
        pad = (0, top_k - kk)
        top_pos = torch.nn.functional.pad(top_pos, pad, value=-1)
        top_w = torch.nn.functional.pad(top_w, pad, value=0.0)
    stats = torch.stack([ent, ent_norm, prefix, generated, sink, sink4, self_mass], dim=-1)
    return {"stats": stats, "top_pos": top_pos, "top_w": top_w}


_TINY = torch.finfo(torch.float32).tiny


def _entropy(a: torch.Tensor) -> torch.Tensor:
    """``−Σ a log a`` over the last axis of float32 probabilities, 0·log 0 taken as 0.

    Each weight's log is taken of the weight clamped to float32's smallest normal number (``a = 0`` then adds
    ``0 · log tiny = 0``; a subnormal weight adds ``a · log tiny`` instead of ``a · log a``, a difference below
    2e-37). One temporary and PyTorch's vectorised ``log``: on this project's CPU about half the time of
    ``torch.special.entr`` (30 against 57 ms over one SmolLM2 capture's rows at P = 1,024, one thread), and
    within 1e-6 of it there.
    """
    buf = a.clamp_min(_TINY)
    buf.log_()
    buf.mul_(a)
    return buf.sum(-1).neg_()


def token_stats(logits: torch.Tensor, top_k: int = 5) -> dict:
    """Next-token distribution summaries.

    Args:
        logits: ``[q, vocab]``.

    Returns:
        ``{"logprobs": [q, vocab] float32, "entropy": [q], "top_ids": [q, top_k] int64,
        "top_lp": [q, top_k]}``.
    """
    lp = torch.log_softmax(logits.float(), dim=-1)
    ent = -(lp.exp() * lp).sum(-1)
    top_lp, top_ids = lp.topk(top_k, dim=-1)
    return {"logprobs": lp, "entropy": ent, "top_ids": top_ids, "top_lp": top_lp}


def chosen_logprobs(lp: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """``lp[i, ids[i]]`` for each row: ``lp`` ``[n, vocab]`` log-probabilities, ``ids`` ``[n]`` the tokens that
    followed. The ids stay on the host through the capture; they are moved to ``lp``'s device here."""
    return lp.gather(-1, ids.to(lp.device).unsqueeze(-1)).squeeze(-1)


def step_record(step, P, consumed, attn_rows, resid, logits, prev_lp, opts) -> dict:
    """Reduce one step's tensors to its record (all small tensors).

    Args:
        step: 0 for prefill, s ≥ 1 for decode. Its first query row sits at position 0 (prefill) or
            ``P + s − 1`` (:func:`trajscope.positions.query_positions`, restated here because this
            kernel runs where trajscope may not be installed).
        P: prompt length; consumed: ``[q]`` ids fed to this step.
        attn_rows: per layer ``[H, n, k]``, the attention rows of the step's last ``n ≤ q`` queries
            (at prefill the boundary may compute only a window of rows); resid: per layer
            ``[q, d_model]``; logits: ``[m, vocab]`` for the step's last ``m ≤ q`` queries (at prefill the
            boundary may compute the unembedding for a window of rows only).
        prev_lp: ``[vocab]`` log-probabilities of the previous step's last row (None at step 0).
        opts: ``(residual_layers, attention_layers, top_k_keys, top_k_tokens, probe, sae)``; ``sae`` is
            None or ``(layer, encode)`` with ``encode([q, d]) -> dict of [q, …] tensors``.
    Returns:
        The record dict that :class:`trajscope.capture.record.StepRecord` wraps; its
        ``"last_lp"`` entry is the ``[vocab]`` log-probabilities of this step's last row.
    """
    res_layers, row_layers, top_k_keys, top_k_tokens, probe, sae = opts
    first_pos = 0 if step == 0 else P + step - 1
    q = consumed.shape[0]
    if step > 0:  # one decode query: the chunk kernel, on a chunk of one step
        attn_rows = [all_keys(a, first_pos + q) for a in attn_rows]
        records, last_lp = decode_records(step, P, consumed, torch.stack(attn_rows), torch.stack(resid), logits,
                                          prev_lp, opts)
        return {**records[0], "last_lp": last_lp}
    # prefill: per layer (already, when the loop reduced each layer as it was read), so the P×P maps and
    # [P, d] block outputs of every layer are never held at once
    per = [a if isinstance(a, dict) else prefill_layer(layer, P, a, resid[layer], opts)
           for layer, a in enumerate(attn_rows)]
    attn_first = per[0]["attn_first_pos"]
    t_stats = token_stats(logits, top_k_tokens)
    lp = t_stats["logprobs"]
    lp_first = q - lp.shape[0]
    # logprob of the prompt tokens after each computed row's query
    chosen = chosen_logprobs(lp[:-1], consumed[q - lp.shape[0] + 1:])
    return {
        "step": step, "first_pos": first_pos, "attn_first_pos": attn_first, "lp_first_pos": lp_first, "ids": consumed.detach().clone(),
        "chosen_lp": chosen, "entropy": t_stats["entropy"], "top_ids": t_stats["top_ids"],
        "top_lp": t_stats["top_lp"], "attn": torch.stack([p["attn"] for p in per]),
        "top_pos": torch.stack([p["top_pos"] for p in per]), "top_w": torch.stack([p["top_w"] for p in per]),
        "act": torch.stack([p["act"] for p in per]),
        "resid": {layer: per[layer]["resid"] for layer in res_layers},
        "rows": {layer: per[layer]["rows"] for layer in row_layers},
        "last_lp": lp[-1],
        "probe": None,  # the prefill is never probed (probe_scores)
        "sae": sae[1](per[sae[0]]["resid"]) if sae is not None else None,
    }


def all_keys(a: torch.Tensor, n_keys: int) -> torch.Tensor:
    """Rows ``[..., k]`` over the newest ``k ≤ n_keys`` keys (a sliding-window cache holds only those),
    zero-padded on the left to all ``n_keys`` keys ``0 … n_keys − 1``."""
    return a if a.shape[-1] == n_keys else torch.nn.functional.pad(a, (n_keys - a.shape[-1], 0))


def prefill_layer(layer, P, a, r, opts) -> dict:
    """One layer's prefill reads reduced to what the prefill record keeps of them.

    The generation loop calls it as each layer is read, so that only one layer's ``[P, d_model]``
    block output and attention rows are alive at a time (capture's prefill memory stays that of
    one layer, not L).

    Args:
        layer: the layer index; P: prompt length (the step's P queries).
        a: ``[H, n, k]`` attention rows of the last ``n ≤ P`` prompt queries (``k ≤ P`` keys: a
            sliding-window cache holds only the newest); r: ``[P, d_model]`` the block output.
        opts: as :func:`step_record`.
    Returns:
        ``{"attn_first_pos", "attn": [H, n, 7], "top_pos", "top_w": [H, n, top_k_keys], "act": [P, 7],
        "resid": [P, d_model] copy or None, "rows": [H, n, P] copy or None}``: the residual is copied when
        the layer's residual is kept or encoded by the SAE, the rows when the layer's rows are kept.
    """
    res_layers, row_layers, top_k_keys, _, _, sae = opts
    a = all_keys(a, P)
    first = P - a.shape[-2]
    s = attention_stats(a, P, first, top_k_keys)
    keep_r = layer in res_layers or (sae is not None and sae[0] == layer)
    return {"attn_first_pos": first, "attn": s["stats"], "top_pos": s["top_pos"], "top_w": s["top_w"],
            "act": residual_stats(r, median_abs=pooled_median_abs(r), pooled=True),
            "resid": r.detach().clone() if keep_r else None,
            "rows": a.detach().clone() if layer in row_layers else None}


def prefill_layers(layers, P, rows, resid, opts) -> list[dict]:
    """:func:`prefill_layer` for several layers at once: one kernel launch per statistic for the group instead
    of one per layer (a GPU's capture is bound by its host's launches). Same arguments, as lists over ``layers``
    (their rows of one shape); returns their dicts, the same numbers as one call per layer (each statistic
    reduces each row or vector alone)."""
    if len(layers) == 1:
        return [prefill_layer(layers[0], P, rows[0], resid[0], opts)]
    res_layers, row_layers, top_k_keys, _, _, sae = opts
    a = torch.stack([all_keys(x, P) for x in rows])  # [G, H, n, P]
    first = P - a.shape[-2]
    s = attention_stats(a, P, first, top_k_keys)
    r = torch.stack(resid)  # [G, P, d]
    meds = [pooled_median_abs(x) for x in resid]
    med = torch.stack([m if m is not None else r.new_zeros((), dtype=torch.float32) for m in meds])
    act = residual_stats(r, median_abs=med.view(-1, 1), pooled=True)  # a layer without a median has no vector past the bar
    out = []
    for g, layer in enumerate(layers):
        keep_r = layer in res_layers or (sae is not None and sae[0] == layer)
        out.append({"attn_first_pos": first, "attn": s["stats"][g], "top_pos": s["top_pos"][g], "top_w": s["top_w"][g],
                    "act": act[g], "resid": resid[g].detach().clone() if keep_r else None,
                    "rows": a[g].clone() if layer in row_layers else None})
    return out


def pooled_median_abs(r: torch.Tensor):
    """The massive rule's prefill reference: the median |x| over every value of one layer's ``[P, d_model]``
    block output, exactly as ``residual_stats(r, pooled=True)`` takes it (``torch.median``: the lower median),
    or None when no |x| passes the absolute bar (then the reference is never used). Off the CPU it is always
    ``torch.median``, with no host sync (the two gates below each wait for the device).

    ``torch.median`` over the P·d values is most of the prefill's residual statistics on a CPU (about 0.8 s
    of 1.2 s per layer at P = 4,096 on SmolLM2, measured); on the CPU the same order statistic comes from
    NumPy's introselect (``np.partition``), about 25× faster, and is the same element, so the value is
    identical. With NumPy missing or a NaN in the layer it is ``torch.median``.
    """
    ax = r.float().abs().reshape(-1)  # a fresh tensor: r itself is never reordered
    if ax.device.type != "cpu":  # no host sync: the median is cheap there, and unused where nothing passes
        return ax.median()
    top = ax.amax()  # NaN where any value is NaN
    nan = bool(torch.isnan(top))
    passes = bool((ax > MASSIVE_ABS).any()) if nan else bool(top > MASSIVE_ABS)
    if not passes:
        return None
    if ax.device.type == "cpu" and not nan:
        try:
            import numpy as np
        except ImportError:
            np = None
        if np is not None:
            k = (ax.numel() - 1) // 2  # torch.median's lower median
            values = ax.numpy()
            values.partition(k)  # in place: ax is this function's own copy
            return torch.tensor(float(values[k]), dtype=torch.float32)
    return ax.median()


def record_step(step, P, consumed, attn_rows, resid, logits, prev_lp, opts, out) -> torch.Tensor:
    """The generation loop's per-step reducer: append :func:`step_record`'s record to ``out``.

    Same arguments as :func:`step_record`, plus ``out``, the list the records go to.
    Returns the ``[vocab]`` log-probabilities of the step's last row (the next step's ``prev_lp``).
    """
    rec = step_record(step, P, consumed, attn_rows, resid, logits, prev_lp, opts)
    last_lp = rec.pop("last_lp")
    out.append(rec)
    return last_lp


def decode_records(first_step, P, ids, rows, resid, logits, prev_lp, opts) -> tuple:
    """The records of C consecutive decode steps, reduced at once (the batched :func:`step_record`).

    Each kernel runs once over the C steps instead of C times, which removes most of the
    per-step cost at short context. The records equal :func:`step_record`'s within float rounding.

    Args:
        first_step: s0 ≥ 1; row c is decode step ``s0 + c``, whose query sits at ``P + s0 − 1 + c``.
        P: prompt length.
        ids: ``[C]`` the query tokens.
        rows: ``[L, H, C, K]`` attention rows, ``K ≥ P + s0 − 1 + C``; row c holds the weights of
            keys ``0 … P + s0 − 1 + c`` and zeros after them.
        resid: ``[L, C, d_model]`` block outputs at the C queries.
        logits: ``[C, vocab]``.
        prev_lp: ``[vocab]`` log-probabilities of step ``s0 − 1``'s last row.
        opts: as :func:`step_record`.
    Returns:
        ``(records, last_lp)``: C record dicts as :func:`step_record` makes them (without ``"last_lp"``),
        and the ``[vocab]`` log-probabilities of the last row.
    """
    res_layers, row_layers, top_k_keys, top_k_tokens, probe, sae = opts
    C = ids.shape[0]
    first_pos = P + first_step - 1
    a_stats = attention_stats(rows, P, first_pos, top_k_keys)
    r_stats = residual_stats(resid)
    t_stats = token_stats(logits, top_k_tokens)
    lp = t_stats["logprobs"]
    chosen = prev_lp[ids[:1]]
    if C > 1:
        chosen = torch.cat([chosen, chosen_logprobs(lp[:-1], ids[1:])])
    sae_out = sae[1](resid[sae[0]]) if sae is not None else None
    records = []
    for c in range(C):
        pos = first_pos + c
        one = slice(c, c + 1)
        records.append({
            "step": first_step + c, "first_pos": pos, "attn_first_pos": pos, "lp_first_pos": pos,
            "ids": ids[one].clone(), "chosen_lp": chosen[one], "entropy": t_stats["entropy"][one],
            "top_ids": t_stats["top_ids"][one], "top_lp": t_stats["top_lp"][one],
            "attn": a_stats["stats"][:, :, one], "top_pos": a_stats["top_pos"][:, :, one],
            "top_w": a_stats["top_w"][:, :, one], "act": r_stats[:, one],
            "resid": {layer: resid[layer, one].clone() for layer in res_layers},
            "rows": {layer: rows[layer, :, one, :pos + 1].clone() for layer in row_layers},
            "probe": probe_scores(resid[:, one], probe, first_step + c, t_stats["entropy"][c])
            if probe is not None else None,
            "sae": {k: v[one] for k, v in sae_out.items()} if sae_out is not None else None,
        })
    return records, lp[-1].clone()


def probe_scores(resid, probe, step: int, entropy: torch.Tensor):
    """Drift scores of the last query position at the probed layers, or None when not sampled.

    Args:
        resid: per layer ``[q, d_model]``.
        probe: ``(layers, mean [Lp, d], inv_sd [Lp, d], threshold [Lp], every, entropy_threshold)``.
        step: the current step (prefill, step 0, is never probed).
        entropy: next-token entropy at the last query (nats).
    Returns:
        ``[Lp]`` scores (diagonal Mahalanobis / √d) or None.
    """
    layers, mean, inv_sd, _, every, ent_thr = probe
    if step == 0 or not (step % every == 0 or (ent_thr >= 0 and float(entropy) > ent_thr)):
        return None
    x = torch.stack([resid[layer][-1] for layer in layers]).float()
    return ((x - mean.to(x.device)) * inv_sd.to(x.device)).pow(2).mean(-1).sqrt()
