"""``panel serve apps/trajscope.py``: the trajscope app, on SmolLM2 when it is installed, else on the sample model.

Each browser session gets its own :class:`trajscope.TrajScope` (its own state);
the sample model, once loaded, is shared by all sessions. The first screen shows
the pre-captured demo run in ``sample_data/runs/demo`` when it is there;
otherwise the app captures a short run of the demo prompt as soon as the page
opens (streaming, like pressing Generate).

The Model box lists the operator's models (default: the installed ones, see
:func:`trajscope.model.available_models`); the page opens on SmolLM2 when it is
among them, with the sample model one choice away. Environment:
``TRAJSCOPE_RUN`` opens another run directory; ``TRAJSCOPE_MODEL`` chooses the
model the page opens on; ``TRAJSCOPE_LOG`` is the log file (default
``~/.cache/trajscope/logs/app.log``: the traceback behind every error sentence a page shows,
under the error id the sentence names).

Serving for a team: what browsers may reach is the operator's choice, given after
``--args`` (see :mod:`trajscope.ui.operator` and ``docs/operator.md``)::

    panel serve apps/trajscope.py --args --data-dir /data/runs --models sample,gpt2 --max-new-tokens 500
"""

import os
import pathlib
import sys

# `panel serve` puts this file's folder first on sys.path, where this very file (trajscope.py)
# would shadow the trajscope package: put the repository root in front of it.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import panel as pn  # noqa: E402

from trajscope.logs import log_to_file  # noqa: E402
from trajscope.ui import operator  # noqa: E402
from trajscope.ui.views.app import default_page  # noqa: E402

pn.extension("tabulator", notifications=True)
log_to_file()  # $TRAJSCOPE_LOG, default ~/.cache/trajscope/logs/app.log: tracebacks behind the pages' sentences
operator.configure(operator.ServeConfig.from_args(sys.argv[1:]))  # `--args …` of panel serve, else the environment

default_page(os.environ.get("TRAJSCOPE_RUN") or None,
             model=os.environ.get("TRAJSCOPE_MODEL") or operator.config().default_model()).servable(
    title="trajscope")
