"""Prompt sets and contrast pairs: the JSON-lines files that the CLI, the app and the studies read.

One reader, :func:`read_jsonl`, turns a JSON-lines file into items, each checked by
a converter that may raise one clear error naming the file and line. On top of it:

- :func:`read_prompts`: lines ``{"prompt": str, "id": ..., "split": ..., "continuation": str}`` (or a bare
  JSON string); ``continuation``, when present, is the human text that followed the prompt in its
  source (the matched baseline that ``trajscope drift`` teacher-forces);
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


def read_prompts(path: str | pathlib.Path) -> list[dict]:
    """Prompts from a JSON-lines file: each line ``{"prompt": ..., "id": ..., "continuation": ...}`` or a JSON string.

    ``id`` and ``continuation`` are optional; a ``continuation`` must be a non-empty string.
    """
    def convert(item: Any, n: int) -> dict:
        if isinstance(item, str):
            item = {"prompt": item}
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
