"""Fixtures of the study tests."""

from __future__ import annotations

import pytest


@pytest.fixture()
def data_dirs(tmp_path_factory, monkeypatch):
    """The app reads files from the tests' temporary directories (as tests/ui/conftest.py sets it up)."""
    import os

    from trajscope.model import sample_data_dir
    from trajscope.ui import operator

    monkeypatch.setenv("TRAJSCOPE_DATA_DIRS", os.pathsep.join([str(tmp_path_factory.getbasetemp()),
                                                               str(sample_data_dir())]))
    monkeypatch.setenv("TRAJSCOPE_RUNS_DIR", str(tmp_path_factory.getbasetemp() / "runs"))
    operator.configure(None)
    yield
    operator.configure(None)
