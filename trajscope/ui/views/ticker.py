"""The status line and generation ticker: step counter, progress bar and the text so far, without re-layout.

Changing the text of a Markdown or HTML pane makes Bokeh lay the whole page out
again (every figure re-measured and redrawn): about a second of main-thread
work per update on a page full of plots. The ticker is a small
:class:`panel.custom.JSComponent` whose ``render`` builds fixed-size DOM nodes
once; a change of ``step`` / ``text`` only sets their ``textContent`` and a bar
width, so streaming a long generation costs the browser almost nothing. When no
generation runs it shows the app's status line (``AppState.status``) in the same
fixed box, so pressing Generate or finishing a run changes no layout either.

The ticker also tells the server when the browser has drawn it (``drawn``). It
sits after Generate and Stop, which are drawn before it: their ``disabled``
changes wait for it (see :class:`~trajscope.ui.views.controls.Controls`), because
BokehJS fails on such a change that arrives before the button is drawn, and drops
the rest of that message (Stop stayed enabled after a short first run).
"""

from __future__ import annotations

import param
from panel.custom import JSComponent


class Ticker(JSComponent):
    """Progress of the running generation; the status line when ``active`` is False."""

    status = param.String(default="", doc="Status line shown when no generation runs.")
    active = param.Boolean(default=False, doc="A generation is running (the ticker is shown).")
    step = param.Integer(default=-1, doc="Last finished step (−1 before the first).")
    max_steps = param.Integer(default=1, doc="Steps planned.")
    text = param.String(default="", doc="Generated text so far (tail), whitespace made visible.")
    message = param.String(default="", doc="What is happening (loading, stopping, …).")
    drawn = param.Boolean(default=False, doc="The browser has drawn the ticker (set from the browser, once).")

    _stylesheets = ["""
    .ts-tick { font-size: 12px; height: 92px; overflow: hidden; }
    .ts-tick-bar { height: 6px; background: #e9ecef; border-radius: 3px; margin: 4px 0; }
    .ts-tick-fill { height: 6px; background: #1f77b4; border-radius: 3px; width: 0%; }
    .ts-tick-text { font-family: monospace; white-space: pre-wrap; word-break: break-all; height: 48px;
                    overflow: hidden; background: #f6f8fa; padding: 2px 4px; border-radius: 4px;
                    display: flex; flex-direction: column; justify-content: flex-end; }
    """]

    _esm = """
    export function render({ model }) {
      const root = document.createElement('div');
      root.className = 'ts-tick';
      const line = document.createElement('div');
      const bar = document.createElement('div'); bar.className = 'ts-tick-bar';
      const fill = document.createElement('div'); fill.className = 'ts-tick-fill'; bar.appendChild(fill);
      const text = document.createElement('div'); text.className = 'ts-tick-text';
      const inner = document.createElement('span'); text.appendChild(inner);
      root.append(line, bar, text);
      const update = () => {
        const on = model.active;
        bar.style.visibility = text.style.visibility = on ? 'visible' : 'hidden';
        const s = model.step, n = Math.max(1, model.max_steps);
        line.textContent = on ? (model.message || (s < 0 ? 'Starting…' : `Generating: step ${s} of ${n - 1}`))
                              : model.status;
        fill.style.width = `${Math.min(100, 100 * (s + 1) / n)}%`;
        inner.textContent = model.text;
      };
      update();
      if (!model.drawn) model.drawn = true;
      model.on(['active', 'step', 'max_steps', 'text', 'message', 'status'], update);
      return root;
    }
    """
