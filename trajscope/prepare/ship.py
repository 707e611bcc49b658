"""Copy a finished build's shippable artefacts into a small directory, and render its figures as Markdown.

Shipped (``DEST/``): ``profile.safetensors``; ``saes/layerL-prefill-only`` (seed 0, with its
feature index) and ``saes/layerL-hybrid`` (seed 0), each ``cfg.json`` +
``sae_weights.safetensors`` + ``training_log.csv``; ``vectors/`` (the CAA vector);
``report/`` (every metric table and summary, seed-1 metrics included, the harvests' ``meta.json``;
no activations);
``config.json`` and ``figures.md`` (:func:`figures`).
"""

from __future__ import annotations

import json
import pathlib
import shutil

import polars as pl

from trajscope.errors import TrajscopeError
from trajscope.prepare import sae_name
from trajscope.prepare.stages import is_done
from trajscope.prepare.steer_stage import distinct_share
from trajscope.stats import binomial_interval

DEGENERATE = 0.5

REPORT_FILES = {"profile": ("fpr_by_layer.parquet",), "sae-eval": ("metrics.parquet", "reproducibility.parquet",
                                                                   "report.json"),
                "steer": ("sweep.parquet", "heldout.parquet", "summary.json")}


def _ci(v: float, lo: float, hi: float, d: int = 3) -> str:
    return f"{v:.{d}f} [{lo:.{d}f}, {hi:.{d}f}]"


def figures(out: str | pathlib.Path) -> str:
    """Markdown tables of every figure of a finished build (profile FPR, SAE metrics, CE, seeds, steering)."""
    out = pathlib.Path(out)
    md = []
    fpr = pl.read_parquet(out / "profile" / "fpr_by_layer.parquet")
    r0 = fpr.row(0, named=True)
    md += [f"### Drift profile: per-position FPR on the evaluate files (nominal {r0['nominal']:.0%})", "",
           f"n = {r0['n_positions']} prefill positions, {r0['n_prompts']} prompts, {r0['n_files']} files.", "",
           "| layer | FPR | Wilson 95% (positions) | bootstrap 95% (files) |", "|---|---|---|---|"]
    md += [f"| {r['layer']} | {r['fpr']:.4f} | [{r['wilson_lo']:.4f}, {r['wilson_hi']:.4f}] | "
           f"[{r['files_lo']:.4f}, {r['files_hi']:.4f}] |" for r in fpr.iter_rows(named=True)]
    rep = json.loads((out / "sae-eval" / "report.json").read_text(encoding="utf-8"))
    md += ["", "### SAEs on the evaluate files (bootstrap 95% over files)", "",
           "| mix | seed | phase | rows | files | FVU (centred) | explained var. | expl. var. (uncentred) | L0 | dead | dense (>1%) |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    md += [f"| {m['mix']} | {m['seed']} | {m['phase']} | {m['n_rows']} | {m['n_files']} | "
           f"{_ci(m['fvu'], m['fvu_lo'], m['fvu_hi'])} | {m['explained_variance']:.3f} | "
           f"{m['explained_variance_uncentred']:.3f} | {_ci(m['l0'], m['l0_lo'], m['l0_hi'], 1)} | "
           f"{m['dead']:.3f} | {m['dense']:.3f} |" for m in rep["metrics"]]
    if rep.get("fvu_gaps"):
        md += ["", "### FVU differences, paired over files (bootstrap 95%)", "",
               "| comparison | mix | seed | phase | difference | files |", "|---|---|---|---|---|---|"]
        md += [f"| {g['comparison']} | {g['mix']} | {g['seed']} | {g['phase']} | "
               f"{_ci(g['estimate'], g['lo'], g['hi'])} | {g['n_files']} |" for g in rep["fvu_gaps"]]
    md += ["", "### CE loss recovered (normalised by zero-ablation; bootstrap 95% over files)", "",
           "| SAE | phase | CE recovered | CE clean | CE zero | CE spliced | positions | sequences | files |",
           "|---|---|---|---|---|---|---|---|---|"]
    md += [f"| {c['sae']} | {c['phase']} | {_ci(c['ce_recovered'], c['lo'], c['hi'])} | {c['ce_clean']:.3f} | "
           f"{c['ce_zero']:.3f} | {c['ce_spliced']:.3f} | {c['n_positions']} | {c['n_seqs']} | {c['n_files']} |"
           for c in rep["ce_recovered"]]
    md += ["", "### Features reproduced across seeds (max decoder cosine ≥ threshold)", "",
           "| mix | seed → other | share (all) | share (alive on eval) | alive | median max cos |",
           "|---|---|---|---|---|---|"]
    md += [f"| {r['mix']} | {r['seed']} → {r['other_seed']} | {r['share']:.4f} | {r['share_of_alive']:.4f} | "
           f"{r['n_alive']}/{r['n_features']} | {r['median_max_cos']:.3f} |" for r in rep["reproducibility"]]
    by_step = rep.get("reproducibility_by_step") or []
    if by_step:
        md += ["", "Through training (decoder snapshots of both seeds):", "",
               "| mix | step | share 0 → 1 | share 1 → 0 | median max cos |", "|---|---|---|---|---|"]
        md += [f"| {r['mix']} | {r['step']} | {r['share_0to1']:.4f} | {r['share_1to0']:.4f} | "
               f"{r['median_max_cos']:.3f} |" for r in by_step]
    st = json.loads((out / "steer" / "summary.json").read_text(encoding="utf-8"))
    ch = st["chosen"]
    md += ["", f"### Steering: French CAA at layer {ch['layer']}, strength {ch['strength']:g} "
           f"(held-out: {st['n_heldout_prompts']} prompts, {len(st['heldout_files'])} files)", "",
           "| arm | success (Wilson 95%) | log-perplexity under the unsteered model (bootstrap 95%) | geo-mean ppl |",
           "|---|---|---|---|"]
    for arm in ("unsteered", "steered"):
        s, p = st[arm]["success"], st[arm]["log_ppl"]
        md.append(f"| {arm} | {_ci(s['estimate'], s['lo'], s['hi'], 2)} | {_ci(p['estimate'], p['lo'], p['hi'], 2)} | "
                  f"{st[arm]['ppl_geomean']:.2f} |")
    dd = st["success_diff"]
    md += ["", f"Steered − unsteered success: {_ci(dd['estimate'], dd['lo'], dd['hi'], 2)} (bootstrap over files).", ""]
    held = pl.read_parquet(out / "steer" / "heldout.parquet").with_columns(
        pl.col("text").map_elements(distinct_share, return_dtype=pl.Float64).alias("distinct"))
    md += [f"Degenerate repetition (distinct words / words < {DEGENERATE}), a check the success criterion and the "
           "perplexity do not make:", ""]
    for arm in ("unsteered", "steered"):
        a = held.filter(pl.col("arm") == arm)
        k = int((a["distinct"] < DEGENERATE).sum())
        iv = binomial_interval(k, a.height)
        md.append(f"- {arm}: {k}/{a.height} = {_ci(iv.estimate, iv.lo, iv.hi, 2)} (Wilson 95%); "
                  f"successes that are not degenerate: {int(((a['distinct'] >= DEGENERATE) & a['success']).sum())}")
    md.append("")
    sw = pl.read_parquet(out / "steer" / "sweep.parquet")
    md += ["Sweep (fit-file prompts):", "", "| layer | strength | success | median ppl | n |", "|---|---|---|---|---|"]
    md += [f"| {r['layer']} | {r['strength']:g} | {r['success']:.2f} | {r['ppl_median']:.2f} | {r['n_prompts']} |"
           for r in sw.iter_rows(named=True)]
    return "\n".join(md) + "\n"


