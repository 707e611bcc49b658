"""``panel serve apps/trajscope.py``: the trajscope app on the shipped sample model.

Each browser session gets its own :class:`trajscope.TrajScope` (its own state);
the sample model, once loaded, is shared by all sessions. The first screen shows
the pre-captured demo run in ``sample_data/runs/demo`` when it is there;
otherwise the app captures a short run of the demo prompt as soon as the page
opens (streaming, like pressing Generate).

Environment: ``TRAJSCOPE_RUN`` opens another run directory; ``TRAJSCOPE_MODEL``
uses another model source for Generate.
"""

import os

import panel as pn

from trajscope.ui.views.app import default_page

pn.extension(notifications=True)

default_page(os.environ.get("TRAJSCOPE_RUN") or None, model=os.environ.get("TRAJSCOPE_MODEL", "sample")).servable(
    title="trajscope")
