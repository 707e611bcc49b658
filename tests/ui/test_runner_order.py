"""GenerationJob applies streamed updates in order even when the event loop runs callbacks out of order."""

from __future__ import annotations

from trajscope.capture import CaptureConfig
from trajscope.ui.runner import GenerationJob


def test_updates_apply_in_order_under_reordered_dispatch(tiny_models, fresh_models):
    pending, seen = [], []
    job = GenerationJob("tiny", "def f(x):", CaptureConfig(max_new_tokens=6, stop_at_eos=False), dispatch=pending.append,
                        on_progress=lambda evs: seen.extend(("step", ev.step) for ev in evs),
                        on_done=lambda t: seen.append(("done", t.n_steps)), on_error=lambda m: seen.append(("error", m)),
                        loader=lambda source, **kw: tiny_models["llama"], flush_every_s=0.0)
    job.start().thread.join(timeout=60)
    for fn in reversed(pending):  # the worst order an event loop could choose
        fn()
    assert seen == [("step", s) for s in range(6)] + [("done", 6)]


def test_dispatch_without_a_server_runs_on_the_ui_loop_thread_in_order():
    """Jupyter: results of a worker thread reach the widgets on the kernel's loop thread, in order."""
    import asyncio
    import threading

    from trajscope.ui.views._base import dispatcher

    seen = []

    import trajscope.ui.views._base as base

    base_in_kernel, base._in_kernel = base._in_kernel, lambda: True  # as in a Jupyter kernel

    async def main():
        dispatch = dispatcher()  # created on the UI (loop) thread, as the views do
        ui = threading.get_ident()
        done = asyncio.Event()
        loop = asyncio.get_running_loop()

        def worker():
            for i in range(20):
                dispatch(lambda i=i: seen.append((i, threading.get_ident() == ui)))
            loop.call_soon_threadsafe(done.set)

        threading.Thread(target=worker).start()
        await done.wait()
        await asyncio.sleep(0.05)

    try:  # on a thread of its own: the browser tests' Playwright may hold this thread's loop
        ui_thread = threading.Thread(target=lambda: asyncio.run(main()))
        ui_thread.start()
        ui_thread.join(30)
    finally:
        base._in_kernel = base_in_kernel
    assert seen == [(i, True) for i in range(20)]
