"""The serving-vllm study's SAE part: one TopK SAE per harvest mode, compared as the sae-stability study does.

A **harvest mode** is one way the engine produced a prompt's layer-``L`` residual rows; its harvest is the
rows the plugin kept, per prompt: the prompt positions the engine computed, then the decode positions.

- ``alone`` (the reference): the prompt alone in the engine (``alone-<i>``);
- ``batch``: the prompt's first co-scheduled run in the plan (:func:`mode_runs`): the first neighbour kind of
  the config that the prompt has, in the first slot;
- ``chunked-prefill-<c>``: the engine with a budget of ``c`` tokens per forward (``chunk<c>-<i>``);
- ``prefix-cache``: the prompts in order on one shared cache (``prefix-<i>``). Positions served from the cache
  were never computed, so this harvest lacks them: for most prompts the leading full blocks of the shared
  header.

Positions before ``first_pos`` (default 1: position 0, the attention sink, whose layer-15 residual in
SmolLM2 has a norm near 29,000, as the project's SmolLM2 SAEs do) are left out of training and evaluation;
the harvest table counts them. The prompts are split once into ``train`` and ``eval`` (:func:`trajscope.stats.split_ids`). Per mode and seed
one TopK SAE is trained on the mode's rows of the train prompts, with one budget for all
(:func:`trajscope.studies.sae_stability.train_compare`, the sae-stability study's own code: same trainer,
same seeds, same pair metrics and verdicts). Every SAE is evaluated on the ``alone`` rows of the eval prompts.
The shared / own regions of the FVU table split those rows at the prompts' shared prefix (the header).

Tables:

- ``serving-vllm_sae_harvests``: per mode, the rows it holds, the positions it lacks against ``alone``, its
  train rows (from ``first_pos`` on), and the relative L2 against ``alone`` at the positions both computed with
  the same tokens (mean per prompt, prompt-bootstrap interval);
- ``serving-vllm_saes``, ``serving-vllm_sae_pairs``, ``serving-vllm_sae_summary``: the sae-stability study's
  ``_saes``, ``_pairs`` and ``_summary`` tables, with ``alone`` as the reference mode (A of every pair);
- ``serving-vllm_sae_split``: each prompt's part, ``train`` or ``eval``.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any, Callable, Sequence

import polars as pl
import torch

from trajscope.errors import TrajscopeError

REFERENCE = "alone"


@dataclasses.dataclass
class PromptRows:
    """One prompt's harvest in one mode: rows ``[n, d]`` of positions ``first .. first + n − 1``, and the
    sequence's token ids (prompt then generated)."""

    first: int
    rows: torch.Tensor
    token_ids: list[int]


def mode_runs(plan: dict[str, list[list[dict]]], n_prompts: int) -> dict[str, dict[int, tuple[str, str]]]:
    """Per harvest mode and prompt index, the ``(engine, run id)`` whose rows make its harvest (module docstring).

    A mode that lacks a run for some prompt (a batch run needs a neighbour) is left out: every SAE must see
    the same prompts.
    """
    out: dict[str, dict[int, tuple[str, str]]] = {REFERENCE: {}, "batch": {}}
    for engine, calls in plan.items():
        for call in calls:
            for r in call:
                rid = r.get("run_id")
                if not rid:
                    continue
                kind, rest = rid.split("-", 1)
                i = int(rest.split("-")[0])
                mode = {"alone": REFERENCE, "batch": "batch", "prefix": "prefix-cache"}.get(
                    kind, f"chunked-prefill-{kind.removeprefix('chunk')}")
                out.setdefault(mode, {}).setdefault(i, (engine, rid))  # the first run in plan order
    return {m: runs for m, runs in out.items() if len(runs) == n_prompts}


def load_harvests(out: pathlib.Path, runs: dict[str, dict[int, tuple[str, str]]],
                  prompts: Sequence[tuple[str, list[int]]], layer: int) -> dict[str, dict[str, PromptRows]]:
    """The runs' kept residual rows at ``layer``, read back from the run directories the plugin wrote."""
    from trajscope.trajectory import Trajectory

    harvests: dict[str, dict[str, PromptRows]] = {}
    for mode, per in runs.items():
        harvests[mode] = {}
        for i, (engine, rid) in sorted(per.items()):
            t = Trajectory.load(out / engine / rid)
            harvests[mode][prompts[i][0]] = PromptRows(int(t.meta["vllm"]["first_computed_pos"]),
                                                       t.residual(layer).float(), list(t.token_ids))
    return harvests


def _common(a: PromptRows, b: PromptRows) -> tuple[int, int]:
    """Positions ``[lo, end)`` both harvests computed, with the same tokens up to and including each."""
    div = next((j for j, (x, y) in enumerate(zip(a.token_ids, b.token_ids)) if x != y),
               min(len(a.token_ids), len(b.token_ids)))
    return max(a.first, b.first), min(a.first + len(a.rows), b.first + len(b.rows), div)


