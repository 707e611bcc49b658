"""Plots of the Eviction card: pure functions, eviction tables (Polars) in, HoloViews elements out.

- :func:`kept_heatmap` — which prompt positions each layer and head keeps (prefill positions
  on x, token text in the hover);
- :func:`step_costs_plot` — per decode step, the recall@k of the step's top attended prompt
  keys inside the kept set, and the attention mass on evicted prompt keys (what the full model
  used that the evicted cache cannot give);
- :func:`rerun_plot` — the masked re-run against the full cache per step: KL of the next-token
  distributions (teacher-forced) and greedy token agreement (free-running);
- :func:`summary_line` — one sentence of the Result's headline numbers (its summaries, computed once by
  :func:`trajscope.studies.eviction.summary.summarize`), with their intervals when there are any.

Every value is drawn at x = the step that computed it (:mod:`trajscope.positions`).
"""

from __future__ import annotations


import holoviews as hv
import numpy as np
import polars as pl

from trajscope import positions
from trajscope.interval_text import format_interval
from trajscope.studies.eviction.engine import first_divergence
from trajscope.studies.eviction.summary import key
from trajscope.studies.registry import Result
from trajscope.ui.plots import integer_hover, visible

KEPT, EVICTED = "#1f77b4", "#e5e5e5"


def _tag(res: Result) -> str:
    kept = res.table("eviction_kept")
    return f"{kept['policy'][0]}, budget {kept['budget'][0]:g}"


def kept_heatmap(res: Result, tokens: pl.DataFrame, prompt_len: int) -> hv.Image:
    """Kept (blue) and evicted (grey) prompt positions, one row per layer and head.

    One image, not a glyph per cell: SmolLM2's 270 query heads over a 41-token chat prompt made 11,070
    rectangles, which took the browser's main thread about half a second to draw.

    Args:
        res: an eviction result of one run, one policy and one budget.
        tokens: the run's ``tokens`` table (``pos``, ``text``) for the hover.
        prompt_len: P.
    Returns:
        ``Image`` ``[layer × head, P]``: 1 where the position is kept, 0 where evicted; ``pos`` on x (the hover
        gives the position's token), the layer/head row on y (top = layer 0, head 0).
    """
    P = prompt_len
    kept_table = res.table("eviction_kept").sort("layer", "head")
    n = kept_table.height
    grid = np.zeros((n, P), dtype=np.float32)
    for i, kept in enumerate(kept_table["kept_pos"].to_list()):
        grid[i, [p for p in kept if 0 <= p < P]] = 1.0
    heads = [f"L{layer} H{head}" for layer, head in zip(kept_table["layer"].to_list(), kept_table["head"].to_list())]
    text = dict(zip(tokens["pos"].to_list(), tokens["text"].to_list()))
    token_labels = [f"{p} «{visible(text.get(p))}»" for p in range(P)]
    hover = integer_hover([("pos", "$x{custom}"), ("layer/head", "$y{custom}"), ("key", "@image{custom}")],
                          {"$x": token_labels, "$y": heads, "@image": ["evicted", "kept"]})
    step = max(1, n // 24)
    per_head = kept_table["kept_pos"].list.len().mean() if n else 0.0
    return hv.Image(grid[::-1], bounds=(-0.5, -0.5, P - 0.5, n - 0.5), kdims=["pos", "row"], vdims=["kept"]).opts(
        cmap=[EVICTED, KEPT], clim=(0, 1), tools=[hover], responsive=True, height=min(600, 90 + 14 * n),
        invert_yaxis=True, yticks=[(i, heads[i]) for i in range(0, n, step)],
        xlabel="prompt position (pos, prefill)", ylabel="layer and head",
        title=f"Kept prompt keys — {_tag(res)}: {per_head:.1f} of {P} prompt positions per head "
              "(blue kept, grey evicted)")


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


def step_costs_plot(res: Result, tokens: pl.DataFrame | None, prompt_len: int) -> hv.Overlay:
    """Per decode step, mean over layers and heads: recall@k of the top attended prompt keys and evicted mass.

    Args:
        res: an eviction result of one run, one policy and one budget.
        tokens: the full run's tokens (query token text in the hover), or None.
        prompt_len: P.
    """
    k = res.config.get("k", 8)
    per = res.table("eviction_steps").sort("step").group_by("step", maintain_order=True).agg(pl.col("recall_at_k").mean().cast(pl.Float64).alias("recall"),
                                         pl.col("evicted_mass").mean().cast(pl.Float64).alias("evicted"))
    per = _with_tokens(per.with_columns(pl.col("step").cast(pl.Int32)), _step_tokens(tokens, prompt_len)).to_pandas()
    hover = [("step", "@step{0}"), ("query token", "@token")]
    rec = hv.Curve(per, "step", ["recall", "token"], label=f"recall@{k} of decode attention in the kept set").opts(
        color=KEPT, tools=["hover"], hover_tooltips=hover + [("recall", "@recall{0.000}")])
    evi = hv.Curve(per, "step", ["evicted", "token"], label="attention mass on evicted prompt keys").opts(
        color="#d62728", tools=["hover"], hover_tooltips=hover + [("evicted mass", "@evicted{0.000}")])
    return (rec * evi).opts(
        title=f"Decode attention vs the kept set — {_tag(res)} (mean over layers and heads)", responsive=True,
        height=260, legend_position="right", xlabel="step (decode)", ylabel="share (0–1)", ylim=(-0.02, 1.02),
        show_grid=True)


def rerun_plot(res: Result, tokens: pl.DataFrame | None, prompt_len: int) -> hv.Overlay:
    """The masked re-run against the full cache, per decode step: KL (teacher-forced) and token agreement.

    Token agreement is drawn as markers at y = 0 where the free-running masked run's greedy token
    differs from the full run's; the dotted line is the first divergence.
    """
    rr = res.table("eviction_rerun").filter(pl.col("step") >= 1).with_columns(pl.col("step").cast(pl.Int32))
    rr = _with_tokens(rr.with_columns(pl.col("token_agrees").cast(pl.Int8).alias("agrees")),
                      _step_tokens(tokens, prompt_len))
    hover = [("step", "@step{0}"), ("query token", "@token")]
    kl = hv.Curve(rr.to_pandas(), "step", ["kl_to_full", "agrees", "token"], label="KL(p_full ‖ p_masked), teacher-forced").opts(
        color="#9467bd", tools=["hover"], hover_tooltips=hover + [("KL (nats)", "@kl_to_full{0.0000}"),
                                                                 ("same greedy token", "@agrees{0}")])
    diff = rr.filter(pl.col("agrees") == 0).with_columns(pl.lit(0.0).alias("y"))
    pts = hv.Scatter(diff.to_pandas(), "step", ["y", "token"], label="greedy token differs (free-running)").opts(
        color="#d62728", marker="x", size=8, tools=["hover"], hover_tooltips=hover)
    first = first_divergence(res.table("eviction_rerun").filter(pl.col("step") >= 1))["first_divergence"][0]
    parts = [kl, pts]
    if first is not None:
        parts.append(hv.VLine(float(first), label="first divergence").opts(color="#d62728", line_dash="dotted"))
    agree = rr["agrees"].mean() if rr.height else float("nan")
    return hv.Overlay(parts).opts(
        title=(f"Masked re-run vs full cache — {_tag(res)}: KL per step, token agreement {agree:.0%}"
               + (f", first divergence at step {first}" if first is not None else ", no divergence")),
        responsive=True, height=260, legend_position="right", xlabel="step (decode)", ylabel="KL (nats)",
        show_grid=True)


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
