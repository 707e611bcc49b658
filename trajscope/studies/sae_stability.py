"""SAE stability under harvest perturbation: does a serving mode change the SAE trained on its
harvest more than re-seeding the training does?

The same prompt set is harvested (block ``layer`` output, every computed prompt position, through
:func:`trajscope.studies.harvest.harvest_served`) under serving modes that differ from the
``reference`` (float32, batch 1, no cache) in one thing each:

- ``batch``: prompts co-batched ``serve_batch`` at a time with ``padding_side`` padding;
- ``bfloat16``: the same weights run in bfloat16 (activations read back as float32);
- ``prefix-cache``: the set's shared prefix (a system prompt / header) is served from a warm prefix
  cache, so its positions are never computed and the harvest has no rows there.

Prompts are split once into ``train`` and ``eval`` (:func:`trajscope.stats.split_ids`). For every
mode and every seed, a TopK SAE is trained on the mode's ``train`` rows with one budget
(:func:`trajscope.features.train.train_sae`; the seed sets both the initialisation and the batch draws,
so for ``batch`` and ``bfloat16`` — same rows, same order — a same-seed pair differs only in the
activation values). Every SAE is evaluated on the **reference** harvest's ``eval`` rows.

Pairs compared (``kind``): ``seed`` (reference seed s vs reference seed s' > s: the seed-to-seed
spread), ``same_seed`` (mode seed s vs reference seed s) and ``cross_seed`` (mode seed s vs
reference seed s' ≠ s: comparable to ``seed`` pairs, plus the mode). Per pair:

- ``dec_maxcos``: mean over B's features of the largest cosine between its decoder row and any of
  A's; ``share_matched``: share of B's features with that cosine ≥ ``match_threshold``;
- ``row_jaccard``: per eval row, Jaccard (:func:`trajscope.metrics.overlap.jaccard`) of A's active
  features and B's active features mapped to their best-matching A feature, averaged over rows;
- ``fvu_delta``: FVU(B) − FVU(A) on the eval rows (FVU as in :mod:`trajscope.metrics.sae_eval`).

Intervals (95 %): prompt-clustered bootstrap over eval prompts
(:func:`trajscope.stats.cluster_bootstrap`) for row metrics — FVU with its denominator (the eval
set's centred variance) held fixed; features resampled for ``dec_maxcos``; binomial for
``share_matched``. :func:`summarize_stability` pools each mode's pairs of one kind and sets them
beside the ``seed`` pairs' range.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import numpy as np
import polars as pl
import torch

from trajscope.errors import TrajscopeError
from trajscope.metrics.overlap import jaccard, row_topk_sets
from trajscope.metrics.sae_eval import reconstruction_stats
from trajscope.stats import binomial_interval, cluster_bootstrap, split_ids
from trajscope.studies.common import deltas
from trajscope.studies.harvest import ServedHarvest, harvest_served

MODES = ("reference", "batch", "bfloat16", "prefix-cache")
METRICS = ("dec_maxcos", "share_matched", "row_jaccard", "fvu_delta")


@dataclasses.dataclass(frozen=True)
class StabilityConfig:
    """Settings of one SAE-stability study (every mode and seed gets the same SAE budget)."""

    layer: int = 3
    modes: tuple[str, ...] = MODES
    seeds: tuple[int, ...] = (0, 1, 2)
    d_sae: int = 512
    k: int = 16
    n_tokens: int = 256_000
    batch_size: int = 512
    lr: float = 1e-3
    serve_batch: int = 16
    padding_side: str = "left"
    eval_fraction: float = 0.25
    split_seed: int = 0
    match_threshold: float = 0.9
    n_boot: int = 1000

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def check(self, n_layers: int) -> None:
        """One clear error for settings the study cannot run."""
        bad = [m for m in self.modes if m not in MODES]
        if bad:
            raise TrajscopeError(f"Unknown serving mode '{bad[0]}'; choose from {', '.join(MODES)}.")
        if "reference" not in self.modes:
            raise TrajscopeError("The modes must include 'reference' (every SAE is compared with it).")
        if len(set(self.seeds)) < 2:
            raise TrajscopeError("Give at least two distinct seeds; the seed-to-seed spread needs them.")
        if not 0 <= self.layer < n_layers:
            raise TrajscopeError(f"Layer {self.layer} is out of range; the model has layers 0..{n_layers - 1}.")
        if not 0 < self.eval_fraction < 1:
            raise TrajscopeError(f"eval_fraction must be between 0 and 1, not {self.eval_fraction}.")


def harvest_modes(model: Any, prompts: Sequence[tuple[str, list[int]]], cfg: StabilityConfig) -> dict[str, ServedHarvest]:
    """One :class:`~trajscope.studies.harvest.ServedHarvest` of block ``cfg.layer`` per serving mode."""
    from trajscope.studies.determinism import sibling
    from trajscope.studies.prefix_cache import check_shared_prefix

    if "prefix-cache" in cfg.modes:
        check_shared_prefix([ids for _, ids in prompts])
    out = {}
    for mode in cfg.modes:
        if mode == "reference":
            out[mode] = harvest_served(model, prompts, [cfg.layer])
        elif mode == "batch":
            out[mode] = harvest_served(model, prompts, [cfg.layer], batch_size=cfg.serve_batch,
                                       padding_side=cfg.padding_side)
        elif mode == "bfloat16":
            out[mode] = harvest_served(sibling(model, "bfloat16"), prompts, [cfg.layer])
        else:
            out[mode] = harvest_served(model, prompts, [cfg.layer], prefix_cache="warm")
    return out


def _pool(h: ServedHarvest, layer: int, ids: set[str]) -> tuple[torch.Tensor, pl.DataFrame]:
    """Activations ``[n, d]`` (float32) and rows (prompt_id, pos) of the computed rows of prompts ``ids``."""
    rows = h.rows.filter((pl.col("status") == "computed") & pl.col("prompt_id").is_in(sorted(ids)))
    return h.acts[layer][rows["act_row"].to_torch()].float(), rows.select("prompt_id", "pos")


def harvest_table(harvests: dict[str, ServedHarvest], layer: int, shared: int, n_boot: int) -> pl.DataFrame:
    """Per mode: rows computed / reused, and the mean relative L2 of its activations vs the reference's at
    the positions it computed (per-prompt means, prompt bootstrap interval)."""
    ref = harvests["reference"].per_prompt(layer)
    recs = []
    for mode, h in harvests.items():
        mine = h.per_prompt(layer)
        per_prompt = []
        for pid, x in mine.items():
            r = ref[pid][ref[pid].shape[0] - x.shape[0]:]  # the positions this mode computed (the suffix)
            per_prompt.append(float(np.mean(deltas({0: r}, {0: x.float()})["rel_l2"])))
        iv = cluster_bootstrap(per_prompt, n_boot=n_boot)
        comp = int((h.rows["status"] == "computed").sum())
        recs.append({"mode": mode, **h.provenance.to_dict(), "n_prompts": len(mine), "n_rows": h.rows.height,
                     "n_computed": comp, "n_reused": h.rows.height - comp, "shared_prefix": shared,
                     "rel_l2_vs_reference": iv.estimate, "rel_l2_lo": iv.lo, "rel_l2_hi": iv.hi})
    return pl.DataFrame(recs)


def decoder_match(w_a: torch.Tensor, w_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For each of B's features, the largest decoder cosine with any of A's features and that feature.

    Args:
        w_a: ``[d_sae_a, d_in]`` decoder rows of A; w_b: ``[d_sae_b, d_in]`` of B.
    Returns:
        ``(maxcos [d_sae_b], match [d_sae_b])`` (``match`` indexes A's features).
    """
    a = w_a.double() / w_a.double().norm(dim=-1, keepdim=True).clamp_min(1e-12)
    b = w_b.double() / w_b.double().norm(dim=-1, keepdim=True).clamp_min(1e-12)
    return (b @ a.T).max(dim=1)


