"""The operator's limits on a served app: confined paths, the model list, the token cap, the model cache."""

from __future__ import annotations

import os

import pytest

import trajscope as ts
from trajscope.ui import operator, runner
from trajscope.ui.operator import ServeConfig
from trajscope.ui.views.app import TrajScope


@pytest.fixture
def data(tmp_path):
    d = tmp_path / "data"
    (d / "runs").mkdir(parents=True)
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "meta.json").write_text("{}")
    (d / "escape").symlink_to(tmp_path / "secret")  # a symlink out of the data directory
    return d


def test_paths_typed_in_the_browser_stay_inside_the_data_directories(data, tmp_path):
    cfg = ServeConfig.from_args(["--data-dir", str(data)], env={})
    assert cfg.path(str(data / "runs"), "run directory") == (data / "runs").resolve()
    for bad in ("/etc", "/etc/passwd", str(data / ".." / "secret"), str(data / "escape"), str(data / "escape" / "meta.json"),
                "../../.."):
        with pytest.raises(ts.TrajscopeError, match="outside the directories this server reads") as info:
            cfg.path(bad, "run directory")
        assert str(info.value).count(".") >= 1 and "\n" not in str(info.value)  # one sentence
    with pytest.raises(ts.TrajscopeError, match="Type the path"):
        cfg.path("  ", "run directory")


def test_options_and_environment(data):
    cfg = ServeConfig.from_args(["--models", "sample,gpt2", "--max-new-tokens", "50", "--max-models", "3"],
                                env={"TRAJSCOPE_DATA_DIRS": str(data)})
    assert cfg.models == ("sample", "gpt2") and cfg.max_new_tokens == 50 and cfg.max_models == 3
    assert cfg.data_dirs == (data.resolve(),)
    assert cfg.model("gpt2") == "gpt2" and cfg.model("mine", trusted=("mine",)) == "mine"
    with pytest.raises(ts.TrajscopeError, match="not on this server's list \\(sample, gpt2\\)"):
        cfg.model("/etc")
    with pytest.raises(ts.TrajscopeError, match="capped at 50"):
        cfg.new_tokens(51)
    with pytest.raises(ts.TrajscopeError, match="Unknown server options"):
        ServeConfig.from_args(["--trust-remote-code"], env={})
    for name in ("TRAJSCOPE_MAX_NEW_TOKENS", "TRAJSCOPE_CAPTURE_THREADS"):  # refused when the server starts
        with pytest.raises(ts.TrajscopeError, match=f"^{name} must be a whole number, not 'many'.$") as info:
            ServeConfig.from_args([], env={name: "many"})
        assert "\n" not in str(info.value)
    assert ServeConfig.from_args([], env={}).capture_threads is None  # every core PyTorch uses
    assert ServeConfig.from_args([], env={"TRAJSCOPE_CAPTURE_THREADS": " 3 "}).capture_threads == 3
    assert ServeConfig.from_args(["--capture-threads", "1"], env={"TRAJSCOPE_CAPTURE_THREADS": "3"}).capture_threads == 1
    default = ServeConfig.from_args([], env={})
    from trajscope.model import available_models

    # the installed models, SmolLM2 first on the page when it is one of them
    assert default.models == tuple(available_models()) and any(d.name == "sample_data" for d in default.data_dirs)
    assert default.default_model() == ("smollm2" if "smollm2" in default.models else default.models[0])


def test_the_app_refuses_and_reads_nothing(data, monkeypatch, sample_model, fresh_models):
    monkeypatch.setenv("TRAJSCOPE_DATA_DIRS", str(data))
    monkeypatch.setenv("TRAJSCOPE_MAX_NEW_TOKENS", "20")
    operator.configure(None)
    runner._MODELS[("sample", False, None)] = sample_model
    app = TrajScope()
    for bad in ("/etc", str(data / "escape")):
        app.state.run_path = bad
        app.controls.open_run()
        assert "outside the directories" in app.state.error and app.state.trajectory is None
    app.study_cards["drift"].settings.profile_path = "/etc/passwd"
    assert "outside the directories" in app.study_cards["drift"].settings.message
    app.state.param.update(prompt="x = 1", max_new_tokens=21, error="")
    assert app.controls.generate(dispatch=lambda fn: fn()) is None and "capped at 20" in app.state.error


def test_model_cache_evicts_the_least_recently_used(monkeypatch, fresh_models):
    monkeypatch.setenv("TRAJSCOPE_MAX_MODELS", "2")
    operator.configure(None)
    loads = []

    def loader(source, **kw):
        loads.append(source)
        return object()

    a = runner.get_model("a", loader=loader)
    runner.get_model("b", loader=loader)
    assert runner.get_model("a", loader=loader) is a  # a is now the most recent
    runner.get_model("c", loader=loader)  # evicts b
    assert [k[0] for k in runner._MODELS] == ["a", "c"] and loads == ["a", "b", "c"]
    runner.get_model("b", loader=loader)
    assert loads == ["a", "b", "c", "b"] and len(runner._MODELS) == 2
    assert os.environ.get("TRAJSCOPE_MAX_MODELS") == "2"


def test_generations_queue_in_order_and_say_their_place(sample_model, fresh_models, monkeypatch):
    import threading

    monkeypatch.setenv("TRAJSCOPE_MAX_GENERATIONS", "1")
    operator.configure(None)
    gate = threading.Event()
    first, second, third = (TrajScope(max_new_tokens=2, prompt=p) for p in ("a = 1", "b = 2", "c = 3"))
    j1 = first.controls.generate(dispatch=lambda fn: fn(), loader=lambda *a, **k: (gate.wait(20), sample_model)[1])
    import time

    time.sleep(0.3)
    j2 = second.controls.generate(dispatch=lambda fn: fn(), loader=lambda *a, **k: sample_model)
    j3 = third.controls.generate(dispatch=lambda fn: fn(), loader=lambda *a, **k: sample_model)
    deadline = time.time() + 10
    while "2 generations ahead" not in third.controls.ticker.message and time.time() < deadline:
        time.sleep(0.05)
    assert "1 generation ahead" in second.controls.ticker.message
    assert "2 generations ahead" in third.controls.ticker.message
    third.controls.stop()  # leaves the queue without generating
    j3.thread.join(10)
    assert "nothing was generated" in third.state.error and third.state.trajectory is None
    gate.set()
    j1.thread.join(30)
    j2.thread.join(30)
    assert first.state.trajectory.meta["prompt"] == "a = 1" and second.state.trajectory.meta["prompt"] == "b = 2"
    assert second.controls.ticker.message == ""  # the waiting note is gone once it runs


def test_session_limit(monkeypatch):
    monkeypatch.setenv("TRAJSCOPE_MAX_SESSIONS", "2")
    operator.configure(None)
    count = operator.SessionCount()
    assert count.enter() and count.enter() and not count.enter() and count.open == 2
    count.leave()
    assert count.enter() and count.open == 2
