"""``examples/quickstart.ipynb`` runs top to bottom in a fresh kernel; the app displays there and in its
HTML export, offline."""

import json
import pathlib
import re

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOK = pathlib.Path(__file__).resolve().parents[2] / "examples" / "quickstart.ipynb"
TITLES = """() => Bokeh.documents.flatMap(d => [...d.all_models])
    .filter(m => m.title && m.title.text !== undefined).map(m => m.title.text)"""


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("nb")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp)}})
    client.execute()
    return nb


def test_quickstart_notebook_runs(executed):
    nb = executed
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    app_cell = next(c for c in nb.cells if c.cell_type == "code" and "ts.TrajScope(" in c.source)
    mimes = {m for o in app_cell.outputs for m in o.get("data", {})}
    assert "application/vnd.holoviews_exec.v0+json" in mimes, mimes  # a live Panel view, not a repr
    loaded = json.dumps([o.get("data", {}) for c in nb.cells for o in c.get("outputs", [])])
    assert "application/vnd.holoviews_load.v0+json" in loaded  # the extension was loaded for the user
    assert any("query position" in o.get("text", "") for o in outputs)


@pytest.mark.ui
def test_quickstart_html_export_renders_the_app_offline(executed, page, tmp_path):
    """Issue: the app cell was blank offline (Panel's JavaScript came from a CDN)."""
    nbconvert = pytest.importorskip("nbconvert")
    pytest.importorskip("playwright.sync_api")
    body, _ = nbconvert.HTMLExporter().from_notebook_node(executed)
    assert not re.search(r"<script[^>]+src=\"https://cdn\.(bokeh|holoviz)", body)  # BokehJS and Panel are inline
    html = tmp_path / "quickstart.html"
    html.write_text(body)
    requested = []

    def offline(route):
        if route.request.url.startswith("file:"):
            return route.continue_()
        requested.append(route.request.url)
        return route.abort()

    page.route("**/*", offline)
    page.set_viewport_size({"width": 1100, "height": 1400})
    page.goto(html.as_uri())
    page.wait_for_function("() => typeof Bokeh !== 'undefined' && Bokeh.documents.length > 0", timeout=60_000)
    page.wait_for_function(f"() => ({TITLES})().some(t => t.includes('telemetry'))", timeout=60_000)
    page.locator("canvas").nth(2).wait_for(state="attached", timeout=60_000)  # drawn (locators pierce shadow roots)
    titles = page.evaluate(TITLES)
    assert any("telemetry" in t for t in titles) and any("Tokens" in t for t in titles), titles
    # what was refused is nbconvert's own page furniture (require.js, MathJax), never the app's resources
    assert not [u for u in requested if "bokeh" in u or "holoviz" in u or "panel" in u], requested
