"""A busy spinner that changes no layout: a card's study is running.

Panel's ``LoadingSpinner`` shows its state through the Bokeh model's
``css_classes``; changing them makes BokehJS lay out the whole card again,
figures included: 90–110 ms of main-thread work on SmolLM2's Eviction card, at
the start and at the end of every run. This :class:`panel.custom.JSComponent`
builds a fixed-size element once and only starts or stops its animation, like
the generation ticker (:mod:`~trajscope.ui.views.ticker`).
"""

from __future__ import annotations

import param
from panel.custom import JSComponent


class Spinner(JSComponent):
    """A 20 px ring that turns while ``value`` is True (bind it to a ``busy`` parameter)."""

    value = param.Boolean(default=False, allow_refs=True, doc="Spin (the work it stands for is running).")

    _stylesheets = ["""
    .ts-spin { width: 20px; height: 20px; box-sizing: border-box; border-radius: 50%; margin: 2px;
               border: 3px solid #dee2e6; border-top-color: #1f77b4; visibility: hidden; }
    .ts-spin.on { visibility: visible; animation: ts-spin 0.9s linear infinite; }
    @keyframes ts-spin { to { transform: rotate(360deg); } }
    """]

    _esm = """
    export function render({ model }) {
      const el = document.createElement('div');
      el.className = 'ts-spin';
      el.setAttribute('role', 'status');
      const update = () => {
        el.classList.toggle('on', model.value);
        el.setAttribute('aria-label', model.value ? 'running' : 'idle');
      };
      update();
      model.on('value', update);
      return el;
    }
    """

    def __init__(self, **params):
        params.setdefault("width", 24)
        params.setdefault("height", 24)
        params.setdefault("margin", (12, 5, 5, 5))  # level with the button beside it in a row of labelled inputs
        super().__init__(**params)
