"""Running a capture for the app: a shared model cache and a background generation job.

Models are big and sessions are many, so one loaded :class:`~trajscope.model.ModelHandle`
per ``(source, remote)`` lives in a module-level cache shared by every session;
:func:`trajscope.capture` holds ``model.lock`` while it generates, so two
sessions asking at once take turns instead of interleaving on one model.

:class:`GenerationJob` runs load + capture on a worker thread so the event loop
stays free. It never touches Panel: every result goes through ``dispatch``, a
callable the view supplies that runs a function on the session's event loop
(in tests, ``dispatch`` can simply call it). Finished steps are buffered and
forwarded in batches a few times a second, so a fast model never floods the
event loop; the settings are a :class:`~trajscope.ui.plan.CapturePlan` frozen
when Generate was pressed.

The cache holds at most the operator's ``max_models``
(:mod:`trajscope.ui.operator`), least recently used out. The NDIF API key is
passed to :func:`trajscope.load_model` as an argument (never through
``os.environ``, a process-wide change other sessions would see); it is not
stored in the cache key (a hash is), the run or any message.
"""

from __future__ import annotations

import collections
import hashlib
import logging
import os
import threading
import time
from typing import Any, Callable

from trajscope.capture import capture
from trajscope.chat import user_message
from trajscope.errors import TrajscopeError
from trajscope.logs import error_id
from trajscope.model import ModelHandle, load_model
from trajscope.ui import openmp

log = logging.getLogger(__name__)
_MODELS: "collections.OrderedDict[tuple, ModelHandle]" = collections.OrderedDict()  # least recently used first
_MODELS_LOCK = threading.Lock()


def get_model(source: str, remote: bool = False, api_key: str | None = None,
              loader: Callable[..., ModelHandle] | None = None) -> ModelHandle:
    """The shared :class:`~trajscope.model.ModelHandle` for ``source`` (loaded on first use).

    Args:
        source: what :func:`trajscope.load_model` accepts.
        remote: NDIF remote model.
        api_key: NDIF key (remote only); part of the cache identity as a hash, never stored in clear.
        loader: replaces :func:`trajscope.load_model` (tests).
    Raises:
        TrajscopeError: from the loader, one sentence.
    """
    key_id = hashlib.sha256(api_key.encode()).hexdigest()[:12] if (remote and api_key) else None
    cache_key = (source, bool(remote), key_id)
    from trajscope.ui.operator import config

    with _MODELS_LOCK:
        if cache_key in _MODELS:
            _MODELS.move_to_end(cache_key)
            return _MODELS[cache_key]
        load = loader or load_model
        if remote and not api_key and not os.environ.get("NDIF_API_KEY"):
            raise TrajscopeError("Remote (NDIF) models need an API key: paste it in the API key field (get one at ndif.us).")
        model = load(source, remote=True, api_key=api_key) if remote else load(source)
        _MODELS[cache_key] = model
        while len(_MODELS) > config().max_models:  # the operator's bound: least recently used out
            old, _ = _MODELS.popitem(last=False)
            log.info("model cache full (%d): unloaded %s", config().max_models, old[0])
        return model


def loaded_model(source: str) -> ModelHandle | None:
    """The local model ``source`` if it is already in the cache (nothing is loaded), else None."""
    with _MODELS_LOCK:
        return _MODELS.get((source, False, None))


class GenerationQueue:
    """First come, first served slots for generations across every session of the process.

    At most ``slots()`` generations run at once (the operator's ``max_generations``); the others wait
    in arrival order and are told their place. A waiting job that is cancelled leaves the queue.
    """

    def __init__(self, slots: Callable[[], int]):
        self.slots = slots
        self._cond = threading.Condition()
        self._line: list[object] = []  # running (first ``slots()``) then waiting, in arrival order

    def wait_turn(self, ticket: object, on_wait: Callable[[int], None], cancel: threading.Event) -> bool:
        """Join the line and block until ``ticket`` may run; ``on_wait(n_ahead)`` when the place changes.

        Returns:
            True when it is the ticket's turn (call :meth:`leave` when done); False if cancelled first.
        """
        with self._cond:
            self._line.append(ticket)
            told = None
            while True:
                place = self._line.index(ticket)
                if place < self.slots():
                    return True
                if cancel.is_set():
                    self._line.remove(ticket)
                    self._cond.notify_all()
                    return False
                ahead = place - self.slots() + 1
                if ahead != told:
                    told = ahead
                    on_wait(ahead)
                self._cond.wait(0.2)

    def leave(self, ticket: object) -> None:
        with self._cond:
            if ticket in self._line:
                self._line.remove(ticket)
            self._cond.notify_all()


