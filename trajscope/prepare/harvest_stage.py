"""Stages ``harvest-prefill`` and ``harvest-decode``: many more distinct layer-``layer`` rows for SAE training.

The ``collect`` stage's corpus (176 short prompts) gives the SAEs about 8,400
distinct prefill rows, far too few for features that reproduce across seeds.
These stages read block ``layer``'s output only, over windows of **training
sources**: every standard-library source file and documentation topic of the
corpus's population (:func:`~trajscope.prepare.corpus.training_sources`) except
the files whose prompts the split put in ``evaluate``, so the held-out files stay
disjoint by source file (the new files are training files; none of them is ever
evaluated on).

- ``harvest-prefill``: up to ``harvest_per_source`` consecutive windows of
  ``harvest_seq_tokens`` tokens per source, sources in order, until
  ``harvest_prefill_rows`` rows; one padded no-cache forward per batch
  (:meth:`~trajscope.model.ModelHandle.forward_batch`, unembedding at the last
  position only). Each window is its own sequence, so its position 0 is the
  attention sink and is left out (``first_pos``).
- ``harvest-decode``: the chat prompts of the training chat files, then windows of
  ``harvest_decode_prompt_tokens`` tokens taken after the prefill windows of each
  source, each continued greedily for ``harvest_decode_new_tokens`` tokens
  (stopping at end of turn) with :meth:`~trajscope.model.ModelHandle.greedy_batch`,
  then one teacher-forced forward over prompt + continuation reads block ``layer``
  at every position (the same activations as the KV-cached decode up to float
  rounding; :mod:`trajscope.sae.harvest` does the same). Its prompt rows
  (positions ``≥ first_pos``) are prefill rows, its continuation rows are decode rows.

Each stops between batches once ``harvest_seconds`` of wall time are spent (0: no
limit); the rows are then the first windows of the same fixed list, and ``meta.json``
records how many (``n_windows``, ``stopped_by_time``), so setting the row budget to
that count reproduces them. Each writes ``acts.safetensors`` (``acts [N, d_model]`` float16; a row with
``|x|`` beyond float16's range is refused) and ``rows.parquet`` (``seq, group, kind,
part="train", pos, step, phase, token_id``).
"""

from __future__ import annotations

import json
import pathlib
import time

import polars as pl
import torch
from safetensors.torch import save_file

from trajscope import positions
from trajscope.errors import TrajscopeError
from trajscope.prepare.corpus import chat_items, token_ids, training_sources, windows
from trajscope.trajectory import write_table

HALF_MAX = 65504.0


def evaluate_groups(out: pathlib.Path) -> set[str]:
    """The source files (groups) of the ``collect`` stage's ``evaluate`` part."""
    rows = pl.read_parquet(out / "collect" / "rows.parquet", columns=["group", "part"])
    return set(rows.filter(pl.col("part") == "evaluate")["group"].unique().to_list())


def _sources(ctx) -> tuple[list[dict], set[str]]:
    c = ctx.cfg
    held = evaluate_groups(ctx.out)
    reach = c.harvest_per_source * c.harvest_seq_tokens + c.harvest_decode_per_source * c.harvest_seq_tokens
    return training_sources(held, max_chars=8 * reach), held


def _check_disjoint(wins: list[dict], held: set[str]) -> None:
    leaked = sorted({w["group"] for w in wins} & held)
    if leaked:
        raise TrajscopeError(f"The harvest would read evaluate files ({', '.join(leaked)}); the split is broken.")


def _out_of_time(c, t0: float) -> bool:
    """Whether the stage's wall budget (``harvest_seconds``; 0: none) is spent."""
    return bool(c.harvest_seconds) and time.monotonic() - t0 > c.harvest_seconds


def _save(d: pathlib.Path, acts: list[torch.Tensor], rows: list[pl.DataFrame], meta: dict) -> dict:
    x = torch.cat(acts)
    peak = float(x.abs().max())
    if peak >= HALF_MAX:
        raise TrajscopeError(f"A harvested row reaches |x| = {peak:.0f}, beyond float16's range; store float32.")
    save_file({"acts": x.half().contiguous()}, str(d / "acts.safetensors"))
    df = pl.concat(rows)
    write_table(df, d / "rows.parquet", "prepare_harvest_rows")
    counts = {ph: int((df["phase"] == ph).sum()) for ph in ("prefill", "decode")}
    info = {**meta, "rows": counts, "n_sequences": int(df["seq"].n_unique()), "n_groups": int(df["group"].n_unique()),
            "max_abs": peak, "dtype": "float16"}
    (d / "meta.json").write_text(json.dumps(info, indent=1), encoding="utf-8")
    return info


