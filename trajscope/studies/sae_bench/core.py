"""SAEBench's core metrics by phase and segment, with file-bootstrap intervals and paired mix differences.

Row groups (every group lies in one phase): ``kind`` ``all`` / ``chat`` / ``code`` × ``phase`` ×
``segment`` (``all``, and for chat rows each of ``system``, ``user``, ``assistant``: the system
turn of the template, the user's message, the assistant header in prefill, the answer in decode).
When the SAEs' training files are named, each kind is repeated over the other files alone
(``"all (unseen)"`` …): rows the SAEs never saw.
Per SAE (mix × seed) and group:

- ``fvu`` = Σ‖x − x̂‖² / Σ‖x − x̄_group‖² and ``explained_variance`` = 1 − fvu (centred;
  ``explained_variance_uncentred`` = 1 − Σ‖x − x̂‖² / Σ‖x‖², close to SAELens' number);
- ``l0``: mean active features per row; ``dead`` / ``dense``: share of features active on no row /
  on more than 1% of the group's rows (both depend on the group's size: read them with ``n_rows``);
- ``ce_recovered`` = (CE_zero − CE_sae) / (CE_zero − CE_clean), SAEBench's "CE loss score", from
  :func:`trajscope.features.ce_recovered.splice_ce` (block output replaced at every position from 1
  on by 0 or by the SAE's reconstruction; each CE the mean over the group's scored positions, a
  position scoring the token after it);
- ``n_rows``, ``n_distinct`` (distinct activation vectors: the template's system turn is the same
  vectors in every chat prompt), ``n_prompts``, ``n_files``.

Intervals: percentile bootstrap over the group's source files (a ratio of per-file sums, files
drawn with replacement; the centring mean x̄ held at the group's). ``diffs``: hybrid − prefill-only
(any second mix − the first) per seed and group, paired: one draw of files weights both ratios.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np
import polars as pl
import torch

from trajscope.metrics.sae_eval import feature_density
from trajscope.metrics.sae_probing import FileBoot

PHASES = ("prefill", "decode")
CHAT_SEGMENTS = ("system", "user", "assistant")


UNSEEN = " (unseen)"


def groups(rows: pl.DataFrame) -> list[tuple[str, str, str, np.ndarray]]:
    """``(kind, phase, segment, row mask)`` of every non-empty group (see the module docstring).

    With a ``seen`` column (rows of files the SAEs were trained on), every kind is also given over the
    unseen files alone, as ``"<kind> (unseen)"``.
    """
    out = []
    kinds = {k: (np.ones(rows.height, bool) if k == "all" else (rows["kind"] == k).to_numpy())
             for k in ("all", "chat", "code") if k == "all" or (rows["kind"] == k).any()}
    if "seen" in rows.columns and rows["seen"].any():
        unseen = ~rows["seen"].to_numpy()
        kinds.update({k + UNSEEN: m & unseen for k, m in list(kinds.items()) if (m & unseen).any()})
    for kind, in_kind in kinds.items():
        for phase in PHASES:
            m = in_kind & (rows["phase"] == phase).to_numpy()
            if m.any():
                out.append((kind, phase, "all", m))
            if kind.startswith("chat"):
                for seg in CHAT_SEGMENTS:
                    ms = m & (rows["segment"] == seg).to_numpy()
                    if ms.any():
                        out.append((kind, phase, seg, ms))
    return out


def _q(boot: np.ndarray, k: int) -> tuple[float, float]:
    boot = boot[np.isfinite(boot)]
    if k < 2 or boot.size == 0:
        return float("nan"), float("nan")
    lo, hi = np.quantile(boot, [0.025, 0.975])
    return float(lo), float(hi)


def encode_all(sae: Any, x: torch.Tensor, chunk: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x̂, f)`` of every row, in chunks (float32)."""
    with torch.no_grad():
        parts = [sae.reconstruct(x[i:i + chunk].to(sae.W_enc.dtype)) for i in range(0, x.shape[0], chunk)]
    return torch.cat([p[0] for p in parts]).float(), torch.cat([p[1] for p in parts]).float()


