"""Passkey retrieval under KV eviction: does the model still find a number hidden in a long prompt?

The field's first check of an eviction policy (the passkey task of Mohtashami & Jaggi, 2023, and the
needle-in-a-haystack tests LAQ, SnapKV and PyramidKV report): a long filler text hides one sentence with a
random passkey at a chosen depth, and a chat question at the end asks for it. The answer is read greedily and
scored by exact match of the key's digits (the first run of digits in the answer equals the key).

Prompts are built offline (:func:`needle_prompts`): the filler is the English documentation topics shipped with
every Python installation (``pydoc_data.topics``), cut to the context length in tokens; the passkey sentence sits
at depth ``d`` (a fraction of the filler's characters); the question is rendered through the tokenizer's chat
template (a tokenizer without one gets it as plain text ending in "The pass key is").

For each prompt the prefill runs once (:func:`needle_study`); each policy × budget then decodes the answer from
that prefill with the evicted prompt keys hidden from every decode query (the model boundary's key mask, from a
shared prefill: :meth:`~trajscope.model.ModelHandle.decode_on_cache`). The full cache's answer is the reference;
at budget 1.0 every policy keeps every key, so its answers equal the full model's exactly. H2O and the oracle are
not offered here: static H2O is the rolling one's first cut, and the oracle needs a full decode per prompt.
``streamingllm_rolling`` and ``h2o_rolling`` hold the whole cache at the budget during decode
(:mod:`trajscope.studies.eviction.rolling`); H2O's prompt scores are every prefill query's row summed layer by
layer (``rows_sum``), never the ``P²`` rows of every layer at once.

Each answer row also says how much of the passkey the policy kept: ``key_kept`` is the share of (layer, head,
passkey token) triples whose key stays after prefill's cut (the passkey's tokens are both of its occurrences in
the needle sentence, :func:`key_positions`).

:func:`heldout_perplexity` is the other measure the field reports: held-out text whose first P tokens are the
compressed prompt and whose rest is teacher-forced under the key mask (mean NLL per token; budget 1.0 equals the
full model's exactly); the registered ``eviction-ppl`` study (:mod:`trajscope.studies.eviction.perplexity`) runs
it on held-out files.

Accuracy per policy and budget comes with a Wilson interval (:func:`trajscope.stats.binomial_interval`) over
prompts, the unit of independence: :func:`accuracy_table` is the one function that computes it (the
``needle_summary`` table of the registered ``needle`` study, :mod:`trajscope.studies.eviction`, which the
report section reads).
"""

from __future__ import annotations

import random
import re
from typing import Any, Callable, Sequence

import polars as pl
import torch

from trajscope.errors import TrajscopeError
from trajscope.metrics import eviction as ev
from trajscope.studies.eviction import queries as eq

STATIC = ("snapkv", "pyramidkv", "streamingllm", "lookahead", "pseudo")
POLICIES = STATIC + ("streamingllm_rolling", "h2o_rolling")
QUESTION = "What is the pass key? Answer with the number only."


