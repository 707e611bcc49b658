"""load_model: sources, families, and one-sentence errors for bad input."""

from __future__ import annotations

import pytest

import trajscope as ts
from trajscope.model import ModelHandle
from tiny import FAMILIES


@pytest.mark.parametrize("family", FAMILIES)
def test_families_know_their_parts(tiny_models, family):
    m = tiny_models[family]
    assert m.n_layers == 2 and m.n_heads == 4 and m.d_model == 32
    assert len(m.blocks()) == 2
    d = m.describe()
    assert d["attn_implementation"] == "rows" and d["device"] == "cpu" and d["dtype"] == "float32"
    assert m.torch_module().config._attn_implementation == "trajscope_rows"


def test_attention_implementations(tiny_dirs, tiny_eager):
    assert tiny_eager["llama"].torch_module().config._attn_implementation == "eager"
    plain = ts.load_model(str(tiny_dirs["gpt2"]), attn="sdpa")
    with pytest.raises(ts.TrajscopeError, match="attn='sdpa'"):
        ts.capture(plain, "x = 1", max_new_tokens=2)
    with pytest.raises(ts.TrajscopeError, match="Unknown attention implementation 'flash'"):
        ts.load_model(str(tiny_dirs["gpt2"]), attn="flash")


def test_sample_model_loads_offline(sample_model):
    assert sample_model.family.name == "llama"
    assert sample_model.n_layers >= 4 and 3e6 <= sum(p.numel() for p in sample_model.torch_module().parameters()) <= 8e6
    assert sample_model.eos_token_id is not None


@pytest.mark.parametrize("source, fragment", [
    ("no-such-org/no-such-model-xyz", "Unknown model 'no-such-org/no-such-model-xyz'"),
    ("./does/not/exist", "No model directory"),
    ("   ", "A model source is needed"),
])
def test_unknown_sources_say_so(source, fragment):
    with pytest.raises(ts.TrajscopeError, match=fragment.replace("(", r"\(")):
        ts.load_model(source)


def test_directory_without_model(tmp_path):
    with pytest.raises(ts.TrajscopeError, match="holds no config.json"):
        ts.load_model(str(tmp_path))


def test_unsupported_architecture(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "bert"}')
    with pytest.raises(ts.TrajscopeError, match="Unsupported architecture 'bert'"):
        ts.load_model(str(tmp_path))


def test_remote_without_key_fails_before_network(monkeypatch):
    monkeypatch.delenv("NDIF_API_KEY", raising=False)
    with pytest.raises(ts.TrajscopeError, match="NDIF_API_KEY"):
        ts.load_model("meta-llama/Llama-3.1-8B", remote=True)


def test_bad_capture_arguments(tiny_models):
    m = tiny_models["llama"]
    with pytest.raises(ts.TrajscopeError, match="positive whole number"):
        ts.capture(m, "x = 1", max_new_tokens=0)
    with pytest.raises(ts.TrajscopeError, match="prompt is empty"):
        ts.capture(m, "   ", max_new_tokens=4)
    with pytest.raises(ts.TrajscopeError, match="context window is 128"):
        ts.capture(m, "x = 1\n" * 100, max_new_tokens=4)
    with pytest.raises(ts.TrajscopeError, match="at most"):
        ts.capture(m, "x = 1", max_new_tokens=200)
    with pytest.raises(ts.TrajscopeError, match="layer 7 is out of range"):
        ts.capture(m, "x = 1", max_new_tokens=2, residual_layers=[7])


def test_ndif_key_travels_per_request_and_nowhere_else(tiny_models, monkeypatch):
    from nnsight import CONFIG

    local = tiny_models["llama"]
    monkeypatch.setattr(type(local.nn), "to_model_key", lambda self: "org/model")  # a hub name, as on NDIF
    before = CONFIG.API.APIKEY
    handle = ModelHandle(local.nn, "org/model", local.family, remote=True, api_key="secret-key-123")
    opts = handle.remote_options()
    assert opts["backend"].api_key == "secret-key-123"
    assert CONFIG.API.APIKEY == before
    assert "secret" not in repr(handle) and "secret" not in str(handle.describe())
    assert local.remote_options() == {}
