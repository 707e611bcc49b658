"""Code a served page runs once BokehJS is loaded there: how trajscope's patches to BokehJS 3.9 reach the page.

Each patch (:mod:`~trajscope.ui.views.css_reads`, :mod:`~trajscope.ui.views.late_children`) is JavaScript that
replaces one BokehJS method, checked on BokehJS 3.9.x alone. A patch module says when it is needed (its own
``needed()``, which benchmarks may turn off) and installs its code with :func:`run_when_ready`.
"""

from __future__ import annotations

import bokeh
from bokeh.models import CustomJS


def bokeh_3_9(version: str = bokeh.__version__) -> bool:
    """Whether ``version`` is a BokehJS 3.9.x, the release the patches were measured and checked on."""
    major, minor = (int(p) for p in version.split(".")[:2])
    return (major, minor) == (3, 9)


def run_when_ready(doc, code: str) -> bool:
    """Run ``code`` in the browser when ``doc`` is ready there; True if it was added (False without a document)."""
    if doc is None:
        return False
    doc.js_on_event("document_ready", CustomJS(code=code))
    return True
