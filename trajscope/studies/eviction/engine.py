"""The KV-eviction study: what each policy's choice of prompt keys costs decode, step by step.

For every prompt, :func:`eviction`:

1. captures the full run (greedy, ``max_new_tokens`` steps, every layer's attention rows kept);
2. scores prompt keys with each policy of :mod:`trajscope.metrics.eviction` — SnapKV, H2O,
   StreamingLLM and PyramidKV from the prefill attention; ``lookahead`` as LAQ does, per budget:
   the window's queries plus those of a greedy ``m``-token draft made on the SnapKV-compressed
   cache (:mod:`trajscope.studies.eviction.queries`); ``pseudo`` from the last ``m`` prompt tokens
   placed again at positions ``P … P+m−1`` (one forward, their rows over the prompt keys);
   ``oracle`` from the real decode queries of steps 1..m — and keeps each budget's top prompt
   positions;
3. measures, per decode step, layer and head, the recall of the step's top-k attended prompt
   positions inside the kept set and the attention mass on evicted positions (the full run's
   rows: what the model actually looked at);
4. re-runs decode with the evicted prompt keys masked out of attention for every decode query
   (the model boundary's key mask — the real model, not a re-implementation): teacher-forced on
   the full run's tokens, the per-step KL(p_full ‖ p_masked) of the next-token distribution and
   ``forced_agrees``; and free-running greedy, ``token_agrees`` and the first step where it fails.

Two token agreements, because they answer two questions:

- ``token_agrees`` (free-running): the masked model decodes on its own; does its token at step s
  equal the full run's? After the first divergence the two continuations have different
  contexts, so later steps mostly disagree whatever the cache keeps: the mean is dominated by
  *when* the first divergence happens. Read it with :func:`first_divergence`.
- ``forced_agrees`` (teacher-forced): both caches see the full run's tokens; does the masked
  cache's greedy choice at step s equal the full cache's? Every step is scored on the same
  context, so one divergence does not spill into later steps: the share of steps whose greedy
  token the eviction changes.

Tables of the :class:`~trajscope.studies.registry.Result` (Parquet when saved): ``eviction_kept`` (run_id,
policy, budget, layer, head, kept_pos), ``eviction_steps`` (run_id, policy, budget, step, layer, head,
recall_at_k, evicted_mass), ``eviction_rerun`` (run_id, policy, budget, step, kl_to_full, token_agrees,
forced_agrees), ``eviction_survival`` (first divergence as a censored time-to-event,
:func:`divergence_survival`), ``eviction_split`` and ``eviction_split_summary`` when the per-step vs
accumulated split is asked (:mod:`trajscope.studies.eviction.split`), and ``eviction_summary``, the one
home of the study's means and intervals (:mod:`trajscope.studies.eviction.summary`).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import polars as pl
import torch

from trajscope import positions
from trajscope.capture import CaptureConfig, capture
from trajscope.errors import TrajscopeError
from trajscope.metrics import eviction as ev
from trajscope.studies.eviction import summary as sm
from trajscope.studies.registry import Result

def _rows(traj) -> tuple[torch.Tensor, torch.Tensor]:
    """``[L, H, P, P]`` prefill and ``[L, S, H, n]`` decode attention rows of a capture with every layer kept."""
    L = traj.meta["model"]["n_layers"]
    parts = [ev.split_rows(traj.attention_rows(layer), traj.prompt_len) for layer in range(L)]
    return torch.stack([p for p, _ in parts]), torch.stack([d for _, d in parts])


def _query_rows(model, traj, policy: str, m: int) -> torch.Tensor | None:
    """``[L, H, m', P]`` rows that ``pseudo`` / ``oracle`` score with (None for the others; ``lookahead``'s
    draft depends on the budget: :func:`~trajscope.studies.eviction.queries.laq_rows`)."""
    from trajscope.studies.eviction import queries as eq

    P = traj.prompt_len
    if policy == "oracle":
        _, dec = _rows(traj)
        return dec[:, :m, :, :P].permute(0, 2, 1, 3)
    if policy == "pseudo":
        return eq.pseudo_rows(model, traj.token_ids[:P], m)
    return None


def _rerun(model, traj, sel: ev.Selection, full_logits: torch.Tensor, run_id: str) -> pl.DataFrame:
    """Per step: KL(full ‖ masked) and greedy agreement teacher-forced on the full run's tokens, and free-running
    token agreement (module docstring)."""
    P, ids = traj.prompt_len, traj.token_ids
    n_new = len(ids) - P
    mask = ev.key_mask(sel, len(ids))
    masked = model.forward(ids[:-1], prompt_len=P, key_mask=mask).logits
    lp_full, lp_masked = full_logits[P - 1:].log_softmax(-1), masked[P - 1:].log_softmax(-1)
    kl = (lp_full.exp() * (lp_full - lp_masked)).sum(-1).clamp_min(0.0)
    forced = (lp_full.argmax(-1) == lp_masked.argmax(-1))[:n_new].tolist()
    free = model.masked_decode(ids[:P], n_new, mask)
    agree = [free[positions.produced_pos(s, P)] == ids[positions.produced_pos(s, P)] for s in range(n_new)]
    return pl.DataFrame({"run_id": [run_id] * n_new, "policy": [sel.policy] * n_new,
                         "budget": [float(sel.budget)] * n_new, "step": list(range(n_new)),
                         "kl_to_full": kl[:n_new].double().tolist(), "token_agrees": agree, "forced_agrees": forced},
                        schema_overrides={"step": pl.Int32})


def eviction(model: Any, prompts: Sequence[str | dict], policies: Sequence[str] = ev.POLICIES,
             budgets: Sequence[float | int] = (0.1, 0.2, 0.5), *, max_new_tokens: int = 32, window: int = 16,
             lookahead: int = 8, k: int = 8, per_head: bool = True, rerun: bool = True,
             progress: Callable[[int, int], None] | None = None, split: bool = False,
             pyramid_schedule: str = "code", config: dict | None = None) -> Result:
    """Run the eviction study over ``prompts``.

    Args:
        model: a :class:`~trajscope.model.ModelHandle` whose attention can be read (``attn="rows"`` or ``"eager"``).
        prompts: texts, or dicts with ``prompt`` and optional ``id``.
        policies: names from :data:`trajscope.metrics.eviction.POLICIES`.
        budgets: fractions of P in (0, 1] or counts.
        max_new_tokens: decode steps of each full run (EOS does not stop it).
        window: the observation / recent window w (must fit every prompt).
        lookahead: m, the draft / pseudo / oracle query count.
        k: top-k attended prompt positions for recall.
        per_head: one kept set per head (True) or per layer.
        rerun: also run the masked re-runs (KL and token agreement).
        pyramid_schedule: PyramidKV's per-layer budgets, ``"code"`` (its reference code's) or ``"paper"``.
        split: also split the damage into per-step and accumulated arms (:mod:`trajscope.studies.eviction.split`;
            the ``eviction_split`` tables).
        progress: ``(done, total)`` after each prompt.
        config: the config to record in the Result (default: these arguments).
    Returns:
        The eviction study's :class:`~trajscope.studies.registry.Result` (module docstring for its tables;
        its summaries are :func:`~trajscope.studies.eviction.summary.headlines`).
    Raises:
        TrajscopeError: an unknown policy, a bad budget, a window longer than a prompt, or a model whose
        attention cannot be read.
    """
    from trajscope.studies.eviction import queries as eq
    from trajscope.studies.eviction.split import split_frame, split_summary

    unknown = [p for p in policies if p not in ev.POLICIES]
    if unknown:
        raise TrajscopeError(f"Unknown eviction policy '{unknown[0]}': choose among {', '.join(ev.POLICIES)}.")
    if getattr(model, "attn_impl", "eager") == "sdpa" or model.remote is True:
        raise TrajscopeError("The eviction study reads attention rows and re-runs with a key mask: load the model "
                             "locally with attn='rows' (the default) or attn='eager'.")
    for b in budgets:  # one clear error before any model work
        ev.resolve_budget(b, 1)
    items = [p if isinstance(p, dict) else {"prompt": p} for p in prompts]
    kept, steps, reruns, splits = [], [], [], []
    cfg = CaptureConfig(max_new_tokens=max_new_tokens, stop_at_eos=False, attention_layers="all")
    for i, item in enumerate(items):
        run_id = str(item.get("id", i))
        traj = capture(model, item["prompt"], cfg, run_id=run_id)
        P = traj.prompt_len
        if window > P:
            raise TrajscopeError(f"The window ({window}) is longer than prompt '{run_id}' ({P} tokens); "
                                 f"use --window ≤ {P} or longer prompts.")
        prefill, decode = _rows(traj)
        full_logits = model.forward(traj.token_ids[:-1]).logits if (rerun or split) else None
        shared = model.forward(traj.token_ids[:P], return_cache=True) if "lookahead" in policies else None
        for policy in policies:
            q = _query_rows(model, traj, policy, lookahead)
            for budget in budgets:
                if policy == "lookahead":
                    q = eq.laq_rows(model, traj.token_ids[:P], shared, prefill, budget, window=window, m=lookahead,
                                    per_head=per_head)[1]
                sel = ev.select(policy, prefill, budget, window=window, query_rows=q, per_head=per_head,
                                schedule=pyramid_schedule)
                tag = [pl.lit(run_id).alias("run_id"), pl.lit(policy).alias("policy"),
                       pl.lit(float(budget)).alias("budget")]
                kept.append(sel.to_frame(run_id))
                steps.append(ev.step_costs(sel, decode, P, k=k).with_columns(tag))
                if rerun:
                    reruns.append(_rerun(model, traj, sel, full_logits, run_id))
                if split:
                    splits.append(split_frame(model, traj.token_ids, P, sel, run_id, full_logits))
        if progress is not None:
            progress(i + 1, len(items))
    lead = ["run_id", "policy", "budget"]
    st = pl.concat(steps)
    st = st.select(lead + [c for c in st.columns if c not in lead])
    rr = pl.concat(reruns) if reruns else pl.DataFrame(schema=sm.RERUN_SCHEMA)
    summary = sm.summarize(st, rr)
    tables = {"eviction_kept": pl.concat(kept), "eviction_steps": st, "eviction_rerun": rr}
    if rr.height:
        tables["eviction_survival"] = divergence_survival(rr.filter(pl.col("step") >= 1))
    if splits:
        tables["eviction_split"] = pl.concat(splits)
        tables["eviction_split_summary"] = split_summary(tables["eviction_split"])
    tables["eviction_summary"] = summary
    settings = config if config is not None else {
        "policies": list(policies), "budgets": [float(b) for b in budgets], "max_new_tokens": max_new_tokens,
        "window": window, "lookahead": lookahead, "k": k, "shared": not per_head, "no_rerun": not rerun, "split": split,
        "pyramid_schedule": pyramid_schedule}
    settings = {**settings, "n_prompts": len(items), "model": model.describe()}
    return Result(study="eviction", tables=tables, config=settings, summaries=sm.headlines(summary))


def run(model: Any, prompts: Sequence[tuple[str, Sequence[int]]], config: Any, progress: Callable | None = None,
        layers: Sequence[int] | None = None) -> Result:
    """The registered study's run: :func:`eviction` on ``(id, token ids)`` prompts with an
    :class:`~trajscope.studies.eviction.config.EvictionConfig`.

    Raises:
        TrajscopeError: ``layers`` given (the policies score every layer), or the study's own errors.
    """
    import dataclasses

    if layers:
        raise TrajscopeError("The eviction study keeps and scores every layer's prompt keys; leave out --layers.")
    return eviction(model, [{"prompt": list(ids), "id": pid} for pid, ids in prompts], config.policies,
                    config.budget_values(), max_new_tokens=config.max_new_tokens, window=config.window,
                    lookahead=config.lookahead, k=config.k, per_head=not config.shared, rerun=not config.no_rerun,
                    split=config.split, pyramid_schedule=config.pyramid_schedule, progress=progress,
                    config=dataclasses.asdict(config))


def first_divergence(rerun: pl.DataFrame) -> pl.DataFrame:
    """Per run, policy and budget: the first step whose free-running masked token differs (null: never)."""
    return (rerun.group_by("run_id", "policy", "budget")
            .agg(pl.col("step").filter(~pl.col("token_agrees")).min().alias("first_divergence"),
                 pl.col("step").max().alias("last_step"))
            .sort("policy", "budget", "run_id"))


def divergence_survival(rerun: pl.DataFrame, level: float = 0.95) -> pl.DataFrame:
    """First divergence as a censored time-to-event, per policy and budget.

    A run that never leaves the full run's tokens is censored at its last step, not dropped (dropping it biases
    the median early). The Kaplan–Meier median with its Brookmeyer–Crowley interval
    (:func:`trajscope.survival.km_median`); ``inf`` where the median or a bound is never reached.

    Returns:
        ``policy, budget, km_median, km_lo, km_hi, n_runs, n_censored``.
    """
    from trajscope.survival import km_median

    fd = first_divergence(rerun).with_columns(
        pl.col("first_divergence").is_not_null().alias("event"),
        pl.coalesce("first_divergence", "last_step").alias("time"))
    rows = []
    for (policy, budget), g in fd.partition_by(["policy", "budget"], as_dict=True, maintain_order=True).items():
        iv = km_median(g["time"].to_numpy(), g["event"].to_numpy(), level)
        rows.append({"policy": policy, "budget": budget, "km_median": iv.estimate, "km_lo": iv.lo, "km_hi": iv.hi,
                     "n_runs": g.height, "n_censored": int((~g["event"]).sum())})
    return pl.DataFrame(rows).sort("policy", "budget")
