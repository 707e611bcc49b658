"""Build the shipped prompt sets from the sample model's held-out standard-library files.

The sample model trained on CPython's standard library except 1 file in 20,
held out by SHA-1 of the relative path (``corpus_files()`` in
``scripts/train_sample_model.py``, imported here so the split is the same one).
From the held-out files (code-page tables under ``encodings/`` skipped) this
writes, under ``sample_data/prompts/``:

- ``heldout_code.jsonl``: 60 prompts (40% eval, 60% train), each a few lines of context ending in a
  function header and the opening line of its docstring; every prompt carries
  ``split``: ``"train"`` (its continuations may train the hybrid SAE) or ``"eval"``
  (never seen by an SAE; ``trajscope sae-drift`` measures on these). The split is
  by file (SHA-1 of the relative path), so no file feeds both. Each prompt also
  keeps ``continuation``: the human text that followed it in the file (at least
  ``CONTINUATION_CHARS`` characters, cut at a line end, or the rest of the file),
  the matched baseline of ``trajscope drift`` (teacher-forced at the positions
  decode would fill). ``prompt + continuation`` is checked to be the file's text.
- ``heldout_chunks.jsonl``: ~1,000-character chunks of the ``train``-split files,
  the prefill corpus for SAE training.

Usage: ``python scripts/make_prompts.py [--n-prompts 60] [--n-chunks 300]``. When the output
files exist, the new ids, prompts, files and splits must equal theirs (other shipped artefacts
depend on them); a mismatch (e.g. a different Python's standard library) stops the script
unless ``--force`` is given.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import importlib.util
import json
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONTINUATION_CHARS = 1500  # ≥ 128 tokens of the sample tokenizer on code (checked by tests/test_drift_heldout.py)


def _h(text: str) -> int:
    return int(hashlib.sha1(text.encode()).hexdigest(), 16)


def heldout_files() -> list[tuple[str, str]]:
    """(relative path, source) of the held-out files, from the training script's own split."""
    spec = importlib.util.spec_from_file_location("train_sample_model", ROOT / "scripts" / "train_sample_model.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    _, val, root = mod.corpus_files()
    out = []
    for f in val:
        rel = str(f.relative_to(root))
        if rel.startswith("encodings/"):
            continue
        try:
            out.append((rel, f.read_text(encoding="utf-8")))
        except (UnicodeDecodeError, OSError):
            continue
    return out


def split_of(rel: str) -> str:
    """``"eval"`` for 1 file in 2 (by SHA-1 of the path), else ``"train"``."""
    return "eval" if _h("split:" + rel) % 2 == 0 else "train"


def function_prompts(rel: str, src: str, context_lines: int = 6) -> list[dict]:
    """Prompts ending in a def header plus its docstring's first line, one per documented function."""
    try:
        tree = ast.parse(src)
    except SyntaxError:
        return []
    lines = src.splitlines(keepends=True)
    line_start = [0]
    for line in lines:
        line_start.append(line_start[-1] + len(line))
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or not node.body:
            continue
        doc = node.body[0]
        if not (isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant) and isinstance(doc.value.value, str)):
            continue
        start = node.lineno - 1 - len(node.decorator_list)
        first_doc = lines[doc.lineno - 1]
        quote = first_doc.find('"""') if '"""' in first_doc else first_doc.find("'''")
        if quote < 0:
            continue
        head = "".join(lines[max(0, start - context_lines): doc.lineno - 1])
        opening = first_doc[: quote + 3]
        rest = first_doc[quote + 3:].rstrip("\n")
        words = rest.split(" ")
        opening += " ".join(words[: max(1, min(3, len(words) // 2))])  # stop mid-sentence
        prompt = head + opening
        if 80 <= len(prompt) <= 900:
            begin = line_start[max(0, start - context_lines)]
            end = begin + len(prompt)
            if src[begin:end] != prompt:
                raise SystemExit(f"{rel}:{node.lineno}: the prompt is not a slice of the file; cannot keep its continuation.")
            out.append({"id": f"{rel}:{node.lineno}:{node.name}", "prompt": prompt, "file": rel, "split": split_of(rel),
                        "continuation": continuation(src, end)})
    return out


def continuation(src: str, end: int, n_chars: int = CONTINUATION_CHARS) -> str:
    """The file's text after offset ``end``: at least ``n_chars`` characters, extended to the next line end."""
    stop = src.find("\n", end + n_chars)
    return src[end:] if stop < 0 else src[end: stop + 1]


KEYS = ("id", "prompt", "file", "split")


def check_same_prompts(path: pathlib.Path, new: list[dict], force: bool) -> None:
    """Stop unless ``new`` has the same ids, prompts, files and splits, in order, as the file at ``path``."""
    if not path.is_file():
        return
    old = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    same = len(old) == len(new) and all(all(o.get(k) == n.get(k) for k in KEYS) for o, n in zip(old, new))
    if not same and not force:
        raise SystemExit(f"{path}: the regenerated prompts differ from the shipped ones (ids, prompts, files or "
                         f"splits); other shipped artefacts depend on them. Re-run with --force to replace them.")


def chunks(rel: str, src: str, size: int = 1000) -> list[dict]:
    """Consecutive ~``size``-character chunks of a file, cut at line ends."""
    out, buf, n = [], "", 0
    for line in src.splitlines(keepends=True):
        buf += line
        if len(buf) >= size:
            out.append({"id": f"{rel}#{n}", "prompt": buf, "file": rel, "split": split_of(rel)})
            buf, n = "", n + 1
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n-prompts", type=int, default=60)
    ap.add_argument("--n-chunks", type=int, default=300)
    ap.add_argument("--eval-share", type=float, default=0.4, help="share of prompts from eval-split files")
    ap.add_argument("--per-file", type=int, default=8, help="at most this many prompts from one file")
    ap.add_argument("--out", default=str(ROOT / "sample_data" / "prompts"))
    ap.add_argument("--force", action="store_true", help="replace prompt files even if ids or prompts change")
    args = ap.parse_args()
    files = heldout_files()
    cands = []
    for rel, src in files:
        fp = sorted(function_prompts(rel, src), key=lambda p: _h(p["id"]))[: args.per_file]
        cands += fp
    cands.sort(key=lambda p: _h(p["id"]))
    n_eval = round(args.n_prompts * args.eval_share)
    picked = [p for p in cands if p["split"] == "eval"][:n_eval]
    picked += [p for p in cands if p["split"] == "train"][: args.n_prompts - len(picked)]
    prompts = sorted(picked, key=lambda p: (p["split"], p["id"]))
    pool = [c for rel, src in files if split_of(rel) == "train" for c in chunks(rel, src)]
    pool.sort(key=lambda c: _h(c["id"]))
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    check_same_prompts(out / "heldout_code.jsonl", prompts, args.force)
    with open(out / "heldout_code.jsonl", "w", encoding="utf-8") as fh:
        for p in prompts:
            fh.write(json.dumps(p) + "\n")
    with open(out / "heldout_chunks.jsonl", "w", encoding="utf-8") as fh:
        for c in sorted(pool[: args.n_chunks], key=lambda c: c["id"]):
            fh.write(json.dumps(c) + "\n")
    n_eval = sum(p["split"] == "eval" for p in prompts)
    print(f"{len(prompts)} prompts ({n_eval} eval, {len(prompts) - n_eval} train) from {len(files)} held-out files; "
          f"{min(len(pool), args.n_chunks)} chunks of {len(pool)} from train-split files -> {out}")


if __name__ == "__main__":
    main()
