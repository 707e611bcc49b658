"""The offline prompt corpus of ``trajscope prepare``: every prompt with its source file.

Three kinds, all available without a network:

- ``stdlib``: chunks of the Python standard library's source files (``n_per_file``
  consecutive ~``chunk_chars``-character chunks from each of ``n_files`` files,
  chosen by SHA-1 of the relative path, so the choice is stable); the group is
  the file;
- ``docs``: the bundled English documentation topics (``pydoc_data.topics``),
  chunked the same way; they all live in one module, so the group is the topic
  (one topic's chunks never straddle a split);
- ``chat``: the chat prompts in ``prompts_dir/chat_*.jsonl`` (one user message
  each, rendered through the tokenizer's chat template); the group is the file.

:func:`split_items` splits the prompts into fit / calibrate / evaluate parts
disjoint in groups (:func:`trajscope.stats.split_ids` with ``groups``).
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import sysconfig
from typing import Any, Sequence

from trajscope.errors import TrajscopeError
from trajscope.stats import split_ids

SKIP_DIRS = ("test", "tests", "idlelib", "encodings", "lib2to3", "site-packages", "turtledemo", "__pycache__")


def _h(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


def _chunks(text: str, n: int, size: int) -> list[str]:
    """Up to ``n`` consecutive chunks of about ``size`` characters, cut at line ends."""
    out, start = [], 0
    while len(out) < n and start < len(text):
        end = text.find("\n", start + size)
        end = len(text) if end < 0 else end + 1
        piece = text[start:end]
        if piece.strip():
            out.append(piece)
        start = end
    return out


def stdlib_items(n_files: int, n_per_file: int, chunk_chars: int) -> list[dict]:
    """Chunks of ``n_files`` standard-library source files (id ``rel#i``, group ``rel``)."""
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    files = []
    for p in root.rglob("*.py"):
        rel = p.relative_to(root).as_posix()
        if any(part in SKIP_DIRS for part in rel.split("/")[:-1]) or p.stat().st_size < 4 * chunk_chars:
            continue
        files.append(rel)
    items = []
    for rel in sorted(files, key=_h)[:n_files]:
        text = (root / rel).read_text(encoding="utf-8", errors="replace")
        for i, piece in enumerate(_chunks(text, n_per_file, chunk_chars)):
            items.append({"id": f"{rel}#{i}", "group": rel, "kind": "stdlib", "prompt": piece})
    if not items:
        raise TrajscopeError(f"No standard-library source files found under {root}.")
    return items


def docs_items(n_topics: int, n_per_topic: int, chunk_chars: int) -> list[dict]:
    """Chunks of ``n_topics`` documentation topics of ``pydoc_data.topics`` (group ``pydoc:TOPIC``)."""
    from pydoc_data.topics import topics

    names = sorted((t for t, text in topics.items() if len(text) >= 2 * chunk_chars), key=_h)[:n_topics]
    items = []
    for name in names:
        for i, piece in enumerate(_chunks(topics[name], n_per_topic, chunk_chars)):
            items.append({"id": f"pydoc:{name}#{i}", "group": f"pydoc:{name}", "kind": "docs", "prompt": piece})
    return items


def chat_items(prompts_dir: str | pathlib.Path) -> list[dict]:
    """The chat prompts of ``prompts_dir/chat_*.jsonl`` (``messages`` lists; group = the file name)."""
    paths = sorted(pathlib.Path(prompts_dir).glob("chat_*.jsonl"))
    if not paths:
        raise TrajscopeError(f"No chat prompt files (chat_*.jsonl) in {prompts_dir}.")
    items = []
    for path in paths:
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            rec = json.loads(line)
            if not isinstance(rec.get("messages"), list) or not rec["messages"]:
                raise TrajscopeError(f"{path}, line {n}: expected a non-empty \"messages\" list.")
            items.append({"id": rec.get("id", f"{path.name}#{n}"), "group": path.name, "kind": "chat",
                          "messages": rec["messages"]})
    return items


def token_ids(model: Any, item: dict, max_tokens: int) -> list[int]:
    """A prompt's token ids: chat messages through the chat template, text cut to ``max_tokens``."""
    if item["kind"] == "chat":
        text = model.tokenizer.apply_chat_template(item["messages"], add_generation_prompt=True, tokenize=False)
        return list(model.tokenizer(text, add_special_tokens=False)["input_ids"])
    return model.encode(item["prompt"])[:max_tokens]


def split_items(items: Sequence[dict], fractions: Sequence[float], seed: int) -> dict[str, str]:
    """``{item id: part}`` with parts fit / calibrate / evaluate disjoint in groups, split per kind.

    Each kind (stdlib, docs, chat) is split on its own so that every part holds every kind.
    """
    part_of: dict[str, str] = {}
    for kind in sorted({it["kind"] for it in items}):
        mine = [it for it in items if it["kind"] == kind]
        parts = split_ids([it["id"] for it in mine], fractions, seed=seed, groups=[it["group"] for it in mine])
        part_of.update({i: name for name, ids in parts.items() for i in ids})
    return part_of


def training_sources(exclude_groups: set[str], max_chars: int) -> list[dict]:
    """Stdlib source files and documentation topics, minus ``exclude_groups``, for the training harvest.

    The same population as :func:`stdlib_items` and :func:`docs_items` (same skip rules, same SHA-1
    order, so the corpus's files come first), every eligible file rather than the first ``n``; each
    source's text is cut to ``max_chars``. The two kinds alternate (stdlib, docs, stdlib, ...) until the
    topics run out. Returns ``{"group", "kind", "text"}`` records.
    """
    from pydoc_data.topics import topics

    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    files = sorted((p.relative_to(root).as_posix() for p in root.rglob("*.py")
                    if not any(part in SKIP_DIRS for part in p.relative_to(root).as_posix().split("/")[:-1])),
                   key=_h)
    stdlib = [{"group": rel, "kind": "stdlib",
               "text": (root / rel).read_text(encoding="utf-8", errors="replace")[:max_chars]}
              for rel in files if rel not in exclude_groups]
    docs = [{"group": f"pydoc:{t}", "kind": "docs", "text": topics[t][:max_chars]}
            for t in sorted(topics, key=_h) if f"pydoc:{t}" not in exclude_groups]
    out = []
    for i in range(max(len(stdlib), len(docs))):
        out += [src[i] for src in (stdlib, docs) if i < len(src)]
    return [s for s in out if s["text"].strip()]


def windows(model: Any, sources: Sequence[dict], size: int, start: int, stride: int, per_source: int,
            total: int) -> list[dict]:
    """Token windows of ``size`` tokens at token offsets ``start, start + stride, ...`` (``per_source`` at
    most) of each source in order, until ``total`` windows: ``{"group", "kind", "offset", "ids"}``."""
    out = []
    for src in sources:
        ids = model.encode(src["text"])
        for j in range(per_source):
            a = start + j * stride
            if a + size > len(ids) or len(out) >= total:
                break
            out.append({"group": src["group"], "kind": src["kind"], "offset": a, "ids": ids[a:a + size]})
        if len(out) >= total:
            break
    return out
