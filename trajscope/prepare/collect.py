"""Stage ``collect``: greedy continuations of every corpus prompt, and the residuals the later stages read.

One batched greedy decode with reads (:meth:`~trajscope.model.ModelHandle.greedy_batch`)
gives, per prompt, every layer's block output at every computed position. Kept:

- ``acts.safetensors``: ``acts [N, d_model]`` float32, block ``layer``'s output at
  every position ``pos ≥ first_pos`` (prefill and decode: the SAE rows), and
  ``prefill_all [N_prefill, n_layers, d_model]`` float16, every layer at the prefill
  rows (the drift profile; float16 holds the sink's ~3·10⁴ without overflow);
- ``rows.parquet``: one row per ``acts`` row (``seq, prompt_id, group, kind, part, pos,
  step, phase, token_id``); the prefill rows come first in each sequence, in the order of
  ``prefill_all``;
- ``sequences.parquet``: ``seq, prompt_id, group, kind, part, prompt_len, token_ids``.

Position 0 (the attention sink; |x| ≈ 29,000 at layers 11–27 on SmolLM2) and any
position before ``first_pos`` is not kept.
"""

from __future__ import annotations

import json
import pathlib

import polars as pl
import torch
from safetensors.torch import save_file

from trajscope import positions
from trajscope.prepare.corpus import chat_items, docs_items, split_items, stdlib_items, token_ids
from trajscope.trajectory import write_table


def corpus(ctx) -> list[dict]:
    """The prompts with their part (fit / calibrate / evaluate, disjoint in groups)."""
    c = ctx.cfg
    items = (stdlib_items(c.n_stdlib_files, c.n_per_file, c.chunk_chars)
             + docs_items(c.n_doc_topics, c.n_per_topic, c.chunk_chars) + chat_items(c.prompts_dir))
    part = split_items(items, c.split_fractions, c.split_seed)
    return [{**it, "part": part[it["id"]]} for it in items]


def run(ctx, d: pathlib.Path) -> dict:
    from tqdm.auto import tqdm

    c, model = ctx.cfg, ctx.model
    items = corpus(ctx)
    enc = [token_ids(model, it, c.max_prompt_tokens) for it in items]
    order = sorted(range(len(items)), key=lambda i: len(enc[i]))
    acts, prefill_all, rows, seqs = [], [], [], []
    bar = tqdm(total=len(items), desc="collect: greedy decode with reads", unit="prompt")
    for start in range(0, len(order), c.gen_batch):
        group = order[start:start + c.gen_batch]
        outs, results = model.greedy_batch([enc[i] for i in group], max_new_tokens=c.max_new_tokens,
                                           padding_side="left", stop_at_eos=True, reads=[(1, 1)] * len(group))
        for i, ids, res in zip(group, outs, results):
            it, P, T = items[i], len(enc[i]), len(ids) - 1
            seq = len(seqs)
            pos = list(range(c.first_pos, T))
            acts.append(res.resid[c.layer][c.first_pos:T].float())
            prefill_all.append(torch.stack([res.resid[l][c.first_pos:P] for l in range(model.n_layers)], 1).half())
            rows.append(pl.DataFrame({
                "seq": [seq] * len(pos), "prompt_id": [it["id"]] * len(pos), "group": [it["group"]] * len(pos),
                "kind": [it["kind"]] * len(pos), "part": [it["part"]] * len(pos), "pos": pos,
                "step": [positions.query_step(p, P) for p in pos], "phase": [positions.phase(p, P) for p in pos],
                "token_id": [ids[p] for p in pos]}))
            seqs.append({"seq": seq, "prompt_id": it["id"], "group": it["group"], "kind": it["kind"],
                         "part": it["part"], "prompt_len": P, "token_ids": list(ids)})
        bar.update(len(group))
    bar.close()
    save_file({"acts": torch.cat(acts).contiguous(), "prefill_all": torch.cat(prefill_all).contiguous()},
              str(d / "acts.safetensors"))
    rows_df = pl.concat(rows)
    write_table(rows_df, d / "rows.parquet", "prepare_rows")
    write_table(pl.DataFrame(seqs), d / "sequences.parquet", "prepare_sequences")
    (d / "meta.json").write_text(json.dumps(ctx.meta, indent=1), encoding="utf-8")
    with open(d / "items.jsonl", "w", encoding="utf-8") as fh:
        for it in items:
            fh.write(json.dumps(it, ensure_ascii=False) + "\n")
    counts = rows_df.group_by("part", "phase").len().sort("part", "phase").to_dicts()
    return {"n_prompts": len(items), "n_groups": len({it["group"] for it in items}), "rows": counts}
