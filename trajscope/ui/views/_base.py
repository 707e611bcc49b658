"""Shared pieces of the views: the state-holding base class and the thread → event-loop bridge."""

from __future__ import annotations

import contextlib
import logging
from typing import Callable, Iterator

import panel as pn
import param
from panel.io.state import set_curdoc

from trajscope.errors import TrajscopeError
from trajscope.logs import failure_sentence
from trajscope.ui.state import AppState

log = logging.getLogger(__name__)


class StateView(pn.viewable.Viewer):
    """A view over an :class:`AppState` (one per session; several views share it).

    A view builds its layout once: the first ``__panel__()`` result is kept and returned by every
    later call (Panel renders one layout in several places). Widgets, streams and the watchers
    that a subclass's ``__panel__`` registers therefore exist once per view, instead of piling up
    with every render. A subclass that must run code on each render (the app registers its
    page-load callback) sets ``cache_layout = False``.
    """

    state = param.ClassSelector(class_=AppState, doc="The app state this view shows and edits.")
    shown = param.Boolean(default=True, doc="Whether the view is on screen. The app sets it from its tabs; a view "
                          "whose analysis is costly defers it while hidden (:meth:`defer`) and runs it when shown.")
    cache_layout = True

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        build = cls.__dict__.get("__panel__")
        if build is None or not cls.cache_layout:
            return

        def __panel__(self, _build=build):
            if self.__dict__.get("_layout") is None:
                self.__dict__["_layout"] = _build(self)
            return self.__dict__["_layout"]

        __panel__.__doc__ = build.__doc__
        cls.__panel__ = __panel__

    def __init__(self, **params):
        if params.get("state") is None:
            params["state"] = AppState()
        super().__init__(**params)
        self._deferred: Callable[[], None] | None = None
        self.opening = False  # True while a deferred analysis runs because the view is being shown
        self.param.watch(self._run_deferred, "shown")

    def defer(self, fn: Callable[[], None]) -> bool:
        """While the view is hidden, keep ``fn`` (the latest one wins) to run when it is shown; True if kept.

        A new run then costs a hidden tab nothing: putting the run on screen does not wait for, or
        compete with, analyses nobody is looking at. While ``fn`` runs because the view is being shown,
        :attr:`opening` is True: an analysis that takes a small fraction of a second may then run at once
        on the event loop (``in_background(inline=True)``), before the app builds the view's models, so
        the card is drawn once with its result instead of drawn, then changed.
        """
        if self.shown:
            return False
        self._deferred = fn
        return True

    def _run_deferred(self, event) -> None:
        fn, self._deferred = self._deferred, None
        if event.new and fn is not None:
            self.opening = True
            try:
                fn()
            finally:
                self.opening = False


INLINE_POSITIONS = 512


def short_run(traj) -> bool:
    """Whether a card's analysis of ``traj`` is short enough to run on the event loop as its tab opens
    (:meth:`StateView.defer`): at most :data:`INLINE_POSITIONS` positions. On SmolLM2's 105-position chat
    run, the SAE encoding took 16 ms and the drift scoring 55 ms on the 2-core CPU."""
    return len(traj.token_ids) <= INLINE_POSITIONS


def provenance_line(state: AppState) -> pn.pane.Markdown:
    """The line above each card naming the run and the model its results belong to (:meth:`AppState.provenance`)."""
    return pn.pane.Markdown(pn.bind(lambda *_: state.provenance(), state.param.revision, state.param.busy),
                            css_classes=["ts-provenance"], sizing_mode="stretch_width", margin=(0, 10),
                            styles={"font-size": "0.8em", "color": "#555"})


def any_of(*flags: bool) -> bool:
    """True when any flag is; ``pn.bind(any_of, card.param.busy, state.param.busy)`` disables a card's action
    while the card works or while Generate replaces the run it acts on."""
    return any(flags)


def served(doc) -> bool:
    """``doc`` (a Bokeh document, or None) belongs to a browser session of a Panel server, not to a notebook's
    comms, a script or a test without a server. Pass ``pn.state.curdoc`` for the current one."""
    return doc is not None and doc.session_context is not None


@contextlib.contextmanager
def redraw_once(doc=None) -> Iterator[None]:
    """Batch every plot update made inside the block into one document change.

    Each HoloViews update that swaps Bokeh models makes the document recompute its whole model
    graph (about 0.05–0.1 s on the app's page); putting a new run on screen may update several
    plots. Inside this block the graph is recomputed at most once, at the end, and only if a model
    was added or removed (Bokeh's own ``freeze()`` always recomputes, which costs the Overview's
    data-only updates 0.05 s for nothing); Panel sends the browser one combined message (``pn.io.hold``).
    """
    doc = doc if doc is not None else pn.state.curdoc
    if doc is None:
        yield
        return
    models = doc.models
    if "invalidate" in vars(models):  # nested in another redraw_once: the outer block recomputes
        yield
        return
    needed: list[bool] = []
    with pn.io.hold(doc):  # (the graph is recomputed before the held events are sent, as freeze() does)
        models.invalidate = lambda: needed.append(True)  # Bokeh's one trigger of a recompute: defer it
        try:
            yield
        finally:
            del models.invalidate
            if needed:
                models.invalidate()


