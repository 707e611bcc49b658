"""A generated report opens from disk in headless Chromium with the network off, plots rendered."""

from __future__ import annotations

import pytest

import trajscope as ts
from trajscope.reports.comparison import compare

pytestmark = pytest.mark.ui


def test_report_renders_offline(sample_model, tmp_path, page):
    vec = ts.SteeringVector.load("sample_data/vectors/quotes_caa_layer3.safetensors", strength=1.0, start_step=4)
    base = ts.capture(sample_model, "def fibonacci(n):\n    ", max_new_tokens=12)
    steered = ts.capture(sample_model, "def fibonacci(n):\n    ", max_new_tokens=12, steering=[vec])
    path = compare([base, steered]).save(tmp_path / "report.html")
    requests = []
    page.context.set_offline(True)
    page.on("request", lambda r: requests.append(r.url))
    page.goto(path.as_uri())
    # Bokeh draws into canvases inside shadow roots; Playwright's locators pierce them.
    page.locator("canvas").nth(6).wait_for(state="attached", timeout=90_000)  # slow under a full suite on 2 cores
    assert page.locator(".bk-Canvas").count() >= 7  # 3 attention + 2 residual + 2 steering plots
    assert page.get_by_text("Generated tokens by step").is_visible()
    assert page.get_by_text("Steering", exact=True).count() >= 1
    assert all(u.startswith("file:") or u.startswith("data:") for u in requests), requests
