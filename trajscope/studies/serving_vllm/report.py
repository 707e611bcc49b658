"""The serving-vllm study's headline numbers (:func:`headline`, their one home) and its report section.

Headline numbers, per part (``batch``, ``chunked-prefill``, ``prefix-cache``):

- the largest mean relative L2 over the part's conditions, with its 95 % prompt-bootstrap interval
  and n prompts, over all compared positions and over decode positions alone;
- the largest single delta as a multiple of the float32 floor (a maximum: no interval);
- the share of compared positions above the floor (pooled);
- the runs whose greedy tokens differ from the alone run's, k of n, with a Wilson interval;

and, for the prefix-cache part, the share of a prompt's positions vLLM served from its cache
(never computed), mean over prompts with its prompt-bootstrap interval.

With the SAE part (:mod:`~trajscope.studies.serving_vllm.saes`), per harvest mode the same-seed row
Jaccard and FVU difference against the ``alone`` SAE (pooled over seeds, prompt-bootstrap interval over eval
prompts, with the sae-stability verdict against the seed-to-seed spread), and that spread itself.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from trajscope.errors import TrajscopeError
from trajscope.escaping import html_text
from trajscope.studies.registry import Result
from trajscope.studies.serving.sections import INTERVAL_NOTE, ci, num, table
from trajscope.studies.serving.summary import reused_share

PARTS = ("batch", "chunked-prefill", "prefix-cache")


def _entry(value: Any, lo: Any = None, hi: Any = None, n: Any = None, **what: Any) -> dict:
    f = (lambda v: None if v is None else float(v))
    return {"value": f(value), "lo": f(lo), "hi": f(hi), "n": None if n is None else int(n), **what}


def headline(result: Result) -> dict[str, dict]:
    """The headline numbers of a serving-vllm Result (module docstring), from its tables."""
    from trajscope.stats import binomial_interval, cluster_bootstrap

    summ, runs, deltas = (result.table(f"serving-vllm{s}") for s in ("_summary", "_runs", ""))
    out: dict[str, dict] = {}
    for part in PARTS:
        s = summ.filter(pl.col("part") == part)
        if not s.height:
            continue
        row = s.sort("rel_l2_mean", descending=True).row(0, named=True)
        out[f"{part}: largest mean rel. L2"] = _entry(row["rel_l2_mean"], row["rel_l2_mean_lo"], row["rel_l2_mean_hi"],
                                                      row["n_prompts"], condition=row["condition"])
        d = deltas.filter(pl.col("part") == part)
        dec = d.filter(pl.col("phase") == "decode")
        if dec.height:  # the prefill rows, most of them, dilute a delta that only decode shows
            ivs = [(cond, cluster_bootstrap(g["rel_l2"].to_numpy(), g["prompt_id"].to_numpy()))
                   for (cond,), g in dec.group_by("condition", maintain_order=True)]
            cond, iv = max(ivs, key=lambda c: c[1].estimate)
            out[f"{part}: largest mean rel. L2 at decode positions"] = _entry(iv.estimate, iv.lo, iv.hi, iv.n_clusters,
                                                                              condition=cond)
        out[f"{part}: largest delta / float32 floor"] = _entry(d["rel_l2"].max() / d["floor_rel_l2"].max(), n=d.height)
        out[f"{part}: share of positions above the floor"] = _entry(d["above_floor"].mean(), n=d.height)
        r = runs.filter(pl.col("part") == part)
        k = int((~r["tokens_identical"]).sum())
        iv = binomial_interval(k, r.height)
        out[f"{part}: runs whose greedy tokens changed"] = _entry(k / r.height, iv.lo, iv.hi, r.height, k=k)
    if _has(result, "serving-vllm_sae_summary"):
        out.update(_sae_headline(result))
    if "serving-vllm_coverage" in result.tables or _has(result, "serving-vllm_coverage"):
        iv = reused_share(result.table("serving-vllm_coverage"))
        out["prefix-cache: share of a prompt's positions never computed"] = _entry(iv.estimate, iv.lo, iv.hi, iv.n_clusters)
    return out


def _sae_headline(result: Result) -> dict[str, dict]:
    """The SAE part's headline entries (module docstring), from ``serving-vllm_sae_summary``."""
    summ = result.table("serving-vllm_sae_summary")
    n_eval = int(result.table("serving-vllm_saes")["n_eval_prompts"][0])
    out = {}
    for row in summ.filter(pl.col("metric").is_in(["row_jaccard", "fvu_delta"])).iter_rows(named=True):
        if row["kind"] == "cross_seed":
            continue
        what = "row Jaccard" if row["metric"] == "row_jaccard" else "FVU(B) − FVU(A)"
        name = (f"SAE seed pairs (alone vs alone): {what}" if row["kind"] == "seed"
                else f"SAE {row['mode']} vs alone, same seed: {what}")
        out[name] = _entry(row["value"], row["lo"], row["hi"], n_eval,
                           **({} if row["kind"] == "seed" else {"verdict": row["verdict"]}))
    return out


