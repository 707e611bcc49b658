"""The SAE bench study's rows: prompts by source file, a greedy harvest, and each row's phase, segment and labels.

Prompts come from JSON-lines files (:func:`trajscope.studies.prompts.read_prompt_file`): a chat
prompt (``messages``) is rendered through the model's chat template and each prompt position takes
its segment from :func:`trajscope.chat.encode_chat` (``system`` / ``user`` / ``assistant``: the
template's own system turn, the user's message, the assistant header); a text prompt is a ``code``
prompt, every prompt position ``user`` (:data:`trajscope.positions.PLAIN_PROMPT_SEGMENT`). Generated
positions take :func:`trajscope.positions.generated_segments` (``assistant`` outside thinking spans).
A prompt's source file is its record's ``file`` (or ``source``) field, else its id up to the first
``#`` or ``:``.

The harvest (:func:`trajscope.features.harvest.harvest`, ``engine="forward"``: HF ``generate`` then
one no-cache forward) reads the SAEs' layer at every position from 1 on (position 0, the attention
sink, is left out as everywhere), over the prompt and its greedy continuation. Code sequences get
the labels of :mod:`trajscope.metrics.sae_code_labels` on prompt + continuation text.
"""

from __future__ import annotations

import glob
import pathlib
import re
from typing import Any, Callable, Sequence

import polars as pl

from trajscope import positions
from trajscope.errors import TrajscopeError
from trajscope.metrics.sae_code_labels import LABELS, code_labels


def file_of(item: dict) -> str:
    """A prompt's source file: ``file`` or ``source`` of its record, else its id up to the first ``#`` or ``:``."""
    for key in ("file", "source"):
        if isinstance(item.get(key), str) and item[key].strip():
            return item[key]
    pid = str(item.get("id", ""))
    return re.split(r"[#:]", pid, maxsplit=1)[0] or pid


def expand_files(patterns: Sequence[str]) -> list[str]:
    """Prompt files named by ``patterns`` (paths or globs; a ``sample_data/…`` path absent here is the shipped
    copy), in order, each once; one sentence when a pattern names nothing."""
    from trajscope.model.load import sample_data_dir

    out: list[str] = []
    for pat in patterns:
        found = sorted(glob.glob(pat))
        p = pathlib.PurePath(pat)
        if not found and p.parts[:1] == ("sample_data",):
            found = sorted(glob.glob(str(sample_data_dir().joinpath(*p.parts[1:]))))
        if not found:
            raise TrajscopeError(f"No prompt file matches '{pat}'.")
        out += [f for f in found if f not in out]
    return out


def read_prompts(patterns: Sequence[str], max_per_file: int) -> list[dict]:
    """Every prompt of the files, at most ``max_per_file`` per source file, each with ``file`` and ``kind``
    (``chat`` or ``code``); ids must be distinct."""
    from trajscope.studies.prompts import read_prompt_file

    items, count, seen = [], {}, set()
    for path in expand_files(patterns):
        for item in read_prompt_file(path):
            f = file_of(item)
            if count.get(f, 0) >= max_per_file:
                continue
            pid = str(item["id"])
            if pid in seen:
                raise TrajscopeError(f"The prompt id '{pid}' appears twice ({path}); the study needs distinct ids.")
            seen.add(pid)
            count[f] = count.get(f, 0) + 1
            items.append({**item, "file": f, "kind": "chat" if "messages" in item else "code"})
    if not items:
        raise TrajscopeError("The prompt files hold no prompts.")
    return items


def encode(model: Any, items: Sequence[dict], max_prompt_tokens: int) -> list[dict]:
    """Each item with ``ids`` (cut to ``max_prompt_tokens``; a chat prompt is never cut, its template must stay
    whole) and ``segments`` (one per prompt position)."""
    from trajscope.chat import encode_chat

    out = []
    for it in items:
        if it["kind"] == "chat":
            chat = encode_chat(model.tokenizer, it["messages"])
            ids, segs = list(chat.ids), list(chat.segments)
        else:
            ids = model.encode(it["prompt"])[:max_prompt_tokens or None]
            segs = [positions.PLAIN_PROMPT_SEGMENT] * len(ids)
        out.append({**it, "ids": ids, "segments": segs})
    return out


def harvest_rows(model: Any, items: Sequence[dict], layer: int, *, new_tokens: int, batch_size: int,
                 progress: Callable[[int, int], None] | None = None) -> Any:
    """The greedy harvest of ``items`` (from :func:`encode`) at ``layer``, its rows tagged with ``file``,
    ``kind``, ``segment`` and, for code sequences, one Boolean column per label (null elsewhere).

    Returns:
        A :class:`~trajscope.features.harvest.Harvest` whose ``rows`` carry the extra columns.
    """
    from trajscope.features.harvest import harvest

    h = harvest(model, [{"prompt": it["ids"], "id": it["id"]} for it in items], layer, max_new_tokens=new_tokens,
                n_sampled=0, greedy=True, engine="forward", batch_size=batch_size, on_capture=progress)
    by_id = {it["id"]: it for it in items}
    decode = model.tokenizer.decode
    extra = []
    for seq in h.sequences.iter_rows(named=True):
        it, ids, P = by_id[seq["prompt_id"]], list(seq["token_ids"]), int(seq["prompt_len"])
        gen = positions.generated_segments([decode([i]) for i in ids[P:]])
        segs = [*it["segments"][:P], *gen]
        labels = code_labels(decode, ids) if it["kind"] == "code" else {k: [None] * len(ids) for k in LABELS}
        extra.append(pl.DataFrame({"seq": [seq["seq"]] * len(ids), "pos": list(range(len(ids))),
                                   "file": [it["file"]] * len(ids), "kind": [it["kind"]] * len(ids),
                                   "segment": segs, **{f"label_{k}": v for k, v in labels.items()}},
                                  schema_overrides={f"label_{k}": pl.Boolean for k in LABELS}))
    tags = pl.concat(extra)
    h.rows = h.rows.join(tags, on=["seq", "pos"], how="left", maintain_order="left")
    return h