def row_jaccards(f_a: torch.Tensor, f_b: torch.Tensor, match: torch.Tensor) -> np.ndarray:
    """Per row, Jaccard of A's active features and B's active features mapped through ``match``: ``[n]``."""
    k = int(max((f_a > 0).sum(-1).max(), (f_b > 0).sum(-1).max(), 1))
    m = match.tolist()
    return np.array([jaccard(sa, {m[j] for j in sb}) for sa, sb in zip(row_topk_sets(f_a, k), row_topk_sets(f_b, k))])


@dataclasses.dataclass
class _Eval:
    """One SAE on the eval rows: per-row FVU share ``err_i / v̄`` and its codes."""

    sq_err: np.ndarray
    codes: torch.Tensor
    stats: dict[str, float]


def _evaluate(sae: Any, x: torch.Tensor) -> _Eval:
    with torch.no_grad():
        x_hat, f = sae.reconstruct(x)
    return _Eval((x.double() - x_hat.double()).pow(2).sum(-1).numpy(), f, reconstruction_stats(x, x_hat, f))


def _fvu_rows(e: _Eval, x: torch.Tensor, mask: np.ndarray) -> np.ndarray:
    """Per-row ``‖x − x̂‖² / v̄`` over the rows in ``mask``; their mean is the subset's FVU."""
    xs = x[torch.as_tensor(mask)].double()
    v = float((xs - xs.mean(0)).pow(2).sum(-1).mean())
    return e.sq_err[mask] / v


