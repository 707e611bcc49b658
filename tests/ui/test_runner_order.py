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
