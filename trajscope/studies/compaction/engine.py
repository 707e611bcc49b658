"""The context-compaction study's setups: one session run masked, restarted, in full and masked early.

When an agent's context ``<sys> <T1> <T2> <summary> <T3>`` is compacted (the summary
replaces T1 and T2), a serving stack can

- **A, mask**: hide T1 and T2 from every query from the start of T3 on, through the
  model boundary's key mask (``key_mask`` False on T1∪T2, ``mask_from`` = T3's first
  position). T3's tokens still attend to sys and the summary, and the summary's KV
  states — computed while T1 and T2 were visible — are kept;
- **B, restart**: recompute ``<sys> <summary> <T3>`` from scratch, with fresh positions;
- **C, full**: mask nothing (the reference);
- **D, mask early** (a control): T1 and T2 hidden from the summary's first query on, positions as
  in A — the summary's states computed as if the turns had never been there.

A differs from B in two ways: the summary's kept states saw T1/T2, and the restart closes the gap
of masked positions between sys and the summary (RoPE sees relative distances). D separates them:
**A vs D** is only what the masked turns leave in the kept summary states, **D vs B** only the
position gap. At block 0 A and D agree exactly (block-0 keys and values do not depend on context),
so A vs B there is the position gap alone.

All four run through the same path of the boundary (a key mask is always given —
all True for B and C), so A with nothing masked is C bit for bit and every difference
between A and C is the mask's. Rows are aligned by T3 token index ``t3_index``.

Measures of one session (:func:`measure_session`); :func:`trajscope.studies.compaction.study.compaction`
gathers them over sessions into the study's Result, one table each:

- ``compaction_states``: per session, pair (``A_vs_C``, ``B_vs_C``, ``D_vs_C``, ``A_vs_B``, ``A_vs_D``,
  ``D_vs_B``; the second setup is the reference), layer and T3 token: relative L2
  ``‖x − r‖ / ‖r‖`` and cosine of the block outputs;
- ``compaction_next_token``: per session, pair and T3 token: ``KL(p_ref ‖ p_x)`` of the next-token
  distribution (nats) and whether the argmax agrees;
- ``compaction_decode``: greedy continuations of ``max_new_tokens`` after T3 (every setup through
  :meth:`~trajscope.model.ModelHandle.masked_decode`): the first generated index where A, B or D
  leaves C's tokens (null when it never does) and the fraction of agreeing tokens;
- ``compaction_probe``: a linear probe (:mod:`trajscope.studies.probe`) reading each session's
  ``label`` (synthetic sessions: the masked number's first digit) from the last T3 token's block
  output, per layer, fitted and scored on a disjoint held-out split under each setup (and fitted
  under C, read under A and B), against chance and a shuffled-label control, with bootstrap
  intervals over held-out sessions;
- ``compaction_attention``: per session, setup, layer and T3 token, the attention mass T3's query
  puts on the summary's keys (and on sys, the masked turns and T3;
  :mod:`trajscope.studies.compaction.attention`), from the attention rows the boundary's forward
  returns with the setup's key mask applied;
- ``compaction_sessions``: the sessions, their split and segment lengths; ``compaction_summary``:
  means of the per-session measures with bootstrap intervals over sessions, computed by one function
  (:func:`trajscope.studies.compaction.summary.summarize`).

A *planted* run (``plant_strength > 0``) adds ``plant_strength · u_label`` (one fixed random unit
direction per class) to block ``plant_layer``'s output at every T1 position, through the
boundary's steering, in A, C and D (B has no T1): a known signal whose travel into T3 the probe
should see under C, and whose leak through the summary it measures under A.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np
import polars as pl
import torch

from trajscope.errors import TrajscopeError
from trajscope.steering import SteeringVector
from trajscope.studies.compaction import attention as ca
from trajscope.studies.sessions import SessionTokens

SETUPS = ("A", "B", "C", "D")
PAIRS = (("A", "C"), ("B", "C"), ("D", "C"), ("A", "B"), ("A", "D"), ("D", "B"))
MASKED = ("t1", "t2")


@dataclasses.dataclass(frozen=True)
class SetupInput:
    """What one setup runs: ``ids [K]``, ``key_mask [K]`` bool, ``mask_from`` and T3's ``(start, end)``."""

    ids: list[int]
    key_mask: torch.Tensor
    mask_from: int
    t3: tuple[int, int]


