"""Every report is drawn through :mod:`trajscope.reports.page`, so its bytes do not depend on what the process
imported: Panel, once imported, patches Bokeh (the figure script's wrapper, the custom-model definitions of
each document, the id counter). Each variant runs in its own process, as the CLI and the app do."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from trajscope.reports.page import canonical_ids

REPO = pathlib.Path(__file__).resolve().parents[1]
DRAW = """
import sys
{first}
from trajscope.reports.comparison import compare
from trajscope.reports.studies import study_report

out = sys.argv[1]
compare(["sample_data/runs/demo", "sample_data/runs/demo"]).save(out + "/comparison.html")
study_report(["sample_data/reports", "sample_data/reports/eviction"], out + "/studies.html")
"""


def _draw(out: pathlib.Path, first: str) -> dict[str, bytes]:
    out.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    subprocess.run([sys.executable, "-c", DRAW.format(first=first), str(out)], cwd=REPO, env=env, check=True,
                   timeout=300)
    return {name: (out / name).read_bytes() for name in ("comparison.html", "studies.html")}


@pytest.mark.slow
def test_a_study_report_and_a_comparison_report_are_the_same_bytes_with_panel_imported_first(tmp_path):
    plain = _draw(tmp_path / "plain", "")
    panel = _draw(tmp_path / "panel", "import panel  # registers Panel's models and patches Bokeh")
    for name in plain:
        assert b"Bokeh.embed.embed_items" in plain[name], name  # the pages hold figures
        assert plain[name] == panel[name], name


def test_only_defined_model_ids_are_renumbered():
    """A data string shaped like an id (a token's text "p1234") stays as it is."""
    page = '<div data-root-id="p2001"></div>{"id":"p2001","data":["p1234"]},{"id":"p2002"}'
    assert canonical_ids(page) == '<div data-root-id="p1001"></div>{"id":"p1001","data":["p1234"]},{"id":"p1002"}'
