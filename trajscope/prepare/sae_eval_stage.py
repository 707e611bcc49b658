"""Stage ``sae-eval``: every SAE measured on the held-out (``evaluate``) source files, by phase.

Per SAE (mix × seed) and phase (prefill rows, decode rows: the model's own greedy
continuations), on rows of the evaluate files only, position 0 excluded:

- FVU, centred: ``Σ‖x − x̂‖² / Σ‖x − x̄‖²`` (x̄ the phase's mean), and explained
  variance ``1 − FVU``; the uncentred one (``1 − Σ‖x − x̂‖² / Σ‖x‖²``, close to
  SAELens' ``explained_variance``) is reported beside it, named so;
- L0 (mean active features per row); dead (never active on these rows) and dense
  (active on more than 1% of them) shares;
- CE loss recovered, normalised by zero-ablation
  (:mod:`trajscope.features.ce_recovered`), for the ``ce_seeds`` on up to ``ce_max_seqs``
  evaluate sequences (taken round-robin over files);

each with a bootstrap interval over files; paired FVU differences (decode − prefill per
SAE, hybrid − prefill-only per seed and phase) with one draw of files weighting both
ratios (:func:`paired_ratio_diff`). Reproducibility across seeds: the share of
one seed's features whose decoder row has cosine ≥ ``reproduce_cos`` with some
feature of the other seed (both directions, all features and alive ones). The
feature index (:mod:`trajscope.features.index`) of seed 0 of the prefill-only SAE is
built over every collected row (all files, both phases) and saved beside it.
Writes ``metrics.parquet``, ``ce.parquet``, ``reproducibility.parquet`` and
``report.json``.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np
import polars as pl
import torch

from trajscope.metrics.sae_eval import reconstruction_stats
from trajscope.prepare import MIXES, sae_name
from trajscope.prepare.sae_stage import layer_rows
from trajscope.features.ce_recovered import ce_recovered_interval, ratio_interval, splice_ce
from trajscope.features.index import FeatureIndex, density_table, examples_table
from trajscope.sae.model import SAE
from trajscope.stats import cluster_bootstrap
from trajscope.studies.sae_stability import decoder_match
from trajscope.trajectory import write_table

PHASES = ("prefill", "decode")


def _encode(sae: SAE, x: torch.Tensor, chunk: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        parts = [sae.reconstruct(x[i:i + chunk]) for i in range(0, x.shape[0], chunk)]
    return torch.cat([p[0] for p in parts]).float(), torch.cat([p[1] for p in parts]).float()


def paired_ratio_diff(a: tuple, b: tuple, *, level: float = 0.95, n_boot: int = 1000, seed: int = 0) -> dict:
    """``Σnum_a/Σden_a − Σnum_b/Σden_b`` with a percentile interval from resampling files jointly.

    ``a`` and ``b`` are ``(num, den, files)`` per row; one draw of files (with replacement, from the files
    of either) weights both ratios, so the interval is paired over files.
    """
    files = np.unique(np.concatenate([np.asarray(a[2]), np.asarray(b[2])]))
    k = files.size

    def sums(t):
        codes = np.searchsorted(files, np.asarray(t[2]))
        return (np.bincount(codes, np.asarray(t[0], dtype=np.float64), minlength=k),
                np.bincount(codes, np.asarray(t[1], dtype=np.float64), minlength=k))

    (na, da), (nb, db) = sums(a), sums(b)
    rng = np.random.default_rng(seed)
    draws = np.stack([np.bincount(rng.integers(0, k, k), minlength=k) for _ in range(n_boot)]).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        boot = draws @ na / (draws @ da) - draws @ nb / (draws @ db)
    boot = boot[np.isfinite(boot)]
    lo, hi = np.quantile(boot, [(1 - level) / 2, 1 - (1 - level) / 2]) if boot.size and k > 1 else (np.nan, np.nan)
    return {"estimate": float(na.sum() / da.sum() - nb.sum() / db.sum()), "lo": float(lo), "hi": float(hi),
            "n_files": int(k), "level": level, "n_boot": n_boot}


def _fvu_parts(sae: SAE, x: torch.Tensor, rows: pl.DataFrame, phase: str) -> tuple:
    """Per row of ``phase``: ``(‖x − x̂‖², ‖x − x̄_phase‖², file)``, with the codes."""
    m = torch.as_tensor((rows["phase"] == phase).to_numpy())
    xp, files = x[m], rows.filter(pl.Series(m.numpy()))["group"].to_numpy()
    xh, f = _encode(sae, xp)
    err = (xp - xh).double().pow(2).sum(-1).numpy()
    cen = (xp.double() - xp.double().mean(0)).pow(2).sum(-1).numpy()
    return (err, cen, files), xp, xh, f


def fvu_gaps(saes: dict, x: torch.Tensor, rows: pl.DataFrame, n_boot: int) -> list[dict]:
    """Paired FVU differences over files: decode − prefill per SAE, and hybrid − prefill-only per seed and phase."""
    parts = {(key, ph): _fvu_parts(sae, x, rows, ph)[0] for key, sae in saes.items() for ph in PHASES}
    out = [{"comparison": "decode - prefill", "mix": mix, "seed": seed, "phase": "both",
            **paired_ratio_diff(parts[((mix, seed), "decode")], parts[((mix, seed), "prefill")], n_boot=n_boot)}
           for mix, seed in saes]
    for seed in sorted({s for _, s in saes}):
        if ("hybrid", seed) in saes and ("prefill-only", seed) in saes:
            out += [{"comparison": "hybrid - prefill-only", "mix": "both", "seed": seed, "phase": ph,
                     **paired_ratio_diff(parts[(("hybrid", seed), ph)], parts[(("prefill-only", seed), ph)],
                                         n_boot=n_boot)} for ph in PHASES]
    return out


def recon_rows(saes: dict, x: torch.Tensor, rows: pl.DataFrame, n_boot: int) -> list[dict]:
    """Reconstruction metrics per SAE and phase with file-bootstrap intervals."""
    out = []
    for (mix, seed), sae in saes.items():
        for phase in PHASES:
            (err, cen, files), xp, xh, f = _fvu_parts(sae, x, rows, phase)
            st = reconstruction_stats(xp, xh, f)
            fvu = ratio_interval(err, cen, files, n_boot=n_boot)
            l0 = cluster_bootstrap((f > 0).sum(-1).double().numpy(), files, n_boot=n_boot)
            out.append({"mix": mix, "seed": seed, "phase": phase, "n_rows": st["n"], "n_files": len(set(files)),
                        "fvu": fvu.estimate, "fvu_lo": fvu.lo, "fvu_hi": fvu.hi,
                        "explained_variance": 1 - fvu.estimate, "explained_variance_uncentred": 1 - st["fvu_uncentred"],
                        "l0": l0.estimate, "l0_lo": l0.lo, "l0_hi": l0.hi, "cos": st["cos"],
                        "dead": st["dead"], "dense": st["dense"]})
    return out


def ce_rows(model, saes: dict, seqs: pl.DataFrame, cfg, n_boot: int) -> tuple[pl.DataFrame, list[dict]]:
    """CE per scored position (clean, zero, each SAE) and CE recovered by phase with file intervals."""
    from tqdm.auto import tqdm

    ev = seqs.filter(pl.col("part") == "evaluate").sort("group", "seq")
    ev = ev.with_columns(pl.int_range(pl.len()).over("group").alias("_r")).sort("_r", "group").head(cfg.ce_max_seqs)
    picked = {f"{mix}-s{seed}": sae for (mix, seed), sae in saes.items() if seed in cfg.ce_seeds}
    frames = []
    for rec in tqdm(ev.iter_rows(named=True), total=ev.height, desc="sae-eval: CE clean/zero/spliced", unit="seq"):
        r = splice_ce(model, picked, rec["token_ids"], cfg.layer, cfg.first_pos)
        P = rec["prompt_len"]
        frames.append(pl.DataFrame({"seq": rec["seq"], "group": rec["group"], "pos": r.pop("pos"), **r})
                      .with_columns(pl.when(pl.col("pos") < P).then(pl.lit("prefill")).otherwise(pl.lit("decode"))
                                    .alias("phase")))
    ce = pl.concat(frames)
    out = []
    for name in picked:
        for phase in PHASES:
            p = ce.filter(pl.col("phase") == phase)
            iv = ce_recovered_interval(p["clean"], p["zero"], p[name], p["group"].to_numpy(), n_boot=n_boot)
            out.append({"sae": name, "phase": phase, "ce_recovered": iv.estimate, "lo": iv.lo, "hi": iv.hi,
                        "ce_clean": float(p["clean"].mean()), "ce_zero": float(p["zero"].mean()),
                        "ce_spliced": float(p[name].mean()), "n_positions": p.height,
                        "n_seqs": p["seq"].n_unique(), "n_files": p["group"].n_unique()})
    return ce, out


def reproducibility(saes: dict, x: torch.Tensor, threshold: float) -> list[dict]:
    """Share of features with a decoder match of cosine ≥ ``threshold`` in the other seed, per mix and direction."""
    out = []
    for mix in MIXES:
        seeds = sorted(s for m, s in saes if m == mix)
        for a, b in ((seeds[0], seeds[1]), (seeds[1], seeds[0])) if len(seeds) > 1 else ():
            cos, _ = decoder_match(saes[(mix, b)].W_dec.detach(), saes[(mix, a)].W_dec.detach())
            alive = (_encode(saes[(mix, a)], x)[1] > 0).any(0)
            ok = cos >= threshold
            out.append({"mix": mix, "seed": a, "other_seed": b, "share": float(ok.double().mean()),
                        "share_of_alive": float(ok[alive].double().mean()) if alive.any() else float("nan"),
                        "n_features": int(cos.numel()), "n_alive": int(alive.sum()),
                        "median_max_cos": float(cos.median()), "threshold": threshold})
    return out


def reproducibility_by_step(out: pathlib.Path, seeds, threshold: float) -> list[dict]:
    """The share reproducing (seed a → seed b, decoder cosine ≥ ``threshold``) at every decoder snapshot that both
    seeds' SAE stages saved (``decoder_snapshots.safetensors``; none: empty)."""
    from safetensors import safe_open

    def snaps(mix, seed):
        path = out / sae_name(mix, seed) / "decoder_snapshots.safetensors"
        if not path.is_file():
            return {}
        with safe_open(str(path), framework="pt") as fh:
            return {int(k.rsplit("step", 1)[1]): fh.get_tensor(k) for k in fh.keys()}

    rows = []
    for mix in MIXES:
        if len(seeds) < 2:
            break
        a, b = snaps(mix, seeds[0]), snaps(mix, seeds[1])
        for step in sorted(set(a) & set(b)):
            ab, _ = decoder_match(b[step], a[step])
            ba, _ = decoder_match(a[step], b[step])
            rows.append({"mix": mix, "step": step, "share_0to1": float((ab >= threshold).double().mean()),
                         "share_1to0": float((ba >= threshold).double().mean()), "median_max_cos": float(ab.median()),
                         "threshold": threshold})
    return rows


