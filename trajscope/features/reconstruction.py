"""The prefill→decode SAE drift report: reconstruction and feature overlap, with its controls.

:func:`reconstruction_report` encodes a harvest (usually the ``eval`` prompts, never seen
in SAE training) with each SAE of each training mix (several seeds per mix), computes
the spliced-in KL / CE increase per row (:mod:`trajscope.features.splice`), and builds:

- ``drift``: every metric of :mod:`trajscope.metrics.sae_eval` per row group (phase,
  depth, step, continuation, entropy band and absolute position bin, each group of one
  phase only) and SAE replicate, with a prompt-clustered bootstrap interval
  (:mod:`trajscope.metrics.sae_intervals`);
- ``seeds``: per mix, the seed mean with its interval and the seed-to-seed spread;
- ``diffs``: each other mix minus the first (e.g. hybrid − prefill-only), with a paired
  interval, the seed floor and a verdict;
- ``overlap``: prefill vs decode feature overlap and dead/dense fractions per decode
  group (all decode rows, depth bands, and position bins against prefill rows of the
  same bin) beside a matched-n prefill-vs-prefill null (:func:`trajscope.metrics.overlap.matched_overlap`).

Prompts are the resampling unit throughout (``prompt_id``; a prompt's greedy and sampled
continuations share it). :func:`format_report` renders the text ``trajscope sae-drift`` prints.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import polars as pl
import torch

from trajscope.metrics import overlap as ov
from trajscope.metrics import sae_intervals as si
from trajscope.metrics.bands import POSITION_ORDER, position_bin_expr
from trajscope.metrics.sae_eval import report_groups
from trajscope.features.harvest import Harvest
from trajscope.sae.model import SAE
from trajscope.features.splice import splice_rows


@dataclasses.dataclass
class SAEReport:
    """The tables of one report (Polars frames; columns in :func:`reconstruction_report`)."""

    drift: pl.DataFrame
    seeds: pl.DataFrame
    diffs: pl.DataFrame
    overlap: pl.DataFrame
    info: dict


@torch.no_grad()
def encode_all(sae: SAE, acts: torch.Tensor, batch: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x_hat [N, d], f [N, d_sae])`` for ``acts [N, d]``, in batches."""
    xs, fs = [], []
    for i in range(0, acts.shape[0], batch):
        x_hat, f = sae.reconstruct(acts[i:i + batch])
        fs.append(f)
        xs.append(x_hat)
    return torch.cat(xs), torch.cat(fs)


def replicate_seeds(saes: Sequence[SAE]) -> list[int]:
    """Training seeds of one mix's SAEs (from ``cfg.json`` metadata; their order 0, 1, … if unknown or repeated)."""
    seeds = [(s.cfg.metadata or {}).get("training", {}).get("seed") for s in saes]
    ok = all(isinstance(s, int) for s in seeds) and len(set(seeds)) == len(seeds)
    return list(seeds) if ok else list(range(len(saes)))


def _decode_groups(rows: pl.DataFrame) -> list[tuple[str, pl.Expr, pl.Expr]]:
    """Overlap comparisons as ``(label, prefill rows, decode rows)``: all, depth bands, position bins."""
    pre, dec = pl.col("phase") == "prefill", pl.col("phase") == "decode"
    out = [("decode", pre, dec)]
    out += [(f"steps {g}", pre, e) for kind, _, g, e in report_groups(rows) if kind == "depth_band"]
    if "pos" in rows.columns:
        b = position_bin_expr(pl.col("pos"))
        out += [(f"pos {lab}", pre & (b == lab), dec & (b == lab)) for lab in POSITION_ORDER]
    return out


