"""Local captures read through one ``tracer.cache`` (model/generation.py::_run_cached).

The per-module reads (the body NDIF runs) are the reference: both paths hand the
step kernels the same tensors, so every table and kept tensor must be equal, with
and without steering (a steered block is read and written in the body, the rest
come from the cache), on GPT-2, GQA Llama and a sliding-window Mistral.
"""

from __future__ import annotations

import pytest
import torch

import trajscope as ts
from trajscope.model import generation
from trajscope.steering import SteeringVector
from tiny import build_tiny_model

from test_capture_chunks import PROMPT, assert_same


def test_the_installed_nnsight_supports_cached_reads():
    # if this fails after an nnsight upgrade, local captures silently fall back to the slower reads
    assert generation.cache_reads()


@pytest.fixture(scope="module")
def window_model(tmp_path_factory):
    return ts.load_model(str(build_tiny_model(tmp_path_factory.mktemp("w"), "mistral", sliding_window=6)))


def _steering(model, layer: int) -> list[SteeringVector]:
    g = torch.Generator().manual_seed(layer)
    return [SteeringVector(layer=layer, direction=torch.randn(model.d_model, generator=g), strength=4.0,
                           start_step=3, end_step=9),
            SteeringVector(layer=model.n_layers - 1, direction=torch.randn(model.d_model, generator=g),
                           strength=2.0, mode="clamp", start_step=0)]


@pytest.mark.parametrize("name", ["gpt2", "llama", "window"])
@pytest.mark.parametrize("steered", [False, True])
def test_cached_reads_equal_per_module_reads(tiny_models, window_model, monkeypatch, name, steered):
    model = window_model if name == "window" else tiny_models[name]
    kw = dict(max_new_tokens=14, stop_at_eos=False, residual_layers="all", attention_layers="all", top_k_keys=4,
              steering=_steering(model, 1) if steered else [])
    calls = []
    real = generation._run_cached
    monkeypatch.setattr(generation, "_run_cached", lambda *a: calls.append(1) or real(*a))
    cached = ts.capture(model, PROMPT, **kw)
    assert calls, "the local capture did not take the cached path"
    monkeypatch.setattr(generation, "cache_reads", lambda: False)
    per_module = ts.capture(model, PROMPT, **kw)
    assert len(calls) == 1
    assert_same(cached, per_module)
    if steered:  # and the steering took effect: the run differs from an unsteered one
        plain = ts.capture(model, PROMPT, **{**kw, "steering": []})
        assert plain.activations["norm"].to_list() != cached.activations["norm"].to_list()
