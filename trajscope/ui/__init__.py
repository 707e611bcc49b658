"""The trajscope app: step through decode token by token.

- :mod:`trajscope.ui.state` holds what the user is looking at (``param`` only, no Panel);
- :mod:`trajscope.ui.plots` turns Polars frames into HoloViews elements (pure functions);
- :mod:`trajscope.ui.views` binds the two in Panel ``Viewer`` classes; :class:`TrajScope`
  is the whole app, in ``panel serve`` and in Jupyter.
"""


def __getattr__(name: str):
    if name == "TrajScope":
        from trajscope.ui.views.app import TrajScope

        return TrajScope
    raise AttributeError(name)
