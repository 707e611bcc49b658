"""The worker-side monitor: one forward's flattened tokens mapped to requests, scored and steered in batch.

vLLM runs every scheduled token of every request in one flattened batch: a forward
sees ``[T, d_model]`` rows, request after request, each request's rows contiguous
(its prefill chunk, or one decode token). The model runner knows, per forward, the
request order (``input_batch.req_ids``), where each request's rows start
(``query_start_loc``) and each token's absolute position. :meth:`Monitor.begin`
turns these into a :class:`BatchView`: for every token its request, ``pos`` and
``step`` (:func:`trajscope.positions.query_step`: 0 for prompt positions, ``pos − P + 1``
after), with the positions a prefix-cache hit skipped never computed (the first
position a request computes is its ``prefix_cached_tokens``).

Per forward, at the monitored layer of each tracked request, :meth:`Monitor.on_layer`
gathers the tracked rows once and computes in batched tensor ops:

- residual statistics (:func:`trajscope.metrics.residual_stats.residual_stats`, each
  vector's own median |x| as the massive-rule reference);
- the drift score against a prefill profile, ``sqrt(mean_d((x_d − μ_d)² / σ_d²))``
  (:meth:`trajscope.profile.ReferenceProfile.score`), one group per profile;
- the SAE's top-k features and reconstruction error (:func:`trajscope.sae.model.sae_features`:
  one encode of all rows, a TopK), one group per SAE;

and at each steered layer adds ``strength · direction`` to the rows of tokens whose
step is ≥ the request's start step k (one ``index_add``), so the token produced by
step k − 1 and every token before it are those of the unsteered run.

vLLM's decoder layers return ``(hidden, residual)`` and fuse the addition into the next
layer's norm, so the block output (the residual stream Hugging Face reports) is
``hidden + residual``; steering adds to ``hidden``. The next-token distribution
comes from the rows ``compute_logits`` returns (one per request, at its last scheduled
position): entropy, top-k, and the logprob of the token that follows.

This module is plain torch: :mod:`trajscope.vllm.plugin` connects it to vLLM.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import numpy as np
import torch

from trajscope import positions
from trajscope.metrics.residual_stats import residual_stats
from trajscope.vllm.catalogue import Catalogue
from trajscope.vllm.request import RequestPlan

TOP_K_TOKENS = 5


@dataclasses.dataclass
class Tracked:
    """One tracked request's state in the worker, and what it has recorded so far."""

    req_id: str
    plan: RequestPlan
    prompt_ids: list[int]
    sampling: dict
    first_pos: int | None = None
    rows: list[dict] = dataclasses.field(default_factory=list)  # per forward: pos, act, score, sae, resid
    dist: dict[int, tuple] = dataclasses.field(default_factory=dict)  # pos -> (entropy, top_ids, top_lp)
    chosen_lp: dict[int, float] = dataclasses.field(default_factory=dict)
    last_logp: torch.Tensor | None = None
    last_logp_pos: int = -1
    n_forwards: int = 0

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)


@dataclasses.dataclass
class BatchView:
    """One forward's map from flattened tokens to tracked requests.

    Attributes:
        spans: per tracked request ``(tracked, start, end)``: its rows ``[start, end)`` of the batch.
        logit_rows: per tracked request its row in ``compute_logits``' output (its index in the batch).
        pos, step: ``[T]`` absolute position and query step of every token (−1 for untracked tokens' step).
        reads: monitored layer -> ``(row index [m], [(tracked, a, b)])``: the gathered rows and each request's slice.
        steer: steered layer -> ``(row index [n], delta [n, d])``.
    """

    spans: list[tuple[Tracked, int, int]]
    logit_rows: list[tuple[Tracked, int]]
    pos: torch.Tensor
    step: torch.Tensor
    reads: dict[int, tuple[torch.Tensor, list[tuple[Tracked, int, int]]]]
    steer: dict[int, tuple[torch.Tensor, torch.Tensor]]


