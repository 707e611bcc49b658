"""Run the steering-success study: generate steered and unsteered continuations, score them from the text.

Prompts come as ``(id, token ids)``; a prompt's source file is its id up to the first ``#`` or
``:``. Prompts of ``exclude_files`` (the files that chose the vector's layer or strength) are left
out; every other prompt is held out (the vectors are fitted on contrast pairs, a separate file).
Every run is greedy, steering from decode step 1 unless it is the by-depth arm.

Arms, each against the unsteered run of the same prompt:

- **headline**: the vector file at its layer and strength (all held-out prompts), and the negated
  vector (the same strength, minus);
- **layer sweep**: CAA vectors from the contrast pairs at each sweep layer × multiplier
  (``sweep_prompts`` prompts);
- **SAE**: the SAE decoder row whose cosine with the CAA vector at the SAE's layer is highest,
  scaled to that vector's norm × multiplier (matched norm), against that CAA cell;
- **by depth**: the headline vector switched on at step k, scored over the equal window of tokens
  k … k + window − 1 against the base run's same window; teacher-forced on the base tokens, the
  KL per step feeds the steering study's onset/accumulation summary
  (:func:`trajscope.studies.steering.summary.decay_summary`).

Per run: the French/English function-word counts, the behaviour score and success
(:mod:`trajscope.metrics.steering`) and the mean NLL of the scored tokens under the unsteered
model (teacher-forced on the run's own text; ``exp`` is the perplexity).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Sequence

import numpy as np
import polars as pl
import torch

from trajscope.errors import TrajscopeError
from trajscope.metrics import steering as M
from trajscope.studies.registry import Result
from trajscope.studies.steering_success import config as C
from trajscope.studies.steering_success import summary as S
from trajscope.studies.steering.sweep import target_ids
from trajscope.studies.steering_success.generate import Prefilled, continuation_logits, prefill, steered_greedy


def file_of(prompt_id: str) -> str:
    """A prompt's source file: its id up to the first ``#`` or ``:``."""
    return re.split(r"[#:]", str(prompt_id), maxsplit=1)[0] or str(prompt_id)


def spread(ids: Sequence[str], n: int) -> list[int]:
    """Indices of ``n`` of ``ids`` taken round-robin over their source files (all when n ≥ len)."""
    by: dict[str, list[int]] = {}
    for i, pid in enumerate(ids):
        by.setdefault(file_of(pid), []).append(i)
    order = [q[j] for j in range(max(map(len, by.values()), default=0)) for q in by.values() if j < len(q)]
    return sorted(order[:n])


def distinct_share(text: str) -> float:
    """Distinct words / words (1.0 for none): low values flag a repetition loop."""
    words = re.findall(r"\w+", text.lower())
    return len(set(words)) / len(words) if words else 1.0


class _Bar:
    def __init__(self, total: int, progress: Callable[[int, int], None] | None):
        from tqdm.auto import tqdm

        self.done, self.total, self.progress = 0, total, progress
        self.bar = tqdm(total=total, desc="steering-success", unit="row", disable=progress is not None)

    def update(self, n: int) -> None:
        self.done += n
        self.bar.update(n)
        if self.progress is not None:
            self.progress(self.done, self.total)


def _score(model: Any, batches: list[Prefilled], conts: list[list[int]], start: int, bar: _Bar,
           targets: list[int] | None = None) -> list[dict]:
    """Text metrics and unsteered NLL of ``conts[start:]`` (cut after the first EOS) for each row."""
    logits = continuation_logits(model, batches, conts, None, on_batch=bar.update)
    eos = model.eos_token_id
    out = []
    for c, lg in zip(conts, logits):
        end = len(c)
        if eos is not None and eos in c[start:]:
            end = c.index(eos, start) + 1
        text = model.tokenizer.decode(c[start:end], skip_special_tokens=True)
        fr, en = M.language_counts(text)
        score, success = M.behaviour(text, c[start:end], targets)
        nll = M.mean_nll(lg[start:end], c[start:end])
        out.append({"text": text, "fr": fr, "en": en, "score": score, "success": success,
                    "nll": nll, "n_scored": end - start, "distinct": distinct_share(text)})
    return out


