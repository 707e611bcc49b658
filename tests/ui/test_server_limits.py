"""Limits the page shows are enforced on the server: the prompt's length before tokenising, and steering
(Steer, depth sweeps) against the operator's generations at once."""

from __future__ import annotations

import threading
import time

import pytest

from trajscope.errors import TrajscopeError
from trajscope.ui import operator, runner
from trajscope.studies.steering.state import MAX_SWEEP_DEPTHS, parse_depths
from trajscope.ui.state import AppState
from trajscope.studies.steering.card import SteeringView

BIG = "x" * 1_000_000  # a prompt set past the page (the textarea stops at 5,000)


class NoTokenizing:
    """A model whose tokenizer must never be asked."""

    n_layers = 2

    def __getattr__(self, name):
        raise AssertionError(f"the model was used ({name}) for a prompt over the cap")


def test_a_1mb_prompt_is_refused_before_tokenising():
    st = AppState(prompt=BIG)
    with pytest.raises(TrajscopeError, match=r"capped at 5,000 characters on this server \(it has 1,000,000\)"):
        st.capture_plan()  # what Generate calls first
    st.prompt = "x" * 5000
    st.capture_plan()  # at the cap: fine


def test_the_runner_refuses_it_before_loading_a_model(short_run):
    loads, errors, done = [], [], threading.Event()
    job = runner.GenerationJob("sample", BIG, AppState().capture_plan(), lambda fn: fn(),
                               on_progress=lambda e: None, on_done=lambda t: done.set(),
                               on_error=lambda m: (errors.append(m), done.set()),
                               loader=lambda *a, **k: loads.append(a) or NoTokenizing())
    job.start()
    assert done.wait(30)
    assert loads == [] and len(errors) == 1 and "capped at 5,000 characters" in errors[0]


def test_typed_compaction_sessions_are_capped_too():
    from trajscope.studies.compaction.state import CompactionSettings

    s = CompactionSettings()
    s.t1 = BIG
    with pytest.raises(TrajscopeError, match="capped at 5,000"):
        s.session()


def test_the_operator_sets_the_prompt_cap():
    cfg = operator.ServeConfig.from_args(["--max-prompt-chars", "10"], env={})
    assert cfg.max_prompt_chars == 10 and cfg.prompt("x" * 10)
    with pytest.raises(TrajscopeError, match="capped at 10 characters"):
        cfg.prompt("x" * 11)


def test_a_sweep_has_at_most_the_depth_cap():
    assert len(parse_depths(",".join(map(str, range(1, MAX_SWEEP_DEPTHS + 1))), 500)) == MAX_SWEEP_DEPTHS
    with pytest.raises(TrajscopeError, match=f"at most {MAX_SWEEP_DEPTHS} depths"):
        parse_depths(",".join(map(str, range(1, 64))), 64)


@pytest.mark.parametrize("action", ["sweep", "steer"])
def test_steering_waits_for_a_generation_slot(short_run, action, monkeypatch):
    monkeypatch.setattr(operator, "_CONFIG", operator.ServeConfig(data_dirs=(), max_generations=1))
    loaded = threading.Event()

    def loader(source):
        loaded.set()
        raise TrajscopeError("Loaded.")

    st = AppState()
    st.set_trajectory(short_run, step=0)
    view = SteeringView(state=st, model_loader=loader)
    holder = object()  # another session's generation holds the only slot
    assert runner.QUEUE.wait_turn(holder, lambda n: None, threading.Event())
    try:
        dispatched = []
        monkeypatch.setattr("trajscope.studies.steering.card.dispatcher", lambda: lambda fn: dispatched.append(fn) or fn())
        getattr(view, action)()
        time.sleep(1.0)
        assert not loaded.is_set(), f"{action} ran while every generation slot was taken"
        assert "Waiting for a free generation slot: 1 ahead." == view.settings.status
    finally:
        runner.QUEUE.leave(holder)
    assert loaded.wait(10)
    deadline = time.monotonic() + 10
    while view.settings.busy and time.monotonic() < deadline:
        time.sleep(0.05)
    assert view.settings.status == "Loaded." and not view.settings.busy
    assert runner.QUEUE._line == []  # the slot is given back
