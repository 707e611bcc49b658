"""KV-cache eviction: which prompt keys a policy keeps, and what each decode step loses by it.

Eviction policies decide, once prefill is done, which of the P prompt positions
keep their keys and values; decode then attends to the kept prompt positions plus
everything it generates. Every policy here is a pure function over attention rows
and returns a boolean **kept mask** ``[L, H, P]`` (layer, head, prompt position).

Budget accounting (all policies): ``B`` is the number of prompt positions kept
per head, **including** the observation window, sinks or recent tokens the policy
always keeps. A budget is a fraction of P in (0, 1] (rounded up, at least 1) or a
count ≥ 1 (capped at P) — :func:`resolve_budget`. ``B = P`` keeps everything (the
reference code returns the cache untouched). A budget below P that is not larger
than what the policy always keeps (the window; StreamingLLM's 4 sinks) raises one
sentence: the reference code refuses it (``assert max_capacity_prompt − window_size
> 0``), and every window-scored policy would keep the same newest tokens.

Policies (``w`` = observation window, default 32; ``m`` = lookahead steps, default 8). Reference code:
KVCache-Factory (Zefan-Cai/KVCache-Factory) ``pyramidkv/pyramidkv_utils.py`` and Lookahead_Q-Cache
(noforit/Lookahead_Q-Cache); the tests re-implement each cluster's ``update_kv`` on fixed attention.

- ``snapkv`` — SnapKV (Li et al., 2024), ``SnapKVCluster.update_kv``: ``s_j = Σ_{i ∈ last w prompt queries}
  a_{i,j}`` for ``j < P − w``, pooled along j (average, kernel 5, stride 1, zero padding 2 counted in the average,
  as ``F.avg_pool1d``'s default; ``pooling=("max", 7)`` for LAQ's stage 1), keep the top ``B − w`` plus the window.
  Per head by default.
- ``h2o`` — H2O (Zhang et al., 2023), ``H2OKVCluster.update_kv``: accumulated attention over every prompt query,
  ``s_j = Σ_{i<P} a_{i,j}``, no pooling, top ``B − w`` heavy hitters plus the ``w`` most recent positions. Decided
  once after prefill; the paper's rolling eviction during decode is not modelled.
- ``streamingllm`` — StreamingLLM (Xiao et al., 2024; mit-han-lab/streaming-llm ``start_size=4``): the first 4
  sink positions plus the ``B − 4`` most recent. Deliberate difference: KVCache-Factory's
  ``StreamingLLMKVCluster`` keeps the first ``B − w`` positions plus the window instead; trajscope follows the
  paper and its own code. Decided once after prefill (no rolling eviction during decode).
- ``pyramidkv`` — PyramidKV (Cai et al., 2024), ``PyramidKVCluster.update_kv``: per-layer budgets that fall with
  depth, each layer then selected as SnapKV. ``schedule="code"`` (default) is the reference code's integer
  schedule (:func:`pyramid_code_capacities`: floored steps that overspend, uniform above ``B > P/2 + w``);
  ``schedule="paper"`` the paper's line from ``2c − c/β`` to ``c/β`` for ``c = B − w``, summing to ``L · B``
  (:func:`pyramid_budgets`).
- ``lookahead`` — LAQ (Lookahead Q-Cache, 2025): the last ``w`` prompt queries plus the queries of a greedy
  ``m``-token draft made on the SnapKV-compressed cache, renormalised over prompt keys, max-pooled with kernel 7
  (:mod:`trajscope.metrics.eviction_laq`, which lists each deliberate difference).
- ``pseudo`` — DapQ-style position-aware pseudo queries: the last ``m`` prompt tokens placed again at the
  positions decode will occupy (``P … P+m−1``), their attention rows over the prompt keys as the scores.
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
import polars as pl
import torch

from trajscope.errors import TrajscopeError

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
    """PyramidKV's per-layer budgets **as its paper writes them** (``schedule="paper"``): linear in depth from
    ``2B − B/β`` (layer 0) to ``B/β`` (last layer), mean ``B``, rounded so they sum to exactly ``n_layers · B``
    (each at least 1).

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