def feature_index(sae: SAE, acts: torch.Tensor, rows: pl.DataFrame, seqs: pl.DataFrame, tok, top_n: int,
                  meta: dict) -> FeatureIndex:
    """Top contexts and prefill/decode density of every feature over all collected rows."""
    f = _encode(sae, acts)[1]
    texts = [[tok.decode([i]) for i in ids] for ids in seqs.sort("seq")["token_ids"].to_list()]
    plen = dict(zip(seqs["seq"].to_list(), seqs["prompt_len"].to_list()))
    where = rows.select(pl.col("seq").alias("run"), "prompt_id", "pos",
                        pl.col("seq").replace_strict(plen).alias("prompt_len"))
    info = {"prompts": "trajscope prepare corpus (stdlib, pydoc topics, chat)", "split": "all",
            "max_new_tokens": meta.get("max_new_tokens"), "top_n": top_n, "n_positions": int(f.shape[0]),
            "n_prefill": int((rows["phase"] == "prefill").sum()), "n_decode": int((rows["phase"] == "decode").sum()),
            "sae_layer": sae.cfg.layer, "sae_hook": sae.cfg.hook_name, "model_name": meta.get("model_name"),
            "greedy": True, "built_with": "trajscope prepare", "first_pos": meta.get("first_pos")}
    return FeatureIndex(examples_table(f, where, texts, top_n, 12),
                        density_table(f > 0, (rows["phase"] == "decode").to_numpy()), info)


