"""Shared fixtures: tiny random models of each architecture family, built in a temp dir.

Models are built from configs (2 layers, width 32–64) and saved with the sample
model's tokenizer so they load through the same offline path as any local model.
Nothing here touches the network (``HF_HUB_OFFLINE=1``).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pathlib

import pytest


import trajscope as ts
from trajscope.model import ModelHandle

from tiny import FAMILIES, build_tiny_model, hf_reference, tiny_config  # noqa: F401  (shared helpers)


def pytest_collection_modifyitems(config, items):
    """Tests marked ``soak`` (hundreds of step changes, kill -9 and resume) run only when selected with
    ``-m soak``, which CI does in a step of its own: they would take the default suite past a quarter hour."""
    expr = config.option.markexpr or ""
    if "soak" in expr and "not soak" not in expr:
        return
    skip = pytest.mark.skip(reason="soak test: run it with `pytest -m soak`")
    for item in items:
        if item.get_closest_marker("soak"):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory) -> dict[str, pathlib.Path]:
    tmp = tmp_path_factory.mktemp("tiny")
    return {f: build_tiny_model(tmp, f) for f in FAMILIES}


@pytest.fixture(scope="session")
def tiny_models(tiny_dirs) -> dict[str, ModelHandle]:
    return {f: ts.load_model(str(p), device="cpu") for f, p in tiny_dirs.items()}


@pytest.fixture(scope="session")
def sample_model() -> ModelHandle:
    return ts.load_model("sample", device="cpu")


@pytest.fixture(scope="session")
def tiny_eager(tiny_dirs) -> dict[str, ModelHandle]:
    """The same tiny models loaded with Hugging Face's eager attention (the reference for attention rows)."""
    return {f: ts.load_model(str(p), device="cpu", attn="eager") for f, p in tiny_dirs.items()}
