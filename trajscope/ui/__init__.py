"""The trajscope app: step through decode token by token.

- :mod:`trajscope.ui.state` holds what the user is looking at (``param`` only, no Panel; a layout
  test enforces it);
- :mod:`trajscope.ui.plots` (and :mod:`trajscope.ui.analysis_plots`, helpers the study cards share)
  turn Polars frames into plot data (pure functions over the numbers of :mod:`trajscope.metrics`, so the app
  shows what reports and exports hold); :mod:`trajscope.ui.step_figures` holds the Overview's Bokeh figures,
  built once per session, whose data a new run replaces;
- :mod:`trajscope.ui.runner` runs captures off the event loop on a shared, locked model;
- :mod:`trajscope.ui.export` builds downloads;
- :mod:`trajscope.ui.views` binds them in Panel ``Viewer`` classes (tokens, attention, telemetry,
  features, export); the study cards (Drift, Steering …) live in their study packages
  (``trajscope/studies/<name>/card.py``) and come from the registry; :class:`TrajScope` is the whole
  app, in ``panel serve`` and in Jupyter.
"""


def __getattr__(name: str):
    if name == "TrajScope":
        from trajscope.ui.views.app import TrajScope

        return TrajScope
    raise AttributeError(name)
