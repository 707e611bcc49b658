"""The Eviction card's plot data: pure functions, eviction tables (Polars) in, plain columns out
(drawn by :mod:`trajscope.studies.eviction.figures`).

- :func:`kept_data` — which prompt positions each layer and head keeps (prefill positions
  on x, token text in the hover);
- :func:`costs_data` — per decode step, the recall@k of the step's top attended prompt
  keys inside the kept set, and the attention mass on evicted prompt keys (what the full model
  used that the evicted cache cannot give);
- :func:`rerun_data` — the masked re-run against the full cache per step: KL of the next-token
  distributions (teacher-forced) and greedy token agreement (free-running);
- :func:`summary_line` — one sentence of the Result's headline numbers (its summaries, computed once by
  :func:`trajscope.studies.eviction.summary.summarize`), with their intervals when there are any.

Every value is drawn at x = the step that computed it (:mod:`trajscope.positions`).
"""

from __future__ import annotations


import numpy as np
import polars as pl

from trajscope import positions
from trajscope.interval_text import format_interval
from trajscope.studies.eviction.engine import first_divergence
from trajscope.studies.eviction.summary import key
from trajscope.studies.registry import Result
from trajscope.ui.plots import visible

KEPT, EVICTED = "#1f77b4", "#e5e5e5"


def _tag(res: Result) -> str:
    kept = res.table("eviction_kept")
    return f"{kept['policy'][0]}, budget {kept['budget'][0]:g}"


