"""Browser events that Panel handles without Bokeh's document lock.

A served page's changes reach the server in two ways: a widget's value (debounced by Panel, then
applied under Bokeh's document lock) and an event (a button click, Enter in a text box). When an event
arrives while a value change is still waiting out its debounce, Panel applies both later, in one
callback that runs *without* the lock (``Reactive._event_coroutine``, a ``nolock`` callback). Panel's
own widgets and panes send their updates through ``pn.io.unlocked()`` there. The app's figures are
plain Bokeh models, though, and a view that sets a ``ColumnDataSource``'s data in that callback makes
Bokeh raise ``RuntimeError: _pending_writes should be non-None…``.

Typing a feature label and pressing Enter does exactly this. The redraw is lost, and the exception also
leaves a stale entry on Bokeh's process-wide ``curdoc()`` stack (``patch_curdoc`` pops only when its body
succeeds). From then on, code in the same process that asks Bokeh for the current document gets that
session's document, or "Patched curdoc has been previously destroyed" once the document is gone.
``bokeh.embed`` is one such caller, and reports use it.

:func:`install` runs that callback's whole body inside ``pn.io.unlocked()``. Every change it makes, Panel's
or the app's, is then held and written to the page at the end, which is what Panel already does for its own.
"""

from __future__ import annotations

import functools


def install() -> bool:
    """Wrap Panel's unlocked event handler once per process; False where this Panel has no such handler."""
    from panel.io.document import unlocked
    from panel.reactive import Reactive

    original = getattr(Reactive, "_event_coroutine", None)
    if original is None:
        return False
    if getattr(original, "_trajscope_unlocked", False):
        return True

    @functools.wraps(original)
    async def _event_coroutine(self, doc, event):
        with unlocked():
            await original(self, doc, event)

    _event_coroutine._trajscope_unlocked = True
    Reactive._event_coroutine = _event_coroutine
    return True
