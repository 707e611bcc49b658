"""Prompt sets for the serving studies: reading them, shared prefixes in tokens, token classes.

A prefix cache reuses KV by token ids, not by text, so shared prefixes are found on the
tokenized prompts (:func:`common_prefix_len`). :func:`with_header` builds a synthetic
shared-prefix set (a fixed system prompt / boilerplate header prepended to every prompt),
the situation a cache-heavy harvest meets in practice. :func:`token_class` labels a token
by its text (``space``, ``newline``, ``punct``, ``digit``, ``word``, ``special``) so a
coverage map can say which kinds of tokens a cache never recomputes.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any, Sequence

from trajscope.errors import TrajscopeError

DEFAULT_HEADER = (
    "# System: you are a careful Python assistant. Answer with code from the standard library,\n"
    "# keep functions short, and document every public function.\n"
    "# License: PSF. This file is part of the example corpus.\n\n"
)


def read_prompt_file(path: str | pathlib.Path, max_prompts: int | None = None) -> list[dict]:
    """Prompts of a JSON-lines file, one ``{"prompt": ..., "id": ...}`` (or a JSON string) per line.

    A line may hold chat ``"messages"`` (``[{"role": ..., "content": ...}, ...]``) instead of a
    ``"prompt"`` string: :func:`encode_prompts` renders them through the model's chat template.
    Items without an ``id`` get their line number. Raises one clear error for a missing file, bad
    JSON or no prompts.
    """
    p = pathlib.Path(path)
    if not p.is_file():
        raise TrajscopeError(f"No prompt file at '{path}'.")
    out: list[dict] = []
    for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TrajscopeError(f"{path}, line {n}: not valid JSON ({exc.msg}).") from exc
        item = {"prompt": item} if isinstance(item, str) else item
        chat = isinstance(item, dict) and isinstance(item.get("messages"), list) and bool(item["messages"])
        if not chat and (not isinstance(item, dict) or not isinstance(item.get("prompt"), str)
                         or not item["prompt"].strip()):
            raise TrajscopeError(f"{path}, line {n}: expected a JSON object with a non-empty \"prompt\" string or "
                                 "a \"messages\" list.")
        out.append({**item, "id": str(item.get("id", n))})
        if max_prompts is not None and len(out) >= max_prompts:
            break
    if not out:
        raise TrajscopeError(f"The prompt file '{path}' holds no prompts.")
    return out


def encode_prompts(model: Any, prompts: Sequence[dict | str], max_tokens: int | None = None) -> list[tuple[str, list[int]]]:
    """``(id, token ids)`` per prompt, each cut to its first ``max_tokens`` tokens when given.

    A prompt with ``"messages"`` is rendered through the model's chat template
    (:func:`trajscope.chat.encode_chat`); a message list the template rejects is one sentence.
    """
    from trajscope.chat import encode_chat

    out = []
    for i, p in enumerate(prompts):
        item = {"prompt": p} if isinstance(p, str) else p
        ids = encode_chat(model.tokenizer, item["messages"]).ids if "messages" in item else model.encode(item["prompt"])
        out.append((str(item.get("id", i)), ids[:max_tokens] if max_tokens else ids))
    return out


def with_header(prompts: Sequence[dict], header: str = DEFAULT_HEADER) -> list[dict]:
    """Each prompt with ``header`` prepended (a synthetic shared system prompt / boilerplate).

    Chat prompts are refused with one sentence: their template already gives them a shared prefix.
    """
    if any("messages" in p for p in prompts):
        raise TrajscopeError("A header is prepended to text prompts only; chat prompts share their template's "
                             "system turn already (leave out --header).")
    return [{**p, "prompt": header + p["prompt"]} for p in prompts]


def check_cut(max_tokens: int | None) -> None:
    """One sentence for a prompt cut below 0 (``ids[:-3]`` would drop each prompt's last 3 tokens, unsaid)."""
    if max_tokens is not None and max_tokens < 0:
        raise TrajscopeError(f"--max-tokens (each prompt's cut) must be 0 for no cut or a number of tokens, "
                             f"not {max_tokens}.")


def study_items(model: Any, items: Sequence[dict], config: Any, max_tokens: int | None) -> tuple[list[dict], int | None]:
    """The prompt records a study runs on and their token cut: the config's ``header`` (``default``:
    :data:`DEFAULT_HEADER`; ``none`` or empty: no header) prepended, and the cut ``max_tokens`` (0 or None: no
    cut) lengthened by the header's tokens, so the cut applies to the prompt after it."""
    check_cut(max_tokens)
    header = getattr(config, "header", None)
    header = DEFAULT_HEADER if header == "default" else (None if header in (None, "", "none") else header)
    out = with_header(list(items), header) if header else list(items)
    cut = (max_tokens + (len(model.encode(header)) if header else 0)) if max_tokens else None
    return out, cut


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def shared_prefix_len(seqs: Sequence[Sequence[int]]) -> int:
    """Length of the token prefix every sequence shares (0 for an empty set)."""
    if not seqs:
        return 0
    n = min(len(s) for s in seqs)
    for s in seqs[1:]:
        n = min(n, common_prefix_len(seqs[0], s))
    return n


def token_class(text: str, special: bool = False) -> str:
    """A coarse class of a token's text: special, newline, space, digit, word or punct."""
    if special:
        return "special"
    if "\n" in text:
        return "newline"
    t = text.strip()
    if not t:
        return "space"
    if t.isdigit():
        return "digit"
    if t.replace("_", "a").isalnum():
        return "word"
    return "punct"


def token_classes(model: Any, ids: Sequence[int]) -> list[str]:
    """:func:`token_class` of each token id, decoded one at a time with the model's tokenizer."""
    tok = model.tokenizer
    special = set(tok.all_special_ids)
    return [token_class(tok.decode([i]), i in special) for i in ids]