def run(ctx, d: pathlib.Path) -> dict:
    c = ctx.cfg
    acts, rows = layer_rows(ctx.out / "collect")
    seqs = pl.read_parquet(ctx.out / "collect" / "sequences.parquet")
    saes = {(mix, seed): SAE.load(str(ctx.out / sae_name(mix, seed))) for mix in MIXES for seed in c.seeds}
    ev = (rows["part"] == "evaluate").to_numpy()
    x, r = acts[torch.as_tensor(ev)], rows.filter(pl.Series(ev))
    metrics = pl.DataFrame(recon_rows(saes, x, r, c.n_boot))
    write_table(metrics, d / "metrics.parquet", "prepare_sae_metrics")
    gaps = fvu_gaps(saes, x, r, c.n_boot)
    repro = pl.DataFrame(reproducibility(saes, x, c.reproduce_cos))
    write_table(repro, d / "reproducibility.parquet", "prepare_sae_reproducibility")
    index = feature_index(saes[("prefill-only", c.seeds[0])], acts, rows, seqs, ctx.model.tokenizer, c.index_top_n,
                          {**ctx.meta, "max_new_tokens": c.max_new_tokens})
    (d / "index").mkdir()
    index.save(d / "index")
    ce, ce_sum = ce_rows(ctx.model, saes, seqs, c, c.n_boot)
    write_table(ce, d / "ce.parquet", "prepare_sae_ce")
    report = {"metrics": metrics.to_dicts(), "fvu_gaps": gaps, "ce_recovered": ce_sum,
              "reproducibility": repro.to_dicts(),
              "reproducibility_by_step": reproducibility_by_step(ctx.out, c.seeds, c.reproduce_cos),
              "eval": {"part": "evaluate", "split_by": "source file", "n_rows": int(ev.sum()),
                       "n_files": r["group"].n_unique()}, **ctx.meta}
    (d / "report.json").write_text(json.dumps(report, indent=1), encoding="utf-8")
    return {"n_eval_rows": int(ev.sum())}