def _frame(seq: int, win: dict, P: int, ids: list[int], first: int) -> pl.DataFrame:
    pos = list(range(first, len(ids)))
    return pl.DataFrame({"seq": [seq] * len(pos), "group": [win["group"]] * len(pos), "kind": [win["kind"]] * len(pos),
                         "part": ["train"] * len(pos), "pos": pos,
                         "step": [positions.query_step(p, P) for p in pos],
                         "phase": [positions.phase(p, P) for p in pos], "token_id": [ids[p] for p in pos]})


def run_prefill(ctx, d: pathlib.Path) -> dict:
    from tqdm.auto import tqdm

    c, model = ctx.cfg, ctx.model
    sources, held = _sources(ctx)
    n_win = -(-c.harvest_prefill_rows // (c.harvest_seq_tokens - c.first_pos))
    wins = windows(model, sources, c.harvest_seq_tokens, 0, c.harvest_seq_tokens, c.harvest_per_source, n_win)
    acts, rows = [], []
    t0, done = time.monotonic(), 0
    for start in tqdm(range(0, len(wins), c.harvest_batch), desc=f"harvest-prefill: layer {c.layer}", unit="batch"):
        if _out_of_time(c, t0):
            break
        part = wins[start:start + c.harvest_batch]
        done = start + len(part)
        res = model.forward_batch([w["ids"] for w in part], layers=[c.layer], logits_rows=[1] * len(part))
        for i, (w, r) in enumerate(zip(part, res)):
            acts.append(r.resid[c.layer][c.first_pos:].float())
            rows.append(_frame(start + i, w, len(w["ids"]), w["ids"], c.first_pos))
    _check_disjoint(wins, held)
    return _save(d, acts, rows, {"layer": c.layer, "first_pos": c.first_pos, "n_windows": done,
                                 "n_windows_planned": len(wins), "stopped_by_time": done < len(wins),
                                 "seq_tokens": c.harvest_seq_tokens, "excluded_groups": sorted(held)})


def run_decode(ctx, d: pathlib.Path) -> dict:
    from tqdm.auto import tqdm

    c, model = ctx.cfg, ctx.model
    sources, held = _sources(ctx)
    P0, N = c.harvest_decode_prompt_tokens, c.harvest_decode_new_tokens
    n_win = -(-c.harvest_decode_rows // N)
    start_tok = c.harvest_per_source * c.harvest_seq_tokens
    wins = windows(model, sources, P0, start_tok, c.harvest_seq_tokens, c.harvest_decode_per_source, n_win)
    chats = [it for it in chat_items(c.prompts_dir) if it["group"] not in held]
    wins = [{"group": it["group"], "kind": "chat", "offset": 0, "ids": token_ids(model, it, c.max_prompt_tokens)}
            for it in chats] + wins
    acts, rows = [], []
    t0, done = time.monotonic(), 0
    for start in tqdm(range(0, len(wins), c.harvest_batch), desc=f"harvest-decode: greedy + layer {c.layer}",
                      unit="batch"):
        if _out_of_time(c, t0):
            break
        part = wins[start:start + c.harvest_batch]
        done = start + len(part)
        outs = model.greedy_batch([w["ids"] for w in part], max_new_tokens=N, padding_side="left", stop_at_eos=True)
        seen = [list(o)[:-1] for o in outs]  # the last token was produced, never computed on
        res = model.forward_batch(seen, layers=[c.layer], logits_rows=[1] * len(part))
        for i, (w, ids, r) in enumerate(zip(part, seen, res)):
            acts.append(r.resid[c.layer][c.first_pos:].float())
            rows.append(_frame(start + i, w, len(w["ids"]), ids, c.first_pos))
    _check_disjoint(wins, held)
    return _save(d, acts, rows, {"layer": c.layer, "first_pos": c.first_pos, "n_windows": done,
                                 "n_windows_planned": len(wins), "stopped_by_time": done < len(wins),
                                 "n_chat_prompts": len(chats), "prompt_tokens": P0, "max_new_tokens": N,
                                 "excluded_groups": sorted(held)})


def run(ctx, d: pathlib.Path, which: str) -> dict:
    """The ``harvest-prefill`` (``which="prefill"``) or ``harvest-decode`` stage."""
    return run_prefill(ctx, d) if which == "prefill" else run_decode(ctx, d)