def filler_text() -> str:
    """English filler: Python's bundled documentation topics, in a fixed order."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k].strip() for k in sorted(topics))


def needle_prompts(model: Any, n: int, context: int, depths: Sequence[float], seed: int = 0) -> list[dict]:
    """``n`` passkey prompts of about ``context`` tokens; depths cycle through ``depths``.

    Returns:
        Dicts with ``id``, ``ids`` (chat-rendered token ids), ``key`` (the passkey digits), ``depth`` and
        ``offset`` (the filler window's start, in tokens; each prompt takes a different window).
    """
    if n < 1 or context < 64:
        raise TrajscopeError(f"Needle prompts need n ≥ 1 and a context of at least 64 tokens (got n={n}, {context}).")
    tok = model.tokenizer
    filler = tok.encode(filler_text(), add_special_tokens=False)
    rng = random.Random(seed)
    overhead = len(_render(tok, "x", 0, "1234567")) + 8
    body = context - overhead
    if body > len(filler):
        raise TrajscopeError(f"A {context}-token context needs more filler than the {len(filler)} tokens shipped.")
    out = []
    for i in range(n):
        key = str(rng.randrange(10 ** 6, 10 ** 7))
        depth = float(depths[i % len(depths)])
        start = rng.randrange(0, len(filler) - body)
        text = tok.decode(filler[start:start + body])
        ids = _render(tok, text, depth, key)
        out.append({"id": f"needle{i}", "ids": ids, "key": key, "depth": depth, "offset": start,
                    "key_pos": key_positions(tok, ids, key)})
    return out


def key_positions(tok: Any, ids: Sequence[int], key: str) -> list[int]:
    """Token positions of ``ids`` whose text overlaps an occurrence of ``key`` (the passkey's digits)."""
    starts, text = [], ""
    for t in ids:
        starts.append(len(text))
        text += tok.decode([t])
    ends = starts[1:] + [len(text)]
    out: set[int] = set()
    at = text.find(key)
    while at >= 0:
        out.update(i for i in range(len(ids)) if starts[i] < at + len(key) and ends[i] > at)
        at = text.find(key, at + 1)
    return sorted(out)


def _render(tok: Any, text: str, depth: float, key: str) -> list[int]:
    cut = int(len(text) * depth)
    cut = text.rfind(" ", 0, cut) + 1 if " " in text[:cut] else cut
    needle = f" The pass key is {key}. Remember it. {key} is the pass key. "
    content = f"{text[:cut]}{needle}{text[cut:]}\n\n{QUESTION}"
    if not getattr(tok, "chat_template", None):  # a base model: the question as plain text
        return tok.encode(content + "\nThe pass key is", add_special_tokens=False)
    ids = tok.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def answer_matches(answer: str, key: str) -> bool:
    """Whether the first run of digits in ``answer`` is exactly ``key``."""
    m = re.search(r"\d+", answer)
    return m is not None and m.group(0) == key


def needle_study(model: Any, prompts: Sequence[dict], policies: Sequence[str] = POLICIES,
                 budgets: Sequence[float | int] = (0.05, 0.1, 0.2, 1.0), *, window: int = 32, lookahead: int = 8,
                 answer_tokens: int = 12, progress: Callable[[int, int], None] | None = None,
                 pyramid_schedule: str = "code") -> pl.DataFrame:
    """Greedy answers of every policy × budget on every prompt, plus the full cache's. ``pyramid_schedule``:
    PyramidKV's per-layer budgets, ``"code"`` (its reference code's, the default) or ``"paper"``.

    Returns:
        One row per prompt × (policy, budget) and one per prompt for ``policy="full"`` (budget 1.0): ``run_id,
        depth, policy, budget, budget_tokens, prompt_len, answer, correct, key_kept`` (the share of the passkey's
        (layer, head, token) keys kept after prefill's cut; NaN when the prompt has no ``key_pos``).
    """
    from trajscope.studies.eviction import rolling
    bad = [p for p in policies if p not in POLICIES]
    if bad:
        raise TrajscopeError(f"The needle task runs {', '.join(POLICIES)}; '{bad[0]}' is not among them.")
    rows: list[dict] = []
    total, done = len(prompts) * (1 + len(policies) * len(budgets)), 0
    for item in prompts:
        ids = item["ids"]
        P = len(ids)
        pre = model.forward(ids, return_cache=True, attention_rows=window)
        prefill = torch.stack([pre.attn[layer] for layer in sorted(pre.attn)])  # [L, H, w, P]
        base = {"run_id": item["id"], "depth": item["depth"], "prompt_len": P}

        kpos = list(item.get("key_pos", []))
        full_got: list[int] = []

        def record(policy: str, budget: float, tokens: float, key_mask: torch.Tensor | None,
                   kept: torch.Tensor | None = None, got: list[int] | None = None) -> None:
            nonlocal done
            if got is None and key_mask is None and full_got:  # nothing evicted: the full cache's answer, exactly
                got = full_got
            if got is None:
                got, _ = model.decode_on_cache(P, pre, answer_tokens, key_mask)
            if policy == "full":
                full_got[:] = got
            text = model.tokenizer.decode(got, skip_special_tokens=True)
            share = float("nan") if not kpos else 1.0 if kept is None else float(kept[..., kpos].float().mean())
            rows.append({**base, "policy": policy, "budget": float(budget), "budget_tokens": float(tokens),
                         "answer": text.strip(), "correct": answer_matches(text, item["key"]), "key_kept": share})
            done += 1
            if progress is not None:
                progress(done, total)

        record("full", 1.0, P, None)
        pseudo = eq.pseudo_rows(model, ids, lookahead, prefill=pre) if "pseudo" in policies else None
        scores = rolling.prompt_scores(model, ids) if "h2o_rolling" in policies else None
        for policy in policies:
            for budget in budgets:
                if policy in rolling.er.ROLLING:
                    got, kept, tokens = rolling.rolling_decode(model, P, pre, answer_tokens, policy, budget,
                                                               window=window, scores=scores, full=full_got)
                    record(policy, budget, tokens, None, kept, got)
                    continue
                q = pseudo
                if policy == "lookahead":
                    q = eq.laq_rows(model, ids, pre, prefill, budget, window=window, m=lookahead)[1]
                sel = ev.select(policy, prefill, budget, window=window, query_rows=q, schedule=pyramid_schedule)
                keep_all = bool(sel.mask.all())
                record(policy, budget, sel.budget_tokens, None if keep_all else ev.key_mask(sel, P + answer_tokens),
                       sel.mask)
    return pl.DataFrame(rows)


def accuracy_table(answers: pl.DataFrame, level: float = 0.95, by: Sequence[str] = ("policy", "budget")) -> pl.DataFrame:
    """Retrieval accuracy per ``by`` group with its Wilson interval over prompts: ``accuracy, lo, hi, n``."""
    from trajscope.stats import binomial_interval

    out = []
    for key, g in answers.partition_by(list(by), as_dict=True, maintain_order=True).items():
        k, n = int(g["correct"].sum()), g.height
        iv = binomial_interval(k, n, level)
        row = {**dict(zip(by, key)), "accuracy": iv.estimate, "lo": iv.lo, "hi": iv.hi, "n": n,
               "mean_kept_tokens": float(g["budget_tokens"].mean())}
        if "key_kept" in g.columns:
            mean = g["key_kept"].mean()
            row["mean_key_kept"] = float("nan") if mean is None else float(mean)
        out.append(row)
    return pl.DataFrame(out).sort(list(by))


def heldout_perplexity(model: Any, texts: Sequence[Sequence[int]], prompt_len: int, policies: Sequence[str] = STATIC,
                       budgets: Sequence[float | int] = (0.1, 0.2, 0.5, 1.0), *, window: int = 32,
                       lookahead: int = 8, progress: Callable[[int, int], None] | None = None,
                       pyramid_schedule: str = "code") -> pl.DataFrame:
    """Perplexity of held-out text under eviction: the first ``prompt_len`` tokens are the prompt a policy
    compresses, the rest is teacher-forced with the evicted prompt keys hidden from every later query.
    ``pyramid_schedule`` as in :func:`needle_study`.

    Returns:
        One row per text × (policy, budget), plus ``policy="full"``: ``run_id, policy, budget, budget_tokens``
        (mean kept prompt positions per head), ``nll`` (mean negative log-likelihood per continuation token, nats)
        and ``n_tokens``; perplexity is ``exp(nll)``. The registered ``eviction-ppl`` study
        (:mod:`trajscope.studies.eviction.perplexity`) runs it on held-out files.
    """
    P = int(prompt_len)
    bad = [p for p in policies if p not in STATIC]
    if bad:
        raise TrajscopeError(f"Held-out perplexity runs the static policies ({', '.join(STATIC)}); '{bad[0]}' is not "
                             "among them (a rolling cache is not teacher-forced here).")
    rows = []
    total, done = len(texts) * (1 + len(policies) * len(budgets)), 0

    def tick() -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total)

    for i, ids in enumerate(texts):
        ids = list(ids)
        if len(ids) <= P + 1:
            raise TrajscopeError(f"Held-out text {i} has {len(ids)} tokens; it needs more than the {P}-token prompt.")
        target = torch.tensor(ids[P:])

        def nll(key_mask: torch.Tensor | None) -> float:
            logits = model.forward(ids[:-1], prompt_len=P, key_mask=key_mask).logits[P - 1:]
            return float(torch.nn.functional.cross_entropy(logits, target))

        rows.append({"run_id": str(i), "policy": "full", "budget": 1.0, "budget_tokens": float(P), "nll": nll(None),
                     "n_tokens": len(target)})
        tick()
        pre = model.forward(ids[:P], return_cache=True, attention_rows=window)
        prefill = torch.stack([pre.attn[layer] for layer in sorted(pre.attn)])
        pseudo = eq.pseudo_rows(model, ids[:P], lookahead, prefill=pre) if "pseudo" in policies else None
        for policy in policies:
            for budget in budgets:
                q = pseudo
                if policy == "lookahead":
                    q = eq.laq_rows(model, ids[:P], pre, prefill, budget, window=window, m=lookahead)[1]
                sel = ev.select(policy, prefill, budget, window=window, query_rows=q, schedule=pyramid_schedule)
                mask = None if bool(sel.mask.all()) else ev.key_mask(sel, len(ids))
                rows.append({"run_id": str(i), "policy": policy, "budget": float(budget),
                             "budget_tokens": float(sel.budget_tokens), "nll": nll(mask), "n_tokens": len(target)})
                tick()
    return pl.DataFrame(rows)


def run(model: Any, prompts: Any, config: Any, progress: Callable[[int, int], None] | None = None,
        layers: Sequence[int] | None = None) -> Any:
    """The registered ``needle`` study: build the passkey prompts of a
    :class:`~trajscope.studies.eviction.config.NeedleConfig` (``prompts`` is not used: the study builds its own),
    answer them under every policy × budget and the full cache.

    Returns:
        A :class:`~trajscope.studies.registry.Result` with ``needle_answers`` and ``needle_summary``
        (:func:`accuracy_table`, the one home of the accuracy and its interval; its rows are the summaries).
    """
    import dataclasses
    import time

    from trajscope.studies.registry import Result

    if layers:
        raise TrajscopeError("The needle study keeps and scores every layer's prompt keys; leave out --layers.")
    built = needle_prompts(model, config.n_prompts, config.context, config.depths, seed=config.seed)
    t0 = time.perf_counter()
    answers = needle_study(model, built, config.policies, config.budget_values(), window=config.window,
                           lookahead=config.lookahead, answer_tokens=config.answer_tokens, progress=progress,
                           pyramid_schedule=config.pyramid_schedule)
    table = accuracy_table(answers)
    summaries = {f"{r['policy']}@{r['budget']:g}": {"value": r["accuracy"], "lo": r["lo"], "hi": r["hi"], "n": r["n"]}
                 for r in table.iter_rows(named=True)}
    cfg = {**dataclasses.asdict(config), "model": model.describe(), "seconds": round(time.perf_counter() - t0, 1)}
    return Result(study="needle", tables={"needle_answers": answers, "needle_summary": table}, config=cfg,
                  summaries=summaries)