class Monitor:
    """Tracks the requests that asked for trajscope, across forwards, in one worker.

    Args:
        catalogue: the server's SAEs, profiles and vectors.
        n_layers, d_model: the served model's shape.
    """

    def __init__(self, catalogue: Catalogue, n_layers: int, d_model: int):
        self.catalogue = catalogue
        self.n_layers, self.d_model = n_layers, d_model
        self.tracked: dict[str, Tracked] = {}
        self.view: BatchView | None = None
        self.view_reqs = 0  # requests in the current forward (compute_logits returns one row each)
        self._profile_cache: dict[tuple[str, int], tuple[torch.Tensor, torch.Tensor, float]] = {}

    # -- requests ------------------------------------------------------------------------------
    def track(self, req_id: str, plan: RequestPlan, prompt_ids: Sequence[int], sampling: dict) -> Tracked:
        t = Tracked(req_id=req_id, plan=plan, prompt_ids=[int(i) for i in prompt_ids], sampling=sampling)
        self.tracked[req_id] = t
        return t

    def pop(self, req_id: str) -> Tracked | None:
        return self.tracked.pop(req_id, None)

    # -- one forward ---------------------------------------------------------------------------
    def begin(self, req_ids: Sequence[str], query_start_loc: np.ndarray, pos: torch.Tensor,
              input_ids: torch.Tensor | None) -> BatchView | None:
        """Map this forward's tokens to tracked requests (None when none of them is tracked).

        Args:
            req_ids: the batch's request ids in row order; query_start_loc: ``[n_reqs + 1]`` row offsets.
            pos: ``[T]`` absolute positions; input_ids: ``[T]`` token ids (for the logprob of each new token).
        """
        spans, logit_rows = [], []
        for r, rid in enumerate(req_ids):
            t = self.tracked.get(rid)
            if t is not None:
                a, b = int(query_start_loc[r]), int(query_start_loc[r + 1])
                if b > a:
                    spans.append((t, a, b))
                    logit_rows.append((t, r))
        if not spans:
            return None
        T = int(query_start_loc[len(req_ids)])
        pos = pos[:T].to(torch.int64)
        step = torch.full((T,), -1, dtype=torch.int64)
        reads: dict[int, list] = {}
        steer: dict[int, list] = {}
        for t, a, b in spans:
            p = pos[a:b]
            step[a:b] = torch.from_numpy(np.asarray(positions.query_step(p.numpy(), t.prompt_len)))
            first = int(p[0])
            t.first_pos = first if t.first_pos is None else min(t.first_pos, first)
            t.n_forwards += 1
            if input_ids is not None and t.last_logp is not None and first == t.last_logp_pos + 1:
                t.chosen_lp[first] = float(t.last_logp[int(input_ids[a])])
            reads.setdefault(t.plan.layer, []).append((t, a, b))
            if t.plan.steered:
                on = torch.nonzero(step[a:b] >= t.plan.start_step).reshape(-1)
                if on.numel():
                    steer.setdefault(t.plan.steer_layer, []).append((on + a, t.plan.steer_direction * t.plan.strength))
        read_idx = {}
        for layer, items in reads.items():
            idx = torch.cat([torch.arange(a, b) for _, a, b in items])
            sl, o = [], 0
            for t, a, b in items:
                sl.append((t, o, o + b - a))
                o += b - a
            read_idx[layer] = (idx, sl)
        steer_idx = {layer: (torch.cat([i for i, _ in items]),
                             torch.cat([v.unsqueeze(0).expand(len(i), -1) for i, v in items]))
                     for layer, items in steer.items()}
        self.view = BatchView(spans, logit_rows, pos, step, read_idx, steer_idx)
        return self.view

    def end(self) -> None:
        self.view = None

    def layers(self) -> set[int]:
        """Every layer some tracked request reads or steers (the hooks of other layers return at once)."""
        return {t.plan.layer for t in self.tracked.values()} | {t.plan.steer_layer for t in self.tracked.values()
                                                                 if t.plan.steered}

    def on_layer(self, layer: int, hidden: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor | None:
        """A decoder layer's output: returns the steered ``hidden`` (or None when unchanged) after recording
        the monitored rows of ``hidden + residual``."""
        v = self.view
        if v is None:
            return None
        out = None
        if layer in v.steer:
            idx, delta = v.steer[layer]
            out = hidden.index_add(0, idx.to(hidden.device), delta.to(hidden.device, hidden.dtype))
            hidden = out
        if layer in v.reads:
            idx, slices = v.reads[layer]
            stream = hidden if residual is None else hidden + residual
            self._record(layer, stream.index_select(0, idx.to(stream.device)).float(), idx, slices)
        return out

    @torch.no_grad()
    def _record(self, layer: int, x: torch.Tensor, idx: torch.Tensor, slices: list) -> None:
        v = self.view
        act = residual_stats(x)
        scores = torch.full((x.shape[0],), float("nan"), dtype=torch.float64)
        for name, rows in _groups(slices, lambda t: t.plan.profile).items():
            mu, inv_var, _ = self._profile(name, layer)
            scores[rows] = ((x[rows].double() - mu).pow(2) * inv_var).mean(-1).sqrt()
        sae_out: dict[str, tuple[dict, dict[int, int]]] = {}  # SAE name -> (outputs, gathered row -> output row)
        for name, rows in _groups(slices, lambda t: t.plan.sae).items():
            from trajscope.sae.model import sae_features

            k = max(t.plan.sae_top_k for t, _, _ in slices if t.plan.sae == name)
            sae_out[name] = (sae_features(self.catalogue.sae(name), x[rows], k),
                             {r: j for j, r in enumerate(rows.tolist())})
        pos = v.pos.index_select(0, idx)
        for t, a, b in slices:
            rec = {"layer": layer, "pos": pos[a:b], "act": act[a:b]}
            if t.plan.profile is not None:
                rec["score"] = scores[a:b]
            if t.plan.sae is not None:
                out, where = sae_out[t.plan.sae]
                j0 = where[a]
                kk = t.plan.sae_top_k
                rec["sae"] = {key: (val[j0:j0 + b - a, :kk] if val.dim() == 2 else val[j0:j0 + b - a])
                              for key, val in out.items()}
            if t.plan.keep_residuals:
                rec["resid"] = x[a:b].clone()
            t.rows.append(rec)

    def _profile(self, name: str, layer: int) -> tuple[torch.Tensor, torch.Tensor, float]:
        key = (name, layer)
        if key not in self._profile_cache:
            p = self.catalogue.profile(name)
            self._profile_cache[key] = (p.mean[layer].double(), 1.0 / p.var[layer].double().clamp_min(1e-12),
                                        float(p.threshold[layer]))
        return self._profile_cache[key]

    def threshold(self, name: str, layer: int) -> float:
        return self._profile(name, layer)[2]

    @torch.no_grad()
    def on_logits(self, logits: torch.Tensor) -> None:
        """``compute_logits``' output ``[n_reqs, vocab]``: the next-token distribution at each tracked
        request's last scheduled position."""
        v = self.view
        if v is None or not v.logit_rows:
            return
        rows = torch.tensor([r for _, r in v.logit_rows])
        if int(rows.max()) >= logits.shape[0]:
            return  # not one row per request (speculative decoding): no distribution is recorded
        logp = torch.log_softmax(logits.index_select(0, rows.to(logits.device)).float(), dim=-1).cpu()
        ent = -(logp.exp() * logp).sum(-1)
        top_lp, top_ids = logp.topk(TOP_K_TOKENS, dim=-1)
        for j, ((t, _), (_, a, b)) in enumerate(zip(v.logit_rows, v.spans)):
            q = int(v.pos[b - 1])
            t.dist[q] = (float(ent[j]), top_ids[j].tolist(), top_lp[j].tolist())
            t.last_logp, t.last_logp_pos = logp[j], q


def _groups(slices: list, key: Callable[[Tracked], Any]) -> dict[Any, torch.Tensor]:
    """Row indices (into the gathered rows) of the requests sharing each non-None ``key``."""
    out: dict[Any, list] = {}
    for t, a, b in slices:
        k = key(t)
        if k is not None:
            out.setdefault(k, []).append(torch.arange(a, b))
    return {k: torch.cat(v) for k, v in out.items()}