def setup_input(tokens: SessionTokens, setup: str, masked: Sequence[str] = MASKED) -> SetupInput:
    """The ids, key mask and T3 span of ``setup`` (``"A"``, ``"B"``, ``"C"`` or ``"D"``) for one session.

    ``masked`` names the segments A and D hide (default T1 and T2; ``()`` makes A and D identical to C).
    A's mask applies from T3's first position, D's from the summary's.
    """
    if setup not in SETUPS:
        raise TrajscopeError(f"Unknown compaction setup '{setup}'; use one of {', '.join(SETUPS)}.")
    restart = setup == "B"
    ids = tokens.restart_ids if restart else tokens.ids
    t3 = tokens.span("t3", restart=restart)
    keep = torch.ones(len(ids), dtype=torch.bool)
    if setup in ("A", "D"):
        for seg in masked:
            a, b = tokens.span(seg)
            keep[a:b] = False
    return SetupInput(ids, keep, tokens.span("summary")[0] if setup == "D" else t3[0], t3)


def _plant_steering(tokens: SessionTokens, direction: torch.Tensor, layer: int, strength: float) -> tuple[list, int]:
    """A steering vector on exactly T1's positions and the ``prompt_len`` that places its steps there."""
    a, b = tokens.span("t1")
    # position p has step p − P + 1 with P = a: T1's positions are steps 1 … b − a
    return [SteeringVector(layer, direction, strength, start_step=1, end_step=b - a + 1, name="plant")], a


def run_setup(model: Any, tokens: SessionTokens, setup: str, *, layers: Sequence[int], masked: Sequence[str] = MASKED,
              plant: tuple[torch.Tensor, int, float] | None = None,
              attention: bool = False) -> tuple[torch.Tensor, dict[int, torch.Tensor]] | tuple:
    """Teacher-forced forward of one setup; the T3 rows only.

    Args:
        plant: ``(direction [d], layer, strength)`` added to T1's positions (A, C, D; B has no T1).
        attention: also return every layer's attention rows of T3's queries (the boundary's
            ``attention_rows``; needs a model loaded with ``attn="rows"`` or ``"eager"``).
    Returns:
        ``(logits [n_t3, vocab], {layer: [n_t3, d_model]})``, row ``i`` = T3 token ``i``; with ``attention``
        a third item ``{layer: [H, n_t3, K]}`` (K = the setup's context length).
    """
    inp = setup_input(tokens, setup, masked)
    steering, prompt_len = (), None
    if plant is not None and setup != "B":
        steering, prompt_len = _plant_steering(tokens, *plant)
    a, b = inp.t3
    out = model.forward(inp.ids, prompt_len=prompt_len, layers=layers, key_mask=inp.key_mask,
                        mask_from=inp.mask_from, steering=steering, attention_rows=(b - a) if attention else 0)
    logits, resid = out.logits[a:b], {k: v[a:b] for k, v in out.resid.items()}
    return (logits, resid, out.attn) if attention else (logits, resid)


def attention_spans(tokens: SessionTokens, setup: str, masked: Sequence[str] = MASKED) -> dict[str, list[tuple[int, int]]]:
    """Key spans of sys, the summary, the masked segments (none for B) and T3 in ``setup``'s context."""
    restart = setup == "B"
    spans = {k: [tokens.span(k, restart=restart)] for k in ("sys", "summary", "t3")}
    spans["masked"] = [] if restart else [tokens.span(k) for k in (masked or MASKED)]
    return spans


