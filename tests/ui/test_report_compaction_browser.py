"""The compaction report section, embedded in a standalone page with BokehJS inline, renders offline in Chromium.

This is the page shape the study report writes (``trajscope/reports/comparison.py``'s inline BokehJS plus each
section's fragment and figures); the check is that the section's figures draw with the network off.
"""

from __future__ import annotations

import pytest

from trajscope.model import sample_data_dir
from trajscope.reports.page import bokeh_js
from trajscope.studies.compaction.section import section
from trajscope.studies.registry import Result

pytestmark = pytest.mark.ui


def test_section_renders_offline(tmp_path, page):
    from bokeh.embed import components

    title, frag, figs = section(Result.load(sample_data_dir() / "reports" / "compaction", "compaction"))
    script, divs = components(figs)
    html = (f"<!doctype html><html><head><meta charset='utf-8'>{bokeh_js()}{script}</head><body>"
            f"<h2>{title}</h2>{frag}{''.join(divs)}</body></html>")
    path = tmp_path / "compaction.html"
    path.write_text(html, encoding="utf-8")
    requests = []
    page.context.set_offline(True)
    page.on("request", lambda r: requests.append(r.url))
    page.goto(path.as_uri())
    page.locator("canvas").nth(len(figs) - 1).wait_for(state="attached", timeout=90_000)
    assert page.locator(".bk-Canvas").count() >= len(figs) == 3
    assert page.get_by_text("Divergence of T3's hidden states", exact=False).is_visible()
    assert all(u.startswith("file:") or u.startswith("data:") for u in requests), requests