def kept_data(res: Result, tokens: pl.DataFrame, prompt_len: int) -> dict:
    """Kept (1) and evicted (0) prompt positions, one row per layer and head (row 0 = layer 0, head 0).

    Args:
        res: an eviction result of one run, one policy and one budget.
        tokens: the run's ``tokens`` table (``pos``, ``text``) for the hover.
        prompt_len: P.
    Returns:
        ``{"grid": [layer × head, P] float32, "heads": row labels ("L0 H0" …), "token_labels": P labels
        ("pos «token»"), "yticks": [(row, label)] (at most ~24), "title": str}``.
    """
    P = prompt_len
    kept_table = res.table("eviction_kept").sort("layer", "head")
    n = kept_table.height
    grid = np.zeros((n, P), dtype=np.float32)
    for i, kept in enumerate(kept_table["kept_pos"].to_list()):
        grid[i, [p for p in kept if 0 <= p < P]] = 1.0
    heads = [f"L{layer} H{head}" for layer, head in zip(kept_table["layer"].to_list(), kept_table["head"].to_list())]
    text = dict(zip(tokens["pos"].to_list(), tokens["text"].to_list()))
    step = max(1, n // 24)
    per_head = kept_table["kept_pos"].list.len().mean() if n else 0.0
    return {"grid": grid, "heads": heads, "token_labels": [f"{p} «{visible(text.get(p))}»" for p in range(P)],
            "yticks": [(i, heads[i]) for i in range(0, n, step)],
            "title": f"Kept prompt keys — {_tag(res)}: {per_head:.1f} of {P} prompt positions per head "
                     "(blue kept, grey evicted)"}


def _step_tokens(tokens: pl.DataFrame | None, prompt_len: int) -> pl.DataFrame | None:
    """``step, token`` — each decode step's query token (pos P + s − 1), for hovers."""
    if tokens is None:
        return None
    q = pl.DataFrame({"step": range(1, tokens.height - prompt_len + 1)}, schema={"step": pl.Int32})
    q = q.with_columns(positions.query_pos_expr(prompt_len).alias("pos"))
    txt = tokens.select(pl.col("pos").cast(pl.Int64), pl.col("text").map_elements(visible, return_dtype=pl.String)
                        .alias("token"))
    return q.with_columns(pl.col("pos").cast(pl.Int64)).join(txt, on="pos", how="left").select("step", "token")


def _with_tokens(df: pl.DataFrame, toks: pl.DataFrame | None) -> pl.DataFrame:
    if toks is None:
        return df.with_columns(pl.lit("—").alias("token"))
    return df.join(toks, on="step", how="left").with_columns(pl.col("token").fill_null("—")).sort("step")


def costs_data(res: Result, tokens: pl.DataFrame | None, prompt_len: int) -> dict:
    """Per decode step, mean over layers and heads: recall@k of the top attended prompt keys and evicted mass.

    Args:
        res: an eviction result of one run, one policy and one budget.
        tokens: the full run's tokens (query token text in the hover), or None.
        prompt_len: P.
    Returns:
        ``{"source": {"step", "recall", "evicted", "token"}, "k": int, "title": str}``.
    """
    per = res.table("eviction_steps").sort("step").group_by("step", maintain_order=True).agg(
        pl.col("recall_at_k").mean().cast(pl.Float64).alias("recall"),
        pl.col("evicted_mass").mean().cast(pl.Float64).alias("evicted"))
    per = _with_tokens(per.with_columns(pl.col("step").cast(pl.Int32)), _step_tokens(tokens, prompt_len))
    return {"source": {c: per[c].to_list() for c in ("step", "recall", "evicted", "token")},
            "k": res.config.get("k", 8),
            "title": f"Decode attention vs the kept set — {_tag(res)} (mean over layers and heads)"}


def rerun_data(res: Result, tokens: pl.DataFrame | None, prompt_len: int) -> dict:
    """The masked re-run against the full cache, per decode step: KL (teacher-forced) and token agreement.

    Returns:
        ``{"kl": {"step", "kl_to_full", "agrees", "token"}, "differs": {"step", "y" (0), "token"}`` (the steps
        where the free-running masked run's greedy token differs from the full run's), ``"first"``: the first
        divergence step or None, ``"title": str}``.
    """
    rr = res.table("eviction_rerun").filter(pl.col("step") >= 1).with_columns(pl.col("step").cast(pl.Int32))
    rr = _with_tokens(rr.with_columns(pl.col("token_agrees").cast(pl.Int8).alias("agrees")),
                      _step_tokens(tokens, prompt_len))
    diff = rr.filter(pl.col("agrees") == 0)
    first = first_divergence(res.table("eviction_rerun").filter(pl.col("step") >= 1))["first_divergence"][0]
    agree = rr["agrees"].mean() if rr.height else float("nan")
    return {"kl": {c: rr[c].to_list() for c in ("step", "kl_to_full", "agrees", "token")},
            "differs": {"step": diff["step"].to_list(), "y": [0.0] * diff.height, "token": diff["token"].to_list()},
            "first": first,
            "title": (f"Masked re-run vs full cache — {_tag(res)}: KL per step, token agreement {agree:.0%}"
                      + (f", first divergence at step {first}" if first is not None else ", no divergence"))}


def summary_line(res: Result, prompt_len: int) -> str:
    """One sentence from the Result: kept positions, then recall@k, evicted mass, KL and token agreement over every
    decode step — the Result's summaries (the ``all`` rows of its ``eviction_summary``), read, not recomputed.

    Intervals are prompt-clustered; with one prompt there is none, and the sentence says so.
    """
    kept = res.table("eviction_kept")
    policy, budget = kept["policy"][0], kept["budget"][0]
    head = res.summaries[key(policy, budget)]
    n = head["n_prompts"]

    def fmt(metric: str, digits: int = 3) -> str:
        m = head[metric]
        return format_interval(m["value"], m["lo"], m["hi"], digits, n_clusters=n)

    parts = [f"{_tag(res)}: keeps {kept['kept_pos'].list.len().mean():.1f} of {prompt_len} prompt positions per head",
             f"recall@{res.config.get('k', 8)} {fmt('recall_at_k')}", f"evicted mass {fmt('evicted_mass')}"]
    rr = res.table("eviction_rerun").filter(pl.col("step") >= 1)
    if rr.height:
        first = first_divergence(rr)["first_divergence"][0]
        parts += [f"KL {fmt('kl_to_full')} nats", f"token agreement {fmt('token_agreement')}",
                  f"first divergence at step {first}" if first is not None else "no divergence"]
    steps = rr.height or res.table("eviction_steps")["step"].n_unique()
    tail = f" (over {steps} decode steps"
    tail += "; one prompt, so no prompt-clustered interval)" if n == 1 else ", 95% prompt-clustered intervals)"
    return "; ".join(parts) + tail + "."
