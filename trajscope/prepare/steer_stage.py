"""Stage ``steer``: a CAA vector for "answer in French", with a success rate computed from the text.

Contrast pairs (``prompts_dir/steer_french_pairs.jsonl``): the same chat question
followed by the start of an answer in French (positive) or in English (negative).
The vector at layer L is the mean over pairs of the difference of block L's output
at the last token (CAA; :meth:`~trajscope.steering.SteeringVector.from_contrast`'s
definition, here read for all sweep layers in one forward per text).

Behaviour criterion, from the generated text only: the steering-success study's
(:func:`trajscope.metrics.steering.is_french`): a continuation *is French* when it holds at
least :data:`~trajscope.metrics.steering.MIN_FRENCH_WORDS` French function words and more
French than English function words, an elided word (``l'huile``, ``it’s``) counted as its
part after the apostrophe, straight or curly.

Layer and strength are picked on sweep prompts (chat prompts of the ``fit`` files):
highest success rate, ties to the lower perplexity. Held-out evaluation on the chat
prompts of the ``calibrate`` and ``evaluate`` files (disjoint in files from the
sweep): success rate steered vs unsteered (Wilson intervals, n prompts), and the
fluency cost: the perplexity of each continuation under the unsteered model.
Steering is added at every position (``start_step = 0``), greedy decoding.
"""

from __future__ import annotations

import json
import math
import pathlib
import re

import numpy as np
import polars as pl
import torch

from trajscope.metrics.steering import is_french, language_counts
from trajscope.prepare.corpus import chat_items, split_items, token_ids
from trajscope.stats import binomial_interval, cluster_bootstrap
from trajscope.steering import SteeringVector
from trajscope.trajectory import write_table

def distinct_share(text: str) -> float:
    """Distinct words / words of ``text`` (1.0 for no words): low values flag degenerate repetition ("la la la")."""
    words = re.findall(r"\w+", text.lower())
    return len(set(words)) / len(words) if words else 1.0


def caa_vectors(model, pairs: list[tuple[list[int], list[int]]], layers) -> dict[int, torch.Tensor]:
    """Per layer, the mean over pairs of ``resid(positive) − resid(negative)`` at the last token."""
    diffs = {layer: [] for layer in layers}
    for pos, neg in pairs:
        rp, rn = model.forward(pos, layers=layers).resid, model.forward(neg, layers=layers).resid
        for layer in layers:
            diffs[layer].append(rp[layer][-1] - rn[layer][-1])
    return {layer: torch.stack(v).mean(0) for layer, v in diffs.items()}


def greedy(model, ids: list[int], n: int, vec: SteeringVector | None) -> list[int]:
    """Greedy continuation (KV cache) with ``vec`` added; returns the new tokens."""
    P, steer = len(ids), [vec] if vec is not None else []
    res = model.forward(ids, prompt_len=P, steering=steer, return_cache=True)
    new: list[int] = []
    for _ in range(n):
        tok = int(res.logits[-1].argmax())
        new.append(tok)
        if tok == model.eos_token_id:
            break
        res = model.forward([tok], prompt_len=P, steering=steer, past=res.cache, return_cache=True)
    return new


def perplexity(model, ids: list[int], new: list[int]) -> float:
    """Perplexity of ``new`` after ``ids`` under the unsteered model."""
    if not new:
        return float("nan")
    full = ids + new
    lp = model.forward(full).logits[len(ids) - 1:-1].log_softmax(-1)
    nll = -lp.gather(-1, torch.tensor(new)[:, None]).mean()
    return float(math.exp(float(nll)))


def _generate(model, prompts, n, vec, tok, desc: str | None = None) -> list[dict]:
    from tqdm.auto import tqdm

    out = []
    for it, ids in tqdm(prompts, desc=desc, unit="prompt", disable=desc is None):
        new = greedy(model, ids, n, vec)
        text = tok.decode(new, skip_special_tokens=True)
        fr, en = language_counts(text)
        out.append({"prompt_id": it["id"], "group": it["group"], "text": text, "french_words": fr,
                    "english_words": en, "success": is_french(text), "ppl": perplexity(model, ids, new)})
    return out


