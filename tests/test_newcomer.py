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


DOCS = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))


def _code_blocks(doc: str) -> str:
    text = (ROOT / doc).read_text()
    return "\n".join(re.findall(r"```(?:bash|python)?\n(.*?)```", text, flags=re.S))


@pytest.mark.parametrize("doc", ["README.md"] + DOCS)
def test_docs_name_only_files_that_ship(doc):
    """Issue: README examples used files that do not ship (prompts.jsonl, PROMPTS.jsonl)."""
    blocks = _code_blocks(doc)
    named = set(re.findall(r"\b((?:sample_data|examples|apps|scripts|benchmarks|docs)/[\w./-]+\.\w+)", blocks))
    if doc == "README.md":
        assert named, "no shipped file named in the README's commands"
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert not missing, f"the commands in {doc} name files that do not ship: {missing}"
    assert "PROMPTS.jsonl" not in blocks and not re.search(r"(?<![\w/])prompts\.jsonl", blocks)


def _trajscope_commands(doc: str) -> list[list[str]]:
    import shlex

    lines = _code_blocks(doc).replace("\\\n", " ").splitlines()
    return [shlex.split(line.split("  #")[0].strip())[1:] for line in lines if line.strip().startswith("trajscope ")]


@pytest.mark.parametrize("doc", ["README.md"] + DOCS)
def test_docs_trajscope_commands_parse(doc):
    """Every `trajscope ...` line in the README and the docs names a real command with real options."""
    from trajscope.cli import build_parser

    commands = _trajscope_commands(doc)
    if doc == "README.md":
        assert len(commands) >= 5
    for argv in commands:
        try:
            build_parser().parse_args(argv)
        except SystemExit:
            pytest.fail(f"{doc}: 'trajscope {' '.join(argv)}' does not parse")


def test_readme_is_a_landing_page():
    """Issue 29: the README is at most 200 lines; the rest lives in docs/, and its links resolve."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text) + re.findall(r'src="([^"]+)"', text)
    local = [link for link in links if "://" not in link]
    assert any(link.startswith("docs/") for link in local)
    missing = [link for link in local if not (ROOT / link).exists()]
    assert not missing, f"README links to files that do not exist: {missing}"


@pytest.mark.parametrize("doc", ["README.md", "docs/operator.md"])
def test_docs_say_to_activate_the_environment(doc):
    text = (ROOT / doc).read_text()
    assert "source .venv/bin/activate" in text or ".venv/bin/" in text


@pytest.mark.parametrize("doc", DOCS)
def test_docs_pictures_resolve(doc):
    """Pictures in the docs are Markdown images of files that exist (MkDocs rewrites those paths,
    not raw <img src>, so a raw tag's relative path breaks on the built site)."""
    page = ROOT / doc
    text = page.read_text()
    assert "<img " not in text, f"{doc}: use ![alt](path){{ width=... }} instead of a raw <img> tag"
    for target in re.findall(r"!\[[^\]]*\]\(([^)\s]+)", text):
        assert (page.parent / target).exists(), f"{doc}: picture {target} does not exist"