def _arm_rows(arm: str, layer: int, strength: float, ids: list[str], steered: list[dict], base: list[dict],
              **extra: Any) -> list[dict]:
    rows = []
    for pid, s, b in zip(ids, steered, base):
        rows.append({"arm": arm, "layer": layer, "strength": float(strength), "prompt_id": pid, "file": file_of(pid),
                     **{k: s[k] for k in ("text", "fr", "en", "score", "success", "nll", "n_scored", "distinct")},
                     "base_text": b["text"], "base_score": b["score"], "base_success": b["success"],
                     "base_nll": b["nll"], **extra})
    return rows


def run(model: Any, prompts: Sequence[tuple[str, list[int]]], config: C.SuccessConfig,
        progress: Callable[[int, int], None] | None = None, layers: Sequence[int] | None = None) -> Result:
    """Run the study on ``prompts`` (``(id, token ids)``).

    Returns:
        A :class:`~trajscope.studies.registry.Result` with tables ``steering_success`` (one row per arm ×
        prompt), ``steering_success_summary`` (per arm), ``steering_success_anti`` (per layer: the
        anti-steerable fraction), ``steering_success_depth`` (per start depth) and
        ``steering_success_depth_steps`` (per depth × prompt × step: teacher-forced KL); summaries from
        :func:`~trajscope.studies.steering_success.summary.headline`.
    """
    if layers:
        raise TrajscopeError("The steering-success study takes its sweep layers from --sweep-layers, not --layers.")
    prompts = [(str(i), list(t)) for i, t in (prompts or [])]
    held = [(i, t) for i, t in prompts if file_of(i) not in set(config.exclude_files)]
    if not held:
        raise TrajscopeError("Every prompt comes from an --exclude-files file; no held-out prompt is left.")
    if config.heldout_prompts:
        held = [held[i] for i in spread([i for i, _ in held], config.heldout_prompts)]
    ids, toks = [i for i, _ in held], [t for _, t in held]
    vec = C.load_vector(model, config)
    pair_file = C.pairs_path(model, config)
    pairs = C.read_pair_ids(model, pair_file)
    sae = C.load_sae(model, config)
    tg = target_ids(model, [config.target]) if config.target else None
    sweep_layers = sorted(set(config.sweep_layers) | ({int(sae[1].cfg.layer)} if sae else set()))
    caa = C.caa_vectors(model, pairs, sweep_layers)
    sw = spread(ids, config.sweep_prompts)
    dp = spread(ids, config.depth_prompts) if config.depths else []
    bs, N = config.batch_size, config.new_tokens
    k_max = max(config.depths) if dp else 0
    n_base = max(N, k_max + config.window)
    n_sweep_runs = len(sweep_layers) * len(config.strengths) + (len(config.strengths) if sae else 0)
    total = (3 * len(held) + 4 * len(held) + (1 + 2 * n_sweep_runs) * len(sw)
             + len(dp) * (2 + 4 * len(config.depths)))
    bar = _Bar(total, progress)
    everyone = list(range(len(held)))
    pre = {"all": prefill(model, toks, bs, bar.update)}
    pre["sweep"] = prefill(model, [toks[i] for i in sw], bs, bar.update)
    pre["depth"] = prefill(model, [toks[i] for i in dp], bs, bar.update) if dp else []

    base_cont = steered_greedy(model, pre["all"], None, n_base, on_batch=bar.update)
    base = _score(model, pre["all"], [c[:N] for c in base_cont], 0, bar, tg)
    rows: list[dict] = []

    def arm(name: str, v: Any, part: str, **extra: Any) -> None:
        rows_of = everyone if part == "all" else sw
        cont = steered_greedy(model, pre[part], v, N, on_batch=bar.update)
        rows.extend(_arm_rows(name, v.layer, v.strength, [ids[i] for i in rows_of],
                              _score(model, pre[part], cont, 0, bar, tg), [base[i] for i in rows_of], **extra))

    arm("headline", vec, "all")
    arm("headline-negated", vec.at(strength=-vec.strength), "all")
    from trajscope.steering import SteeringVector

    for L in sweep_layers:
        for s in config.strengths:
            arm("caa-sweep", SteeringVector(layer=L, direction=caa[L], strength=s, name=f"caa-{L}"), "sweep",
                direction_norm=float(caa[L].norm()))
    feature = None
    if sae is not None:
        name, model_sae = sae
        L = int(model_sae.cfg.layer)
        W = model_sae.W_dec.detach().float()
        cos = (W @ caa[L]) / (W.norm(dim=-1) * caa[L].norm())
        feature = int(cos.argmax())
        row = W[feature] / W[feature].norm() * caa[L].norm()
        for s in config.strengths:
            arm("sae", SteeringVector(layer=L, direction=row, strength=s, name=f"{name}-f{feature}"), "sweep",
                direction_norm=float(row.norm()), feature=feature, cosine=float(cos[feature]))
    depth_rows, step_rows = _by_depth(model, config, vec, pre["depth"], [ids[i] for i in dp],
                                      [base_cont[i] for i in dp], bar, tg)
    bar.bar.close()
    runs = pl.DataFrame(rows, infer_schema_length=None)
    summary = S.arm_summary(runs, n_boot=config.n_boot)
    anti = S.anti_steerable(runs)
    steps = pl.DataFrame(step_rows, infer_schema_length=None) if step_rows else pl.DataFrame()
    depth = S.depth_summary(pl.DataFrame(depth_rows, infer_schema_length=None), steps, config.window, config.n_boot) \
        if depth_rows else pl.DataFrame()
    setup = {"n_heldout": len(held), "heldout_files": sorted({file_of(i) for i in ids}),
             "excluded_files": sorted(set(config.exclude_files)), "n_sweep": len(sw), "n_depth": len(dp),
             "vector_layer": vec.layer, "vector_strength": vec.strength, "vector_norm": float(vec.direction.norm()),
             "pairs": str(pair_file), "n_pairs": len(pairs), "sweep_layers": sweep_layers,
             "caa_cosine_to_vector": (float(torch.nn.functional.cosine_similarity(caa[vec.layer], vec.direction, 0))
                                      if vec.layer in caa else None),
             "sae": sae[0] if sae else None, "sae_feature": feature, "new_tokens": N,
             "criterion": f"token {config.target!r}" if config.target else "french"}
    tables = {"steering_success": runs, "steering_success_summary": summary, "steering_success_anti": anti}
    if depth.height:
        tables.update(steering_success_depth=depth, steering_success_depth_steps=steps)
    return Result(study="steering-success", tables=tables, config=dataclasses.asdict(config),
                  summaries={**S.headline(summary, anti, depth), "setup": setup})


