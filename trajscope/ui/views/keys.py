"""Keyboard navigation: left/right arrow keys step through the run.

A tiny :class:`panel.custom.JSComponent` listens for ``keydown`` on the page
and sends ``"ArrowLeft"`` / ``"ArrowRight"`` to Python, unless the key is typed
into a text field (the event's composed path starts at an input or textarea, so
typing a prompt never moves the step).
"""

from __future__ import annotations

import param
from panel.custom import JSComponent

from trajscope.ui.state import AppState


class ArrowKeys(JSComponent):
    """Invisible component: ← calls ``state.prev()``, → calls ``state.next()``.

    The state is a plain attribute, not a parameter: every parameter of a JSComponent is
    synchronised with the browser, and the state (with its run) must stay on the server.
    """

    presses = param.Integer(default=0, doc="Arrow-key presses handled so far (for tests and diagnostics).")

    _esm = """
    export function render({ model }) {
      const handler = (e) => {
        if (e.key !== 'ArrowLeft' && e.key !== 'ArrowRight') return;
        if (e.altKey || e.ctrlKey || e.metaKey) return;
        const path = e.composedPath ? e.composedPath() : [e.target];
        for (const el of path) {
          const tag = (el && el.tagName || '').toLowerCase();
          if (tag === 'input' || tag === 'textarea' || tag === 'select' || (el && el.isContentEditable)) return;
        }
        e.preventDefault();
        model.send_msg(e.key);
      };
      document.addEventListener('keydown', handler);
      model.on('remove', () => document.removeEventListener('keydown', handler));
      const el = document.createElement('span');
      el.style.display = 'none';
      return el;
    }
    """

    def __init__(self, state: AppState, **params):
        super().__init__(**params)
        self.state = state

    def _handle_msg(self, msg) -> None:
        if msg == "ArrowRight":
            self.state.next()
        elif msg == "ArrowLeft":
            self.state.prev()
        else:
            return
        self.presses += 1