def _slots() -> int:
    from trajscope.ui.operator import config

    return config().max_generations


QUEUE = GenerationQueue(_slots)


def local_model(state: Any, card: str, loader: Callable[[str], ModelHandle] | None = None) -> ModelHandle:
    """The model a card that masks keys runs on (Eviction, Compaction): a local one, or one sentence why not.

    Args:
        state: the app state (its model source and NDIF flag).
        card: the card's name, for the message.
        loader: ``(source) -> ModelHandle`` to use instead of the shared cache (tests).
    Raises:
        TrajscopeError: the model is an NDIF model, or the operator does not allow it.
    """
    if state.remote:
        raise TrajscopeError(f"The {card} card needs key masks, which run on a local model only: untick "
                             "'NDIF remote' and choose a local model.")
    if loader is not None:
        return loader(state.model_source)
    return get_model(state.model_key()[0])  # a model the operator allows (one sentence otherwise)


def _scrub(message: str, secret: str | None) -> str:
    return message.replace(secret, "***") if secret else message


class GenerationJob:
    """Load (cached) + capture on a worker thread, reporting through ``dispatch`` in batches.

    The worker only appends each finished step to a buffer; at most every ``flush_every_s``
    seconds it dispatches one flush that hands the new steps to ``on_progress`` as a list, so
    the event loop handles a few updates per second however fast the model is. A partial
    :class:`~trajscope.Trajectory` (a table build) is only made when ``on_partial`` is given,
    on the worker thread, at most every ``partial_every_s`` seconds.

    Args:
        source, remote, api_key: the model (see :func:`get_model`).
        prompt: text to continue.
        plan: a :class:`~trajscope.ui.plan.CapturePlan` (or a plain ``CaptureConfig``) frozen when
            Generate was pressed; resolved for the model once it is loaded, never re-read from the UI.
        dispatch: ``dispatch(fn)`` runs ``fn()`` on the UI's event loop.
        on_progress: ``(events: list[StepEvent])`` the steps finished since the last call.
        on_done: ``(traj)`` with the finished (or cancelled) run, after the last ``on_progress``.
        on_error: ``(message: str)`` one sentence; the API key is scrubbed from it.
        on_partial: ``(traj)`` with the steps so far (optional).
        on_wait: ``(n_ahead)`` while the job waits in :data:`QUEUE` for a free generation slot (optional).
        threads: CPU threads of a local capture, for the worker thread only; default
            :func:`~trajscope.ui.openmp.capture_threads` (every core, or ``TRAJSCOPE_CAPTURE_THREADS``).
        chat: send a text prompt as one user message through the model's chat template, when the
            model has one (:func:`trajscope.chat.user_message`).
    """

    def __init__(self, source: str, prompt: str, plan: Any, dispatch: Callable[[Callable[[], None]], None],
                 on_progress: Callable[[list], None], on_done: Callable[[Any], None], on_error: Callable[[str], None],
                 remote: bool = False, api_key: str | None = None, flush_every_s: float = 0.2,
                 on_partial: Callable[[Any], None] | None = None, partial_every_s: float = 2.0,
                 loader: Callable | None = None, on_wait: Callable[[int], None] | None = None,
                 threads: int | None = None, chat: bool = False):
        self.source, self.prompt, self.plan, self.chat = source, prompt, plan, chat
        self.on_wait = on_wait
        self.remote, self._api_key = remote, api_key
        self.dispatch = dispatch
        self.on_progress, self.on_partial, self.on_done, self.on_error = on_progress, on_partial, on_done, on_error
        self.flush_every_s, self.partial_every_s = flush_every_s, partial_every_s
        self.loader = loader
        self.threads = threads
        self.cancel = threading.Event()
        self.thread = threading.Thread(target=self._run, name="trajscope-generate", daemon=True)
        self.config = None  # the CaptureConfig actually used, once the model is known
        self.steps_done = 0  # steps the worker has finished (read by tests and Stop diagnostics)
        self.steps_at_stop: int | None = None
        # start_s (click to worker), load_s, capture_s (worker thread), to_loop_s (capture end to the UI's
        # handling of it), on_screen_s: for diagnostics and benchmarks
        self.timings: dict[str, float] = {}
        self._t_start = time.monotonic()
        self.t_captured: float | None = None
        self._last_flush = self._last_partial = 0.0
        self._buffer: list = []
        self._buffer_lock = threading.Lock()
        self._queue: collections.deque = collections.deque()

    def start(self) -> "GenerationJob":
        self._t_start = time.monotonic()
        self.thread.start()
        return self

    def stop(self) -> None:
        """Ask the capture to end after the current step (it keeps the steps it has)."""
        self.steps_at_stop = self.steps_done
        self.cancel.set()

    def _send(self, fn: Callable[[], None]) -> None:
        """Queue ``fn`` and dispatch a drain: the event loop may run dispatched callbacks out of
        order, but every drain empties the queue first-in first-out, so updates apply in order."""
        self._queue.append(fn)
        self.dispatch(self._drain)

    def _drain(self) -> None:
        while True:
            try:
                fn = self._queue.popleft()
            except IndexError:
                return
            try:
                fn()
            except Exception:  # one failing update must not swallow the ones queued after it (e.g. on_done)
                log.exception("a generation update failed")

    def _flush(self) -> None:
        """Send the buffered steps as one ``on_progress`` call (nothing when the buffer is empty)."""
        with self._buffer_lock:
            events, self._buffer = self._buffer, []
        if events:
            self._send(lambda: self.on_progress(events))

    def _should_stop(self) -> bool:
        """capture's cancel check, asked once after each step: it also counts the steps the generation
        has finished (its events trail it by up to about 0.1 s, capture/chunks.py)."""
        self.steps_done += 1
        return self.cancel.is_set()

    def _on_step(self, event: Any) -> None:
        self.steps_done = max(self.steps_done, event.step + 1)
        with self._buffer_lock:
            self._buffer.append(event)
        now = time.monotonic()
        if now - self._last_flush >= self.flush_every_s:
            self._last_flush = now
            self._flush()
        if self.on_partial is not None and now - self._last_partial >= self.partial_every_s:
            self._last_partial = now
            traj = event.partial()
            self._send(lambda: self.on_partial(traj))

    def _config(self, model: ModelHandle):
        plan = self.plan
        return plan.for_model(model.n_layers, model.d_model, model.model_id) if hasattr(plan, "for_model") else plan

    def _run(self) -> None:
        def waiting(n_ahead: int) -> None:
            if self.on_wait is not None:
                self._send(lambda: self.on_wait(n_ahead))

        if not QUEUE.wait_turn(self, waiting, self.cancel):
            self._send(lambda: self.on_error("Stopped while waiting for a free generation slot; nothing was generated."))
            return
        try:
            self._generate()
        finally:
            QUEUE.leave(self)

    def _generate(self) -> None:
        try:
            t0 = time.monotonic()
            if isinstance(self.prompt, str):  # before the model loads and long before it tokenises
                from trajscope.ui.operator import config

                config().prompt(self.prompt)
            model = get_model(self.source, self.remote, self._api_key, loader=self.loader)
            self.config = self._config(model)
            if not self.remote:
                openmp.set_threads(self.threads if self.threads is not None else openmp.capture_threads())
            self._last_flush = self._last_partial = t1 = time.monotonic()
            prompt = self.prompt
            if self.chat and isinstance(prompt, str) and getattr(model.tokenizer, "chat_template", None):
                prompt = user_message(prompt)  # rendered through the model's template; tokens get segments
            traj = capture(model, prompt, self.config, on_step=self._on_step, cancel=self._should_stop)
            self.t_captured = time.monotonic()
            self.timings = {"start_s": t0 - self._t_start, "load_s": t1 - t0, "capture_s": self.t_captured - t1}
            log.info("generation: model %.2f s, capture %.2f s, %d steps", t1 - t0, self.timings["capture_s"],
                     traj.n_steps)
        except TrajscopeError as exc:
            msg = _scrub(str(exc), self._api_key)
            log.info("generation refused: %s", msg)
            self._flush()
            self._send(lambda: self.on_error(msg))
        except Exception as exc:  # an unexpected failure still leaves the app usable
            first = (str(exc).splitlines() or [""])[0]
            err_id = error_id()
            # the server log keeps the whole traceback under the id the browser shows
            log.error("generation failed [error %s]: %s", err_id, _scrub(repr(exc), self._api_key),
                      exc_info=(type(exc), exc, exc.__traceback__) if not self._api_key else None)
            msg = _scrub(f"Generation failed: {type(exc).__name__}: {first} (error {err_id}; the server log has "
                         "the details).", self._api_key)
            self._flush()
            self._send(lambda: self.on_error(msg))
        else:
            self._flush()
            self._send(lambda: self.on_done(traj))