def reconstruction_report(harvest: Harvest, saes: Mapping[str, SAE | Sequence[SAE]], *, model: Any = None,
                          overlap_k: int = 64, min_count: int = 5, n_boot: int = 1000, n_null: int = 200,
                          level: float = 0.95, seed: int = 0,
                          progress: Callable[[str, int, int], None] | None = None) -> SAEReport:
    """Reconstruction drift and feature overlap of several training mixes (several seeds each) on one harvest.

    Args:
        harvest: activations ``[N, d]`` and tags (``Harvest.rows``, with ``prompt_id``) at one layer.
        saes: mix name → one SAE or its seed replicates; each must read the harvest's width
            (checked). The first mix is the base of ``diffs``.
        model: a ``ModelHandle`` for the spliced-in KL / CE increase (skipped when None).
        overlap_k: top-k-by-frequency set size for the Jaccard overlap.
        min_count: activations for a feature to count as appearing / vanishing.
        n_boot: prompt-bootstrap resamples per interval; n_null: matched-null draws.
        level: interval coverage; seed: seed of every resampling.
        progress: optional ``(sae label, done, total)`` callback during splicing.

    Returns:
        :class:`SAEReport` with ``drift`` (``kind, phase, group, sae, seed, metric, value, lo, hi, n,
        n_prompts``), ``seeds`` (``kind, phase, group, sae, metric, n_seeds, value, lo, hi, seed_min,
        seed_max, seed_range, seed_sd``), ``diffs`` (``kind, phase, group, sae, base, metric, diff,
        diff_lo, diff_hi, seed_floor, verdict``) and ``overlap`` (``sae, seed, decode_group`` and the
        columns of :func:`trajscope.metrics.overlap.matched_overlap`).
    """
    rows = harvest.rows
    reps = {name: list(s) if isinstance(s, (list, tuple)) else [s] for name, s in saes.items()}
    prompts = rows["prompt_id"].to_numpy()
    encoded: dict[tuple[str, int], tuple[torch.Tensor, torch.Tensor, np.ndarray | None, np.ndarray | None]] = {}
    overlaps: list[dict] = []
    groups = _decode_groups(rows)
    for name, replicates in reps.items():
        for seed_, sae in zip(replicate_seeds(replicates), replicates):
            sae.check_input(harvest.acts, harvest.layer)
            x_hat, f = encode_all(sae, harvest.acts)
            kl = ce = None
            if model is not None:
                label = f"{name} seed {seed_}"
                cb = (lambda d, t, label=label: progress(label, d, t)) if progress is not None else None
                sp = splice_rows(model, harvest.sequences, rows, harvest.layer, sae, progress=cb)
                kl = sp["kl"].cast(pl.Float64).fill_null(float("nan")).to_numpy()
                ce = sp["ce_increase"].cast(pl.Float64).fill_null(float("nan")).to_numpy()
            encoded[(name, seed_)] = (x_hat, f, kl, ce)
            for label, pre_e, dec_e in groups:
                pm, dm = _mask(rows, pre_e), _mask(rows, dec_e)
                if not dm.any():
                    continue
                for r in ov.matched_overlap(f[pm], prompts[pm.numpy()], f[dm], k=overlap_k, min_count=min_count,
                                            n_resamples=n_null, level=level, seed=seed):
                    overlaps.append({"sae": name, "seed": seed_, "decode_group": label, **r})
    drift, seeds, diffs = [], [], []
    base = next(iter(reps))
    for kind, phase, label, expr in report_groups(rows):
        m = _mask(rows, expr)
        if not m.any():
            continue
        codes = np.unique(prompts[m.numpy()], return_inverse=True)[1].reshape(-1)
        n_prompts = int(codes.max()) + 1
        sums = {key: si.group_sums(codes, n_prompts, harvest.acts[m], x_hat[m], f[m],
                                   None if kl is None else kl[m.numpy()], None if ce is None else ce[m.numpy()])
                for key, (x_hat, f, kl, ce) in encoded.items()}
        metrics = [k for k in si.METRICS if model is not None or k not in ("kl", "ce_increase")]
        keys = {"kind": kind, "phase": phase, "group": label}
        opts = {"n_boot": n_boot, "level": level, "seed": seed}
        drift += [{**keys, **r} for r in si.interval_rows(sums, metrics, **opts)]
        srows = si.seed_summary(sums, metrics, **opts)
        seeds += [{**keys, **r} for r in srows]
        diffs += [{**keys, **r} for r in si.mix_differences(sums, srows, base, metrics, **opts)]
    info = {"layer": harvest.layer, "n_rows": len(harvest), "n_prompts": int(np.unique(prompts).size),
            "split": harvest.meta.get("split"), "mixes": {k: replicate_seeds(v) for k, v in reps.items()},
            "base": base, "n_boot": n_boot, "n_null": n_null, "level": level, "overlap_k": overlap_k,
            "cluster": "prompt_id"}
    return SAEReport(pl.DataFrame(drift), pl.DataFrame(seeds), pl.DataFrame(diffs), pl.DataFrame(overlaps), info)


