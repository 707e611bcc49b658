"""Fixtures for the app tests: short runs of the sample model, and headless Chromium for the ``ui`` tests.

Browser tests use Debian's Chromium (``/usr/bin/chromium``; Playwright cannot
download browsers here) through pytest-playwright's ``browser_type_launch_args``.
"""

from __future__ import annotations

import os
import pathlib

import pytest

import trajscope as ts

CHROMIUM = "/usr/bin/chromium"
PROMPT = "def fibonacci(n):\n    "


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args):
    if not os.path.exists(CHROMIUM):
        pytest.skip("Chromium is not installed (apt-get install -y chromium fonts-liberation)")
    return {**browser_type_launch_args, "executable_path": CHROMIUM, "headless": True,
            "args": ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                     "--disable-background-networking", "--disable-component-update", "--disable-sync",
                     # for the memory test: window.gc() and unquantised performance.memory
                     "--js-flags=--expose-gc", "--enable-precise-memory-info"]}


@pytest.fixture(scope="session")
def short_run(sample_model) -> ts.Trajectory:
    """12 greedy decode steps of the sample model, full attention rows of layers 0 and 1."""
    return ts.capture(sample_model, PROMPT, max_new_tokens=12, attention_layers=[0, 1])


@pytest.fixture(scope="session")
def short_run_dir(short_run, tmp_path_factory) -> pathlib.Path:
    return short_run.save(tmp_path_factory.mktemp("runs") / "short")


@pytest.fixture
def fresh_models():
    """Empty the app's shared model cache for the test, restoring it afterwards."""
    from trajscope.ui import runner

    saved = dict(runner._MODELS)
    runner._MODELS.clear()
    yield runner._MODELS
    runner._MODELS.clear()
    runner._MODELS.update(saved)


@pytest.fixture(autouse=True)
def _runs_dir(tmp_path, monkeypatch):
    """Runs the app saves go to the test's temporary directory, never into the checkout."""
    monkeypatch.setenv("TRAJSCOPE_RUNS_DIR", str(tmp_path / "runs"))
    return tmp_path / "runs"


@pytest.fixture(autouse=True)
def _operator(tmp_path_factory, monkeypatch, _runs_dir):
    """The served-app confinement, with the tests' temporary directories among the data directories."""
    from trajscope.model import sample_data_dir
    from trajscope.ui import operator

    dirs = [str(tmp_path_factory.getbasetemp()), str(sample_data_dir()), str(_runs_dir)]
    monkeypatch.setenv("TRAJSCOPE_DATA_DIRS", os.pathsep.join(dirs))
    # set explicitly: a lazy read by an earlier test's worker thread, racing this setup, cannot replace it
    operator.configure(operator.ServeConfig.from_args(env=dict(os.environ)))
    operator.SESSIONS = operator.SessionCount()  # killed test servers never report their sessions' end
    yield
    operator.configure(None)


@pytest.fixture(autouse=True)
def _servers():
    """Stop the Panel servers a test started (browser tests serve the app in-process), then check that no
    callback failed inside Bokeh's process-wide ``curdoc()`` stack: a document left there is what every later
    test in this process would get from ``curdoc()`` (see :mod:`trajscope.ui.views.unlocked`)."""
    yield
    import time

    import panel as pn
    from bokeh.io import doc as bokeh_doc

    pn.state.kill_all_servers()
    deadline = time.monotonic() + 5  # a callback still running on a stopping server pops its own entry
    while bokeh_doc._PATCHED_CURDOCS and time.monotonic() < deadline:
        time.sleep(0.05)
    left = len(bokeh_doc._PATCHED_CURDOCS)
    bokeh_doc._PATCHED_CURDOCS.clear()  # the next test starts clean either way
    assert left == 0, (f"{left} Bokeh document(s) left on curdoc()'s stack: a server callback raised inside "
                       "bokeh.io.doc.patch_curdoc during this test (its traceback is in the log)")


@pytest.fixture
def app_page(page, sample_model, fresh_models):
    """The served page on the demo run, the sample model shared; returns ``(page, app)`` (the session's TrajScope)."""
    from browser import serve_app
    from trajscope.ui import runner
    from trajscope.ui.views.app import default_page

    runner._MODELS[("sample", False, None)] = sample_model
    return page, serve_app(page, default_page)
