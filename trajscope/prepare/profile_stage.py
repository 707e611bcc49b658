"""Stage ``profile``: a drift profile fitted, calibrated and evaluated on disjoint source files.

The ``collect`` stage's prefill residuals (every layer, positions ``≥ first_pos``)
of the ``fit`` files give the per-dimension moments, those of the ``calibrate``
files the per-layer thresholds at nominal ``fpr``
(:func:`trajscope.profile.profile_from_residuals`). On the ``evaluate`` files,
the per-position false-positive rate by layer: the share of prefill positions
scoring above their layer's threshold, with a Wilson interval over positions
(which treats positions as independent, too narrow) and a bootstrap interval
over files (positions of one file resampled together: the honest one).

Writes ``profile.safetensors`` (a :class:`~trajscope.profile.ReferenceProfile`
whose ``info`` records the split, the model and the sink treatment) and
``fpr_by_layer.parquet``.
"""

from __future__ import annotations

import pathlib

import numpy as np
import polars as pl
from safetensors.torch import load_file

from trajscope.profile import profile_from_residuals
from trajscope.stats import binomial_interval, cluster_bootstrap
from trajscope.trajectory import write_table


def prefill_by_prompt(src: pathlib.Path) -> tuple[list[dict], pl.DataFrame]:
    """Per prompt ``{layer: [n, d_model]}`` float32 prefill residuals, and one row per prompt."""
    t = load_file(str(src / "acts.safetensors"))["prefill_all"]
    rows = pl.read_parquet(src / "rows.parquet").filter(pl.col("phase") == "prefill")
    seq = rows["seq"].to_numpy()
    starts = np.flatnonzero(np.r_[True, seq[1:] != seq[:-1]])
    ends = np.r_[starts[1:], seq.size]
    residuals = [{layer: t[a:b, layer].float() for layer in range(t.shape[1])} for a, b in zip(starts, ends)]
    prompts = rows[starts.tolist()].select("seq", "prompt_id", "group", "kind", "part")
    return residuals, prompts


def fpr_table(profile, residuals: list[dict], prompts: pl.DataFrame, n_boot: int) -> pl.DataFrame:
    """Per layer: FPR of the evaluate prompts' positions, Wilson (positions) and bootstrap (files) intervals."""
    ev = [i for i, p in enumerate(prompts["part"].to_list()) if p == "evaluate"]
    groups = prompts["group"].to_list()
    out = []
    for layer in range(profile.n_layers):
        flags, files = [], []
        for i in ev:
            f = (profile.score(layer, residuals[i][layer]) > profile.threshold[layer]).numpy()
            flags.append(f)
            files += [groups[i]] * f.size
        flags = np.concatenate(flags).astype(np.float64)
        w = binomial_interval(int(flags.sum()), flags.size)
        b = cluster_bootstrap(flags, np.asarray(files), n_boot=n_boot)
        out.append({"layer": layer, "fpr": float(flags.mean()), "wilson_lo": w.lo, "wilson_hi": w.hi,
                    "files_lo": b.lo, "files_hi": b.hi, "n_positions": int(flags.size),
                    "n_prompts": len(ev), "n_files": len(set(files)), "nominal": float(profile.info["fpr"])})
    return pl.DataFrame(out)


def run(ctx, d: pathlib.Path) -> dict:
    c = ctx.cfg
    residuals, prompts = prefill_by_prompt(ctx.out / "collect")
    part = prompts["part"].to_list()
    fit = [i for i, p in enumerate(part) if p == "fit"]
    cal = [i for i, p in enumerate(part) if p == "calibrate"]
    split = {name: sorted(set(prompts.filter(pl.col("part") == name)["group"].to_list()))
             for name in ("fit", "calibrate", "evaluate")}
    info = {**ctx.meta, "model_id": c.model_id, "split_by": "source file (group)", "split_groups": split,
            "skip_first": c.first_pos}
    profile = profile_from_residuals(residuals, fpr=c.fpr, fit=fit, calibrate=cal, info=info)
    profile.save(d / "profile.safetensors")
    table = fpr_table(profile, residuals, prompts, c.n_boot)
    write_table(table, d / "fpr_by_layer.parquet", "prepare_fpr_by_layer")
    return {"n_fit_prompts": len(fit), "n_calibrate_prompts": len(cal),
            "n_files": {k: len(v) for k, v in split.items()}}
