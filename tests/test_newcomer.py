"""Newcomer checks outside the app: what a first-time user runs or reads must work as written."""

from __future__ import annotations

import pathlib
import re
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_report_requests_nothing_from_the_network(tmp_path):
    """Issue: the page requested Google Fonts; a standalone report must open offline."""
    import trajscope as ts
    from trajscope.ui.export import report_bytes

    traj = ts.Trajectory.load(ROOT / "sample_data" / "runs" / "demo")
    html = report_bytes(traj).decode()
    # what the page itself loads: script and stylesheet tags, CSS imports (URLs inside the inlined
    # BokehJS bundle, e.g. MathJax for LaTeX labels that the report never uses, are not requests)
    fetched = re.findall(r"""<script[^>]*\ssrc\s*=\s*["'](https?://[^"']+)""", html)
    fetched += re.findall(r"""<link[^>]*\shref\s*=\s*["'](https?://[^"']+)""", html)
    fetched += re.findall(r"""@import\s+(?:url\()?["']?(https?://[^"')\s]+)""", html)
    assert not fetched, fetched
    assert "fonts.googleapis" not in html and "cdn.bokeh.org" not in html


def test_serve_show_says_where_to_open_the_app(monkeypatch, capsys):
    """Issue: `--show` gave no feedback when no browser opens."""
    from trajscope.cli import main

    calls = []
    monkeypatch.setattr(subprocess, "call", lambda cmd: calls.append(cmd) or 0)
    assert main(["serve", "--show", "--port", "5123"]) == 0
    err = capsys.readouterr().err
    assert "http://localhost:5123/trajscope" in err and "none opens" in err
    assert calls and "--show" in calls[0] and "5123" in calls[0]


def test_readme_names_only_files_that_ship():
    """Issue: README examples used files that do not ship (prompts.jsonl, PROMPTS.jsonl)."""
    text = (ROOT / "README.md").read_text()
    blocks = "\n".join(re.findall(r"```(?:bash|python)?\n(.*?)```", text, flags=re.S))
    named = set(re.findall(r"\b((?:sample_data|examples|apps|scripts|benchmarks|docs)/[\w./-]+\.\w+)", blocks))
    assert named, "no shipped file named in the README's commands"
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert not missing, f"the README's commands name files that do not ship: {missing}"
    assert "PROMPTS.jsonl" not in blocks and not re.search(r"(?<![\w/])prompts\.jsonl", blocks)


@pytest.mark.parametrize("doc", ["README.md", "docs/operator.md"])
def test_docs_say_to_activate_the_environment(doc):
    text = (ROOT / doc).read_text()
    assert "source .venv/bin/activate" in text or ".venv/bin/" in text
