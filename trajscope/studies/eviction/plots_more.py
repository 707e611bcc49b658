"""More plots of the Eviction card: the per-step vs accumulated split of this run, and passkey retrieval.

- :func:`split_data` — per decode step, KL to the full model of the **per-step** arm (only the step's own query
  sees the masked prompt; its history was computed with every key) and of the **accumulated** arm (every decode
  query masked, so the history carries the damage), with their depth-band means as steps
  (:mod:`trajscope.studies.eviction.split`);
- :func:`split_rows` — the depth-band rows of ``eviction_split_summary`` as text cells, each with its interval
  (one prompt: "no interval", said so);
- :func:`passkey_rows` — this prompt's masked answer under each policy, and whether it retrieves the key.

Pure functions: tables in, plain columns or text cells out (drawn by
:mod:`trajscope.studies.eviction.figures`); every value at x = the step that computed it.
The shipped needle table's figure is :func:`trajscope.studies.eviction.needle_figure.needle_figure`; its caption
is :data:`NEEDLE_CAPTION` here.
"""

from __future__ import annotations

import polars as pl

from trajscope.interval_text import format_interval
from trajscope.studies.registry import Result

PER_STEP, ACCUMULATED = "#2ca02c", "#9467bd"
SPLIT_CAPTION = ("Per-step vs accumulated, this run: KL(p_full ‖ p_arm) of the next-token distribution at each "
                 "decode step, teacher-forced on the full run's tokens. Per-step (green): only that step's query "
                 "sees the evicted prompt, its history was computed with every key. Accumulated (purple): every "
                 "decode query sees the evicted prompt, so the history carries the damage too. The gap is the "
                 "damage carried by generated tokens. Pale bars: depth-band means (one run: no interval).")
NEEDLE_CAPTION = ("Passkey retrieval accuracy shipped with this model (the needle study on its own passkey "
                  "prompts, not this run): share of prompts whose greedy answer gives the key, by kept share of the "
                  "prompt, with 95% Wilson intervals over prompts; 'full' is the uncompressed cache.")


def split_data(res: Result) -> dict:
    """Both arms of the split per decode step for one policy and budget, with their depth-band means.

    Returns:
        ``{"lines": {"step", "kl_per_step", "kl_accumulated"}, "bands": {"x0", "x1", "y", "arm"}`` (one
        segment per depth band and arm: the band's mean over its steps ± 0.4), ``"title": str}``.
    """
    sp = res.table("eviction_split").sort("step")
    policy, budget = sp["policy"][0], sp["budget"][0]
    bands = {"x0": [], "x1": [], "y": [], "arm": []}
    summ = res.table("eviction_split_summary")
    if summ.height:
        extent = sp.with_columns(_band()).group_by("depth_band", maintain_order=True).agg(
            pl.col("step").min().alias("lo"), pl.col("step").max().alias("hi"))
        for r in summ.join(extent, on="depth_band").iter_rows(named=True):
            for metric in ("kl_per_step", "kl_accumulated"):
                bands["x0"].append(r["lo"] - 0.4)
                bands["x1"].append(r["hi"] + 0.4)
                bands["y"].append(r[metric])
                bands["arm"].append(metric)
    return {"lines": {c: sp[c].to_list() for c in ("step", "kl_per_step", "kl_accumulated")}, "bands": bands,
            "title": f"Per-step vs accumulated damage — {policy}, budget {budget:g}"}


def _band() -> pl.Expr:
    from trajscope.metrics.bands import depth_band_expr

    return depth_band_expr(pl.col("step")).alias("depth_band")


def split_rows(res: Result) -> list[list[str]]:
    """``[depth band, per-step, accumulated, carried (paired)]`` cells, each mean with its interval."""
    summ = res.table("eviction_split_summary")
    out = []
    for r in summ.iter_rows(named=True):
        n = r.get("n_prompts")
        out.append([str(r["depth_band"])] + [format_interval(r[m], r[f"{m}_lo"], r[f"{m}_hi"], 4, n_clusters=n)
                                             for m in ("kl_per_step", "kl_accumulated", "kl_carried")])
    return out


def passkey_rows(answers: pl.DataFrame) -> list[list[str]]:
    """``[policy, budget, kept tokens, answer, retrieves the key]`` cells, the full cache first."""
    order = answers.with_columns((pl.col("policy") != "full").alias("_o")).sort("_o", "policy", "budget")
    return [[r["policy"], f"{r['budget']:g}", f"{r['budget_tokens']:.0f}", r["answer"],
             "yes" if r["correct"] else "no"] for r in order.iter_rows(named=True)]