def ce_table(model: Any, saes: Mapping[str, Any], sequences: pl.DataFrame, layer: int,
             progress: Callable[[int, int], None] | None = None) -> pl.DataFrame:
    """Per scored position of every sequence: ``seq``, ``pos``, ``clean``, ``zero`` and one CE column per SAE key."""
    from trajscope.features.ce_recovered import splice_ce

    frames = []
    for n, rec in enumerate(sequences.iter_rows(named=True), 1):
        r = splice_ce(model, saes, list(rec["token_ids"]), layer, first_pos=1)
        frames.append(pl.DataFrame({"seq": rec["seq"], "pos": r.pop("pos"), **r}))
        if progress is not None:
            progress(n, sequences.height)
    return pl.concat(frames)


def core_tables(x: torch.Tensor, rows: pl.DataFrame, codes: Mapping[tuple[str, int], tuple[torch.Tensor, torch.Tensor]],
                ce: pl.DataFrame | None, *, n_boot: int, seed: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    """``(core, diffs)`` tables (columns in the module docstring).

    Args:
        x: ``[n, d]`` activations of ``rows``; rows: harvest rows with ``file``, ``kind``, ``phase``, ``segment``.
        codes: ``{(mix, seed): (x̂, f)}``.
        ce: :func:`ce_table` with a column ``"<mix>-s<seed>"`` per SAE (None: no CE recovered).
    """
    ce_rows = None
    if ce is not None:
        ce_rows = rows.select("seq", "pos").with_row_index("_i").join(ce, on=["seq", "pos"], how="left").sort("_i")
    core, diffs = [], []
    mixes = list(dict.fromkeys(m for m, _ in codes))
    xd = x.double()
    for kind, phase, seg, m in groups(rows):
        files = rows["file"].to_numpy()[m]
        fb = FileBoot(files, n_boot, seed)
        xm = xd[torch.as_tensor(m)]
        cen = (xm - xm.mean(0)).pow(2).sum(-1).numpy()
        tot = xm.pow(2).sum(-1).numpy()
        n_distinct = int(torch.unique(xm.float(), dim=0).shape[0])
        info = {"kind": kind, "phase": phase, "segment": seg, "n_rows": int(m.sum()), "n_distinct": n_distinct,
                "n_prompts": int(rows["prompt_id"].filter(pl.Series(m)).n_unique()), "n_files": fb.k}
        ce_m, fb_ce = None, None
        if ce_rows is not None:
            ce_m = ce_rows.filter(pl.Series(m))
            ok = ce_m["clean"].is_not_null().to_numpy()
            ce_files = files[ok]
            ce_m = ce_m.filter(pl.Series(ok))
            fb_ce = FileBoot(ce_files, n_boot, seed) if ce_m.height else None
        boots: dict[tuple[str, int], dict[str, np.ndarray]] = {}
        for (mix, s), (xh, f) in codes.items():
            mm = torch.as_tensor(m)
            err = (xm - xh[mm].double()).pow(2).sum(-1).numpy()
            fm = f[mm]
            l0 = (fm > 0).sum(-1).double().numpy()
            fvu, fvu_b = fb.ratio(err, cen)
            l0v, l0_b = fb.ratio(l0, np.ones_like(l0))
            dens = feature_density(fm)
            cos = torch.nn.functional.cosine_similarity(xm, xh[mm].double(), dim=-1).mean()
            (fvu_lo, fvu_hi), (l0_lo, l0_hi) = _q(fvu_b, fb.k), _q(l0_b, fb.k)
            row = {"mix": mix, "seed": s, **info, "fvu": fvu, "fvu_lo": fvu_lo, "fvu_hi": fvu_hi,
                   "explained_variance": 1 - fvu, "explained_variance_lo": 1 - fvu_hi,
                   "explained_variance_hi": 1 - fvu_lo,
                   "explained_variance_uncentred": 1 - float(err.sum() / tot.sum()), "cos": float(cos),
                   "l0": l0v, "l0_lo": l0_lo, "l0_hi": l0_hi,
                   "dead": float((dens == 0).double().mean()), "dense": float((dens > 0.01).double().mean()),
                   "ce_recovered": None, "ce_recovered_lo": None, "ce_recovered_hi": None, "ce_clean": None,
                   "ce_zero": None, "ce_sae": None, "n_ce_positions": 0}
            boots[(mix, s)] = {"fvu": (fvu, fvu_b)}
            key = f"{mix}-s{s}"
            if fb_ce is not None and key in ce_m.columns:
                z, c, sp = (ce_m[col].to_numpy() for col in ("zero", "clean", key))
                if z.sum() - c.sum() > 0:
                    v, b = fb_ce.ratio(z - sp, z - c)
                    lo, hi = _q(b, fb_ce.k)
                    row.update(ce_recovered=v, ce_recovered_lo=lo, ce_recovered_hi=hi)
                    boots[(mix, s)]["ce_recovered"] = (v, b)
                row.update(ce_clean=float(c.mean()), ce_zero=float(z.mean()), ce_sae=float(sp.mean()),
                           n_ce_positions=int(z.size))
            core.append(row)
        for other in mixes[1:]:
            for s in sorted({s for mm_, s in codes if mm_ == mixes[0]} & {s for mm_, s in codes if mm_ == other}):
                for metric in ("fvu", "ce_recovered"):
                    a, b = boots[(other, s)].get(metric), boots[(mixes[0], s)].get(metric)
                    if a is None or b is None:
                        continue
                    lo, hi = _q(a[1] - b[1], (fb_ce if metric == "ce_recovered" else fb).k)
                    diffs.append({"kind": kind, "phase": phase, "segment": seg, "metric": metric, "mix": other,
                                  "base": mixes[0], "seed": s, "diff": a[0] - b[0], "lo": lo, "hi": hi,
                                  "n_files": fb.k, "n_rows": int(m.sum())})
    diff_schema = {"kind": pl.String, "phase": pl.String, "segment": pl.String, "metric": pl.String, "mix": pl.String,
                   "base": pl.String, "seed": pl.Int64, "diff": pl.Float64, "lo": pl.Float64, "hi": pl.Float64,
                   "n_files": pl.Int64, "n_rows": pl.Int64}
    return pl.DataFrame(core, infer_schema_length=None), pl.DataFrame(diffs, schema=diff_schema)


def reproducibility(saes: Mapping[tuple[str, int], Any], alive: Mapping[tuple[str, int], torch.Tensor],
                    threshold: float) -> pl.DataFrame:
    """For every ordered pair of SAEs of one mix (seed a → seed b), and of two mixes at one seed: how many of a's
    features have a decoder row with cosine ≥ ``threshold`` in b (best match), of all and of those alive
    (active on some row of the study)."""
    from trajscope.studies.sae_stability import decoder_match

    out = []
    keys = list(saes)
    for a in keys:
        for b in keys:
            same_mix, same_seed = a[0] == b[0], a[1] == b[1]
            if a == b or not (same_mix or same_seed):
                continue
            cos, _ = decoder_match(saes[b].W_dec.detach(), saes[a].W_dec.detach())
            ok = cos >= threshold
            al = alive[a]
            out.append({"comparison": "across seeds" if same_mix else "across mixes", "mix": a[0], "seed": a[1],
                        "other_mix": b[0], "other_seed": b[1], "n_reproduced": int(ok.sum()),
                        "n_features": int(cos.numel()), "n_reproduced_alive": int((ok & al).sum()),
                        "n_alive": int(al.sum()), "median_best_cos": float(cos.median()), "threshold": threshold})
    schema = {"comparison": pl.String, "mix": pl.String, "seed": pl.Int64, "other_mix": pl.String,
              "other_seed": pl.Int64, "n_reproduced": pl.Int64, "n_features": pl.Int64, "n_reproduced_alive": pl.Int64,
              "n_alive": pl.Int64, "median_best_cos": pl.Float64, "threshold": pl.Float64}
    return pl.DataFrame(out, schema=schema)
