"""The one text rule: :mod:`trajscope.escaping` shows payloads literally in HTML and in Panel's Markdown."""

from __future__ import annotations

import html

import panel as pn
import pytest

from trajscope.escaping import html_text, md_text

PAYLOADS = ["<img src=x onerror=alert(1)>", "<script>alert(1)</script>", "<svg onload=alert(1)>",
            '"><b>x</b>', "@{x}{safe} $x", "*a* `c` [l](javascript:alert(1)) C:\\d\\a_b &amp; $y$"]


def rendered(pane) -> str:
    """The HTML a Panel pane sends to the browser (which decodes it once and sets it as innerHTML)."""
    return html.unescape(pane._transform_object(pane.object)["object"])


@pytest.mark.parametrize("payload", PAYLOADS)
def test_html_text_leaves_no_markup(payload):
    out = html_text(payload)
    assert "<" not in out and ">" not in out and '"' not in out
    assert html.unescape(out) == payload


@pytest.mark.parametrize("payload", PAYLOADS)
@pytest.mark.parametrize("pane", [pn.pane.Markdown, pn.pane.Alert])
def test_md_text_renders_literally_in_markdown_panes(payload, pane):
    out = rendered(pane("Error: " + md_text(payload)))
    assert "<img" not in out and "<script" not in out and "<svg" not in out and "<b>" not in out and "<a " not in out
    assert "<em>" not in out and "<code>" not in out
    text = html.unescape(out.removeprefix("<p>").strip().removesuffix("</p>"))  # what the page shows
    assert text == "Error: " + payload


@pytest.mark.parametrize("payload", PAYLOADS)
def test_str_pane_needs_html_text(payload):
    # Panel 1.9's Str pane passes HTML through: the helper is what keeps it text
    assert "<pre>" + html_text(payload) + "</pre>" == rendered(pn.pane.Str(html_text(payload)))
    if "<" in payload:
        assert payload in rendered(pn.pane.Str(payload))  # without it, the markup reaches the page


def test_none_is_empty():
    assert html_text(None) == md_text(None) == ""
