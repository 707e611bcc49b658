"""The UI thread's OpenMP team steps aside while a capture runs; captures leave one core to the page."""

from __future__ import annotations

import os
import pathlib
import threading

import pytest
import torch

from trajscope.capture import CaptureConfig
from trajscope.ui import openmp
from trajscope.ui.runner import GenerationJob

needs_runtime = pytest.mark.skipif(openmp.runtime() is None, reason="no OpenMP runtime reachable from PyTorch")


def on_thread(fn):
    """``fn()`` on a fresh thread (OpenMP settings and teams are per thread); its result or exception."""
    out = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as exc:  # re-raised on the test's thread
            out["error"] = exc

    t = threading.Thread(target=run)
    t.start()
    t.join(60)
    if "error" in out:
        raise out["error"]
    return out["value"]


def tasks() -> set[str]:
    """The process's thread ids."""
    return set(os.listdir("/proc/self/task"))


@needs_runtime
def test_hold_puts_the_thread_on_one_openmp_thread_and_release_restores_it_after_the_last_hold():
    def body():
        before = torch.get_num_threads()
        seen = []
        assert openmp.hold() and openmp.hold()  # two captures started from this thread
        seen.append(torch.get_num_threads())
        openmp.release()
        seen.append(torch.get_num_threads())  # one capture still runs
        openmp.release()
        seen.append(torch.get_num_threads())
        openmp.release()  # an extra release is harmless
        return before, seen, openmp.held()

    before, seen, left = on_thread(body)
    assert seen == [1, 1, before] and left == 0


@needs_runtime
@pytest.mark.skipif(not pathlib.Path("/proc/self/task").is_dir() or torch.get_num_threads() < 2,
                    reason="counts OpenMP worker threads in /proc; needs two or more intra-op threads")
def test_hold_frees_the_threads_team():
    """libgomp throttles every team while the process holds more OpenMP threads than CPUs: the hold
    must free this thread's team (its worker threads exit), not only stop using it."""
    def body():
        n = torch.get_num_threads()
        before = tasks()
        x = torch.randn(512, 512)
        for _ in range(3):
            x @ x  # a parallel op: this thread now owns a team of n threads (n - 1 new workers)
        team = tasks() - before
        openmp.hold()
        try:
            return n, team, team - tasks()
        finally:
            openmp.release()

    n, team, gone = on_thread(body)  # other threads may come and go meanwhile: only the team's are counted
    assert len(team) >= n - 1 and len(gone) == n - 1, (n, team, gone)


def test_lend_holds_only_when_dispatch_defers_to_this_threads_loop_and_gives_back_once():
    def deferred(fn):
        fn()

    deferred.deferred = True

    def body():
        inline = openmp.lend(lambda fn: fn())  # no loop: nothing to hold
        assert openmp.held() == 0
        inline()
        give_back = openmp.lend(deferred)
        held = openmp.held()
        on_thread(give_back)  # not the owner's thread: no effect
        still = openmp.held()
        give_back()
        give_back()  # one-shot
        return held, still, openmp.held()

    if openmp.runtime() is None:
        assert on_thread(body) == (0, 0, 0)
    else:
        assert on_thread(body) == (1, 1, 0)


@needs_runtime
def test_set_threads_changes_the_calling_thread_only():
    main = torch.get_num_threads()
    # a new thread starts from the process's count, which is not this thread's when an earlier test left it held
    fresh = on_thread(torch.get_num_threads)

    def body():
        openmp.set_threads(1)
        return torch.get_num_threads()

    assert on_thread(body) == 1
    assert torch.get_num_threads() == main
    assert on_thread(torch.get_num_threads) == fresh


@needs_runtime
@pytest.mark.parametrize("setting", [None, 1, 3])
def test_generation_captures_on_every_core_unless_the_operator_says(tiny_models, fresh_models, setting):
    from trajscope.ui import operator

    argv = [] if setting is None else ["--capture-threads", str(setting)]
    operator.configure(operator.ServeConfig.from_args(argv, env={}))  # the conftest restores the default after
    want = setting or torch.get_num_threads()
    seen, done = [], []
    job = GenerationJob("tiny", "def f(x):", CaptureConfig(max_new_tokens=3, stop_at_eos=False),
                        dispatch=lambda fn: fn(),  # runs the updates on the worker thread
                        on_progress=lambda evs: seen.append(torch.get_num_threads()), on_done=done.append,
                        on_error=pytest.fail, loader=lambda source, **kw: tiny_models["llama"], flush_every_s=0.0)
    job.start().thread.join(timeout=60)
    assert done and set(seen) == {want}
    assert openmp.capture_threads() == want


def test_served_generate_holds_the_event_loop_thread_until_the_run_ends(tiny_models, fresh_models):
    """Controls.generate lends the UI thread's cores for as long as its run lasts (done or error)."""
    from trajscope.ui.state import AppState
    from trajscope.ui.views.controls import Controls

    def body():
        pending = []

        def dispatch(fn):
            pending.append(fn)

        dispatch.deferred = True  # as a served session's dispatcher
        controls = Controls(state=AppState(max_new_tokens=3))
        job = controls.generate(dispatch=dispatch, loader=lambda source, **kw: tiny_models["llama"])
        during = openmp.held()
        job.thread.join(timeout=60)
        while pending:  # the event loop's ticks, on this (the UI) thread
            pending.pop(0)()
        return during, openmp.held(), controls.state.trajectory is not None

    expected = (1, 0, True) if openmp.runtime() is not None else (0, 0, True)
    assert on_thread(body) == expected
