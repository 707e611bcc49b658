"""A failure inside a card's background work: one sentence on the card, the traceback in the log.

``in_background`` (the one mechanism every card's background work goes through) turns a
:class:`TrajscopeError` into its own sentence and anything else into ``"<what> failed: …
(error <id>; the log has the details)"``, logging the traceback under that id.
"""

from __future__ import annotations

import logging
import re

import pytest
from bokeh.document import Document

import trajscope as ts
from trajscope.errors import TrajscopeError
from trajscope.logs import log_to_file
from trajscope.ui.state import AppState
from trajscope.ui.views import features
from trajscope.ui.views._base import in_background


@pytest.fixture
def log_file(tmp_path):
    path = log_to_file(tmp_path / "app.log")
    yield path
    logger = logging.getLogger("trajscope")
    for h in [h for h in logger.handlers if getattr(h, "baseFilename", None) == str(path)]:
        logger.removeHandler(h)
        h.close()


def test_an_unexpected_failure_in_the_sae_card_is_one_sentence_and_a_logged_traceback(sample_model, log_file,
                                                                                          monkeypatch):
    def broken(traj, sae, k=16):
        raise RuntimeError("planted failure\nsecond line")

    monkeypatch.setattr(features, "encode_run", broken)
    run = ts.capture(sample_model, "def f(x):\n    ", max_new_tokens=4, residual_layers=[3])
    state = AppState()
    state.set_trajectory(run, step=0)
    view = features.FeaturesView(state=state)
    view.__panel__().get_root(Document())
    msg = view.message
    m = re.fullmatch(r"Encoding the run with the SAE failed: RuntimeError: planted failure "
                     r"\(error ([0-9a-f]{8}); the log has the details\)\.", msg)
    assert m, msg  # one sentence, not "Encoding…" left on screen
    logged = log_file.read_text()
    assert f"[error {m.group(1)}]" in logged and "Traceback" in logged and "planted failure" in logged
    assert "in broken" in logged  # the traceback reaches the injected frame


def test_bad_input_keeps_its_own_sentence_and_logs_no_traceback(log_file):
    out = []

    def work():
        raise TrajscopeError("The SAE reads layer 3 but the run kept no residuals there.")

    in_background(work, out.append, lambda msg: out.append(("error", msg)))
    assert out == [("error", "The SAE reads layer 3 but the run kept no residuals there.")]
    assert "Traceback" not in log_file.read_text()


def test_success_applies_the_result(log_file):
    out = []
    in_background(lambda: 41 + 1, out.append, lambda msg: out.append(("error", msg)))
    assert out == [42]