def harvest_table(harvests: dict[str, dict[str, PromptRows]], train: Sequence[str], first_pos: int,
                  n_boot: int) -> pl.DataFrame:
    """Per mode: rows held, positions lacking against ``alone``, train rows (positions ≥ ``first_pos``), rel. L2
    vs ``alone`` (module docstring)."""
    from trajscope.stats import cluster_bootstrap

    ref = harvests[REFERENCE]
    recs = []
    for mode, per in harvests.items():
        rel, missing = [], 0
        for pid, h in per.items():
            r = ref[pid]
            lo, end = _common(r, h)
            a, b = r.rows[lo - r.first:end - r.first].double(), h.rows[lo - h.first:end - h.first].double()
            rel.append(float(((b - a).norm(dim=-1) / a.norm(dim=-1).clamp_min(1e-30)).mean()) if end > lo else float("nan"))
            have = set(range(h.first, h.first + len(h.rows)))
            missing += sum(1 for p in range(r.first, r.first + len(r.rows)) if p not in have)
        iv = cluster_bootstrap([v for v in rel if v == v], n_boot=n_boot)
        recs.append({"mode": mode, "n_prompts": len(per), "n_rows": sum(len(h.rows) for h in per.values()),
                     "n_missing": missing, "n_train_rows": len(_stack(per, train, first_pos)[0]),
                     "rel_l2_vs_alone": iv.estimate, "rel_l2_lo": iv.lo, "rel_l2_hi": iv.hi})
    return pl.DataFrame(recs)


def _stack(per: dict[str, PromptRows], ids: Sequence[str], first_pos: int) -> tuple[torch.Tensor, pl.DataFrame]:
    """Rows of prompts ``ids`` at positions ≥ ``first_pos``, stacked ``[n, d]``, and their ``prompt_id`` and ``pos``."""
    xs, pids, pos = [], [], []
    for pid in ids:
        h = per[pid]
        skip = max(0, first_pos - h.first)
        xs.append(h.rows[skip:])
        pids += [pid] * len(h.rows[skip:])
        pos += list(range(h.first + skip, h.first + len(h.rows)))
    return torch.cat(xs).float(), pl.DataFrame({"prompt_id": pids, "pos": pos}, schema_overrides={"pos": pl.Int32})


def sae_tables(harvests: dict[str, dict[str, PromptRows]], shared: int, cfg: Any, *, eval_fraction: float,
               first_pos: int = 1, split_seed: int = 0,
               progress: Callable[[int, int], None] | None = None) -> dict[str, pl.DataFrame]:
    """Split the prompts, train an SAE per mode and seed, compare them (module docstring).

    Args:
        harvests: ``{mode: {prompt_id: PromptRows}}``, ``alone`` among the modes, the same prompts in each.
        shared: the prompts' shared prefix length (the FVU table's shared / own regions).
        cfg: a :class:`~trajscope.studies.sae_stability.StabilityConfig` (budget, seeds, threshold, n_boot).
        eval_fraction: the share of prompts held out for evaluation; split_seed: the split's seed.
        first_pos: positions before it are left out of training and evaluation (the attention sink).
        progress: optional ``(done, total)`` after each trained SAE.
    Returns:
        ``serving-vllm_sae_harvests``, ``serving-vllm_saes``, ``serving-vllm_sae_pairs``, ``serving-vllm_sae_summary``
        and ``serving-vllm_sae_split``.
    """
    from trajscope.stats import split_ids
    from trajscope.studies.sae_stability import train_compare

    if REFERENCE not in harvests:
        raise TrajscopeError("The SAE part needs the alone harvest: it is the reference every SAE is compared with.")
    ids = list(harvests[REFERENCE])
    if any(set(per) != set(ids) for per in harvests.values()):
        raise TrajscopeError("Every harvest mode must hold the same prompts; the SAEs are compared on one split.")
    if len(ids) < 4:
        raise TrajscopeError(f"The SAE part needs at least 4 prompts (train and eval), not {len(ids)}.")
    split = split_ids(ids, (1 - eval_fraction, eval_fraction), ("train", "eval"), seed=split_seed)
    x_eval, eval_rows = _stack(harvests[REFERENCE], split["eval"], first_pos)
    pools = {mode: _stack(per, split["train"], first_pos)[0] for mode, per in harvests.items()}
    saes, pairs, summary = train_compare(pools, x_eval, eval_rows, shared, cfg, reference=REFERENCE, progress=progress)
    setup = {"layer": cfg.layer, "n_train_prompts": len(split["train"]), "n_eval_prompts": len(split["eval"]),
             "shared_prefix": shared, "first_pos": first_pos}
    lit = lambda d: [pl.lit(v).alias(k) for k, v in d.items()]  # noqa: E731
    return {"serving-vllm_sae_harvests": harvest_table(harvests, split["train"], first_pos, cfg.n_boot).with_columns(lit(setup)),
            "serving-vllm_saes": saes.with_columns(lit({**setup, "d_sae": cfg.d_sae, "k": cfg.k, "n_tokens": cfg.n_tokens})),
            "serving-vllm_sae_pairs": pairs, "serving-vllm_sae_summary": summary,
            "serving-vllm_sae_split": pl.DataFrame({"prompt_id": ids, "split": [
                "train" if p in set(split["train"]) else "eval" for p in ids]})}