def _by_depth(model: Any, config: C.SuccessConfig, vec: Any, batches: list[Prefilled], ids: list[str],
              base_cont: list[list[int]], bar: _Bar, tg: list[int] | None) -> tuple[list[dict], list[dict]]:
    """Per depth k × prompt: window text metrics of the steered and base runs; per step the teacher-forced KL."""
    if not batches:
        return [], []
    W = config.window
    span = max(config.depths) + W
    base_tf = continuation_logits(model, batches, [c[:span] for c in base_cont], None, on_batch=bar.update)
    rows, steps = [], []
    for k in config.depths:
        v = vec.at(start_step=k)
        cont = steered_greedy(model, batches, v, W, prefix=[c[:k] for c in base_cont], on_batch=bar.update)
        st = _score(model, batches, cont, k, bar, tg)
        bw = _score(model, batches, [c[:k + W] for c in base_cont], k, bar, tg)
        forced = continuation_logits(model, batches, [c[:span] for c in base_cont], v, on_batch=bar.update)
        for i, pid in enumerate(ids):
            rows.append({"start_step": k, "prompt_id": pid, "file": file_of(pid), "prompt_idx": i,
                         **{k2: st[i][k2] for k2 in ("text", "score", "success", "nll", "n_scored", "distinct")},
                         "base_text": bw[i]["text"], "base_score": bw[i]["score"], "base_success": bw[i]["success"],
                         "base_nll": bw[i]["nll"]})
            kl = M.kl_divergence(base_tf[i], forced[i]).numpy()
            flip = (base_tf[i].argmax(-1) != forced[i].argmax(-1)).numpy()
            for s in range(1, span):  # row s of the logits is query step s
                steps.append({"run_id": pid, "prompt_idx": i, "start_step": k, "strength": float(v.strength),
                              "step": s, "kl_to_base": float(kl[s]), "token_changed": bool(flip[s])})
    return rows, steps
