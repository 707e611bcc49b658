"""KV-cache eviction: which prompt keys a policy keeps, and what each decode step loses by it.

Eviction policies decide, once prefill is done, which of the P prompt positions
keep their keys and values; decode then attends to the kept prompt positions plus
everything it generates. Every policy here is a pure function over attention rows
and returns a boolean **kept mask** ``[L, H, P]`` (layer, head, prompt position).

Budget accounting (all policies): ``B`` is the number of prompt positions kept
per head, **including** the observation window, sinks or recent tokens the policy
always keeps. A budget is a fraction of P in (0, 1] (rounded up, at least 1) or a
count ≥ 1 (capped at P) — :func:`resolve_budget`. When ``B`` is not larger than
the always-kept part, the always-kept part is cut to its newest ``B`` positions.

Policies (``w`` = observation window, default 32; ``m`` = lookahead steps, default 8):

- ``snapkv`` — SnapKV (Li et al., 2024, "SnapKV: LLM Knows What You are Looking for
  Before Generation"): ``s_j = Σ_{i ∈ last w prompt queries} a_{i,j}`` for ``j < P − w``,
  average-pooled along j (kernel 5, stride 1, zero padding 2 counted in the average, as
  ``F.avg_pool1d``'s default and SnapKV's reference code do), keep the top ``B − w`` plus the
  window. Per head by default.
- ``h2o`` — H2O (Zhang et al., 2023, "H2O: Heavy-Hitter Oracle"): accumulated attention
  over every prompt query, ``s_j = Σ_{i<P} a_{i,j}``, top ``B − w`` heavy hitters plus the
  ``w`` most recent positions.
- ``streamingllm`` — StreamingLLM (Xiao et al., 2024, "Efficient Streaming Language Models
  with Attention Sinks"): the first 4 sink positions plus the ``B − 4`` most recent.
- ``pyramidkv`` — PyramidKV (Cai et al., 2024): per-layer budgets that fall linearly with
  depth (:func:`pyramid_budgets`, as its reference code: the part outside the window,
  ``c = B − w``, runs from ``2c − c/β`` at layer 0 to ``c/β`` at the last, mean ``c``, so the total
  is ``L · B``; a layer's budget is capped at P and the excess goes to the shallowest layers
  below P, so ``B = P`` keeps everything), each layer then selected as SnapKV.
- ``lookahead`` — LAQ-style (Lookahead Q-Cache, 2025): SnapKV's rule with the scores
  taken from the queries of the first ``m`` tokens of a draft generation.
- ``pseudo`` — DapQ-style position-aware pseudo queries: the window's tokens placed at the
  positions decode will occupy (``P … P+m−1``), their attention rows as the scores.
- ``oracle`` — the real decode queries of steps 1..m: the upper bound of any scorer.

``per_head=False`` sums the scores over a layer's heads and keeps one set for all of
them (the choice of GQA-style shared caches).

Per decode step, layer and head (:func:`step_costs`): ``recall_at_k`` — the share of
the decode row's top-k attended prompt positions that were kept (k' = min(k, P), ties
by lower position); ``evicted_mass`` — the attention the row puts on evicted prompt
positions (what the full model used and the evicted cache cannot give).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import polars as pl
import torch

from trajscope.errors import TrajscopeError
from trajscope.metrics.bands import depth_band_expr, sort_bands

POLICIES = ("snapkv", "h2o", "streamingllm", "pyramidkv", "lookahead", "pseudo", "oracle")
SINKS = 4
POOL = 5


def resolve_budget(budget: float | int, P: int) -> int:
    """Kept prompt positions per head for ``budget`` (a fraction in (0, 1] or a count ≥ 1)."""
    if isinstance(budget, bool):
        raise TrajscopeError(f"Budget {budget!r} is neither a fraction in (0, 1] nor a count ≥ 1.")
    if isinstance(budget, int) or (isinstance(budget, float) and budget > 1 and budget.is_integer()):
        if budget < 1:
            raise TrajscopeError(f"Budget {budget} is not a count ≥ 1 of prompt positions.")
        return min(int(budget), P)
    b = float(budget)
    if not 0 < b <= 1:
        raise TrajscopeError(f"Budget {budget} is not a fraction in (0, 1] of the prompt (nor a whole count ≥ 1).")
    return max(1, math.ceil(b * P))


def pyramid_budgets(budget: int, n_layers: int, beta: float = 20.0) -> list[int]:
    """PyramidKV's per-layer budgets: linear in depth from ``2B − B/β`` (layer 0) to ``B/β`` (last layer),
    mean ``B``, rounded so they sum to exactly ``n_layers · B`` (each at least 1).

    Example: ``pyramid_budgets(10, 4, beta=5)`` → ``[18, 13, 7, 2]`` (from 18 to 2 in steps of 16/3).
    """
    if n_layers == 1:
        return [budget]
    lo = budget / beta
    hi = 2 * budget - lo
    raw = [hi - (hi - lo) * layer / (n_layers - 1) for layer in range(n_layers)]
    out = [max(1, int(math.floor(r))) for r in raw]
    short = n_layers * budget - sum(out)
    order = sorted(range(n_layers), key=lambda i: -(raw[i] - math.floor(raw[i])))
    for i in order[: max(0, short)]:
        out[i] += 1
    return out


def _capped(budgets: list[int], P: int) -> list[int]:
    """Per-layer budgets capped at P, the excess handed to the shallowest layers still below P (same total)."""
    out = [min(b, P) for b in budgets]
    excess = sum(budgets) - sum(out)
    for i in range(len(out)):
        give = min(excess, P - out[i])
        out[i] += give
        excess -= give
    return out


def _pool(scores: torch.Tensor, kernel: int = POOL) -> torch.Tensor:
    """Average pool along the last axis (stride 1, same length; zero padding counted, as SnapKV's code)."""
    if scores.shape[-1] == 0 or kernel <= 1:
        return scores
    pad = kernel // 2
    shape = scores.shape
    x = scores.reshape(-1, 1, shape[-1]).float()
    s = torch.nn.functional.avg_pool1d(x, kernel, stride=1, padding=pad, count_include_pad=True)
    return s.reshape(shape)


def _keep(scores: torch.Tensor, P: int, budget: int, always: torch.Tensor) -> torch.Tensor:
    """``[H, P]`` mask: the ``always`` positions (newest first if over budget) plus the top scores."""
    H = scores.shape[0]
    mask = torch.zeros(H, P, dtype=torch.bool)
    fixed = [int(p) for p in always.tolist()]
    if len(fixed) >= budget:
        mask[:, sorted(fixed)[len(fixed) - budget:]] = True
        return mask
    mask[:, fixed] = True
    free = budget - len(fixed)
    s = scores.clone().float()
    s[:, fixed] = float("-inf")
    order = torch.argsort(-s, dim=-1, stable=True)[:, :free]  # ties: lower position first
    mask.scatter_(1, order, True)
    return mask


def _window(P: int, w: int) -> torch.Tensor:
    return torch.arange(max(0, P - w), P)


def _select_scored(scores: torch.Tensor, P: int, budget: int, w: int, per_head: bool, pool: bool) -> torch.Tensor:
    """``[H, P]`` from per-head scores ``[H, P]``: pool (optional), share across heads (optional), keep."""
    s = scores.clone().float()
    s[:, max(0, P - w):] = 0.0  # the window is kept anyway; it must not steal pooled mass from its neighbours
    if pool:
        s = _pool(s)
    if not per_head:
        s = s.sum(0, keepdim=True).expand_as(scores)
    return _keep(s, P, budget, _window(P, w))


@dataclasses.dataclass(frozen=True)
class Selection:
    """A policy's kept prompt positions.

    Attributes:
        policy, budget: as asked (``budget`` a fraction or a count).
        budget_tokens: kept positions per head (per layer for ``pyramidkv``: their mean).
        per_head: one set per head (True) or per layer (False).
        window: the observation / recent window w.
        mask: ``[L, H, P]`` bool, True = kept.
    """

    policy: str
    budget: float
    budget_tokens: float
    per_head: bool
    window: int
    mask: torch.Tensor

    def kept_positions(self, layer: int, head: int) -> list[int]:
        return torch.nonzero(self.mask[layer, head]).reshape(-1).tolist()

    def to_frame(self, run_id: str) -> pl.DataFrame:
        """The ``eviction_kept`` rows: run_id, policy, budget, layer, head, kept_pos (list of positions)."""
        L, H, _ = self.mask.shape
        rows = [(run_id, self.policy, float(self.budget), layer, head, self.kept_positions(layer, head))
                for layer in range(L) for head in range(H)]
        return pl.DataFrame(rows, schema={"run_id": pl.String, "policy": pl.String, "budget": pl.Float64,
                                          "layer": pl.Int16, "head": pl.Int16, "kept_pos": pl.List(pl.Int32)},
                            orient="row")


def select(policy: str, prefill: torch.Tensor, budget: float | int, *, window: int = 32,
           query_rows: torch.Tensor | None = None, per_head: bool = True, beta: float = 20.0) -> Selection:
    """Kept prompt positions of ``policy``.

    Args:
        policy: one of :data:`POLICIES`.
        prefill: ``[L, H, P, P]`` prefill attention (query × key) — SnapKV reads its last ``window``
            rows, H2O all of them.
        budget: a fraction of P in (0, 1] or a count.
        window: w, the observation window (SnapKV, PyramidKV, lookahead, pseudo, oracle) or the
            recent window (H2O).
        query_rows: ``[L, H, m, ≥P]`` attention rows of the queries that ``lookahead`` (draft
            tokens), ``pseudo`` (pseudo queries) or ``oracle`` (real decode steps 1..m) score with.
        per_head: one set per head (True) or shared by a layer's heads (False).
        beta: PyramidKV's steepness (first layer ``2B − B/β``, last ``B/β``).
    Returns:
        A :class:`Selection` with ``mask [L, H, P]``.
    Raises:
        TrajscopeError: unknown policy, bad budget, window longer than the prompt, missing query rows.
    """
    if policy not in POLICIES:
        raise TrajscopeError(f"Unknown eviction policy '{policy}': choose among {', '.join(POLICIES)}.")
    if prefill.dim() != 4 or prefill.shape[-1] != prefill.shape[-2]:
        raise TrajscopeError(f"Prefill attention must be [layers, heads, P, P]; got shape {tuple(prefill.shape)}.")
    L, H, P, _ = prefill.shape
    if not 1 <= window <= P:
        raise TrajscopeError(f"The window ({window}) is longer than the prompt ({P} tokens); use a window ≤ {P}.")
    B = resolve_budget(budget, P)
    a = prefill.float()
    masks, mean_budget = [], float(B)
    if policy == "streamingllm":
        keep = torch.zeros(H, P, dtype=torch.bool)
        sinks = min(SINKS, B)
        keep[:, :sinks] = True
        if B > sinks:
            keep[:, P - (B - sinks):] = True
        masks = [keep] * L
    elif policy == "h2o":
        for layer in range(L):
            masks.append(_select_scored(a[layer].sum(1), P, B, window, per_head, pool=False))
    elif policy in ("snapkv", "pyramidkv"):
        if policy == "pyramidkv":
            w_in = min(window, B)
            budgets = _capped([w_in + c for c in pyramid_budgets(B - w_in, L, beta)], P) if B > w_in else [B] * L
        else:
            budgets = [B] * L
        mean_budget = sum(budgets) / L
        for layer in range(L):
            masks.append(_select_scored(a[layer, :, P - window:].sum(1), P, min(P, budgets[layer]), window,
                                        per_head, pool=True))
    else:
        if query_rows is None:
            raise TrajscopeError(f"The '{policy}' policy scores with query rows (draft, pseudo or decode queries); "
                                 "pass query_rows=[layers, heads, m, keys].")
        q = query_rows[..., :P].float()
        for layer in range(L):
            masks.append(_select_scored(q[layer].sum(1), P, B, window, per_head, pool=True))
    return Selection(policy, float(budget), mean_budget, per_head, window, torch.stack(masks))


def split_rows(rows: torch.Tensor, prompt_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A capture's ``attention_rows`` of one layer ``[H, n, n]`` → prefill ``[H, P, P]``, decode ``[S, H, n]``."""
    P = prompt_len
    return rows[:, :P, :P], rows[:, P:, :].permute(1, 0, 2)


def step_costs(selection: Selection, decode: torch.Tensor, prompt_len: int, k: int = 8,
               first_step: int = 1) -> pl.DataFrame:
    """Per decode step, layer and head: recall of the row's top-k prompt keys in the kept set, and evicted mass.

    Args:
        selection: the policy's :class:`Selection`.
        decode: ``[L, S, H, K]`` attention rows of S decode queries (keys ``K ≥ P``; prompt keys first).
        prompt_len: P.
        k: top-k prompt keys per row (k' = min(k, P)); ties by lower position.
        first_step: the step of ``decode[:, 0]`` (1 = the first decode step).
    Returns:
        ``step, layer, head, recall_at_k, evicted_mass`` (one row per step × layer × head).
    """
    P = prompt_len
    a = decode[..., :P].float()  # [L, S, H, P]
    L, S, H, _ = a.shape
    kk = min(k, P)
    kept = selection.mask[:, None, :, :].expand(L, S, H, P)
    order = torch.argsort(-a, dim=-1, stable=True)[..., :kk]
    recall = kept.gather(-1, order).float().mean(-1)
    evicted = (a * (~kept).float()).sum(-1)
    grid = torch.meshgrid(torch.arange(L), torch.arange(S), torch.arange(H), indexing="ij")
    return pl.DataFrame({
        "step": (grid[1].reshape(-1) + first_step).numpy().astype("int32"),
        "layer": grid[0].reshape(-1).numpy().astype("int16"), "head": grid[2].reshape(-1).numpy().astype("int16"),
        "recall_at_k": recall.reshape(-1).numpy(), "evicted_mass": evicted.reshape(-1).numpy()})


def depth_summary(costs: pl.DataFrame, by: Sequence[str] = ("policy", "budget")) -> pl.DataFrame:
    """Means of ``recall_at_k`` and ``evicted_mass`` by the ``by`` columns and decode-depth band."""
    keys = [c for c in by if c in costs.columns]
    out = (costs.with_columns(depth_band_expr(pl.col("step")).alias("depth_band"))
           .group_by(*keys, "depth_band").agg(pl.col("recall_at_k", "evicted_mass").mean(), pl.len().alias("n")))
    return sort_bands(out, *keys, "depth_band")


def key_mask(selection: Selection, n_positions: int) -> torch.Tensor:
    """``[L, H, n_positions]`` keys that decode queries may see: kept prompt positions and every generated one."""
    L, H, P = selection.mask.shape
    out = torch.ones(L, H, n_positions, dtype=torch.bool)
    out[:, :, :P] = selection.mask
    return out
