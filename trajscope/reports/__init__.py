"""Reports: standalone HTML pages that open offline.

- :mod:`~trajscope.reports.page`: the page shell and BokehJS inline (one of each);
- :mod:`~trajscope.reports.comparison`: runs side by side (:func:`compare`, ``trajscope report``);
- :mod:`~trajscope.reports.studies`: the sections of every registered study found in folders
  (``trajscope study-report``); each section is its study's own (the registry).
"""