def pyramid_code_capacities(budget: int, window: int, prompt_len: int, n_layers: int, beta: int = 20) -> list[int]:
    """PyramidKV's per-layer capacities outside the window **as its reference code computes them**
    (``schedule="code"``, the default): KVCache-Factory ``pyramidkv/pyramidkv_utils.py``,
    ``PyramidKVCluster.update_kv``, line for line in integer arithmetic::

        min_num = (B − w) // β;  max_num = 2(B − w) − min_num
        if max_num ≥ P − w: max_num = P − w;  min_num = 2(B − w) − max_num
        steps = (max_num − min_num) // (L − 1);  capacity_l = max_num − l · steps
        P < B: keep everything;  P < 2(B − w): every layer B − w (uniform);  else capacity_l

    What this gives, unlike the paper: ``steps`` is floored, so deeper layers keep more than the paper's line
    and the total overspends (e.g. 22.4% of the prompt kept at budget 0.2 on the shipped prompts); and above
    ``B > P/2 + w`` every layer gets the same ``B − w`` (SnapKV). ``L = 1`` (the code divides by zero) is
    uniform here. Each layer then keeps ``capacity_l`` top-scored positions plus the window.

    Example: ``pyramid_code_capacities(40, 8, 200, 4, beta=20)`` → min 1, max 63, steps 20 → ``[63, 43, 23, 3]``.
    """
    B, w, P, L = int(budget), int(window), int(prompt_len), int(n_layers)
    if P < B:
        return [P - w] * L
    if P < 2 * (B - w) or L == 1:
        return [B - w] * L
    min_num = (B - w) // int(beta)
    max_num = (B - w) * 2 - min_num
    if max_num >= P - w:
        max_num = P - w
        min_num = (B - w) * 2 - max_num
    steps = (max_num - min_num) // (L - 1)
    return [max_num - layer * steps for layer in range(L)]


def _capped(budgets: list[int], P: int) -> list[int]:
    """Per-layer budgets capped at P, the excess handed to the shallowest layers still below P (same total)."""
    out = [min(b, P) for b in budgets]
    excess = sum(budgets) - sum(out)
    for i in range(len(out)):
        give = min(excess, P - out[i])
        out[i] += give
        excess -= give
    return out


def _pool(scores: torch.Tensor, kernel: int = POOL, kind: str = "avg") -> torch.Tensor:
    """Pool along the last axis (stride 1, padding ``kernel // 2``, same length), as the reference code's
    ``F.avg_pool1d`` (zero padding counted in the average) or ``F.max_pool1d`` (padding never wins)."""
    if scores.shape[-1] == 0 or kernel <= 1:
        return scores
    pad = kernel // 2
    shape = scores.shape
    x = scores.reshape(-1, 1, shape[-1]).float()
    if kind == "max":
        s = torch.nn.functional.max_pool1d(x, kernel, stride=1, padding=pad)
    else:
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


