"""``examples/quickstart.ipynb`` runs top to bottom in a fresh kernel, and the app displays there."""

import json
import pathlib

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOK = pathlib.Path(__file__).resolve().parents[2] / "examples" / "quickstart.ipynb"


def test_quickstart_notebook_runs(tmp_path):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    app_cell = next(c for c in nb.cells if c.cell_type == "code" and "ts.TrajScope(" in c.source)
    mimes = {m for o in app_cell.outputs for m in o.get("data", {})}
    assert "application/vnd.holoviews_exec.v0+json" in mimes, mimes  # a live Panel view, not a repr
    loaded = json.dumps([o.get("data", {}) for c in nb.cells for o in c.get("outputs", [])])
    assert "application/vnd.holoviews_load.v0+json" in loaded  # the extension was loaded for the user
    assert any("query position" in o.get("text", "") for o in outputs)