def state_distances(x: torch.Tensor, ref: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of ``x, ref [n, d]``: relative L2 ``‖x − ref‖ / ‖ref‖`` and cosine, each ``[n]``."""
    x, ref = x.double(), ref.double()
    rel = (x - ref).norm(dim=-1) / ref.norm(dim=-1).clamp_min(1e-12)
    return rel, torch.nn.functional.cosine_similarity(x, ref, dim=-1)


def next_token_kl(ref_logits: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """``KL(p_ref ‖ p)`` in nats per row of ``[n, vocab]`` logits: ``[n]``."""
    lr, lx = ref_logits.double().log_softmax(-1), logits.double().log_softmax(-1)
    return (lr.exp() * (lr - lx)).sum(-1).clamp_min(0.0)


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first index where ``a`` and ``b`` differ (over their common length), or None."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def greedy_continuations(model: Any, tokens: SessionTokens, n: int,
                         masked: Sequence[str] = MASKED) -> dict[str, list[int]]:
    """``{setup: the n greedy tokens after T3}``, each through the boundary's masked decode (from its ``mask_from``)."""
    out = {}
    for s in SETUPS:
        inp = setup_input(tokens, s, masked)
        ids = model.masked_decode(inp.ids, n, inp.key_mask, mask_from=inp.mask_from)
        out[s] = ids[len(inp.ids):]
    return out


def plant_directions(n_classes: int, d_model: int, seed: int = 0) -> torch.Tensor:
    """``[n_classes, d_model]`` fixed random orthonormal directions (one per class), from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(d_model, n_classes, generator=g, dtype=torch.float64))
    return q.T.float().contiguous()


def measure_session(model: Any, tokens: SessionTokens, layers: Sequence[int], *, masked: Sequence[str] = MASKED,
                    plant: tuple[torch.Tensor, int, float] | None = None,
                    max_new_tokens: int = 0, attention: bool = True) -> tuple:
    """Every measure of one session (module docstring).

    Returns:
        ``(states, next_token, decode_rows, last, attention)``: the session's rows of ``compaction_states``
        and ``compaction_next_token``, its ``compaction_decode`` rows (none when ``max_new_tokens`` is 0),
        ``{setup: [n_layers, d_model]}`` the last T3 token's block outputs (the probe's features), and its
        ``compaction_attention`` rows (empty when ``attention`` is False).
    """
    sid = pl.lit(tokens.session_id)
    runs = {s: run_setup(model, tokens, s, layers=layers, masked=masked, plant=plant, attention=attention)
            for s in SETUPS}
    att = (pl.concat([ca.attention_rows_table(tokens.session_id, s, runs[s][2], attention_spans(tokens, s, masked),
                                              list(layers)) for s in SETUPS]) if attention else ca.empty())
    idx = list(range(tokens.n_t3))
    states, kls = [], []
    for x, ref in PAIRS:
        pair = pl.lit(f"{x}_vs_{ref}")
        for layer in layers:
            rel, cos = state_distances(runs[x][1][layer], runs[ref][1][layer])
            states.append(pl.DataFrame({"t3_index": idx, "rel_l2": rel.numpy(), "cosine": cos.numpy()})
                          .select(session_id=sid, pair=pair, layer=pl.lit(layer, pl.Int32), t3_index="t3_index",
                                  rel_l2="rel_l2", cosine="cosine"))
        kl = next_token_kl(runs[ref][0], runs[x][0]).numpy()
        agree = (runs[ref][0].argmax(-1) == runs[x][0].argmax(-1)).numpy()
        kls.append(pl.DataFrame({"t3_index": idx, "kl": kl, "top1_agrees": agree})
                   .select(session_id=sid, pair=pair, t3_index="t3_index", kl="kl", top1_agrees="top1_agrees"))
    decode = []
    if max_new_tokens:
        cont = greedy_continuations(model, tokens, max_new_tokens, masked)
        for s in ("A", "B", "D"):
            decode.append(dict(session_id=tokens.session_id, setup=s,
                               first_divergence=first_divergence(cont[s], cont["C"]),
                               agree_fraction=float(np.mean([a == c for a, c in zip(cont[s], cont["C"])])),
                               n_new=max_new_tokens, text=model.tokenizer.decode(cont[s]),
                               text_full=model.tokenizer.decode(cont["C"])))
    last = {s: torch.stack([runs[s][1][layer][-1] for layer in layers]) for s in SETUPS}
    return pl.concat(states), pl.concat(kls), decode, last, att