def _has(result: Result, name: str) -> bool:
    try:
        result.table(name)
        return True
    except TrajscopeError:
        return False


def section(result: Result) -> tuple[str, str, list]:
    """``(title, html, figures)`` of the study, from its Result alone."""
    summ = result.table("serving-vllm_summary")
    runs = result.table("serving-vllm_runs")
    floor = result.table("serving-vllm_floor")
    heads = result.summaries or headline(result)
    cfg = result.config
    setup = heads.get("setup") or {}
    lines = "".join(f"<li>{html_text(k)}: {ci(v.get('value'), v.get('lo'), v.get('hi'), v.get('n'))}"
                    f"{''.join(' (' + html_text(v[w]) + ')' for w in ('condition', 'verdict') if v.get(w))}</li>"
                    for k, v in heads.items() if k != "setup")
    eng = "".join(f"<li>{html_text(name)}: {html_text(', '.join(f'{a}={b}' for a, b in e['settings'].items()))}; "
                  f"start {num(e['start_seconds'])} s, calls {num(e['run_seconds'])} s</li>"
                  for name, e in (setup.get("engines") or {}).items())
    tok = runs.group_by("part", "condition", maintain_order=True).agg(
        pl.len().alias("n_runs"), (~pl.col("tokens_identical")).sum().alias("tokens_changed"),
        pl.col("num_cached_tokens").mean().alias("mean_cached_tokens"))
    html = (f"<p>The same prompts on a real vLLM engine ({html_text(str(setup.get('model', '?')))}, float32, eager, "
            f"layer {html_text(str(cfg.get('layer', '?')))}, {html_text(str(cfg.get('new_tokens', '?')))} greedy tokens): "
            "each compared run against the prompt's alone run, position by position, at the positions both computed "
            "and before the first generated token that differs. The float32 floor is the determinism study's "
            f"(max over prompts of max(1 vs 2 threads, 2 × vs float64), on Hugging Face): {num(floor['floor_rel_l2'].max())}."
            f" n = {floor.height} prompts. No fitted quantity, so no held-out split. {INTERVAL_NOTE} "
            "Token changes: Wilson interval over runs.</p>"
            f"<ul>{lines}</ul><p class='note'><b>Engines.</b></p><ul>{eng}</ul>"
            + table(summ, ["part", "condition", "n_prompts", "rel_l2_mean", "rel_l2_max", "floor_rel_l2",
                           "frac_above_floor"], ci_of=["rel_l2_mean"])
            + table(tok))
    if _has(result, "serving-vllm_coverage_summary"):
        cov = result.table("serving-vllm_coverage_summary")
        html += ("<p>Prefix-cache coverage from vLLM's own <code>num_cached_tokens</code>: the share of positions "
                 "never computed, by token class, region (shared header / the prompt's own tokens) and position band.</p>"
                 + table(cov))
    if _has(result, "serving-vllm_sae_summary"):
        html += _sae_html(result)
    return "Serving on a real engine (vLLM)", html, []


def _sae_html(result: Result) -> str:
    """The SAE part: harvests, pairs against re-seeding, and each SAE's FVU on the held-out alone rows."""
    harv, summ, saes = (result.table(f"serving-vllm_{t}") for t in ("sae_harvests", "sae_summary", "saes"))
    s0 = saes.row(0, named=True)
    return ("<h3>SAEs trained on each harvest mode</h3>"
            f"<p>One TopK SAE (d_sae {s0['d_sae']}, k {s0['k']}, {s0['n_tokens']:,} training rows drawn) per harvest "
            f"mode and seed on the layer-{s0['layer']} rows of {s0['n_train_prompts']} train prompts; every SAE is "
            f"evaluated on the alone rows of {s0['n_eval_prompts']} held-out prompts (A = the alone SAE, B = the "
            f"other), as the sae-stability study does; positions before {s0['first_pos']} (the attention sink) are "
            "left out of both. Rows at positions below the shared prefix "
            f"({s0['shared_prefix']} tokens) are the same in every prompt, so the <i>shared</i> region's interval over "
            "prompts does not measure sampling error. " + INTERVAL_NOTE + " Decoder cosines: features resampled; "
            "share matched: binomial.</p>"
            + table(harv.rename({"rel_l2_lo": "rel_l2_vs_alone_lo", "rel_l2_hi": "rel_l2_vs_alone_hi"}),
                    ["mode", "n_prompts", "n_rows", "n_missing", "n_train_rows", "rel_l2_vs_alone"],
                    ci_of=["rel_l2_vs_alone"])
            + table(summ.rename({"lo": "value_lo", "hi": "value_hi"}),
                    ["mode", "kind", "metric", "n_pairs", "value", "seed_min", "seed_max", "verdict"], ci_of=["value"])
            + table(saes.sort("mode", "region", "seed"), ["mode", "seed", "region", "n_rows", "n_prompts", "fvu", "l0",
                                                           "dead"], ci_of=["fvu"]))