def sae_table(evals: dict[tuple[str, int], _Eval], x: torch.Tensor, rows: pl.DataFrame, shared: int,
              curves: dict[tuple[str, int], pl.DataFrame], n_boot: int) -> pl.DataFrame:
    """Per SAE (mode, seed) and eval region (all / shared prefix / own tokens): FVU with its interval; the
    other :func:`~trajscope.metrics.sae_eval.reconstruction_stats` (over all eval rows) on the ``all`` rows."""
    pid = rows["prompt_id"].to_numpy()
    region = np.where(rows["pos"].to_numpy() < shared, "shared", "own")
    recs = []
    for (mode, seed), e in evals.items():
        last = curves[(mode, seed)].tail(max(1, curves[(mode, seed)].height // 10))
        for name, mask in (("all", np.ones(len(pid), bool)), ("shared", region == "shared"), ("own", region == "own")):
            if not mask.any():
                continue
            iv = cluster_bootstrap(_fvu_rows(e, x, mask), pid[mask], n_boot=n_boot)
            recs.append({"mode": mode, "seed": seed, "region": name, "n_rows": int(mask.sum()),
                         "n_prompts": int(len(set(pid[mask]))), "fvu": iv.estimate, "fvu_lo": iv.lo, "fvu_hi": iv.hi,
                         **{k: e.stats[k] if name == "all" else None  # over all eval rows only
                            for k in ("fvu_uncentred", "cos", "l0", "dead", "dense")},
                         "train_fvu_last10": float(last["fvu"].mean()), "train_dead_last10": float(last["dead"].mean())})
    return pl.DataFrame(recs)


def _pairs(modes: Sequence[str], seeds: Sequence[int], reference: str) -> list[tuple[str, int, int, str]]:
    """``(mode_b, seed_b, seed_a, kind)``; A is always the ``reference`` mode's SAE of ``seed_a``."""
    out = [(reference, t, s, "seed") for i, s in enumerate(seeds) for t in seeds[i + 1:]]
    for mode in (m for m in modes if m != reference):
        out += [(mode, s, a, "same_seed" if s == a else "cross_seed") for s in seeds for a in seeds]
    return out


def pair_rows(cfg: StabilityConfig, saes: dict, evals: dict, x: torch.Tensor,
              rows: pl.DataFrame, reference: str = "reference") -> tuple[pl.DataFrame, dict]:
    """The per-pair table (metrics with intervals) and the per-pair raw values the summary pools.

    The modes are those of ``saes`` (keys ``(mode, seed)``), in order; ``reference`` is mode A of every pair."""
    pid = rows["prompt_id"].to_numpy()
    every = np.ones(len(pid), bool)
    recs, raw = [], {}
    modes = list(dict.fromkeys(m for m, _ in saes))
    for mode, sb, sa, kind in _pairs(modes, cfg.seeds, reference):
        a, b = (reference, sa), (mode, sb)
        maxcos, match = decoder_match(saes[a].W_dec.detach(), saes[b].W_dec.detach())
        jac = row_jaccards(evals[a].codes, evals[b].codes, match)
        dfvu = _fvu_rows(evals[b], x, every) - _fvu_rows(evals[a], x, every)
        matched = int((maxcos >= cfg.match_threshold).sum())
        raw[(mode, sb, sa)] = {"dec_maxcos": maxcos.numpy(), "matched": (matched, maxcos.numel()),
                               "row_jaccard": jac, "fvu_delta": dfvu}
        ivs = {"dec_maxcos": cluster_bootstrap(maxcos.numpy(), n_boot=cfg.n_boot),
               "share_matched": binomial_interval(matched, maxcos.numel()),
               "row_jaccard": cluster_bootstrap(jac, pid, n_boot=cfg.n_boot),
               "fvu_delta": cluster_bootstrap(dfvu, pid, n_boot=cfg.n_boot)}
        rec = {"mode": mode, "kind": kind, "seed_b": sb, "seed_a": sa, "n_eval_rows": len(pid),
               "n_eval_prompts": len(set(pid)), "n_features": maxcos.numel()}
        for name, iv in ivs.items():
            rec.update({name: iv.estimate, f"{name}_lo": iv.lo, f"{name}_hi": iv.hi})
        recs.append(rec)
    return pl.DataFrame(recs), raw


def summarize_stability(pairs: pl.DataFrame, raw: dict, rows: pl.DataFrame, n_boot: int = 1000) -> pl.DataFrame:
    """Per mode, pair kind and metric: the pooled value with its interval, beside the seed pairs' range.

    ``verdict`` reads a mode against re-seeding: for similarities (``dec_maxcos``, ``share_matched``,
    ``row_jaccard``) ``beyond seed spread`` when the whole interval lies below the ``seed`` pairs'
    smallest value, ``closer than reseeding`` when it lies above their largest, else ``within seed
    spread``; for ``fvu_delta`` (signed, B − A) ``beyond seed spread`` when the interval excludes 0 and
    both its ends exceed the largest |Δ| of the seed pairs.
    """
    pid = rows["prompt_id"].to_numpy()
    seed_rows = pairs.filter(pl.col("kind") == "seed")
    recs = []
    for (mode, kind), g in pairs.group_by("mode", "kind", maintain_order=True):
        keys = [(mode, sb, sa) for sb, sa in zip(g["seed_b"], g["seed_a"])]
        for metric in METRICS:
            if metric == "share_matched":
                k = sum(raw[key]["matched"][0] for key in keys)
                iv = binomial_interval(k, sum(raw[key]["matched"][1] for key in keys))
            elif metric == "dec_maxcos":
                iv = cluster_bootstrap(np.concatenate([raw[key][metric] for key in keys]), n_boot=n_boot)
            else:  # rows of every pair, clustered by prompt (a prompt's rows travel together across pairs)
                iv = cluster_bootstrap(np.concatenate([raw[key][metric] for key in keys]),
                                       np.concatenate([pid] * len(keys)), n_boot=n_boot)
            s = seed_rows[metric]
            lo, hi = float(s.min()), float(s.max())
            if metric == "fvu_delta":
                big = float(s.abs().max())
                beyond = not (iv.lo <= 0 <= iv.hi) and min(abs(iv.lo), abs(iv.hi)) > big
                verdict = "beyond seed spread" if beyond else "within seed spread"
            else:
                verdict = ("beyond seed spread" if iv.hi < lo else "closer than reseeding" if iv.lo > hi
                           else "within seed spread")
            if kind == "seed":
                verdict = "seed spread"
            recs.append({"mode": mode, "kind": kind, "metric": metric, "n_pairs": len(keys), "value": iv.estimate,
                         "lo": iv.lo, "hi": iv.hi, "seed_min": lo, "seed_max": hi, "verdict": verdict})
    return pl.DataFrame(recs)


def sae_stability_study(model: Any, prompts: Sequence[tuple[str, list[int]]], cfg: StabilityConfig = StabilityConfig(),
                        progress: Callable[[int, int], None] | None = None) -> dict[str, pl.DataFrame]:
    """Harvest under every mode, train ``len(modes) × len(seeds)`` SAEs, compare them.

    Args:
        model: a local :class:`~trajscope.model.ModelHandle` (float32 is the reference).
        prompts: ``(prompt_id, token ids)`` pairs; with ``prefix-cache`` in the modes they must share
            a prefix (e.g. :func:`trajscope.studies.prompts.with_header`).
        cfg: a :class:`StabilityConfig`.
        progress: optional ``(done, total)`` after each trained SAE.
    Returns:
        ``sae-stability_harvests`` (per mode), ``sae-stability_saes`` (per SAE × eval region),
        ``sae-stability_pairs`` (per pair), ``sae-stability_summary`` (per mode × kind × metric).
    """
    from trajscope.studies.prompts import shared_prefix_len

    cfg.check(model.n_layers)
    if model.dtype != "float32":
        raise TrajscopeError(f"The reference harvest runs in float32; load the model in float32, not {model.dtype}.")
    ids = [p for p, _ in prompts]
    if len(set(ids)) != len(ids):
        raise TrajscopeError("Prompt ids must be distinct; the train/eval split is by prompt.")
    if len(ids) < 4:
        raise TrajscopeError(f"The SAE-stability study needs at least 4 prompts (train and eval), not {len(ids)}.")
    split = split_ids(ids, (1 - cfg.eval_fraction, cfg.eval_fraction), ("train", "eval"), seed=cfg.split_seed)
    harvests = harvest_modes(model, prompts, cfg)
    shared = shared_prefix_len([s for _, s in prompts])
    x_eval, eval_rows = _pool(harvests["reference"], cfg.layer, set(split["eval"]))
    pools = {mode: _pool(harvests[mode], cfg.layer, set(split["train"]))[0] for mode in cfg.modes}
    saes, pairs, summary = train_compare(pools, x_eval, eval_rows, shared, cfg, progress=progress)
    setup = {"layer": cfg.layer, "n_train_prompts": len(split["train"]), "n_eval_prompts": len(split["eval"])}
    return {"sae-stability_harvests": harvest_table(harvests, cfg.layer, shared, cfg.n_boot).with_columns(
                [pl.lit(v).alias(k) for k, v in setup.items()]),
            "sae-stability_saes": saes.with_columns(
                [pl.lit(v).alias(k) for k, v in {**setup, "d_sae": cfg.d_sae, "k": cfg.k,
                                                  "n_tokens": cfg.n_tokens}.items()]),
            "sae-stability_pairs": pairs, "sae-stability_summary": summary}


def train_compare(pools: dict[str, torch.Tensor], x_eval: torch.Tensor, eval_rows: pl.DataFrame, shared: int,
                  cfg: StabilityConfig, *, reference: str = "reference",
                  progress: Callable[[int, int], None] | None = None) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """Train one TopK SAE per harvest and seed with one budget, evaluate each on ``x_eval`` and compare them.

    Args:
        pools: ``{mode: training rows [n, d]}``, ``reference`` among them (the A side of every pair).
        x_eval: the held-out rows every SAE is evaluated on ``[m, d]``; eval_rows: their ``prompt_id`` and
            ``pos`` (the bootstrap clusters and the shared / own regions, ``pos < shared`` being shared).
        cfg: the budget (``d_sae``, ``k``, ``n_tokens``, ``batch_size``, ``lr``, ``layer``), ``seeds``,
            ``match_threshold`` and ``n_boot``; its ``modes`` are not read (the pools' keys are the modes).
        progress: optional ``(done, total)`` after each trained SAE.
    Returns:
        ``(saes, pairs, summary)``: :func:`sae_table`, :func:`pair_rows` and :func:`summarize_stability`.
    """
    from trajscope.features.train import TrainConfig, train_sae

    if reference not in pools:
        raise TrajscopeError(f"The harvests must include the reference mode '{reference}'.")
    steps = max(1, cfg.n_tokens // cfg.batch_size)
    tcfg = dict(d_sae=cfg.d_sae, k=cfg.k, n_tokens=cfg.n_tokens, batch_size=cfg.batch_size, lr=cfg.lr,
                warmup_steps=min(100, max(1, steps // 10)), dead_after=min(200_000, cfg.n_tokens // 4))
    saes, evals, curves, total = {}, {}, {}, len(pools) * len(cfg.seeds)
    for mode, pool in pools.items():
        for seed in cfg.seeds:
            sae, curve = train_sae(pool, None, TrainConfig(**tcfg, seed=seed), layer=cfg.layer, progress=False,
                                   metadata={"serving_mode": mode, "n_train_rows": int(pool.shape[0])})
            saes[(mode, seed)], curves[(mode, seed)] = sae, curve
            evals[(mode, seed)] = _evaluate(sae, x_eval)
            if progress is not None:
                progress(len(saes), total)
    pairs, raw = pair_rows(cfg, saes, evals, x_eval, eval_rows, reference)
    return (sae_table(evals, x_eval, eval_rows, shared, curves, cfg.n_boot), pairs,
            summarize_stability(pairs, raw, eval_rows, cfg.n_boot))
