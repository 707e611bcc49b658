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

import trajscope as ts
from trajscope.model import sample_data_dir
from trajscope.ui.state import DEMO_PROMPT

pn.extension(notifications=True)

run_dir = os.environ.get("TRAJSCOPE_RUN") or str(sample_data_dir() / "runs" / "demo")
has_run = os.path.exists(os.path.join(run_dir, "meta.json"))
app = ts.TrajScope(model=os.environ.get("TRAJSCOPE_MODEL", "sample"), trajectory=run_dir if has_run else None,
                   prompt=DEMO_PROMPT, max_new_tokens=64 if has_run else 24, autostart=not has_run)
if has_run:
    app.state.run_path = run_dir
app.template().servable(title="trajscope")