def run(ctx, d: pathlib.Path) -> dict:
    from tqdm.auto import tqdm

    c, model = ctx.cfg, ctx.model
    tok = model.tokenizer
    lines = (pathlib.Path(c.prompts_dir) / "steer_french_pairs.jsonl").read_text(encoding="utf-8").splitlines()
    recs = [json.loads(x) for x in lines if x.strip()]
    chat = lambda q, a: token_ids(model, {"kind": "chat", "messages": [{"role": "user", "content": q}]}, 0) \
        + list(tok(a, add_special_tokens=False)["input_ids"])
    pairs = [(chat(r["question"], r["positive"]), chat(r["question"], r["negative"])) for r in recs]
    vecs = caa_vectors(model, pairs, list(c.steer_layers))
    items = chat_items(c.prompts_dir)
    part = split_items(items, c.split_fractions, c.split_seed)
    enc = lambda its: [(it, token_ids(model, it, 0)) for it in its]
    sweep = enc([it for it in items if part[it["id"]] == "fit"][:c.steer_sweep_prompts])
    held = enc([it for it in items if part[it["id"]] in ("calibrate", "evaluate")])
    rows = []
    configs = [(layer, s) for layer in c.steer_layers for s in c.steer_strengths]
    for layer, s in tqdm(configs, desc="steer: layer x strength sweep", unit="config"):
        vec = SteeringVector(layer=layer, direction=vecs[layer], strength=s, start_step=0, name="french-caa")
        g = _generate(model, sweep, c.steer_sweep_tokens, vec, tok)
        rows.append({"layer": layer, "strength": s, "success": float(np.mean([r["success"] for r in g])),
                     "ppl_median": float(np.nanmedian([r["ppl"] for r in g])), "n_prompts": len(g)})
    sweep_df = pl.DataFrame(rows)
    best = sweep_df.sort(["success", "ppl_median"], descending=[True, False]).row(0, named=True)
    vec = SteeringVector(layer=best["layer"], direction=vecs[best["layer"]], strength=best["strength"],
                         start_step=0, name="french-caa")
    gens = []
    for arm, v in (("unsteered", None), ("steered", vec)):
        gens += [{"arm": arm, **r} for r in _generate(model, held, c.steer_eval_tokens, v, tok,
                                                        desc=f"steer: held-out {arm}")]
    gdf = pl.DataFrame(gens)
    summary = {}
    for arm in ("unsteered", "steered"):
        a = gdf.filter(pl.col("arm") == arm)
        ppl = np.log(a["ppl"].fill_nan(None).drop_nulls().to_numpy())
        summary[arm] = {"success": binomial_interval(int(a["success"].sum()), a.height).to_dict(),
                        "log_ppl": cluster_bootstrap(ppl, n_boot=c.n_boot).to_dict(),
                        "ppl_geomean": float(np.exp(ppl.mean()))}
    st, un = gdf.filter(pl.col("arm") == "steered"), gdf.filter(pl.col("arm") == "unsteered")
    diff = st["success"].cast(pl.Float64).to_numpy() - un["success"].cast(pl.Float64).to_numpy()
    summary["success_diff"] = cluster_bootstrap(diff, st["group"].to_numpy(), n_boot=c.n_boot).to_dict()
    summary["chosen"] = best
    summary["n_heldout_prompts"] = len(held)
    summary["heldout_files"] = sorted({it["group"] for it, _ in held})
    summary["sweep_files"] = sorted({it["group"] for it, _ in sweep})
    vec.save(d / f"french_caa_layer{vec.layer}.safetensors")
    write_table(sweep_df, d / "sweep.parquet", "prepare_steer_sweep")
    write_table(gdf, d / "heldout.parquet", "prepare_steer_heldout")
    (d / "summary.json").write_text(json.dumps({**summary, **ctx.meta}, indent=1), encoding="utf-8")
    return {"layer": best["layer"], "strength": best["strength"]}
