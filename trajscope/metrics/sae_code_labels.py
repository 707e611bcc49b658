"""Token-level labels of Python text, computed offline from the text alone (the truth of k-sparse probing).

A probe needs a label per token position that does not come from the model. For Python source
(the prompt and the model's continuation, as one text) the standard library gives it:

- ``string``: the token overlaps a string literal (``tokenize.STRING``, docstrings included; on
  Python 3.12+ also the parts of an f-string);
- ``keyword``: the token overlaps a Python keyword (``tokenize.NAME`` with :func:`keyword.iskeyword`);
- ``indented``: the token sits on a line whose first character is a space or a tab;
- ``digit``: the token's text holds a decimal digit.

Characters are mapped to tokens through prefix decoding: token i covers
``[len(decode(ids[:i])), len(decode(ids[:i + 1])))``, so the labels follow the tokenizer exactly
(a zero-width token gets ``None``). ``string`` and ``keyword`` come from :mod:`tokenize`, which
needs consistent indentation: a snippet cut out of a file starts indented and dedents below its
first line, so every indentation width the text uses is first declared by a synthetic prefix of
one line per width (``" " * w + "0"``), which the labels never see. Where :mod:`tokenize` still
stops (an unterminated string or bracket at the end of a cut text) the tokens it produced keep
their labels and every token from the failure on gets ``None`` for ``string`` and ``keyword``
(left out of those probes, never guessed). A text cut in the middle of a string literal is read
as the tokenizer reads it (a known limit: the cut is what the model saw too).
"""

from __future__ import annotations

import io
import keyword
import re
import tokenize
from typing import Any, Callable, Sequence

LABELS = ("string", "keyword", "indented", "digit")

_INDENT = re.compile(r"^[ \t]+(?=\S)", re.MULTILINE)


def token_spans(decode: Callable[[list[int]], str], ids: Sequence[int]) -> tuple[str, list[tuple[int, int]]]:
    """``(text, [(start, end)] per token)`` from prefix decoding (see the module docstring)."""
    ids = list(ids)
    ends = [len(decode(ids[:i + 1])) for i in range(len(ids))]
    starts = [0, *ends[:-1]]
    return decode(ids), [(s, max(s, e)) for s, e in zip(starts, ends)]


def _line_starts(text: str) -> list[int]:
    starts = [0]
    starts += [m.end() for m in re.finditer("\n", text)]
    return starts


def python_char_spans(text: str) -> tuple[dict[str, list[tuple[int, int]]], int]:
    """Character spans of string literals and keywords in ``text``, and the offset where :mod:`tokenize`
    stopped (``len(text)`` when it read everything)."""
    widths = sorted({len(m.group(0).expandtabs(8)) for m in _INDENT.finditer(text)})
    prefix = "".join(" " * w + "0\n" for w in [0, *widths])
    src = prefix + text
    line_off = _line_starts(src)
    spans: dict[str, list[tuple[int, int]]] = {"string": [], "keyword": []}
    stopped = len(text)

    def at(rc: tuple[int, int]) -> int:
        return line_off[rc[0] - 1] + rc[1] - len(prefix)

    string_types = {tokenize.STRING, *(getattr(tokenize, n) for n in ("FSTRING_START", "FSTRING_MIDDLE",
                                                                       "FSTRING_END") if hasattr(tokenize, n))}
    last = 0  # end of the last token tokenize produced
    try:
        for tok in tokenize.generate_tokens(io.StringIO(src).readline):
            if tok.type == tokenize.ERRORTOKEN and tok.string.strip() in ("'", '"'):
                raise tokenize.TokenError("unterminated string", tok.start)
            if tok.type in string_types:
                spans["string"].append((at(tok.start), at(tok.end)))
            elif tok.type == tokenize.NAME and keyword.iskeyword(tok.string):
                spans["keyword"].append((at(tok.start), at(tok.end)))
            if tok.type not in (tokenize.DEDENT, tokenize.ENDMARKER):
                last = max(last, at(tok.end))
    except (tokenize.TokenError, SyntaxError):  # IndentationError is a SyntaxError
        stopped = max(0, min(last, len(text)))
    return spans, stopped


def _overlaps(span: tuple[int, int], spans: list[tuple[int, int]]) -> bool:
    s, e = span
    return any(a < e and s < b for a, b in spans)


def code_labels(decode: Callable[[list[int]], str], ids: Sequence[int]) -> dict[str, list[Any]]:
    """Per token of ``ids``: ``{label: [True / False / None]}`` for every label of :data:`LABELS`.

    Args:
        decode: the tokenizer's ``decode`` (ids → text).
        ids: the token ids of one sequence (prompt and continuation).
    Returns:
        One list of ``len(ids)`` values per label; ``None`` where the label is unknown (a zero-width
        token, or past the point where :mod:`tokenize` stopped for ``string`` / ``keyword``).
    """
    text, spans = token_spans(decode, ids)
    chars, stopped = python_char_spans(text)
    line_start = _line_starts(text)
    out: dict[str, list[Any]] = {k: [] for k in LABELS}
    import bisect

    for s, e in spans:
        if e <= s:
            for k in LABELS:
                out[k].append(None)
            continue
        known = e <= stopped
        out["string"].append(_overlaps((s, e), chars["string"]) if known else None)
        out["keyword"].append(_overlaps((s, e), chars["keyword"]) if known else None)
        ls = line_start[bisect.bisect_right(line_start, s) - 1]
        out["indented"].append(text[ls:ls + 1] in (" ", "\t"))
        out["digit"].append(any(c.isdigit() for c in text[s:e]))
    return out
