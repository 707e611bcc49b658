"""Panel views of the trajscope app. Each takes the shared :class:`~trajscope.ui.state.AppState`.

- :mod:`.controls`: model, prompt and sampling settings, Generate / Stop, open a run;
- :mod:`.player`: the step player (play/pause, previous/next, jump, arrow keys);
- :mod:`.tokens`: the token strip;
- :mod:`.attention`: heatmap, layer × head grid, top attended tokens;
- :mod:`.telemetry`: curves over steps;
- :mod:`.features`: SAE features of the run (top features, timeline, reconstruction error);
- :mod:`.export`: downloads;
- :mod:`.app`: :class:`TrajScope`, all of the above in one layout, with each registered study's card
  (:func:`trajscope.studies.registry.cards`: Drift, Steering …) as a tab.
"""
