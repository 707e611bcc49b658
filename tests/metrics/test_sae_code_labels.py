"""Token labels of Python text: string literals, keywords, indented lines and digits, from tokenize/keyword."""

from __future__ import annotations

from trajscope.metrics.sae_code_labels import code_labels, python_char_spans

TEXT = '        if x:\n            return "a b"\n    y = 42  # done\nfor i in z:\n    s = """doc\n'
PIECES = ["        ", "if", " x", ":\n", "            ", "return", ' "a', ' b"', "\n", "    ", "y", " =", " 4", "2",
          "  # done\n", "for", " i", " in", " z", ":\n", "    ", "s", " =", ' """', "doc", "\n"]


def _decode(ids):
    return "".join(PIECES[i] for i in ids)


def test_labels_follow_tokenize_on_a_cut_snippet():
    assert "".join(PIECES) == TEXT
    lab = code_labels(_decode, list(range(len(PIECES))))
    tok = dict(zip(PIECES, range(len(PIECES))))
    assert [PIECES[i] for i, v in enumerate(lab["keyword"]) if v] == ["if", "return", "for", " in"]
    assert [PIECES[i] for i, v in enumerate(lab["string"]) if v] == [' "a', ' b"']
    assert [PIECES[i] for i, v in enumerate(lab["digit"]) if v] == [" 4", "2"]
    assert lab["indented"][tok["if"]] and lab["indented"][tok["y"]] and not lab["indented"][tok["for"]]
    # the unterminated docstring at the end: tokenize stops there, so string/keyword are unknown from it on
    assert lab["string"][tok[' """']] is None and lab["keyword"][tok["doc"]] is None
    assert lab["string"][tok["s"]] is False and lab["indented"][tok["doc"]] is True


def test_dedent_below_the_first_line_is_read():
    spans, stopped = python_char_spans("    a = 'x'\n  if b:\n        pass\nc = 1\n")
    assert stopped == len("    a = 'x'\n  if b:\n        pass\nc = 1\n")
    assert len(spans["string"]) == 1 and len(spans["keyword"]) == 2
