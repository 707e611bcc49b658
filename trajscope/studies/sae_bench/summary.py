"""The SAE bench study's headline numbers: one function per number, all read from the study's tables.

Each function returns ``{name: {"value", "lo", "hi", …}}`` (the 95% bootstrap over source files;
with several seeds of a mix, ``value`` / ``lo`` / ``hi`` are seed means and ``seed_min`` /
``seed_max`` give the seed range); :func:`summarize` joins them. The report section, the
``sae-bench_summary`` table and the result marker hold these dicts; nothing else computes them.

- :func:`ce_recovered`: ``ce recovered <phase> <mix>`` on all rows of the phase (of the files the SAEs
  never saw, when the study was told their training files: :func:`headline_kind`);
- :func:`explained_variance`: ``explained variance <phase> <mix>`` (centred);
- :func:`mix_difference`: ``ce recovered <phase> <mix> − <base>`` (paired over files, per seed);
- :func:`probe_auroc`: ``probe auroc decode <label> k<k> <mix>`` and the dense ceiling
  ``probe auroc decode <label> residual`` (held-out files' decode rows);
- :func:`reproduced`: ``reproduced <mix> s<a>→s<b>``, the count of a's features with a decoder
  match of cosine ≥ the threshold in b (``n`` = the SAE's width).
"""

from __future__ import annotations

import math
from typing import Any

import polars as pl

HEADLINE_K = 5


def _num(v: Any) -> float | None:
    if v is None:
        return None
    v = float(v)
    return None if math.isnan(v) else v


def _seed_mean(g: pl.DataFrame, col: str) -> dict[str, Any]:
    vals = [v for v in g[col].to_list() if _num(v) is not None]
    lo = [v for v in g[f"{col}_lo"].to_list() if _num(v) is not None]
    hi = [v for v in g[f"{col}_hi"].to_list() if _num(v) is not None]
    return {"value": sum(vals) / len(vals) if vals else None, "lo": sum(lo) / len(lo) if len(lo) == g.height else None,
            "hi": sum(hi) / len(hi) if len(hi) == g.height else None, "n_seeds": g.height,
            "seed_min": min(vals) if len(vals) > 1 else None, "seed_max": max(vals) if len(vals) > 1 else None}


def headline_kind(kinds: Any) -> str:
    """The rows the headline numbers use: ``all (unseen)`` (files the SAEs never saw) when the study named the
    SAEs' training files, else ``all``."""
    return "all (unseen)" if "all (unseen)" in set(kinds) else "all"


def _by_phase(core: pl.DataFrame, col: str, name: str) -> dict[str, dict[str, Any]]:
    out = {}
    kind = headline_kind(core["kind"].to_list())
    top = core.filter((pl.col("kind") == kind) & (pl.col("segment") == "all"))
    for phase in ("prefill", "decode"):
        for (mix,), g in top.filter(pl.col("phase") == phase).group_by(["mix"], maintain_order=True):
            r = g.row(0, named=True)
            out[f"{name} {phase} {mix}"] = {**_seed_mean(g, col), "n": r.get("n_ce_positions") if col == "ce_recovered"
                                            else r["n_rows"], "n_files": r["n_files"], "n_prompts": r["n_prompts"],
                                            "rows": kind}
    return out


def ce_recovered(core: pl.DataFrame) -> dict[str, dict[str, Any]]:
    """CE loss recovered (normalised by zero-ablation) per phase and mix, all rows of the phase."""
    if "ce_recovered" not in core.columns or core["ce_recovered"].is_null().all():
        return {}
    return _by_phase(core, "ce_recovered", "ce recovered")


def explained_variance(core: pl.DataFrame) -> dict[str, dict[str, Any]]:
    """Explained variance (centred, 1 − FVU) per phase and mix, all rows of the phase."""
    return _by_phase(core, "explained_variance", "explained variance")


def mix_difference(diffs: pl.DataFrame) -> dict[str, dict[str, Any]]:
    """CE recovered of each mix minus the first mix, per phase (all rows), seed mean of the paired differences."""
    out = {}
    kind = headline_kind(diffs["kind"].to_list())
    sel = diffs.filter((pl.col("kind") == kind) & (pl.col("segment") == "all") & (pl.col("metric") == "ce_recovered"))
    for (phase, mix, base), g in sel.group_by(["phase", "mix", "base"], maintain_order=True):
        out[f"ce recovered {phase} {mix} − {base}"] = {**_seed_mean(g.rename({"diff": "d", "lo": "d_lo", "hi": "d_hi"}),
                                                                  "d"), "n_files": int(g["n_files"][0]), "rows": kind}
    return out


def probe_auroc(probes: pl.DataFrame, k: int = HEADLINE_K) -> dict[str, dict[str, Any]]:
    """AUROC on the held-out files' decode rows: the k-sparse probe of each mix (seed mean) and the dense ceiling."""
    out: dict[str, dict[str, Any]] = {}
    if not probes.height:
        return out
    dec = probes.filter(pl.col("eval_phase") == "decode")
    for label in dict.fromkeys(dec["label"].to_list()):
        d = dec.filter(pl.col("label") == label)
        for (mix,), g in d.filter((pl.col("probe") != "residual") & (pl.col("k") == k)).group_by(["probe"],
                                                                                               maintain_order=True):
            out[f"probe auroc decode {label} k{k} {mix}"] = {**_seed_mean(g, "auroc"), "n": int(g["n_rows"][0]),
                                                             "n_files": int(g["n_files"][0])}
        res = d.filter(pl.col("probe") == "residual")
        if res.height:
            out[f"probe auroc decode {label} residual"] = {**_seed_mean(res, "auroc"), "n": int(res["n_rows"][0]),
                                                          "n_files": int(res["n_files"][0])}
    return out


def reproduced(repro: pl.DataFrame) -> dict[str, dict[str, Any]]:
    """Features of one seed with a decoder match (cosine ≥ threshold) in another seed of the same mix (a count)."""
    out = {}
    for r in repro.filter(pl.col("comparison") == "across seeds").iter_rows(named=True):
        out[f"reproduced {r['mix']} s{r['seed']}→s{r['other_seed']}"] = {
            "value": float(r["n_reproduced"]), "lo": None, "hi": None, "n": r["n_features"], "count": True,
            "n_alive": r["n_alive"], "n_reproduced_alive": r["n_reproduced_alive"], "threshold": r["threshold"]}
    return out


def summarize(core: pl.DataFrame, diffs: pl.DataFrame, probes: pl.DataFrame, repro: pl.DataFrame) -> dict[str, Any]:
    """Every headline number of one Result (the functions above, in order)."""
    return {**ce_recovered(core), **explained_variance(core), **mix_difference(diffs), **probe_auroc(probes),
            **reproduced(repro)}


def summary_table(summaries: dict[str, Any]) -> pl.DataFrame:
    """The summaries as the ``sae-bench_summary`` table (``setup`` left out)."""
    rows = [{"summary": k, "value": s.get("value"), "lo": s.get("lo"), "hi": s.get("hi"), "n": s.get("n"),
             "n_files": s.get("n_files"), "seed_min": s.get("seed_min"), "seed_max": s.get("seed_max")}
            for k, s in summaries.items() if k != "setup" and isinstance(s, dict)]
    schema = {"summary": pl.String, "value": pl.Float64, "lo": pl.Float64, "hi": pl.Float64, "n": pl.Int64,
              "n_files": pl.Int64, "seed_min": pl.Float64, "seed_max": pl.Float64}
    return pl.DataFrame(rows, schema=schema)
