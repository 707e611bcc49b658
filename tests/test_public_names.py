"""Every name a module of trajscope lists in ``__all__`` exists (``from module import *`` works)."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import trajscope


def _modules():
    for info in pkgutil.walk_packages(trajscope.__path__, "trajscope."):
        if not info.name.endswith(".__main__"):  # importing it runs the command line
            yield info.name


@pytest.mark.parametrize("name", sorted(_modules()))
def test_every_listed_name_exists(name):
    try:
        module = importlib.import_module(name)
    except ImportError as exc:  # an optional dependency (vLLM) this environment lacks
        pytest.skip(f"{name}: {exc}")
    missing = [n for n in getattr(module, "__all__", []) if not hasattr(module, n)]
    assert missing == [], f"{name}.__all__ lists {missing}"