def _select_scored(scores: torch.Tensor, P: int, budget: int, w: int, per_head: bool,
                   pool: tuple[str, int] | None) -> torch.Tensor:
    """``[H, P]`` from per-head scores ``[H, P]``: pool (``(kind, kernel)`` or None), share across heads
    (optional), keep the window plus the top ``budget − w``."""
    s = scores.clone().float()
    s[:, max(0, P - w):] = 0.0  # the window is kept anyway; the code pools only keys before it (zeros ≡ its padding)
    if pool:
        s = _pool(s, pool[1], pool[0])
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
           query_rows: torch.Tensor | None = None, per_head: bool = True, beta: float = 20.0,
           schedule: str = "code", pooling: tuple[str, int] = ("avg", POOL), laq_mask: str = "reference") -> Selection:
    """Kept prompt positions of ``policy``.

    Args:
        policy: one of :data:`POLICIES`.
        prefill: ``[L, H, n, P]`` prefill attention rows of the last ``n`` prompt queries (``n = P``: all) —
            SnapKV, PyramidKV and LAQ read the last ``window`` rows, H2O all P of them.
        budget: a fraction of P in (0, 1] or a count.
        window: w, the observation window (SnapKV, PyramidKV, lookahead, pseudo, oracle) or the
            recent window (H2O).
        query_rows: ``[L, H, m, ≥P]`` attention rows of the queries that ``lookahead`` (the LAQ draft's,
            over every prompt key: :mod:`trajscope.metrics.eviction_laq`), ``pseudo`` (pseudo queries) or
            ``oracle`` (real decode steps 1..m) score with.
        per_head: one set per head (True) or shared by a layer's heads (False).
        beta: PyramidKV's steepness.
        schedule: PyramidKV's per-layer budgets: ``"code"`` (its reference code's integer schedule,
            :func:`pyramid_code_capacities`) or ``"paper"`` (the paper's formula, :func:`pyramid_budgets`).
        pooling: ``(kind, kernel)`` of the window-scored policies other than ``lookahead`` (``"avg"`` or
            ``"max"``); SnapKV's reference default is ``("avg", 5)``, LAQ's stage 1 ``("max", 7)``.
        laq_mask: ``lookahead``'s block mask, ``"reference"`` or ``"positions"``
            (:func:`~trajscope.metrics.eviction_laq.laq_scores`).
    Returns:
        A :class:`Selection` with ``mask [L, H, P]``.
    Raises:
        TrajscopeError: unknown policy or schedule, bad budget, window longer than the prompt, a budget below
        P that is not larger than the window (the reference code refuses it), missing query rows.
    """
    from trajscope.metrics.eviction_laq import KERNEL, laq_scores

    if policy not in POLICIES:
        raise TrajscopeError(f"Unknown eviction policy '{policy}': choose among {', '.join(POLICIES)}.")
    if schedule not in ("code", "paper"):
        raise TrajscopeError(f"Unknown PyramidKV schedule '{schedule}': choose 'code' or 'paper'.")
    if prefill.dim() != 4 or prefill.shape[-2] > prefill.shape[-1]:
        raise TrajscopeError(f"Prefill attention must be [layers, heads, n, P] (the last n ≤ P prompt queries); "
                             f"got shape {tuple(prefill.shape)}.")
    L, H, n, P = prefill.shape
    if not 1 <= window <= P:
        raise TrajscopeError(f"The window ({window}) is longer than the prompt ({P} tokens); use a window ≤ {P}.")
    if n < (P if policy == "h2o" else window):
        raise TrajscopeError(f"'{policy}' reads the last {P if policy == 'h2o' else window} prefill query rows; "
                             f"only {n} were given.")
    B = resolve_budget(budget, P)
    if B >= P:  # the reference code returns the cache untouched (q_len < max_capacity_prompt)
        return Selection(policy, float(budget), float(P), per_head, window, torch.ones(L, H, P, dtype=torch.bool))
    always = SINKS if policy == "streamingllm" else window
    if B <= always:
        what = "4 attention sinks" if policy == "streamingllm" else f"window ({window})"
        raise TrajscopeError(f"A budget of {B} tokens is not larger than the {what}, so '{policy}' would keep only "
                             f"what it always keeps (the reference code refuses it); raise the budget or shrink "
                             f"the window.")
    a = prefill.float()
    masks, mean_budget = [], float(B)
    if policy == "streamingllm":
        keep = torch.zeros(H, P, dtype=torch.bool)
        keep[:, :SINKS] = True
        keep[:, P - (B - SINKS):] = True
        masks = [keep] * L
    elif policy == "h2o":
        for layer in range(L):
            masks.append(_select_scored(a[layer].sum(1), P, B, window, per_head, pool=None))
    elif policy in ("snapkv", "pyramidkv"):
        if policy == "snapkv":
            budgets = [B] * L
        elif schedule == "code":
            budgets = [window + c for c in pyramid_code_capacities(B, window, P, L, int(beta))]
        else:
            budgets = _capped([window + c for c in pyramid_budgets(B - window, L, beta)], P)
        mean_budget = sum(budgets) / L
        for layer in range(L):
            masks.append(_select_scored(a[layer, :, n - window:].sum(1), P, budgets[layer], window, per_head,
                                        pool=pooling))
    else:
        if query_rows is None:
            raise TrajscopeError(f"The '{policy}' policy scores with query rows (draft, pseudo or decode queries); "
                                 "pass query_rows=[layers, heads, m, keys].")
        for layer in range(L):
            if policy == "lookahead":
                s = laq_scores(a[layer, :, n - window:], query_rows[layer], laq_mask)
                masks.append(_select_scored(s, P, B, window, per_head, pool=("max", KERNEL)))
            else:
                masks.append(_select_scored(query_rows[layer, ..., :P].float().sum(1), P, B, window, per_head,
                                            pool=pooling))
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


def key_mask(selection: Selection, n_positions: int) -> torch.Tensor:
    """``[L, H, n_positions]`` keys that decode queries may see: kept prompt positions and every generated one."""
    L, H, P = selection.mask.shape
    out = torch.ones(L, H, n_positions, dtype=torch.bool)
    out[:, :, :P] = selection.mask
    return out