def format_table(df: Any, digits: int = 4) -> str:
    """A plain fixed-width text rendering of a small Polars frame (what the CLI prints)."""
    cols = df.columns
    cells = [[c for c in cols]]
    for row in df.iter_rows():
        cells.append(["" if v is None else f"{v:.{digits}g}" if isinstance(v, float) else str(v) for v in row])
    widths = [max(len(r[i]) for r in cells) for i in range(len(cols))]
    lines = ["  ".join(r[i].rjust(widths[i]) if i > 1 else r[i].ljust(widths[i]) for i in range(len(cols)))
             for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _mask(rows: pl.DataFrame, expr: pl.Expr) -> torch.Tensor:
    return torch.from_numpy(rows.select(expr.fill_null(False)).to_series().to_numpy().astype(bool))


def _ci(v: float, lo: float, hi: float, digits: int = 3) -> str:
    if not np.isfinite(v):
        return "—"
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return f"{v:.{digits}f}"
    return f"{v:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def format_report(rep: SAEReport, metrics: Sequence[str] = ("fvu", "cos", "kl", "ce_increase", "dead", "dense"),
                  overlap_metrics: Sequence[str] = ("jaccard_topk", "spearman", "n_appear", "n_vanish", "dead")
                  ) -> str:
    """The text ``trajscope sae-drift`` prints: seed means with intervals and seed ranges, differences
    with verdicts, and overlap beside its matched-n null (seed means over replicates)."""
    i = rep.info
    lvl = int(round(100 * i["level"]))
    mixes = ", ".join(f"{k} (seeds {','.join(map(str, v))})" for k, v in i["mixes"].items())
    out = [f"SAE drift at layer {i['layer']}: {i['n_prompts']} prompts, {i['n_rows']} rows ({i['split'] or '?'} split).",
           f"SAEs: {mixes}. Values are seed means with {lvl}% prompt-clustered bootstrap intervals "
           f"({i['n_boot']} resamples of prompts); 'seeds' is the min–max over seeds (the noise floor). A difference "
           "is 'beyond noise' when its paired interval excludes 0 and it exceeds both mixes' seed ranges. Every "
           "group holds rows of one phase; 'position_bin' groups put prefill and decode rows at the same absolute "
           "positions. dead/dense have no bootstrap interval (resampling changes them by itself): read them against "
           "the matched-n null below.", ""]
    s = rep.seeds.filter(pl.col("metric").is_in(list(metrics)))
    d = rep.diffs.filter(pl.col("metric").is_in(list(metrics)))
    for m in [m for m in metrics if m in set(s["metric"].to_list())]:
        part = s.filter(pl.col("metric") == m)
        cells = []
        for (kind, phase, group), g in part.group_by(["kind", "phase", "group"], maintain_order=True):
            rec: dict[str, Any] = {"kind": kind, "group": group}
            for r in g.iter_rows(named=True):
                if "n" not in rec:
                    rec.update(n=r["n"], prompts=r["n_prompts"])
                rec[r["sae"]] = _ci(r["value"], r["lo"], r["hi"])
                rec[f"seeds {r['sae']}"] = f"{r['seed_min']:.3f}–{r['seed_max']:.3f}"
            for r in d.filter((pl.col("metric") == m) & (pl.col("group") == group) & (pl.col("kind") == kind)
                              ).iter_rows(named=True):
                rec[f"{r['sae']} − {r['base']}"] = f"{_ci(r['diff'], r['diff_lo'], r['diff_hi'])} {r['verdict']}"
            cells.append(rec)
        out += [f"{m}:", format_table(pl.DataFrame(cells)), ""]
    o = rep.overlap.filter(pl.col("metric").is_in(list(overlap_metrics)))
    if o.height:
        agg = o.group_by(["sae", "decode_group", "metric"], maintain_order=True).agg(
            pl.col("n_pre").first(), pl.col("n_dec").first(), pl.col("n_matched").first(),
            pl.col("observed_all").mean(), pl.col("observed").mean(), pl.col("observed").min().alias("obs_min"),
            pl.col("observed").max().alias("obs_max"), pl.col("null_mean").mean(), pl.col("null_lo").mean(),
            pl.col("null_hi").mean(), pl.col("outside_null").sum().alias("outside"), pl.len().alias("n_seeds"))
        table = agg.select(
            "sae", "decode_group", "metric", "n_pre", "n_dec", "n_matched",
            pl.col("observed_all").round(3).alias("all rows"),
            pl.when(pl.col("observed").is_nan()).then(pl.lit("— (too few prefill rows for a null)")).otherwise(
                pl.format("{} (seeds {}–{})", pl.col("observed").round(3), pl.col("obs_min").round(3),
                          pl.col("obs_max").round(3))).alias("at n_matched"),
            pl.when(pl.col("null_mean").is_nan()).then(pl.lit("—")).otherwise(
                pl.format("{} [{}, {}]", pl.col("null_mean").round(3), pl.col("null_lo").round(3),
                          pl.col("null_hi").round(3))).alias("prefill-vs-prefill null"),
            pl.format("{}/{}", pl.col("outside"), pl.col("n_seeds")).alias("seeds outside null"))
        out += [f"Feature overlap, prefill vs decode (top-{i['overlap_k']} by frequency), beside a matched-n null: "
                f"{i['n_null']} draws of two prompt-disjoint prefill samples of n_matched rows; 'at n_matched' uses "
                "the same prefill draws against n_matched decode rows. 'pos' groups compare prefill and decode rows "
                "at the same absolute positions.", format_table(table), ""]
    return "\n".join(out)
