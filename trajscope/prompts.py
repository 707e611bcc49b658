"""Prompt sets and contrast pairs: the JSON-lines files that the CLI, the app and the studies read.

One reader, :func:`read_jsonl`, turns a JSON-lines file into items, each checked by
a converter that may raise one clear error naming the file and line. On top of it:

- :func:`read_prompts`: lines ``{"prompt": str, "id": ..., "split": ..., "continuation": str}`` (or a bare
  JSON string); ``continuation``, when present, is the human text that followed the prompt in its
  source (the matched baseline that ``trajscope drift`` teacher-forces). Where chat prompts are
  taken (``chat=True``: ``trajscope capture``), a line may hold ``"messages": [{"role": ..., "content": ...}]``
  instead of ``"prompt"`` (:mod:`trajscope.chat`);
- :func:`read_pairs`: contrast pairs ``{"positive": str, "negative": str}`` for CAA steering.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any, Callable

from trajscope.errors import TrajscopeError


def read_jsonl(path: str | pathlib.Path, what: str, convert: Callable[[Any, int], Any]) -> list:
    """Items of a JSON-lines file, each passed through ``convert(item, line_no)`` (which may raise).

    Blank lines are skipped; a missing file, invalid JSON or an empty file is one clear error.
    """
    p = pathlib.Path(path)
    if not p.is_file():
        raise TrajscopeError(f"No {what} file at '{path}'.")
    out = []
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        raise TrajscopeError(f"'{path}' is not UTF-8 text, so it is not a JSON-lines {what} file.") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TrajscopeError(f"{path}, line {n}: not valid JSON ({exc.msg}).") from None
        out.append(convert(item, n))
    if not out:
        raise TrajscopeError(f"The {what} file '{path}' holds no {what}s.")
    return out


def read_prompts(path: str | pathlib.Path, chat: bool = False) -> list[dict]:
    """Prompts from a JSON-lines file: each line ``{"prompt": ..., "id": ..., "continuation": ...}`` or a JSON string.

    ``id`` and ``continuation`` are optional; a ``continuation`` must be a non-empty string. With
    ``chat=True`` a line may give ``"messages"`` (a list of ``{"role", "content"}``) instead of ``"prompt"``.
    """
    def convert(item: Any, n: int) -> dict:
        if isinstance(item, str):
            item = {"prompt": item}
        if isinstance(item, dict) and "messages" in item:
            if not chat:
                raise TrajscopeError(f"{path}, line {n}: chat \"messages\" are taken by `trajscope capture` only; "
                                     "give a \"prompt\" string here.")
            if "prompt" in item:
                raise TrajscopeError(f"{path}, line {n}: give either \"prompt\" or \"messages\", not both.")
            from trajscope.chat import check_messages

            try:
                return {**item, "messages": check_messages(item["messages"])}
            except TrajscopeError as exc:
                raise TrajscopeError(f"{path}, line {n}: {exc}") from None
        if not isinstance(item, dict) or not isinstance(item.get("prompt"), str) or not item["prompt"].strip():
            raise TrajscopeError(f"{path}, line {n}: expected a JSON object with a non-empty \"prompt\" string.")
        cont = item.get("continuation")
        if cont is not None and (not isinstance(cont, str) or not cont):
            raise TrajscopeError(f"{path}, line {n}: \"continuation\" must be a non-empty string when given.")
        return item

    return read_jsonl(path, "prompt", convert)


def read_pairs(path: str | pathlib.Path) -> list[tuple[str, str]]:
    """Contrast pairs from JSON lines ``{"positive": str, "negative": str}``."""
    def convert(item: Any, n: int) -> tuple[str, str]:
        if not isinstance(item, dict) or not isinstance(item.get("positive"), str) or not isinstance(item.get("negative"), str):
            raise TrajscopeError(f"{path}, line {n}: expected {{\"positive\": ..., \"negative\": ...}}.")
        return item["positive"], item["negative"]

    return read_jsonl(path, "contrast-pair", convert)