def ship(out: str | pathlib.Path, dest: str | pathlib.Path, layer: int, seed: int = 0) -> pathlib.Path:
    """Copy the shippable artefacts of the finished build ``out`` into ``dest`` (see the module docstring)."""
    out, dest = pathlib.Path(out), pathlib.Path(dest)
    needed = ["profile", sae_name("prefill-only", seed), sae_name("hybrid", seed), "sae-eval", "steer"]
    missing = [n for n in needed if not is_done(out, n)]
    if missing:
        raise TrajscopeError(f"The build in {out} has unfinished stages ({', '.join(missing)}); run prepare first.")
    for sub in ("saes", "vectors", "report"):
        (dest / sub).mkdir(parents=True, exist_ok=True)
    shutil.copy2(out / "profile" / "profile.safetensors", dest / "profile.safetensors")
    for mix in ("prefill-only", "hybrid"):
        target = dest / "saes" / f"layer{layer}-{mix}"
        target.mkdir(exist_ok=True)
        for f in ("cfg.json", "sae_weights.safetensors", "training_log.csv"):
            shutil.copy2(out / sae_name(mix, seed) / f, target / f)
        if mix == "prefill-only":
            for f in (out / "sae-eval" / "index").iterdir():
                shutil.copy2(f, target / f.name)
    for f in (out / "steer").glob("*.safetensors"):
        shutil.copy2(f, dest / "vectors" / f.name)
    for stage, files in REPORT_FILES.items():
        for f in files:
            shutil.copy2(out / stage / f, dest / "report" / f"{stage}_{f}")
    for name in ("harvest-prefill", "harvest-decode"):
        if (out / name / "meta.json").is_file():
            shutil.copy2(out / name / "meta.json", dest / "report" / f"{name}_meta.json")
    for d in sorted(out.iterdir()):
        if (d / "DONE.json").is_file():
            shutil.copy2(d / "DONE.json", dest / "report" / f"{d.name}_DONE.json")
    shutil.copy2(out / "config.json", dest / "config.json")
    (dest / "figures.md").write_text(figures(out), encoding="utf-8")
    return dest