def _in_kernel() -> bool:
    """Running inside a Jupyter kernel (whose event loop delivers the widgets' comm messages)."""
    import sys

    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return getattr(shell, "kernel", None) is not None


def dispatcher(doc=None) -> Callable[[Callable[[], None]], None]:
    """A ``dispatch(fn)`` that runs ``fn`` on the event loop of ``doc`` (the current document by default).

    In a served session, ``fn`` is scheduled with ``add_next_tick_callback`` (the Bokeh document
    lock is held there, so models may change). In Jupyter (comms, no server session) it is queued
    on the kernel's event loop, the thread the widgets live on, in order; with no running loop
    (plain scripts, tests) ``fn`` runs at once. ``dispatch.deferred`` says which: True when ``fn``
    is queued for the loop.
    """
    import asyncio

    doc = doc if doc is not None else pn.state.curdoc
    loop = None
    if _in_kernel():
        try:
            loop = asyncio.get_running_loop()  # the kernel's loop (the widgets' thread), captured at the start
        except RuntimeError:
            loop = None

    def run(fn: Callable[[], None]) -> None:
        with set_curdoc(doc):
            fn()

    def dispatch(fn: Callable[[], None]) -> None:
        if served(doc):
            doc.add_next_tick_callback(lambda: run(fn))
        elif loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(run, fn)
        else:
            fn()

    dispatch.deferred = served(doc) or loop is not None
    return dispatch


def in_background(work: Callable[[], object], apply: Callable[[object], None], on_error: Callable[[str], None],
                  doc=None, name: str = "trajscope-analysis", what: str = "The analysis",
                  inline: bool = False) -> None:
    """Run ``work()`` off the event loop and ``apply(result)`` back on it; a failure calls ``on_error``.

    In a served session ``work`` runs on a daemon thread and ``apply`` on the session's next tick
    (under the document lock); without a server session (Jupyter comms, tests) both run at once,
    in order, on the calling thread. While ``work`` runs, the event loop's thread lends it its
    OpenMP cores (:func:`trajscope.ui.openmp.lend`).

    Args:
        on_error: ``(sentence)`` on the event loop when ``work`` raises: a
            :class:`~trajscope.errors.TrajscopeError`'s own sentence, or for anything else
            ``"<what> failed: …"`` with an error id whose traceback the log holds
            (:func:`trajscope.logs.failure_sentence`). The card stays usable either way.
        what: names the work in that sentence ("The eviction study").
        inline: run ``work`` and ``apply`` now, on the calling thread (for work known to be short).
    """
    import threading

    from trajscope.ui import openmp

    def attempt() -> tuple[bool, object]:
        try:
            return True, work()
        except TrajscopeError as exc:
            return False, str(exc)
        except Exception as exc:  # the card must stay usable; the traceback goes to the log
            return False, failure_sentence(what, exc, log)

    def finish(outcome: tuple[bool, object]) -> None:
        ok, value = outcome
        apply(value) if ok else on_error(str(value))

    doc = doc if doc is not None else pn.state.curdoc
    if inline or not served(doc):
        finish(attempt())
        return
    dispatch = dispatcher(doc)
    give_back = openmp.lend(dispatch)

    def run() -> None:
        outcome = attempt()
        dispatch(lambda: (give_back(), finish(outcome)))

    threading.Thread(target=run, name=name, daemon=True).start()


def in_slot(ticket: object, work: Callable[[], str], dispatch: Callable[[Callable[[], None]], None],
            on_wait: Callable[[int], None], on_done: Callable[[str], None], cancel, what: str,
            name: str = "trajscope-generation") -> None:
    """Run ``work()`` on a thread that first waits for, then holds, one slot of Generate's queue.

    Steering, its depth sweep and the calibration report are generations too, so they queue with Generate
    (the operator's ``--max-generations``) for their whole run. ``on_wait(n_ahead)`` is dispatched while
    waiting; ``on_done(message)`` on the event loop at the end: ``work``'s own message, a
    :class:`~trajscope.errors.TrajscopeError`'s sentence, the failure sentence (traceback to the log, under
    ``what``), or "Stopped while waiting…" when ``cancel`` (a ``threading.Event``) is set before the turn.
    While ``work`` runs, the event loop's OpenMP team steps aside and the work keeps one core for the page.
    """
    import threading

    from trajscope.ui import openmp
    from trajscope.ui.runner import QUEUE

    give_back = openmp.lend(dispatch)

    def run() -> None:
        if not QUEUE.wait_turn(ticket, lambda n: dispatch(lambda: on_wait(n)), cancel):
            dispatch(lambda: (give_back(), on_done("Stopped while waiting for a free generation slot.")))
            return
        openmp.set_threads(openmp.capture_threads())  # as Generate
        try:
            msg = work()
        except TrajscopeError as exc:
            msg = str(exc)
        except Exception as exc:  # the view must stay usable; the traceback goes to the log
            msg = failure_sentence(what, exc, log)
        finally:
            QUEUE.leave(ticket)
        dispatch(lambda: (give_back(), on_done(msg)))

    threading.Thread(target=run, name=name, daemon=True).start()
