"""When the page-side patches to BokehJS apply, and how they reach a document (trajscope.ui.views._page_patch)."""

from __future__ import annotations

import pytest
from bokeh.document import Document

from trajscope.ui.views import _page_patch, css_reads, late_children


def ready_code(doc: Document) -> list[str]:
    """The code of each callback ``doc`` sends the browser to run when the document is ready (its JSON, as served)."""
    entries = dict(doc.to_json().content["callbacks"]["entries"])
    return [c["attributes"]["code"] for c in entries.get("document_ready", [])]


@pytest.mark.parametrize(("version", "expected"), [("3.9.0", True), ("3.9.2", True), ("3.9.3.dev1", True),
                                                   ("3.8.2", False), ("3.10.0", False), ("4.0.0", False)])
def test_the_patches_apply_to_bokehjs_3_9_alone(version, expected):
    assert _page_patch.bokeh_3_9(version) is expected
    assert css_reads.needed(version) is expected and late_children.needed(version) is expected


def test_a_patch_runs_when_its_document_is_ready_in_the_browser():
    doc = Document()
    assert _page_patch.run_when_ready(doc, "window.patched = true")
    assert ready_code(doc) == ["window.patched = true"]
    assert not _page_patch.run_when_ready(None, "window.patched = true")  # a notebook, or no server: nothing to run


@pytest.mark.skipif(not _page_patch.bokeh_3_9(), reason="the patches are for BokehJS 3.9")
def test_each_patch_module_installs_its_own_code():
    doc = Document()
    assert css_reads.install(doc) and late_children.install(doc)
    assert ready_code(doc) == [css_reads.PATCH, late_children.PATCH]
    assert not css_reads.install(None) and not late_children.install(None)
