"""Keyboard navigation: left/right arrow keys step through the run.

A tiny :class:`panel.custom.JSComponent` listens for ``keydown`` on the page
and sends ``"ArrowLeft"`` / ``"ArrowRight"`` to Python, unless the key is typed
into a text field (the event's composed path starts at an input or textarea, so
typing a prompt never moves the step).

It also keeps Enter typed into one of the app's one-line inputs (the step box)
away from the page's own keyboard shortcuts: JupyterLab handles every keydown on
its document in the capture phase and takes Enter (its "edit cell" command),
which cancelled the input's commit, so the step box ignored Enter there. A
capture listener on ``window`` runs before the document's and stops the event's
propagation (not its default action, which commits the input).
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
      const enter = (e) => {
        if (e.key !== 'Enter' || e.shiftKey || e.altKey || e.ctrlKey || e.metaKey) return;
        const path = e.composedPath ? e.composedPath() : [e.target];
        const first = path[0];
        if ((first && first.tagName || '').toLowerCase() !== 'input') return;
        if (path.some((el) => el && el.classList && el.classList.contains('ts-step-box'))) e.stopPropagation();
      };
      document.addEventListener('keydown', handler);
      window.addEventListener('keydown', enter, true);
      model.on('remove', () => {
        document.removeEventListener('keydown', handler);
        window.removeEventListener('keydown', enter, true);
      });
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
